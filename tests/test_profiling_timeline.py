"""The profiled step's timeline (meshplan/executor/profiling.py timeline): hand-drawn intervals."""

from meshplan.executor.profiling import timeline


def test_timeline_by_hand():
    # compute 0-10 and 12-20 (two streams overlap 15-18), communication 8-14 and 25-30:
    # span 0-30, busy 0-20 and 25-30 = 25, idle 5; communication 11 µs, of which 8-10 and 12-14 beside
    # compute (4), exposed 7.
    compute = [(0, 10), (12, 20), (15, 18)]
    comm = [(8, 14), (25, 30)]
    t = timeline(compute, comm)
    assert t == {"span": 30, "busy": 25, "idle": 5, "comm_exposed": 7, "comm_hidden": 4}


def test_timeline_empty_and_disjoint():
    assert timeline([], [])["span"] == 0.0
    t = timeline([(0, 4)], [(4, 6)])  # back to back: nothing hidden, nothing idle
    assert (t["idle"], t["comm_hidden"], t["comm_exposed"]) == (0, 0, 2)
