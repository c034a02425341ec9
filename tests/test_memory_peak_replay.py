"""benchmarks/memory_peak.py's replay of an allocator trace: the peak, and what is live at it by site."""

from benchmark_scripts import load

memory_peak = load("memory_peak")


def _alloc(addr, size, line, file="/x/meshplan/executor/a.py"):
    return {"action": "alloc", "addr": addr, "size": size, "frames": [{"filename": file, "line": line, "name": "f"}]}


def _free(addr):
    return {"action": "free_completed", "addr": addr}


def test_peak_and_live_blocks_by_site():
    trace = [_alloc(1, 10, 1), _alloc(2, 5, 2), _free(1), _alloc(3, 7, 3), _alloc(4, 4, 1), _free(3), _alloc(5, 1, 9)]
    peak, by_site, site = memory_peak.live_at_peak(trace)
    assert peak == 16  # 5 + 7 + 4 passes the earlier 10 + 5
    assert by_site == {"executor/a.py:3 f": 7, "executor/a.py:2 f": 5, "executor/a.py:1 f": 4}
    assert site == "executor/a.py:1 f"  # the allocation that reached the peak


def test_site_is_the_innermost_meshplan_frame_else_python():
    frames = [
        {"filename": "/usr/lib/torch/nn/functional.py", "line": 5, "name": "linear"},
        {"filename": "/repo/meshplan/kernels/ssd.py", "line": 40, "name": "chunk_states"},
    ]
    assert memory_peak._site(frames) == "kernels/ssd.py:40 chunk_states"
    assert memory_peak._site(frames[:1]) == "functional.py:5 linear"
    assert memory_peak._site([]) == "(no Python frame)"
