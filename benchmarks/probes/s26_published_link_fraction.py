"""Session-26 scratch test, kept so its figures trace: the published dense rows (benchmarks/published_runs.py)
priced with every preset's intra-node link rate scaled by --fraction (NCCL reaches 0.55-0.81 of NVLink's on 2-4
H200s, benchmarks/results/s26-h200x*-nccl/), to see whether one such fraction in the presets would serve. It is not
applied anywhere.

    PYTHONPATH=. python benchmarks/probes/s26_published_link_fraction.py --fraction 0.8
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import published_runs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fraction", type=float, default=0.8)
    args = ap.parse_args()
    load = published_runs.load_cluster

    def scaled(name):
        c = load(name)
        link = replace(c.intra_link, bandwidth_bytes_per_s=c.intra_link.bandwidth_bytes_per_s * args.fraction)
        return replace(c, intra_link=link)

    for label, loader in (("datasheet", load), (f"x{args.fraction:g}", scaled)):
        published_runs.load_cluster = loader
        s = published_runs.summarize(published_runs.evaluate(published_runs.load_rows()))
        by = ", ".join(f"{k.removesuffix('.toml')} {v['within']}/{v['rows']}" for k, v in s["by_source"].items())
        print(f"{label}: {s['within_tolerance']} of {s['test_rows']} within; median |error| "
              f"{s['median_abs_error']:.1%} ({by})")  # fmt: skip


if __name__ == "__main__":
    main()
