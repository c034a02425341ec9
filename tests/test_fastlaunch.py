"""FastLaunch: compile once per specialization (without launching), then launch through the compiled
runner with every argument in declaration order (compile-time ones included) — checked against a
stand-in for a Triton kernel."""

import pytest
import torch

from meshplan.kernels.fastlaunch import FastLaunch


class _Compiled:
    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("runner", grid, args))


class _Kernel:
    arg_names = ["x_ptr", "n", "BLOCK", "FLAG"]

    def __init__(self):
        self.log = []

    def warmup(self, *args, grid, **meta):
        self.log.append(("compile", grid, args, meta))
        return _Compiled(self.log)

    def __getitem__(self, grid):
        return lambda *args, **meta: self.log.append(("jit", grid, args, meta))


@pytest.fixture
def compiled_mode(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")


def test_first_call_compiles_then_runner_takes_all_arguments_in_order(compiled_mode):
    k = _Kernel()
    fast = FastLaunch(k)
    x = torch.zeros(64)
    fast((4,), x, 100, BLOCK=32, FLAG=True, num_warps=4)
    fast((4,), x, 100, BLOCK=32, FLAG=True, num_warps=4)
    assert [e[0] for e in k.log] == ["compile", "runner", "runner"]
    assert k.log[0][3] == {"BLOCK": 32, "FLAG": True, "num_warps": 4}
    assert k.log[1][1] == (4, 1, 1)  # the grid padded to three axes
    assert k.log[1][2] == (x, 100, 32, True)


def test_a_new_specialization_compiles_again(compiled_mode):
    k = _Kernel()
    fast = FastLaunch(k)
    x = torch.zeros(64)
    fast((4,), x, 100, BLOCK=32, FLAG=True)
    fast((4,), x, 101, BLOCK=32, FLAG=True)  # another integer value
    fast((4,), x[1:], 100, BLOCK=32, FLAG=True)  # a pointer off the 16-byte alignment
    fast((4,), x.double(), 100, BLOCK=32, FLAG=True)  # another dtype
    fast((8,), x, 100, BLOCK=32, FLAG=True)  # another grid
    fast((4,), x, 100, BLOCK=64, FLAG=True)  # another compile-time argument
    assert [e[0] for e in k.log] == ["compile", "runner"] * 6


def test_an_unkeyed_counter_reuses_the_launcher(compiled_mode):
    k = _Kernel()
    fast = FastLaunch(k, unkeyed=("n",))
    x = torch.zeros(64)
    for epoch in (1, 2, 16):
        fast((4,), x, epoch, BLOCK=32, FLAG=True)
    assert [e[0] for e in k.log] == ["compile", "runner", "runner", "runner"]
    assert [e[2][1] for e in k.log[1:]] == [1, 2, 16]


def test_bind_launches_nothing_until_called(compiled_mode):
    k = _Kernel()
    launch = FastLaunch(k).bind((2, 3), torch.zeros(8), 8, BLOCK=8, FLAG=False)
    assert [e[0] for e in k.log] == ["compile"]
    launch(torch.ones(8), 8)
    assert k.log[-1][0] == "runner" and k.log[-1][1] == (2, 3, 1)


def test_interpreter_goes_through_the_jit(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    k = _Kernel()
    fast = FastLaunch(k)
    for _ in range(3):
        fast((2,), torch.zeros(8), 8, BLOCK=8, FLAG=False)
    assert [e[0] for e in k.log] == ["jit"] * 3
