"""The command `meshplan execute` and `meshplan calibrate` start (torch's elastic launcher over
meshplan.executor.worker or calibrate_run, each worker given the run's record: runspec.py), and
running it: torch-free, so that the CLI builds and checks it without importing torch.

The workers say how far they are on stdout, one line a finished unit of work (`progress_line`); the
CLI draws them as a progress bar, keeps the steps that finished, and stops the run at its timeout.
A failed run is one line naming the rank that failed first and how (its exit code or signal), read
from the failure report torch's launcher prints."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque

from meshplan.errors import MeshplanError

PROGRESS = "meshplan-progress"


def worker_command(
    module: str,
    spec_path: str,
    nproc: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
) -> list[str]:
    """torchrun's command line: `nproc` workers of `module` (meshplan.executor.worker, or
    meshplan.executor.calibrate_run) on this node (standalone, or node `node_rank` of `nnodes` meeting
    at `rdzv_endpoint`), each given the path of the run's record (meshplan.executor.runspec)."""
    return launcher(nproc, nnodes, node_rank, rdzv_endpoint) + ["-m", module, spec_path]


def launcher(nproc: int, nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None) -> list[str]:
    """torchrun with `nproc` processes on this node: standalone, or one node of `nnodes`."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--nnodes={nnodes}"]
    if nnodes > 1:
        if not rdzv_endpoint:
            raise MeshplanError("--rdzv-endpoint is required with --nnodes > 1 (host:port of node 0)")
        return cmd + [f"--node-rank={node_rank}", f"--rdzv-endpoint={rdzv_endpoint}", "--rdzv-backend=c10d"]
    return cmd + ["--standalone"]


def progress_line(done: int, total: int, what: str, seconds: float | None = None) -> str:
    """What a worker prints when a unit of work has finished: `meshplan-progress 3 9 0.0123 step 1/5`."""
    return f"{PROGRESS} {done} {total} {'-' if seconds is None else f'{seconds:.6g}'} {what}"


_PROGRESS_LINE = re.compile(rf"^{PROGRESS} (\d+) (\d+) (\S+) (.*)$")


def parse_progress(line: str) -> dict | None:
    """A progress line's {done, total, seconds, what}; None for any other line."""
    m = _PROGRESS_LINE.match(line.strip())
    if not m:
        return None
    seconds = None if m.group(3) == "-" else float(m.group(3))
    return {"done": int(m.group(1)), "total": int(m.group(2)), "seconds": seconds, "what": m.group(4)}


def root_cause(output: str) -> dict | None:
    """The failure torch's elastic launcher reports first — {rank, exitcode, signal, traceback} — from its
    report ("Root Cause (first observed failure)", else the first of "Failures"); None without one.
    A rank killed by a signal other than the SIGTERM the launcher sends the others is preferred: the
    others failed because it did."""
    blocks = []
    for m in re.finditer(
        r"^\[\d+\]:\s*$(?P<body>(?:\n[ \t]+\S.*)+)",
        output,
        flags=re.M,
    ):
        body = m.group("body")
        rank = re.search(r"^\s*rank\s*:\s*(\d+)", body, flags=re.M)
        code = re.search(r"^\s*exitcode\s*:\s*(-?\d+)", body, flags=re.M)
        trace = re.search(r"^\s*traceback\s*:\s*(.*)$", body, flags=re.M)
        if not (rank and code):
            continue
        exitcode = int(code.group(1))
        blocks.append(
            {
                "rank": int(rank.group(1)),
                "exitcode": exitcode,
                "signal": _signal_name(-exitcode) if exitcode < 0 else None,
                "traceback": trace.group(1).strip() if trace else "",
                "root": "Root Cause" in output[: m.start()].rsplit("----", 1)[-1],
            }
        )
    if not blocks:
        return None
    killed = [b for b in blocks if b["signal"] not in (None, "SIGTERM")]
    roots = [b for b in blocks if b["root"]]
    return (killed or roots or blocks)[0]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class WorkersFailed(MeshplanError):
    """A run that did not finish: the one line to print, the units of work that had finished (progress
    records, in order) for the run file that records it, and the failure as the launcher reported it."""

    def __init__(self, message: str, finished: list[dict], failure: dict):
        super().__init__(message)
        self.finished, self.failure = finished, failure


def failed_run(exc: WorkersFailed, **run) -> dict:
    """The run file of a run that did not finish: what ran (`run`: model, layout, seq, …), how it failed,
    and the units of work that finished with rank 0's seconds for each, so that the time spent is not
    lost. Its measured part holds the error, which `meshplan compare` refuses in one line."""
    finished = [{"what": r["what"], "seconds": r["seconds"]} for r in exc.finished]
    timed = [  # the timed steps (not the ones timed again without communication)
        r["seconds"]
        for r in exc.finished
        if r["what"].startswith("step ") and "without" not in r["what"] and r["seconds"] is not None
    ]
    return {
        "status": "failed",
        **run,
        "error": str(exc),
        "failure": exc.failure,
        "finished": finished,
        "measured": {"error": str(exc), "step_times_s": timed},
        "predicted": {},
    }


def describe_failure(cause: dict | None, output_lines: list[str], returncode: int) -> str:
    """One line: which rank failed first and how."""
    if cause is None:
        errors = [line for line in output_lines if "Error" in line or "error" in line]
        detail = errors[-1].strip() if errors else "see torchrun's output"
        return f"the launcher failed (exit {returncode}): {detail}"
    if cause["signal"]:
        number = -cause["exitcode"]
        why = {
            "SIGKILL": ": killed from outside the run, or by the host's out-of-memory killer",
            "SIGSEGV": ": a crash in native code",
            "SIGTERM": ": stopped from outside the run",
        }.get(cause["signal"], "")
        return f"rank {cause['rank']} was killed by {cause['signal']} (signal {number}{why})"
    # An exception: its last line as the worker printed it (the error file is often not written).
    errors = [
        line.strip()
        for line in output_lines
        if re.match(r"^\s*(\S*(Error|Exception)\b.*:|error: )", line) and "ChildFailedError" not in line
    ]
    detail = errors[-1] if errors else cause["traceback"] or "see torchrun's output"
    return f"rank {cause['rank']} failed (exit {cause['exitcode']}): {detail}"


def run_workers(cmd: list[str], timeout: float, on_progress=None) -> list[dict]:
    """Run the workers, at most `timeout` seconds; returns the progress records of the units of work
    that finished. Each progress line goes to `on_progress(record)`. A failed rank or a run past its
    timeout (its processes are stopped) is a WorkersFailed naming the rank and how it failed.
    NVLink multicast (NVLS) stays off unless the caller's environment turns it on."""
    env = dict(os.environ, NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0"))
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,  # its own process group: a timeout stops the launcher and every worker
    )
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        return _follow(proc, lines, timeout, on_progress)
    except BaseException:
        _stop(proc, grace_s=5.0)  # Ctrl-C or a bug here: the run's own session would outlive the CLI
        raise


def _follow(proc: subprocess.Popen, lines: queue.Queue, timeout: float, on_progress) -> list[dict]:
    """run_workers' loop: progress lines to `on_progress`, the rest kept for the failure report."""
    finished: list[dict] = []
    tail: deque = deque(maxlen=400)
    deadline = time.monotonic() + timeout
    eof = False
    while not eof:
        try:
            line = lines.get(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
        except queue.Empty:
            line = ""
        if line is None:
            eof = True
        elif line:
            record = parse_progress(line)
            if record is None:
                tail.append(line.rstrip("\n"))
            else:
                finished.append(record)
                if on_progress is not None:
                    on_progress(record)
        if not eof and time.monotonic() > deadline:
            _stop(proc)
            raise WorkersFailed(
                f"the run did not finish in {timeout:g} s (--timeout) and was stopped after "
                f"{_steps_done(finished)}; raise --timeout for a longer run",
                finished,
                {"timed_out": True},
            )
    try:
        returncode = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _stop(proc)
        raise WorkersFailed(
            f"the run did not finish in {timeout:g} s (--timeout) and was stopped; raise --timeout for a longer run",
            finished,
            {"timed_out": True},
        ) from None
    if returncode != 0:
        output = "\n".join(tail)
        cause = root_cause(output)
        raise WorkersFailed(
            describe_failure(cause, list(tail), returncode) + f", after {_steps_done(finished)}",
            finished,
            cause or {"exitcode": returncode},
        )
    return finished


def _steps_done(finished: list[dict]) -> str:
    """'203 steps (step 201/100000 the last to finish)', or a calibration's '7 of 12 measurements (…)'."""
    if not finished:
        return "nothing had finished"
    last = f"({finished[-1]['what']} the last to finish)"
    steps = [r for r in finished if r["what"].startswith(("step ", "warm-up step "))]
    if steps:
        return f"{len(steps)} step{'s' if len(steps) != 1 else ''} {last}"
    return f"{len(finished)} of {finished[-1]['total']} measurements {last}"


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to the run's process group (the launcher passes it on), then SIGKILL after `grace_s`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
