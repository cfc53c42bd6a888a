"""The fused losses' logit maps (student_logit_scale / student_softcap / teacher_logit_scale /
teacher_softcap: Cohere's logit_scale, Gemma 2's final_logit_softcapping, TRL #6629), against a
float64 autograd reference that applies the map to full logits as the model's forward does:
z = softcap * tanh(scale * u / softcap) (or scale * u), u = x W^T + b, before the temperature.

Tolerances: the fp32 cases of test_fused_linear_jsd.py (TOL[float32]: the fp32 GEMMs and exp/log)
plus the vector tanh's <= 4 ULP of |z| <= softcap on each logit (src/cpu/vmath.h), which moves a
loss by at most ~softcap * 2^-21 / T: 2e-5 absolute here (softcap <= 5)."""
import math
import types

import pytest
import torch

from kdloss import KdlossError, _lib
from kdloss.torch import (FusedLinearDistillLoss, FusedLinearJSDLoss, FusedLinearTopKDistillLoss,
                          fused_linear_distill_loss, topk_distill_loss)
from kdloss.torch.adapters import logit_map_kwargs

import reference as ref
from conftest import assert_close, covers_registry
from test_fused_linear_jsd import make
from test_topk import fused_case

RTOL, ATOL = 1e-4, 2e-5


def mapped(u, scale, cap):
    return cap * torch.tanh(scale * u / cap) if cap else scale * u


def ref_fused(t, div, beta, alpha, temperature, w_hard, w_soft, maps):
    """(loss, soft, hard, grads) in float64 with autograd through the maps."""
    d = {k: (None if x is None else x.detach().double()) for k, x in t.items() if k != "labels"}
    for k in ("xs", "ws", "bs"):
        if d[k] is not None:
            d[k].requires_grad_()
    zs = mapped(d["xs"] @ d["ws"].T + (d["bs"] if d["bs"] is not None else 0), *maps[:2])
    zt = mapped(d["xt"] @ d["wt"].T + (d["bt"] if d["bt"] is not None else 0), *maps[2:])
    labels = t["labels"]
    mask = labels != -100
    n = max(1, int(mask.sum()))
    safe = torch.where(mask, labels, torch.zeros_like(labels))
    hard = ((torch.logsumexp(zs, -1) - zs.gather(1, safe[:, None])[:, 0]) * mask).sum() / n
    lq = torch.log_softmax(zs / temperature, -1)
    lp = torch.log_softmax(zt / temperature, -1)
    soft = (ref.div_rows(lp, lq, div, beta, alpha) * mask).sum() / n
    loss = w_hard * hard + w_soft * soft
    loss.backward()
    return loss.detach(), soft.detach(), hard.detach(), {
        k: d[k].grad for k in ("xs", "ws", "bs") if d[k] is not None}


MAPS = [(1.7, None, 1.0, None), (1.0, 5.0, 1.0, 8.0), (2.0, 3.0, 0.6, 2.5), (1.0, None, 1.3, 4.0)]
DIVS = ["forward_kl", "reverse_kl", "jsd", "skew_forward_kl", "skew_reverse_kl", "tvd"]


def _kw(maps):
    return dict(zip(("student_logit_scale", "student_softcap", "teacher_logit_scale",
                     "teacher_softcap"), maps))


@pytest.mark.parametrize("maps", MAPS, ids=lambda m: "s%s_c%s_t%s_c%s" % m)
@pytest.mark.parametrize("div", DIVS)
def test_fused_distill_matches_float64_through_the_maps(maps, div):
    t = make(torch.Generator().manual_seed(3), bias=True, ignore=True, v=97)
    t["ws"] = (t["ws"] * 3).detach()  # logits of spread ~6: the caps saturate
    want = ref_fused(t, div, 0.3, 0.2, 1.7, 0.4, 0.6, maps)
    for k in ("xs", "ws", "bs"):
        t[k] = t[k].detach().clone().requires_grad_()
    loss, soft, hard = fused_linear_distill_loss(
        t["xs"], t["ws"], t["xt"], t["wt"], t["labels"], t["bs"], t["bt"], divergence=div,
        beta=0.3, alpha=0.2, temperature=1.7, weight_hard_loss=0.4, weight_soft_loss=0.6,
        return_soft_hard_loss=True, **_kw(maps))
    loss.backward()
    for name, a, b in zip(("loss", "soft", "hard"), (loss, soft, hard), want[:3]):
        assert_close(a, b, RTOL, ATOL, name)
    for k, g in want[3].items():
        assert_close(t[k].grad, g, RTOL, ATOL * max(1.0, float(g.abs().max())), f"d{k}")


def test_jsd_module_and_compile_carry_the_maps():
    t = make(torch.Generator().manual_seed(5), bias=False, v=64)
    maps = (1.5, 4.0, 1.0, 6.0)
    want = ref_fused(dict(t, bs=None, bt=None), "jsd", 0.5, 0.1, 2.0, 0.5, 0.5, maps)
    mod = FusedLinearJSDLoss(temperature=2.0, **_kw(maps))
    fn = torch.compile(lambda *a: mod(*a), fullgraph=True, backend="eager")
    for f in (mod, fn):
        xs = t["xs"].detach().clone().requires_grad_()
        loss = f(xs, t["ws"], t["xt"], t["wt"], t["labels"])
        loss.backward()
        assert_close(loss, want[0], RTOL, ATOL, "loss")
        assert_close(xs.grad, want[3]["xs"], RTOL, ATOL, "dxs")


@pytest.mark.parametrize("tail", ["bucket", "renorm_both"])
def test_topk_student_map_matches_the_logits_loss(tail):
    """The fused top-k loss with a student map equals topk_distill_loss on the mapped logits
    (formed in float64); dX through the map by autograd on that float64 chain."""
    xs, ws, bs, ids, lps, labels = fused_case(torch.Generator().manual_seed(9), bt=10, h=16,
                                              v=80, k=6, t=1.5)
    x64, w64, b64 = (a.detach().double().requires_grad_() for a in (xs, ws, bs))
    z = mapped(x64 @ w64.T + b64, 1.3, 3.0)
    want = topk_distill_loss(z.float(), ids, lps, labels, divergence="jsd", tail=tail,
                             temperature=1.5)
    # dX: the logits loss's own gradient, pulled back through the map and the head in float64
    zf = z.detach().float().requires_grad_()
    topk_distill_loss(zf, ids, lps, labels, divergence="jsd", tail=tail,
                      temperature=1.5).backward()
    (z * zf.grad.double()).sum().backward()
    x = xs.detach().clone().requires_grad_()
    got = FusedLinearTopKDistillLoss(divergence="jsd", tail=tail, temperature=1.5,
                                     student_logit_scale=1.3, student_softcap=3.0)(
        x, ws, ids, lps, labels, bs)
    got.backward()
    assert_close(got, want, RTOL, ATOL, "loss")
    assert_close(x.grad, x64.grad, 1e-3, 1e-3 * float(x64.grad.abs().max()), "dxs")


def test_identity_maps_change_nothing():
    t = make(torch.Generator().manual_seed(2), bias=True, ignore=True)
    base = FusedLinearDistillLoss(divergence="tvd", weight_hard_loss=0.3)
    same = FusedLinearDistillLoss(divergence="tvd", weight_hard_loss=0.3, student_logit_scale=1.0,
                                  student_softcap=None, teacher_logit_scale=None)
    a = base(t["xs"], t["ws"], t["xt"], t["wt"], t["labels"], t["bs"], t["bt"])
    b = same(t["xs"], t["ws"], t["xt"], t["wt"], t["labels"], t["bs"], t["bt"])
    assert torch.equal(a, b)


@pytest.mark.parametrize("bad", [dict(student_softcap=-1.0), dict(teacher_logit_scale=-2.0),
                                 dict(student_softcap=float("nan")),
                                 dict(teacher_softcap=float("inf"))])
def test_bad_maps_raise_invalid_param(bad):
    t = make(torch.Generator().manual_seed(4))
    with pytest.raises(KdlossError) as e:
        fused_linear_distill_loss(t["xs"], t["ws"], t["xt"], t["wt"], t["labels"], **bad)
    assert e.value.status == _lib.ERR_INVALID_PARAM
    name = next(iter(bad)).split("_")[0]
    assert f"{name}_map" in str(e.value)


def test_non_numbers_are_refused_early():
    with pytest.raises(KdlossError):
        FusedLinearDistillLoss(student_softcap="30")


def test_logit_map_kwargs_reads_hf_configs():
    gemma = types.SimpleNamespace(final_logit_softcapping=30.0)
    cohere = types.SimpleNamespace(logit_scale=0.0625, final_logit_softcapping=None)
    plain = types.SimpleNamespace()
    assert logit_map_kwargs(gemma, cohere) == dict(
        student_logit_scale=1.0, student_softcap=30.0, teacher_logit_scale=0.0625,
        teacher_softcap=None)
    assert logit_map_kwargs(plain, None) == dict(
        student_logit_scale=1.0, student_softcap=None, teacher_logit_scale=1.0,
        teacher_softcap=None)
    with pytest.raises(TypeError):
        logit_map_kwargs(types.SimpleNamespace(logit_scale="x"))
    FusedLinearDistillLoss(**logit_map_kwargs(gemma, cohere))  # the keywords fit


def test_cases_cover_the_divergence_registry():
    assert covers_registry(DIVS) == []
