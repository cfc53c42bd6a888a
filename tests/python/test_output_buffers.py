"""Output buffers (docs/ARCHITECTURE.md, "Output buffers"): no backward materializes a zero
gradient for an op's non-differentiable outputs, and large host outputs reuse free pooled
memory, never memory something still references. The first fails on a binding without it (the
profiler's operator list shows a fill_ of the saved gradient's shape)."""

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


def _mib(n):
    return (n << 20) // 4  # float32 elements in n MiB


def test_free_output_storage_is_reused_and_live_one_never():
    _backend.release_output_buffers()
    a = _backend.out_empty((4, _mib(8) // 4), torch.float32, "cpu")
    pa = a.data_ptr()
    view = a[1:]  # a view keeps the storage referenced
    del a
    b = _backend.out_empty((4, _mib(8) // 4), torch.float32, "cpu")
    assert b.data_ptr() != pa, "an output aliased a live view's storage"
    del view
    c = _backend.out_empty((_mib(8),), torch.float32, "cpu")  # same bytes, other shape
    assert c.data_ptr() == pa and c.shape == (_mib(8),) and c.is_contiguous()
    small = _backend.out_empty((4, 4), torch.float32, "cpu")
    assert small.shape == (4, 4) and small.is_contiguous()
    del b, c
    _backend.release_output_buffers()
    assert not [s for s in _backend._POOL._slots if _backend._POOL._free(s)]


def test_pool_is_bounded_and_threads_get_distinct_storages():
    import threading
    _backend.release_output_buffers()
    got, lock = [], threading.Lock()

    def grab():
        t = _backend.out_empty((_mib(4),), torch.float32, "cpu")
        with lock:
            got.append(t)
    ths = [threading.Thread(target=grab) for _ in range(12)]
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show
    for t in ths:
        t.start()
    try:
        for t in ths:
            t.join()
    finally:
        sys.setswitchinterval(0.005)
    assert len({t.data_ptr() for t in got}) == 12  # all alive: no two share memory
    assert len(_backend._POOL._slots) <= _backend._OutputPool.SLOTS
    del got
    _backend.release_output_buffers()


def test_held_gradients_survive_later_calls():
    """A leaf's .grad from one step (the pool's storage) is never reused while it is held: the
    next steps' gradients land elsewhere and the held values stay as they were."""
    g = torch.Generator().manual_seed(11)
    held = []
    for _ in range(3):
        x = torch.log_softmax(spread((512, 4096), g), -1).requires_grad_()
        t = torch.log_softmax(spread((512, 4096), g), -1)
        F.kl_div(x, t, reduction="sum", log_target=True).backward()
        held.append((x.grad, -torch.exp(t)))
    assert len({gr.data_ptr() for gr, _ in held}) == 3
    for gr, ref in held:
        torch.testing.assert_close(gr, ref, rtol=1e-6, atol=1e-7)


def test_grad_of_kl_div_is_the_saved_buffer_without_copy():
    g = torch.Generator().manual_seed(7)
    x = torch.log_softmax(spread((512, 2048), g), -1).requires_grad_()
    t = torch.log_softmax(spread((512, 2048), g), -1)
    F.kl_div(x, t, reduction="sum", log_target=True).backward()
    ref = torch.exp(t) * -1.0  # d/dx sum(exp(t) (t - x)) = -exp(t)
    torch.testing.assert_close(x.grad, ref, rtol=1e-6, atol=1e-7)
