"""A checkpoint through `meshplan execute --weights` on the GPU against transformers' own model.

transformers writes a Llama (GQA, llama3 rotary scaling) and a Mamba-2 checkpoint of a few tens of
millions of parameters here (nothing is downloaded); its model then gives the loss of a batch of ids
in fp32 and in bf16, and meshplan executes the checkpoint (bf16, the whole model, one GPU) on the same
ids. Prints a table and writes JSON:

    python benchmarks/weights_check.py --out $OUT/weights-check.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

VOCAB, SEQ = 4096, 4096


def _models():
    from transformers import LlamaConfig, LlamaForCausalLM, Mamba2Config, Mamba2ForCausalLM

    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024,
    }
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=512,
            intermediate_size=1536,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            rms_norm_eps=1e-5,
            rope_parameters=rope,
            tie_word_embeddings=False,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
    )
    mamba = Mamba2ForCausalLM(
        Mamba2Config(
            vocab_size=VOCAB,
            hidden_size=512,
            state_size=64,
            head_dim=64,
            num_heads=16,
            n_groups=1,
            expand=2,
            conv_kernel=4,
            num_hidden_layers=4,
            layer_norm_epsilon=1e-5,
            tie_word_embeddings=True,
            chunk_size=256,
        )
    )
    return {"llama3-tiny": llama, "mamba2-tiny": mamba}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (1, SEQ + 1), generator=torch.Generator().manual_seed(1))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        np.save(Path(tmp) / "ids.npy", ids.numpy())
        for name, model in _models().items():
            folder = Path(tmp) / name
            model.save_pretrained(folder)
            gpu = model.cuda().eval()
            with torch.no_grad():
                fp32 = gpu(input_ids=ids.cuda(), labels=ids.cuda()).loss.item()
                bf16 = gpu.to(torch.bfloat16)(input_ids=ids.cuda(), labels=ids.cuda()).loss.item()
            del gpu
            torch.cuda.empty_cache()
            run_file = Path(args.out).with_name(f"weights-run-{name}.json")
            cmd = [
                sys.executable,
                "-m",
                "meshplan",
                "execute",
                "--model",
                str(folder),
                "--weights",
                str(folder),
                "--layout",
                "single",
                "--seq",
                str(SEQ),
                "--nproc",
                "1",
                "--device",
                "cuda",
                "--steps",
                "2",
                "--tokens",
                str(Path(tmp) / "ids.npy"),
                "--out",
                str(run_file),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            run = json.loads(run_file.read_text()) if run_file.exists() else {}
            loss = run.get("measured", {}).get("loss")
            rows.append(
                {
                    "model": name,
                    "params": sum(p.numel() for p in model.parameters()),
                    "seq": SEQ,
                    "hf_fp32_loss": fp32,
                    "hf_bf16_loss": bf16,
                    "meshplan_bf16_loss": loss,
                    "rel_to_fp32": None if loss is None else loss / fp32 - 1,
                    "exit": proc.returncode,
                    "stderr_tail": proc.stderr[-2000:],
                }
            )
    print(f"{'model':<14}{'params':>12}{'HF fp32':>10}{'HF bf16':>10}{'meshplan':>10}{'vs fp32':>9}")
    for r in rows:
        mp = "failed" if r["meshplan_bf16_loss"] is None else f"{r['meshplan_bf16_loss']:.4f}"
        rel = "" if r["rel_to_fp32"] is None else f"{100 * r['rel_to_fp32']:+.2f}%"
        print(f"{r['model']:<14}{r['params']:>12,}{r['hf_fp32_loss']:>10.4f}{r['hf_bf16_loss']:>10.4f}{mp:>10}{rel:>9}")
    Path(args.out).write_text(
        json.dumps(
            {
                "command": "python benchmarks/weights_check.py --out $OUT/weights-check.json",
                "environment": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)},
                "rows": rows,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
