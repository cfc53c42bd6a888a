"""A fused loss declared once (modules.declare_fused with a _calls.FusedSpec): its custom op,
functional form, module and backend call all come from the one record. Two throwaway losses
are declared here over existing C entry points, a dense-teacher one (forward KL only, through
kdloss_fused_linear_distill) and a top-k one (reverse KL, kdloss_fused_linear_topk_distill), and
must give the hand-written losses' bits, under autograd, FakeTensor and torch.compile."""

import ctypes

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kdloss
from kdloss import _lib
from kdloss.torch import functional as F
from kdloss.torch import modules
from kdloss.torch._calls import FusedSpec

from conftest import cpu_backend


def _dense_params(temperature, weight_hard_loss, weight_soft_loss, ignore_index, chunk_size,
                  memory_budget):
    return _lib.fld_params(_lib.div_params("forward_kl", 0.5, 0.1), temperature,
                           weight_hard_loss, weight_soft_loss, ignore_index, chunk_size, False,
                           memory_budget)


def _topk_params(temperature, weight_hard_loss, ignore_index, chunk_size, memory_budget):
    return _lib.fltk_params(_lib.div_params("reverse_kl", 0.5, 0.1), _lib.topk_tail("bucket"),
                            temperature, weight_hard_loss, 1.0, ignore_index, chunk_size,
                            False, memory_budget)


FKL, FklLoss = modules.declare_fused(FusedSpec(
    name="spec_probe_fkl", c_name="kdloss_fused_linear_distill", teacher="dense",
    params=_dense_params, scalars=(("temperature", 1.0), ("weight_hard_loss", 0.5),
                                   ("weight_soft_loss", 0.5)),
    doc="forward KL + CE on the fused heads (a test's throwaway)"), "SpecProbeFklLoss")
RKL, RklLoss = modules.declare_fused(FusedSpec(
    name="spec_probe_topk_rkl", c_name="kdloss_fused_linear_topk_distill", teacher="topk",
    params=_topk_params, scalars=(("temperature", 1.0), ("weight_hard_loss", 0.0))),
    "SpecProbeTopkRklLoss")


def _dense(gen, dt=torch.float32):
    xs = torch.randn(7, 5, generator=gen).to(dt).requires_grad_()
    ws = torch.randn(11, 5, generator=gen).to(dt).requires_grad_()
    bs = torch.randn(11, generator=gen).to(dt).requires_grad_()
    xt, wt = torch.randn(7, 6, generator=gen).to(dt), torch.randn(13, 6, generator=gen).to(dt)
    labels = torch.randint(0, 11, (7,), generator=gen)
    labels[2] = -100
    return xs, ws, bs, xt, wt, labels


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_dense_spec_is_the_hand_written_loss(gen, dt):
    xs, ws, bs, xt, wt, labels = _dense(gen, dt)
    kw = dict(temperature=2.0, weight_hard_loss=0.3, weight_soft_loss=0.7, chunk_size=3)
    for labels_ in (labels, None):
        kwl = dict(kw, weight_hard_loss=0.0) if labels_ is None else kw
        got = FKL(xs, ws, xt, wt, labels_, bs, return_soft_hard_loss=True, **kwl)
        g_got = torch.autograd.grad(got[0] * 1.5, (xs, ws, bs))
        ref = F.fused_linear_distill_loss(xs, ws, xt, wt, labels_, bs, divergence="forward_kl",
                                          return_soft_hard_loss=True, **kwl)
        g_ref = torch.autograd.grad(ref[0] * 1.5, (xs, ws, bs))
        for a, b in zip(got + g_got, ref + g_ref):
            _same(a, b)
    mod = FklLoss(temperature=2.0, weight_hard_loss=0.3, weight_soft_loss=0.7, chunk_size=3)
    assert "temperature=2.0" in repr(mod)
    _same(mod(xs, ws, xt, wt, labels, bs, num_items_in_batch=9),
          F.fused_linear_distill_loss(xs, ws, xt, wt, labels, bs, divergence="forward_kl",
                                      num_items_in_batch=9, **kw))
    assert F.spec_probe_fkl_loss is FKL and modules.SpecProbeFklLoss is FklLoss


def test_topk_spec_is_the_hand_written_loss(gen):
    xs, ws, bs, _, _, labels = _dense(gen)
    ids = torch.stack([torch.randperm(11, generator=gen)[:4] for _ in range(7)])
    lps = torch.log_softmax(torch.randn(7, 11, generator=gen), -1).gather(-1, ids)
    got = RKL(xs, ws, ids, lps, None, bs, temperature=1.5)
    ref = F.fused_linear_topk_distill_loss(xs, ws, ids, lps, None, bs, divergence="reverse_kl",
                                           temperature=1.5)
    _same(got, ref)
    for a, b in zip(torch.autograd.grad(got, (xs, ws, bs)),
                    torch.autograd.grad(ref, (xs, ws, bs))):
        _same(a, b)
    got = RklLoss(weight_hard_loss=0.5)(xs, ws, ids, lps, labels)
    _same(got, F.fused_linear_topk_distill_loss(xs, ws, ids, lps, labels, divergence="reverse_kl",
                                                weight_hard_loss=0.5))


def test_spec_errors_are_the_library_s(gen):
    xs, ws, bs, xt, wt, labels = _dense(gen)
    with pytest.raises(kdloss.KdlossError, match="true_labels|label|weight_hard"):
        FKL(xs, ws, xt, wt, labels * 0 + 99)  # a label out of range: the C call's check
    with pytest.raises(kdloss.KdlossError, match="different token counts"):
        FKL(xs, ws, xt[:3], wt, None, weight_hard_loss=0.0)
    with pytest.raises(kdloss.KdlossError, match="num_items_in_batch"):
        FKL(xs, ws, xt, wt, labels, num_items_in_batch=0)
    with pytest.raises(TypeError, match="unexpected keyword"):
        FklLoss(beta=0.2)


def test_spec_op_under_fake_tensors_and_compile(gen):
    xs, ws, bs, xt, wt, labels = _dense(gen)
    real = (xs.detach(), ws.detach(), xt, wt)
    with FakeTensorMode() as mode:
        fx, fw, fxt, fwt = (mode.from_tensor(t) for t in real)
        out = torch.ops.kdloss.spec_probe_fkl(fx, fw, fxt, fwt, None, None, None, 1.0, 0.0,
                                              1.0, -100, 0, 0, True, False, False, 0)
        assert out[0].shape == () and out[3].shape == fx.shape and out[4].shape == (0,)
    fn = torch.compile(lambda x, w: FKL(x, w, xt, wt, labels), backend="aot_eager",
                       fullgraph=True)
    got = fn(xs, ws)
    ref = FKL(xs, ws, xt, wt, labels)
    _same(got, ref)
    for a, b in zip(torch.autograd.grad(got, (xs, ws)), torch.autograd.grad(ref, (xs, ws))):
        _same(a, b)


def test_spec_calls_are_well_formed_on_cuda(monkeypatch, gen):
    # without a GPU: the CUDA backend under a fake C layer that checks each call against its
    # prototype (test_package's), host tensors routed to it
    from test_package import _fake_cuda_layer
    calls = []
    be = _fake_cuda_layer(monkeypatch, calls)
    monkeypatch.setattr(be, "_ctx", lambda device: (ctypes.c_void_p(0x1234), 0))
    with cpu_backend(be):
        xs, ws, bs, xt, wt, labels = _dense(gen)
        FKL(xs, ws, xt, wt, labels, bs).backward()
        ids = torch.stack([torch.randperm(11, generator=gen)[:4] for _ in range(7)])
        RKL(xs, ws, ids, torch.zeros(7, 4), None, bs)
    assert [c for c in calls if c.startswith("kdloss_cuda_")] == [
        "kdloss_cuda_fused_linear_distill_workspace_size", "kdloss_cuda_fused_linear_distill",
        "kdloss_cuda_fused_linear_topk_distill_workspace_size",
        "kdloss_cuda_fused_linear_topk_distill"]
