"""The packed-documents row of issue #34: 16K (+1) token ids of 6 documents, seed 0, as a .npz of `tokens`
and `documents` (`meshplan execute --tokens`).

    python benchmarks/packed_docs.py OUT.npz
"""

import sys

import numpy as np


def main(path: str) -> None:
    rng = np.random.default_rng(0)
    n = 16384 + 1
    tokens = rng.integers(0, 50000, n)
    cuts = np.sort(rng.choice(np.arange(1, n), 5, replace=False))  # 6 documents
    documents = np.searchsorted(cuts, np.arange(n), side="right")
    np.savez(path, tokens=tokens, documents=documents)


if __name__ == "__main__":
    main(sys.argv[1])
