"""The one-pass Adam kernel (meshplan.kernels.adam; interpreted without a GPU: tests/conftest.py) against
the plain-torch reference MixedAdam runs off the GPU, over several steps; its bf16 rounding against
torch's; and MixedAdam's and ZeroAdam's steps through it against their torch path."""

import pytest
import torch

from meshplan.executor import optim
from meshplan.executor.optim import MixedAdam
from meshplan.kernels.adam import adam_step, fits
from meshplan.kernels.reference import adam_step_ref

HYPER = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8)  # a large lr: each step moves w far past the tolerance


def _states(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen), torch.zeros(n), torch.zeros(n), gen


def _close(mine, ref):
    """Equal to fp32 rounding: the kernel and torch's ops round, fuse and order m, v and w's updates alike
    up to an ulp or two of their terms a step — of the tensor's largest, where a sum cancels (m's
    b1·m + (1 − b1)·g near zero)."""
    ulp = torch.finfo(torch.float32).eps * ref.abs().max().item()
    torch.testing.assert_close(mine, ref, rtol=4e-6, atol=4 * ulp)


@pytest.mark.parametrize("n", [1, 7, 1024, 3001])
@pytest.mark.parametrize("grad_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_kernel_matches_the_torch_reference_over_steps(n, grad_dtype, out_dtype):
    w, m, v, gen = _states(n, seed=n)
    ref = [t.clone() for t in (w, m, v)]
    out = torch.full((n,), float("nan"), dtype=out_dtype)
    ref_out = out.clone()
    for step in range(1, 5):
        grad = (torch.randn(n, generator=gen) * 10 ** (step - 2)).to(grad_dtype)  # magnitudes 0.1 to 100
        adam_step(w, m, v, grad, out, step=step, **HYPER)
        adam_step_ref(*ref, grad, ref_out, step=step, **HYPER)
        for mine, theirs in zip((w, m, v), ref):
            _close(mine, theirs)
        assert torch.equal(out, w.to(out_dtype))  # the weight written is the master's, rounded as torch does
    assert torch.all(w != _states(n, seed=n)[0])  # every element stepped


def test_kernel_leaves_memory_past_the_parameter_alone():
    """The last program's elements past n are masked: tensors cut from longer buffers keep their tails."""
    n, spare = 1500, 700
    bufs = [torch.full((n + spare,), 7.0) for _ in range(3)]
    out_buf = torch.full((n + spare,), 7.0, dtype=torch.bfloat16)
    grad = torch.randn(n).to(torch.bfloat16)
    adam_step(*(b[:n] for b in bufs), grad, out_buf[:n], step=1, **HYPER)
    for b in [*bufs, out_buf]:
        assert torch.all(b[n:] == 7.0)
    assert torch.all(bufs[1][:n] != 7.0)


def test_bf16_rounding_is_torchs_ties_to_even():
    """With lr 0 and a zero gradient the step writes w unchanged, rounded to bf16: ties go to the even
    neighbour, overflow to inf, NaN stays NaN — bit for bit torch's fp32 → bf16 copy."""
    ulp = 2.0**-7  # of bf16 in [1, 2)
    w = torch.tensor(
        [1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), 1 + ulp / 2 + 2**-20, 3.0e38, 3.4028235e38, -3.4028235e38]
        + [float("inf"), float("-inf"), 1e-40, -0.0, 0.0, 123.456, float("nan")]
    )
    out = torch.empty(w.numel(), dtype=torch.bfloat16)
    adam_step(
        w,
        torch.zeros_like(w),
        torch.zeros_like(w),
        torch.zeros_like(w),
        out,
        lr=0.0,
        betas=(0.9, 0.95),
        eps=1e-8,
        step=1,
    )
    want = w.to(torch.bfloat16)
    assert torch.equal(out.view(torch.int16)[:-1], want.view(torch.int16)[:-1])
    assert out[-1].isnan()


def test_rejects_what_it_cannot_take():
    w = torch.zeros(8)
    assert fits(w, w.clone(), w.clone(), torch.zeros(8, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16))
    assert not fits(w, w.clone(), w.clone(), torch.zeros(9), torch.zeros(8))  # lengths differ
    assert not fits(w, w.clone(), w.clone(), torch.zeros(4, 4).t(), torch.zeros(16))  # not contiguous
    with pytest.raises(ValueError, match="fp32"):
        adam_step(w.double(), w, w, w, w, step=1, **HYPER)


def _params(seed):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(33, 17), (5,), (4, 3, 7)]
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(torch.bfloat16)) for s in shapes], gen


def test_mixed_adam_through_the_kernel_equals_its_torch_path(monkeypatch):
    """MixedAdam as it steps on a GPU (the kernel, writing each parameter in place) against its CPU path
    (the reference's torch ops), three steps of bf16 weights and gradients."""
    kernel_params, gen = _params(0)
    torch_params = [torch.nn.Parameter(p.detach().clone()) for p in kernel_params]
    kernel_opt, torch_opt = MixedAdam(kernel_params, lr=1e-2), MixedAdam(torch_params, lr=1e-2)
    for _ in range(3):
        for a, b in zip(kernel_params, torch_params):
            a.grad = torch.randn(a.shape, generator=gen).to(torch.bfloat16)
            b.grad = a.grad.clone()
        with monkeypatch.context() as patch:
            patch.setattr(optim, "_use_kernel", lambda *t: fits(*t))
            kernel_opt.step()
        torch_opt.step()
        for mine, theirs in zip(kernel_opt.master, torch_opt.master):
            _close(mine, theirs)
        for p, w in zip(kernel_params, kernel_opt.master):
            assert torch.equal(p.detach(), w.to(torch.bfloat16))


def test_scalars_read_from_the_device_step_as_the_arguments_do(monkeypatch):
    """A captured step (executor.graphs) reads its bias corrections from a device tensor that `advance`
    fills before each replay: MixedAdam so, its `apply` repeated with nothing on the host changed but
    `advance`, steps bit for bit as MixedAdam with the corrections passed as arguments."""
    a_params, gen = _params(2)
    b_params = [torch.nn.Parameter(p.detach().clone()) for p in a_params]
    a_opt, b_opt = MixedAdam(a_params, lr=1e-2), MixedAdam(b_params, lr=1e-2)
    with monkeypatch.context() as patch:
        patch.setattr(optim, "_use_kernel", lambda *t: fits(*t))
        assert a_opt.on_device_scalars() is None
        for _ in range(3):
            for a, b in zip(a_params, b_params):
                a.grad = torch.randn(a.shape, generator=gen).to(torch.bfloat16)
                b.grad = a.grad.clone()
            a_opt.advance()
            assert a_opt.scalars.tolist() == [
                pytest.approx(v, rel=1e-7) for v in (1e-2 / (1 - 0.9**a_opt.t), (1 - 0.95**a_opt.t) ** 0.5)
            ]
            a_opt.apply()
            b_opt.step()
            for mine, theirs in zip(a_opt.master + a_opt.m + a_opt.v, b_opt.master + b_opt.m + b_opt.v):
                assert torch.equal(mine, theirs)


def test_off_the_kernel_the_optimizer_says_why_it_cannot_be_captured():
    """On the CPU (torch's AdamW path, handed the step count on the host) no step is captured."""
    opt = MixedAdam(_params(3)[0])
    reason = opt.on_device_scalars()
    assert reason is not None and reason.startswith("optimizer: ") and "torch's AdamW" in reason
    assert opt.scalars is None


def test_mixed_adam_cpu_step_is_the_torch_arithmetic():
    """Off the GPU MixedAdam steps as it did before the kernel (the arithmetic written out here): the
    gradient cast to fp32, m and v's updates, the bias-corrected step, the bf16 copy back — bit for bit."""
    params, gen = _params(1)
    opt = MixedAdam(params, lr=1e-2)
    masters = [p.detach().float().clone() for p in params]
    ms, vs = [torch.zeros_like(w) for w in masters], [torch.zeros_like(w) for w in masters]
    b1, b2 = opt.betas
    for t in range(1, 4):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(torch.bfloat16)
        for p, w, m, v in zip(params, masters, ms, vs):
            g = p.grad.float()
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            w.addcdiv_(m, v.sqrt().div_((1 - b2**t) ** 0.5).add_(opt.eps), value=-opt.lr / (1 - b1**t))
        opt.step()
        for p, w, mine in zip(params, masters, opt.master):
            assert torch.equal(mine, w)
            assert torch.equal(p.detach(), w.to(torch.bfloat16))


class _OneRankOfTwo:
    """GradientSync as ZeroAdam sees it on rank `rank` of a 2-rank gradient group whose gathers do not
    move data (Mesh.enabled False: each rank's all-gather lands only its own slice): the summed
    gradients' shards given."""

    def __init__(self, rank, grads):
        from types import SimpleNamespace

        self.rank, self.grads, self.weights = rank, grads, None
        axis = SimpleNamespace(rank=rank, size=2)
        self.mesh = SimpleNamespace(enabled=False, axis=lambda name: axis, record=lambda *a: None)

    def group_of(self, p):
        return "dp", 2, self.rank

    def shard(self, p):
        return self.grads[id(p)]

    def clear(self):
        pass


@pytest.mark.parametrize("rank", [0, 1])
def test_zero_adam_writes_its_slice_in_place_through_the_kernel(monkeypatch, rank):
    """ZeroAdam on one rank of two, stepping through the kernel: its half of each weight (padded where the
    size is odd) lands in the weight's memory as MixedAdam's step over the whole weight puts it there."""
    from meshplan.executor.comm import shard_of
    from meshplan.executor.optim import ZeroAdam

    params, gen = _params(2)  # 561, 5 and 84 elements: two of them padded to a multiple of 2
    whole = [torch.nn.Parameter(p.detach().clone()) for p in params]
    grads = [torch.randn(p.shape, generator=gen).to(torch.bfloat16) for p in params]
    sync = _OneRankOfTwo(rank, {id(p): shard_of(g, 2, rank).clone() for p, g in zip(params, grads)})
    zero, ref = ZeroAdam(params, sync, lr=1e-2), MixedAdam(whole, lr=1e-2)
    memory = [p.data_ptr() for p in params]
    for p, g in zip(whole, grads):
        p.grad = g
    with monkeypatch.context() as patch:
        patch.setattr(optim, "_use_kernel", lambda *t: fits(*t))
        zero.step()
    ref.step()
    for p, q, ptr in zip(params, whole, memory):
        s = -(-p.numel() // 2)
        mine, theirs = p.detach().view(-1)[rank * s : (rank + 1) * s], q.detach().view(-1)[rank * s : (rank + 1) * s]
        assert p.data_ptr() == ptr
        assert (mine.float() - theirs.float()).abs().max() <= 2**-6 * theirs.float().abs().max()  # a bf16 ulp
    for w, full in zip(zero.master, ref.master):
        _close(w[: shard_of(full, 2, rank).numel()], shard_of(full, 2, rank))
