"""Output buffers (docs/ARCHITECTURE.md, "Output buffers"): no backward materializes a zero
gradient for an op's non-differentiable outputs, and large host outputs carry the huge-page
advice. Both fail on a binding without them (the first by the profiler's operator list: a
fill_ of the saved gradient's shape; the second by the mapping's VmFlags)."""

import os
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from kdloss.torch import _backend
from kdloss.torch import functional as F

from conftest import spread

_ZEROS = ("aten::fill_", "aten::zero_", "aten::zeros", "aten::zeros_like")


def _backward_fills(loss):
    """The fills of more than one element a backward ran (loss.backward()'s own seed, the
    one-element ones() of a scalar loss, is not one)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        loss.backward()
    return [(e.key, e.input_shapes) for e in prof.key_averages(group_by_input_shape=True)
            if e.key in _ZEROS and any(s and _numel(s) > 1 for s in e.input_shapes)]


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _cases(g):
    bt, v, h = 6, 64, 8
    zs = spread((bt, v), g).requires_grad_()
    zt = spread((bt, v), g)
    ls = torch.log_softmax(zs.detach(), -1).requires_grad_()
    lt = torch.log_softmax(zt, -1)
    xs = spread((bt, h), g).requires_grad_()
    ws = spread((v, h), g).mul_(0.3).requires_grad_()
    xt, wt = spread((bt, 2 * h), g), spread((v, 2 * h), g).mul_(0.3)
    ids = torch.topk(zt, 4, -1).indices
    lp = torch.gather(lt, -1, ids)
    yield "kl_div", lambda: F.kl_div(ls, lt, reduction="batchmean", log_target=True)
    yield "kl_div none", lambda: F.kl_div(ls, lt, reduction="none", log_target=True).sum()
    yield "jsd", lambda: F.jsd(ls, lt)
    yield "distill_loss", lambda: F.distill_loss(zs, zt)
    yield "distill_loss none", lambda: F.distill_loss(zs, zt, reduction="none").sum()
    yield "topk_distill_loss", lambda: F.topk_distill_loss(zs, ids, lp)
    yield "fused_linear_distill_loss", lambda: F.fused_linear_distill_loss(
        xs, ws, xt, wt, torch.randint(0, v, (bt,), generator=g))
    yield "fused_linear_topk_distill_loss", lambda: F.fused_linear_topk_distill_loss(
        xs, ws, ids, lp)


@pytest.mark.parametrize("name", [n for n, _ in _cases(torch.Generator().manual_seed(0))])
def test_backward_fills_no_zero_gradient(name):
    g = torch.Generator().manual_seed(1234)
    loss = dict(_cases(g))[name]()
    bad = _backward_fills(loss)
    assert not bad, f"{name}: backward ran {bad} (a materialized zero gradient)"


def _vm_flags(addr):
    """VmFlags of the mapping of /proc/self/smaps holding `addr`."""
    cur = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                cur = lo <= addr < hi
            elif cur and line.startswith("VmFlags:"):
                return line.split()[1:]
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux")
                    or not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"),
                    reason="transparent huge pages are a Linux feature")
def test_large_host_output_advised_huge():
    t = _backend.out_empty((1024, 8192), torch.float32, "cpu")  # 32 MiB
    inner = -(-t.data_ptr() // (2 << 20)) * (2 << 20)
    flags = _vm_flags(inner)
    assert flags is not None and "hg" in flags, f"no huge-page advice: VmFlags {flags}"
    small = _backend.out_empty((4, 4), torch.float32, "cpu")
    assert small.shape == (4, 4) and small.is_contiguous()


def test_grad_of_kl_div_is_the_saved_buffer_without_copy():
    g = torch.Generator().manual_seed(7)
    x = torch.log_softmax(spread((512, 2048), g), -1).requires_grad_()
    t = torch.log_softmax(spread((512, 2048), g), -1)
    F.kl_div(x, t, reduction="sum", log_target=True).backward()
    ref = torch.exp(t) * -1.0  # d/dx sum(exp(t) (t - x)) = -exp(t)
    torch.testing.assert_close(x.grad, ref, rtol=1e-6, atol=1e-7)
