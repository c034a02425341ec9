"""`recommend --headroom GIB` (planner.plan's headroom_bytes): only plans that leave that much of each GPU
free beyond what is priced are ranked — a user's margin for what no term prices (the caching allocator's
slack, stacks' and NICs' buffers). Bad values are refused in one line."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from meshplan.cli import app
from meshplan.costmodel.options import CostOptions
from meshplan.errors import MeshplanError
from meshplan.models import PRESETS
from meshplan.planner.plan import KNOBS, plan
from meshplan.topologies.cluster import load_cluster

GIB = 2**30
CLUSTER = load_cluster("h100-sxm-8")


def _ranked(seq: int, headroom_gib: float):
    got = plan(
        PRESETS["dense-7b"],
        CLUSTER,
        seq,
        1,
        CostOptions(),
        keep=0,
        workers=1,
        search=frozenset(KNOBS),
        headroom_bytes=headroom_gib * GIB,
    )
    return got.ranked, got.reason


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([16384, 32768]), st.floats(0, 30), st.floats(0, 30))
def test_headroom_keeps_only_roomier_plans(seq, a, b):
    """Every plan ranked leaves the headroom free, and — every mesh priced (keep=0; the CLI's pruning by the
    best `top` can price a mesh under a looser bound) — more headroom never ranks a mesh less did not."""
    low, high = sorted((a, b))
    ranked_low, _ = _ranked(seq, low)
    ranked_high, _ = _ranked(seq, high)
    for c in ranked_high:
        assert c.device_bytes + high * GIB <= CLUSTER.gpu.memory_bytes
    assert {str(c.layout) for c in ranked_high} <= {str(c.layout) for c in ranked_low}


def test_a_tight_mesh_drops_out_and_the_reason_says_so():
    """dense-7b at 16K on 8 H100s: dp=2,pp=2,tp=2 (ZeRO 0) leaves 2.6 GiB free with its fastest knobs; asked
    for 4, that setting is not ranked (the mesh may come back with knobs that keep more), and the reason
    names the margin every ranked plan keeps."""
    ranked, _ = _ranked(16384, 0)
    tight = {str(c.layout): c for c in ranked if CLUSTER.gpu.memory_bytes - c.device_bytes < 4 * GIB}
    assert "dp=2,pp=2,tp=2" in tight
    roomy, reason = _ranked(16384, 4)
    for c in roomy:
        if str(c.layout) in tight:
            assert c.knobs != tight[str(c.layout)].knobs and c.device_bytes < tight[str(c.layout)].device_bytes
    assert "at least 4.0 GiB of each GPU free (--headroom)" in reason


def test_headroom_past_the_gpu_or_below_zero_is_refused():
    for bad in (-1, 80, float("nan")):
        with pytest.raises(MeshplanError, match=r"^--headroom: .* GiB is not between 0 and the GPU's 79.2 GiB"):
            _ranked(16384, bad)
    out = CliRunner().invoke(app, ["recommend", "--model", "dense-7b", "--cluster", "h100-sxm-8", "--headroom", "-2"])
    assert out.exit_code != 0 and "--headroom" in out.output and "Traceback" not in out.output
