"""Host synchronizations of the CUDA path, counted without a GPU.

CudaBackend runs here over a fake C layer (every kdloss_cuda_* call returns OK and writes
nothing; the other C functions are the real ones) on host tensors, registered as the backend of
the CPU device, with _backend.is_host answering False: the binding then takes every decision it
takes for device memory. Every read of a tensor's value on the host (Tensor.item, float(), int(),
bool(), tolist(), numpy()) is counted: on a GPU each is a stream synchronization. Targets
(docs/ARCHITECTURE.md, "Host synchronizations"): 0 a call for kl_div, jsd and distill_loss without
labels, at most 1 a fused call (the status word, when labels or ids are given), 0 in backward.
"""

import ctypes

import pytest
import torch

from kdloss import _lib
from kdloss.torch import _backend, set_cuda_status_check
from kdloss.torch import functional as F

from conftest import cpu_backend

_READS = ("item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__")


class Reads:
    """Counts host reads of tensor values while `counting`."""

    def __init__(self):
        self.n = 0
        self.counting = False


def _fake_fn(real):
    def fn(name):
        if not name.startswith("kdloss_cuda_"):
            return real(name)

        def call(*args):
            if name.endswith("_workspace_size"):
                args[-1]._obj.value = 64
            return 0
        return call
    return fn


@pytest.fixture
def reads(monkeypatch):
    r = Reads()
    for attr in _READS:
        orig = getattr(torch.Tensor, attr)

        def counted(self, *a, _orig=orig, **k):
            if r.counting:
                r.n += 1
            return _orig(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, attr, counted)
    monkeypatch.setattr(_lib, "fn", _fake_fn(_lib.fn))
    be = _backend.CudaBackend()
    monkeypatch.setattr(be, "_ctx", lambda device: (ctypes.c_void_p(0x1234), 0))
    monkeypatch.setattr(be, "_stream", staticmethod(lambda index: ctypes.c_void_p(None)))
    monkeypatch.setattr(be, "_workspace",
                        staticmethod(lambda n, device: (torch.zeros(n, dtype=torch.uint8), n)))
    monkeypatch.setattr(_backend, "is_host", lambda t: False)
    with cpu_backend(be):
        yield r


def _count(reads, loss_fn):
    """(host reads in forward, host reads in backward) of loss_fn()."""
    reads.n, reads.counting = 0, True
    try:
        out = loss_fn()
        loss = out[0] if isinstance(out, tuple) else out
        forward, reads.n = reads.n, 0
        loss.sum().backward()
        return forward, reads.n
    finally:
        reads.counting = False


def _logits(gen, *shape):
    return (torch.randn(*shape, generator=gen) * 3).requires_grad_()


@pytest.mark.parametrize("reduction", ["mean", "sum", "batchmean", "none"])
def test_kl_div_reads_nothing(reads, gen, reduction):
    x = _logits(gen, 6, 11)
    t = torch.softmax(torch.randn(6, 11, generator=gen), -1)
    assert _count(reads, lambda: F.kl_div(torch.log_softmax(x, -1), t,
                                          reduction=reduction)) == (0, 0)


def test_jsd_reads_nothing_without_labels(reads, gen):
    x = _logits(gen, 6, 11)
    y = torch.log_softmax(torch.randn(6, 11, generator=gen), -1)
    assert _count(reads, lambda: F.jsd(torch.log_softmax(x, -1), y, beta=0.3)) == (0, 0)
    labels = torch.randint(0, 11, (6,), generator=gen)
    assert _count(reads, lambda: F.jsd(torch.log_softmax(x, -1), y, labels)) == (1, 0)


@pytest.mark.parametrize("divergence", ["forward_kl", "jsd", "skew_reverse_kl"])
@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean", "none"])
def test_distill_reads_nothing_without_labels(reads, gen, divergence, reduction):
    zs, zt = _logits(gen, 2, 3, 11), torch.randn(2, 3, 11, generator=gen)
    assert _count(reads, lambda: F.distill_loss(zs, zt, divergence=divergence,
                                                reduction=reduction, temperature=2.0)) == (0, 0)


def _fused_inputs(gen, bias=False):
    xs, ws = _logits(gen, 5, 4), _logits(gen, 9, 4)
    xt, wt = torch.randn(5, 6, generator=gen), torch.randn(9, 6, generator=gen)
    bs = _logits(gen, 9) if bias else None
    return xs, ws, xt, wt, bs


def test_fused_reads_at_most_the_status_word(reads, gen):
    xs, ws, xt, wt, bs = _fused_inputs(gen, bias=True)
    labels = torch.randint(0, 9, (5,), generator=gen)
    # without labels the status word cannot report anything: not read
    assert _count(reads, lambda: F.fused_linear_jsd(xs, ws, xt, wt)) == (0, 0)
    assert _count(reads, lambda: F.fused_linear_distill_loss(
        xs, ws, xt, wt, None, bs, weight_hard_loss=0.0, divergence="reverse_kl")) == (0, 0)
    # with labels: the one read of the status word
    assert _count(reads, lambda: F.fused_linear_jsd_loss(xs, ws, xt, wt, labels, bs)) == (1, 0)
    assert _count(reads, lambda: F.fused_linear_distill_loss(
        xs, ws, xt, wt, labels, return_soft_hard_loss=True)) == (1, 0)
    set_cuda_status_check(False)
    try:
        assert _count(reads, lambda: F.fused_linear_jsd_loss(xs, ws, xt, wt, labels)) == (0, 0)
    finally:
        set_cuda_status_check(True)


def test_fused_topk_reads_at_most_the_status_word(reads, gen):
    xs, ws, _, _, _ = _fused_inputs(gen)
    ids = torch.stack([torch.randperm(9, generator=gen)[:3] for _ in range(5)])
    lps = torch.log_softmax(torch.randn(5, 9, generator=gen), -1).gather(-1, ids)
    # the teacher's ids are device memory: the status word can report a bad one, read once
    assert _count(reads, lambda: F.fused_linear_topk_distill_loss(xs, ws, ids, lps)) == (1, 0)


def test_the_count_can_fail(reads, gen):
    # a planted read in backward is counted, so the zeros above mean something
    x = _logits(gen, 4, 5)
    y = torch.log_softmax(torch.randn(4, 5, generator=gen), -1)

    def planted():
        loss = F.jsd(torch.log_softmax(x, -1), y)
        return loss * (1.0 + 0.0 * float(y.sum()))
    assert _count(reads, planted) == (1, 0)
    monkey = _backend.is_host
    assert monkey(torch.zeros(1)) is False  # the device decisions are the ones exercised
