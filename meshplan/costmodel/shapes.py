"""Parameter counts and channel shares of single blocks: pure functions of a ModelSpec that the memory
model, the schedule, the compute model and the layout modules all use (a leaf of costmodel's imports)."""

from __future__ import annotations

import math


def local_bc_channels(m, head_div: int) -> float:
    """Mamba-2's B and C channels on a rank whose heads are split `head_div` ways: split with the
    groups where T divides ngroups, else the whole groups its heads use (gcd(T, ngroups) ways)."""
    return 2 * m.ngroups * m.d_state / math.gcd(head_div, m.ngroups)
