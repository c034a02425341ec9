"""benchmarks/peers.py end to end on the CPU, its README table, and benchmarks/vendor_mamba_ssm.py.

The Mamba-2 cases need mamba_ssm's Triton files in benchmarks/third_party/ (git-ignored; written by
vendor_mamba_ssm.py from a mamba checkout): where they are absent the smoke run must say it skipped them.
"""

import json
import os
import re
import subprocess
import sys

from benchmark_scripts import BENCHMARKS, load

ROOT = BENCHMARKS.parent


def test_smoke_run_writes_every_case_it_can(tmp_path):
    """Two gloo ranks: the dense case on rank 0, the tp=2 case on both, and the Mamba-2 cases (interpreted
    kernels) where mamba_ssm is vendored — meshplan's and mamba_ssm's results agreeing to fp32 rounding."""
    out = tmp_path / "peers.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(BENCHMARKS / "peers.py")]
    cmd += ["--smoke", "--out", str(out), "--peers", "torch-eager", "dtensor-tp", "mamba_ssm"]
    cmd += ["--steps", "1", "--warmup", "1", "--mamba-chunks", "64"]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(out.read_text())["records"]
    cases = {(r["case"], r["gpus"], r["peer"]) for r in records}
    assert {("dense-2layer-train", 1, "torch-eager"), ("dense-2layer-train-tp2", 2, "dtensor-tp")} <= cases
    mamba = [r for r in records if r["peer"] == "mamba_ssm"]
    if not (BENCHMARKS / "third_party" / "mamba_ssm" / "ops" / "triton" / "ssd_combined.py").is_file():
        assert "Mamba-2 cases skipped: no mamba_ssm in" in done.stdout and not mamba
        return
    assert {r["case"] for r in mamba} == {"ssd-scan-fwd-bwd", "mamba2-block-train"}
    for r in mamba:
        assert r["agrees"] and r["max_rel_err"] < 1e-4 and r["peer_chunk"] == 64, r
        assert r["peer_ms"] > 0 and r["meshplan_ms"] > 0
    assert len(mamba[-1]["rel_err"]) == 2 + 2 * 9  # y, dx and each of two layers' nine weights


def test_readme_peers_table_is_the_results_files_table():
    """README's peers table is what `peers.py --table` prints for the files it names (session 19's files
    under their old case and peer names read as today's)."""
    peers = load("peers")
    readme = (ROOT / "README.md").read_text()
    names = re.search(r"\(`python benchmarks/peers.py --table` of (.*?) in `benchmarks/results/`", readme).group(1)
    files = [str(BENCHMARKS / "results" / n) for n in re.findall(r"`([^`]+)`", names)]
    assert files and peers.markdown(files) in readme
    old = peers.normalized({"case": "dense-7b 2 layers train", "gpus": 2, "peer": "dtensor-tp-eager"})
    assert (old["case"], old["peer"]) == ("dense-2layer-train-tp2", "dtensor-tp")


def test_vendor_copies_the_imported_closure_with_empty_packages(tmp_path):
    """From an unpacked sdist: the three roots and what they import at module level (also inside try),
    not what a function imports; empty __init__.py files, the LICENSE and SOURCE.json beside them."""
    vendor = load("vendor_mamba_ssm")
    src = tmp_path / "sdist"
    files = {
        "mamba_ssm/__init__.py": '__version__ = "9.9"\nfrom mamba_ssm.ops.selective_scan_interface import x\n',
        "mamba_ssm/ops/triton/ssd_combined.py": (
            "try:\n    from causal_conv1d import f\nexcept ImportError:\n    f = None\n"
            "from mamba_ssm.ops.triton.ssd_bmm import g\n"
            "def slow():\n    from mamba_ssm.ops.selective_scan_interface import s\n"
        ),
        "mamba_ssm/ops/triton/ssd_bmm.py": (
            "try:\n    from mamba_ssm.utils.determinism import a\nexcept ImportError:\n    pass\n"
        ),
        "mamba_ssm/ops/triton/layernorm_gated.py": "import math\n",
        "mamba_ssm/ops/triton/layer_norm.py": "from mamba_ssm.utils.torch import custom_fwd\n",
        "mamba_ssm/utils/determinism.py": "",
        "mamba_ssm/utils/torch.py": "",
        "LICENSE": "Apache License 2.0\n",
    }
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    out = tmp_path / "third_party"
    record = vendor.vendor(vendor.Source(str(src), "HEAD"), out)
    copied = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    modules = [n for n in files if n.startswith("mamba_ssm/") and not n.endswith("__init__.py")]
    inits = ["mamba_ssm/__init__.py", "mamba_ssm/ops/__init__.py", "mamba_ssm/ops/triton/__init__.py"]
    inits += ["mamba_ssm/utils/__init__.py"]
    assert copied == sorted(modules + inits + ["mamba_ssm/LICENSE", "mamba_ssm/SOURCE.json"])
    assert all((out / n).read_text() == "" for n in inits)
    assert record["version"] == "9.9" and record["commit"] is None and record["files"] == sorted(modules)
