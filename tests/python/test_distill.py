"""distill_loss / DistillLoss / FusedLinearDistillLoss against float64 torch references written
from the definitions (docs/MATH.md section 7), every divergence. Tolerances: tests/README.md."""

import pytest
import torch

import kdloss
from kdloss import _lib
from kdloss.torch import DistillLoss, FusedLinearDistillLoss, FusedLinearJSDLoss
from kdloss.torch.functional import distill_loss

import reference as ref
from conftest import covers_registry

DIVS = [("forward_kl", 0.5, 0.1), ("reverse_kl", 0.5, 0.1), ("jsd", 0.5, 0.1), ("jsd", 0.0, 0.1),
        ("jsd", 1.0, 0.1), ("jsd", 0.2, 0.1), ("skew_forward_kl", 0.5, 0.1),
        ("skew_forward_kl", 0.5, 0.0), ("skew_forward_kl", 0.5, 1.0), ("skew_reverse_kl", 0.5, 0.1),
        ("skew_reverse_kl", 0.5, 1.0), ("tvd", 0.5, 0.1)]


# CUDA tensors go to kdloss_cuda_distill_logits; that case runs only on a CUDA build with a GPU.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not (torch.cuda.is_available() and _lib.lib().kdloss_cuda_available()),
    reason="needs a GPU and a CUDA build of libkdloss"))]


def ref_rows(zs, zt, div, beta, alpha, t):
    """Per-row divergence of softmax(zt/t) (P) and softmax(zs/t) (Q), float64."""
    lq = torch.log_softmax(zs.double() / t, -1)
    lp = torch.log_softmax(zt.double() / t, -1)
    return ref.div_rows(lp, lq, div, beta, alpha)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("div,beta,alpha", DIVS)
@pytest.mark.parametrize("reduction", ["batchmean", "sum", "none"])
def test_distill_loss_matches_reference(div, beta, alpha, reduction, device):
    torch.manual_seed(0)
    bt, v, t = 9, 37, 2.0
    zc = torch.randn(bt, v) * 3
    zt = torch.randn(bt, v) * 3
    labels = torch.randint(0, v, (bt,))
    labels[[1, 4]] = -100
    zs = zc.to(device).requires_grad_()
    out = distill_loss(zs, zt.to(device), labels.to(device), divergence=div, beta=beta,
                       alpha=alpha, temperature=t, reduction=reduction)
    zd = zc.detach().double().requires_grad_()
    rows = (ref_rows(zd, zt, div, beta, alpha, t) + 0 * zd.sum(-1)) * (labels != -100)
    ref = {"batchmean": rows.sum() / 7, "sum": rows.sum(), "none": rows}[reduction]
    torch.testing.assert_close(out.double().cpu(), ref.detach(), rtol=1e-4, atol=1e-6)
    w = torch.randn(bt) if reduction == "none" else torch.tensor(1.7)
    (out * w.to(device)).sum().backward()
    (ref * w.double()).sum().backward()
    torch.testing.assert_close(zs.grad.double().cpu(), zd.grad, rtol=1e-3, atol=1e-6)


def test_distill_all_ignored_and_module():
    zs = torch.randn(4, 11, requires_grad=True)
    zt = torch.randn(4, 11)
    labels = torch.full((4,), -100)
    loss = DistillLoss(divergence="tvd")(zs, zt, labels)
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(zs.grad) == 0


@pytest.mark.parametrize("kw", [dict(divergence="kl"), dict(beta=1.5), dict(alpha=float("nan")),
                                dict(alpha=-0.1), dict(temperature=0.0),
                                dict(temperature=float("nan"))])
def test_distill_bad_params_raise(kw):
    zs, zt = torch.randn(2, 5), torch.randn(2, 5)
    with pytest.raises(kdloss.KdlossError) as e:
        distill_loss(zs, zt, **kw)
    assert e.value.status == -5 and "invalid parameter" in str(e.value)


def _fused_ref(xs, ws, xt, wt, labels, div, beta, alpha, t, wh, wsft, t2, ii=-100):
    zs = xs.double() @ ws.double().T
    zt = xt.double() @ wt.double().T
    keep = labels != ii
    n = max(1, int(keep.sum()))
    ce = torch.nn.functional.cross_entropy(zs[keep], labels[keep], reduction="sum") \
        if keep.any() else zs.sum() * 0
    soft = (ref_rows(zs, zt, div, beta, alpha, t) * keep).sum()
    return (wh * ce + wsft * soft * (t * t if t2 else 1.0)) / n


@pytest.mark.parametrize("div,beta,alpha", DIVS)
@pytest.mark.parametrize("t2", [False, True])
def test_fused_linear_distill_matches_reference(div, beta, alpha, t2):
    torch.manual_seed(1)
    bt, h, v, t = 10, 16, 41, 1.5
    xs = torch.randn(bt, h, requires_grad=True)
    ws = (torch.randn(v, h) * 0.3).requires_grad_()
    xt, wt = torch.randn(bt, h), torch.randn(v, h) * 0.3
    labels = torch.randint(0, v, (bt,))
    labels[3] = -100
    m = FusedLinearDistillLoss(divergence=div, beta=beta, alpha=alpha, weight_hard_loss=0.3,
                               weight_soft_loss=0.7, temperature=t, t2_scale=t2)
    loss = m(xs, ws, xt, wt, labels)
    xd, wd = xs.detach().double().requires_grad_(), ws.detach().double().requires_grad_()
    ref = _fused_ref(xd, wd, xt, wt, labels, div, beta, alpha, t, 0.3, 0.7, t2)
    torch.testing.assert_close(loss.double(), ref.detach(), rtol=1e-4, atol=1e-6)
    loss.backward()
    ref.backward()
    torch.testing.assert_close(xs.grad.double(), xd.grad, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(ws.grad.double(), wd.grad, rtol=1e-3, atol=1e-5)


def test_fused_linear_jsd_is_distill_jsd():
    torch.manual_seed(2)
    xs, ws = torch.randn(6, 8), torch.randn(23, 8)
    xt, wt = torch.randn(6, 8), torch.randn(23, 8)
    labels = torch.randint(0, 23, (6,))
    a = FusedLinearJSDLoss(beta=0.3, temperature=2.0, return_soft_hard_loss=True)(
        xs, ws, xt, wt, labels)
    b = FusedLinearDistillLoss(divergence="jsd", beta=0.3, temperature=2.0,
                               return_soft_hard_loss=True)(xs, ws, xt, wt, labels)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_fused_linear_distill_bad_params_and_all_ignored():
    xs, ws = torch.randn(3, 4, requires_grad=True), torch.randn(7, 4)
    labels = torch.full((3,), -100)
    for kw in (dict(divergence="nope"), dict(alpha=2.0), dict(temperature=-1.0)):
        with pytest.raises(kdloss.KdlossError) as e:
            FusedLinearDistillLoss(**kw)(xs, ws, xs.detach(), ws, labels)
        assert e.value.status == -5
    loss = FusedLinearDistillLoss(divergence="skew_reverse_kl")(xs, ws, xs.detach(), ws, labels)
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(xs.grad) == 0


def test_cases_cover_the_divergence_registry():
    assert covers_registry({d for d, _, _ in DIVS}) == []
