"""How many random plans break which rule: the rules of tests/random_plans.py over N seeded random
plans (random HF-shaped models, clusters of 1 to 4,096 nodes, meshes, knobs, global batches, modes,
stacks), counted by rule. The same seed draws the same plans on any commit, so running it on the code
before a fix (PYTHONPATH=<that checkout>) counts what the fix removed.

Run: python benchmarks/invariant_sweep.py --plans 5000 --seed 0 --out benchmarks/results/invariant-sweep.json
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "tests"))  # random_plans; meshplan itself from PYTHONPATH when given

from random_plans import memory_violations, random_plan, violations  # noqa: E402

from meshplan.errors import MeshplanError  # noqa: E402


def rule_of(message: str) -> str:
    """A violation's rule, its numbers taken out (they differ plan by plan)."""
    return re.sub(r"\(.*\)", "(…)", re.sub(r"-?\d+(\.\d+)?(e[-+]\d+)?", "N", message))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    counts: Counter = Counter()
    broken = drawn = 0
    examples: dict[str, str] = {}
    t0 = time.perf_counter()
    while drawn < args.plans:
        try:
            plan = random_plan(rng.choice, rng.randint)
        except MeshplanError:
            continue
        drawn += 1
        try:
            found = violations(plan) + memory_violations(plan)
        except Exception as exc:  # an estimate that crashes breaks the rules too
            found = [f"crashed: {type(exc).__name__}: {exc}"]
        broken += bool(found)
        for message in found:
            rule = rule_of(message)
            counts[rule] += 1
            examples.setdefault(rule, f"{plan}: {message}")
    import meshplan

    code = Path(meshplan.__file__).resolve().parents[1]
    commit = subprocess.run(
        ["git", "-C", str(code), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    result = {
        "command": " ".join(["python", "benchmarks/invariant_sweep.py"] + sys.argv[1:]),
        "code": str(code),
        "commit": commit,
        "plans": drawn,
        "seed": args.seed,
        "plans_breaking_a_rule": broken,
        "violations_by_rule": dict(counts.most_common()),
        "example_by_rule": examples,
        "seconds": time.perf_counter() - t0,
    }
    print(f"{drawn} random plans (seed {args.seed}) on {code} at {commit[:10]}: {broken} break a rule")
    for rule, n in counts.most_common():
        print(f"  {n:6d}  {rule}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
