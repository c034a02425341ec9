"""fastlaunch.bind: compile once (without launching), then launch through the compiled runner with
every argument in declaration order (compile-time ones included, defaults filled in) — checked
against a stand-in for a Triton kernel."""

import inspect

import pytest
import torch

from meshplan.kernels.fastlaunch import bind


class _Compiled:
    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("runner", grid, args))


class _Param:
    def __init__(self, name, default=inspect._empty):
        self.name, self.default = name, default


class _Kernel:
    arg_names = ["x_ptr", "n", "BLOCK", "FLAG"]
    params = [_Param("x_ptr"), _Param("n"), _Param("BLOCK"), _Param("FLAG", default=False)]

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


def test_bind_compiles_once_and_launches_nothing_until_called(compiled_mode):
    k = _Kernel()
    launch = bind(k, (2, 3), torch.zeros(8), 8, BLOCK=8, FLAG=True, num_warps=4)
    assert [e[0] for e in k.log] == ["compile"]
    assert k.log[0][3] == {"BLOCK": 8, "FLAG": True, "num_warps": 4}
    x = torch.ones(8)
    launch(x, 8)
    launch(x, 9)  # an integer the caller knows is not specialized on (a counter)
    assert [e[0] for e in k.log] == ["compile", "runner", "runner"]
    assert k.log[1][1] == (2, 3, 1)  # the grid padded to three axes
    assert k.log[1][2] == (x, 8, 8, True) and k.log[2][2] == (x, 9, 8, True)


def test_bound_runner_fills_compile_time_defaults(compiled_mode):
    k = _Kernel()
    bind(k, (4,), torch.zeros(8), 8, BLOCK=32)(torch.zeros(8), 8)
    assert k.log[-1][2][2:] == (32, False)


def test_interpreter_goes_through_the_jit(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    k = _Kernel()
    launch = bind(k, (2,), torch.zeros(8), 8, BLOCK=8, FLAG=False)
    for _ in range(3):
        launch(torch.zeros(8), 8)
    assert [e[0] for e in k.log] == ["jit"] * 3
