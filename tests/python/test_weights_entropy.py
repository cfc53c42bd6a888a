"""token_weights= and return_entropy= (include/kdloss.h, "Per-row weights and the student's
entropy"; functional.py's module docstring) on the losses on logits and the fused losses, against
float64 references written from the definitions: a row of weight w adds w times its loss and its
gradients, a weight of 0 ignores the row, the divisor is the count of the kept rows; the entropy is
H(softmax(z / T)) per row, 0 on ignored rows, without gradient.

Inputs are fresh random draws (the seed printed; KDLOSS_TEST_SEED reruns one). Tolerances: fp32
operands 1e-4 relative on losses, entropies and gradients (fp32 logits over V <= 300 with double
row sums: the error is a few fp32 ulps of the largest term, far below that; the same budget as
test_distill.py); bf16 operands are compared with the reference run on the same bf16-rounded
values, 2e-3 (one bf16 rounding of the gradient, 2^-9, plus fp32 accumulation)."""

import os
import random

import pytest
import torch

from kdloss import KdlossError
from kdloss.torch import DistillLoss, FusedLinearDistillLoss, FusedLinearTopKDistillLoss
from kdloss.torch import functional as F

import reference as ref
from conftest import assert_close, require_row_extras, spread

SEED = int(os.environ.get("KDLOSS_TEST_SEED") or random.SystemRandom().randrange(2**31))
print(f"test_weights_entropy: KDLOSS_TEST_SEED={SEED}")


def _gen(salt):
    return torch.Generator().manual_seed(SEED * 1000 + salt)


def _weights(bt, g):
    """Per-row weights >= 0 with zeros among them (rows 1 and bt-2 weigh 0)."""
    w = torch.rand(bt, generator=g) * 2
    w[1] = 0.0
    w[bt - 2] = 0.0
    return w


def _entropy(z, t):
    lq = torch.log_softmax(z.double() / t, -1)
    return -(lq.exp() * lq).sum(-1)


def _softcap(u, scale, cap):
    u = u * scale
    return cap * torch.tanh(u / cap) if cap else u


# ---- losses on logits ---------------------------------------------------------------------------

@require_row_extras("logits")
@pytest.mark.parametrize("div,beta", [("forward_kl", 0.5), ("reverse_kl", 0.5), ("jsd", 0.3)])
@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean", "none"])
def test_distill_loss_weights_entropy(div, beta, reduction):
    g = _gen(1)
    bt, v, t = 11, 53, 1.7
    zs0, zt = spread((bt, v), g, 3), spread((bt, v), g, 3)
    labels = torch.randint(0, v, (bt,), generator=g)
    labels[[0, 5]] = -100
    w = _weights(bt, g)
    zs = zs0.clone().requires_grad_()
    out, ent = F.distill_loss(zs, zt, labels, divergence=div, beta=beta, temperature=t,
                              reduction=reduction, token_weights=w, return_entropy=True)
    zd = zs0.double().requires_grad_()
    kept = (labels != -100) & (w > 0)
    lq = torch.log_softmax(zd / t, -1)
    lp = torch.log_softmax(zt.double() / t, -1)
    rows = ref.div_rows(lp, lq, div, beta) * w.double() * kept
    n = max(1, int(kept.sum()))
    want = {"batchmean": rows.sum() / n, "sum": rows.sum(), "mean": rows.sum() / (n * v),
            "none": rows}[reduction]
    assert_close(out, want, 1e-4, what=f"{div} {reduction} loss")
    assert_close(ent, _entropy(zs0, t) * kept, 1e-4, what="entropy")
    assert not ent.requires_grad and ent.dtype == torch.float32 and ent.shape == (bt,)
    up = torch.randn(bt, generator=g) if reduction == "none" else torch.tensor(1.3)
    (out * up).sum().backward()
    (want * up.double()).sum().backward()
    assert_close(zs.grad, zd.grad, 1e-4, what=f"{div} {reduction} gradient")


@require_row_extras("logits")
def test_distill_loss_weights_module_and_shape():
    """(B, T, V) logits: the entropy comes back (B, T); the module's return_entropy and forward's
    token_weights reach the same call; the weights get no gradient even when they require it."""
    g = _gen(2)
    b, t_, v = 2, 5, 31
    zs, zt = spread((b, t_, v), g), spread((b, t_, v), g)
    w = _weights(b * t_, g).view(b, t_).requires_grad_()
    loss, ent = DistillLoss(divergence="reverse_kl", temperature=0.8,
                            return_entropy=True)(zs, zt, token_weights=w)
    loss2, ent2 = F.distill_loss(zs.reshape(-1, v), zt.reshape(-1, v), divergence="reverse_kl",
                                 temperature=0.8, token_weights=w.reshape(-1),
                                 return_entropy=True, reduction="sum")
    assert ent.shape == (b, t_)
    assert_close(ent.reshape(-1), ent2, 1e-6, what="entropy (B, T) vs (B*T,)")
    assert_close(loss * b, loss2, 1e-5, what="batchmean * B vs sum (no labels)")
    assert not loss.requires_grad  # no student tensor requires grad (w's requires_grad: data)
    with pytest.raises(KdlossError, match="token_weights"):
        F.distill_loss(zs, zt, token_weights=torch.ones(3))


@require_row_extras("topk_logits")
@pytest.mark.parametrize("tail", ["bucket", "renorm_both"])
def test_topk_distill_loss_weights_entropy(tail):
    g = _gen(3)
    bt, v, k, t = 9, 41, 6, 1.3
    zs0 = spread((bt, v), g, 2)
    zt = spread((bt, v), g, 2)
    lp_full = torch.log_softmax(zt / t, -1)
    ids = torch.stack([torch.randperm(v, generator=g)[:k] for _ in range(bt)])
    ids[2, 4:] = -1
    lps = torch.gather(lp_full, 1, ids.clamp(min=0))
    labels = torch.randint(0, v, (bt,), generator=g)
    labels[3] = -100
    w = _weights(bt, g)
    zs = zs0.clone().requires_grad_()
    out, ent = F.topk_distill_loss(zs, ids, lps, labels, tail=tail, temperature=t,
                                   token_weights=w, return_entropy=True)
    zd = zs0.double().requires_grad_()
    kept = (labels != -100) & (w > 0)
    rows = ref.topk_rows(zd, ids, lps, "forward_kl", tail, t=t) * w.double() * kept
    want = rows.sum() / max(1, int(kept.sum()))
    assert_close(out, want, 1e-4, what=f"topk {tail} loss")
    assert_close(ent, _entropy(zs0, t) * kept, 1e-4, what="topk entropy")
    out.backward()
    want.backward()
    assert_close(zs.grad, zd.grad, 1e-4, what=f"topk {tail} gradient")


# ---- fused losses -------------------------------------------------------------------------------

def _fused_reference(xs, ws, bs, xt, wt, bt_, labels, w, div, beta, t, w_hard, w_soft, maps,
                     items=None):
    """(loss, soft, hard, entropy) in float64, differentiable in xs, ws, bs."""
    zs = _softcap(xs @ ws.T + bs, maps[0], maps[1])
    zt = _softcap(xt @ wt.T + bt_, maps[2], maps[3])
    kept = (labels != -100) & (w > 0)
    wk = w.double() * kept
    lq, lp = torch.log_softmax(zs / t, -1), torch.log_softmax(zt / t, -1)
    soft = (ref.div_rows(lp, lq, div, beta) * wk).sum()
    ce = -torch.log_softmax(zs, -1).gather(1, labels.clamp(min=0)[:, None])[:, 0]
    hard = (ce * wk).sum()
    n = items if items is not None else max(1, int(kept.sum()))
    ent = -(lq.exp() * lq).sum(-1) * kept
    return (w_hard * hard + w_soft * soft) / n, soft / n, hard / n, ent.detach()


@require_row_extras("fused")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("div,beta,maps", [("jsd", 0.5, (1.0, 0.0, 1.0, 0.0)),
                                           ("reverse_kl", 0.5, (0.7, 9.0, 1.2, 0.0)),
                                           ("forward_kl", 0.5, (1.0, 0.0, 1.0, 6.0))])
@pytest.mark.parametrize("items", [None, 17])
def test_fused_linear_distill_weights_entropy(dtype, div, beta, maps, items):
    g = _gen(4)
    bt, hs, ht, v, t = 13, 24, 20, 97, 1.5
    xs0, ws0 = spread((bt, hs), g).to(dtype), (spread((v, hs), g) * 0.3).to(dtype)
    bs0 = (torch.randn(v, generator=g) * 0.2).to(dtype)
    xt, wt = spread((bt, ht), g).to(dtype), (spread((v, ht), g) * 0.3).to(dtype)
    labels = torch.randint(0, v, (bt,), generator=g)
    labels[[4, 7]] = -100
    w = _weights(bt, g)
    xs, ws, bs = (a.clone().requires_grad_() for a in (xs0, ws0, bs0))
    loss, soft, hard, ent = F.fused_linear_distill_loss(
        xs, ws, xt, wt, labels, bs, None, divergence=div, beta=beta, weight_hard_loss=0.3,
        weight_soft_loss=0.7, temperature=t, return_soft_hard_loss=True, token_weights=w,
        return_entropy=True, num_items_in_batch=items, student_logit_scale=maps[0],
        student_softcap=maps[1] or None, teacher_logit_scale=maps[2],
        teacher_softcap=maps[3] or None)
    d = [a.double().requires_grad_() for a in (xs0, ws0, bs0)]
    rl, rs, rh, re = _fused_reference(*d, xt.double(), wt.double(), torch.zeros(v, dtype=torch.float64),
                                      labels, w, div, beta, t, 0.3, 0.7, maps, items)
    tol = 1e-4 if dtype == torch.float32 else 2e-3
    for got, want, what in ((loss, rl, "loss"), (soft, rs, "soft"), (hard, rh, "hard"),
                            (ent, re, "entropy")):
        assert_close(got, want, tol, what=f"{div} {dtype} {what}")
    assert not ent.requires_grad and ent.shape == (bt,)
    loss.backward()
    rl.backward()
    for got, want, what in zip((xs.grad, ws.grad, bs.grad), (a.grad for a in d),
                               ("dxs", "dws", "dbs")):
        assert_close(got, want, tol * 10 if dtype == torch.bfloat16 else tol,
                     what=f"{div} {dtype} {what}")


@require_row_extras("fused")
def test_fused_module_weights_entropy_and_no_weight_gradient():
    """FusedLinearDistillLoss(return_entropy=True)(..., token_weights=w): the functional form's
    result; weights that require grad get none; all-ones weights give the unweighted loss."""
    g = _gen(5)
    bt, h, v = 8, 16, 45
    xs, ws = spread((bt, h), g).requires_grad_(), (spread((v, h), g) * 0.3).requires_grad_()
    xt, wt = spread((bt, h), g), spread((v, h), g) * 0.3
    labels = torch.randint(0, v, (bt,), generator=g)
    w = _weights(bt, g).requires_grad_()
    mod = FusedLinearDistillLoss(divergence="reverse_kl", return_entropy=True)
    loss, ent = mod(xs, ws, xt, wt, labels, token_weights=w)
    loss2, ent2 = F.fused_linear_distill_loss(xs, ws, xt, wt, labels, divergence="reverse_kl",
                                              token_weights=w, return_entropy=True)
    assert_close(loss, loss2, 0, what="module vs functional")
    assert_close(ent, ent2, 0, what="module vs functional entropy")
    loss.backward()
    assert w.grad is None
    plain = F.fused_linear_distill_loss(xs, ws, xt, wt, labels, divergence="reverse_kl")
    ones = F.fused_linear_distill_loss(xs, ws, xt, wt, labels, divergence="reverse_kl",
                                       token_weights=torch.ones(bt))
    assert_close(ones, plain, 1e-6, what="weights of 1 vs none")
    with pytest.raises(KdlossError):
        F.fused_linear_distill_loss(xs, ws, xt, wt, labels, token_weights=-torch.ones(bt))


@require_row_extras("fused_topk")
def test_fused_topk_weights_entropy():
    g = _gen(6)
    bt, h, v, k, t = 10, 12, 64, 5, 1.2
    xs0, ws0 = spread((bt, h), g), spread((v, h), g) * 0.4
    zt = spread((bt, v), g, 2)
    ids = torch.stack([torch.randperm(v, generator=g)[:k] for _ in range(bt)])
    lps = torch.gather(torch.log_softmax(zt / t, -1), 1, ids)
    w = _weights(bt, g)
    xs, ws = xs0.clone().requires_grad_(), ws0.clone().requires_grad_()
    loss, ent = FusedLinearTopKDistillLoss(temperature=t, return_entropy=True)(
        xs, ws, ids, lps, token_weights=w)
    xd, wd = xs0.double().requires_grad_(), ws0.double().requires_grad_()
    zs = xd @ wd.T
    kept = w > 0
    rows = ref.topk_rows(zs, ids, lps, "forward_kl", "bucket", t=t) * w.double()
    want = rows.sum() / max(1, int(kept.sum()))
    assert_close(loss, want, 1e-4, what="fused topk loss")
    assert_close(ent, _entropy(zs.detach(), t) * kept, 1e-4, what="fused topk entropy")
    loss.backward()
    want.backward()
    assert_close(xs.grad, xd.grad, 1e-4, what="fused topk dxs")
    assert_close(ws.grad, wd.grad, 1e-4, what="fused topk dws")


def test_ops_fake_shapes_with_weights_and_entropy():
    """The custom ops under FakeTensorMode: the entropy output is [BT] when asked for, (0,)
    otherwise; token_weights of the wrong size fail there too."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        xs, ws = torch.empty(6, 8), torch.empty(30, 8)
        out = torch.ops.kdloss.fused_linear_distill(
            xs, ws, xs, ws, None, None, None, "jsd", 0.5, 0.1, 1.0, 0.0, 1.0, -100, 0, False,
            True, True, False, token_weights=torch.empty(6), want_entropy=True)
        assert out[6].shape == (6,)
        out = torch.ops.kdloss.distill_loss(torch.empty(6, 30), torch.empty(6, 30), None,
                                            "forward_kl", 0.5, 0.1, 1.0, -100, "sum", True)
        assert out[2].shape == (0,)
        with pytest.raises(KdlossError, match="token_weights"):
            torch.ops.kdloss.distill_loss(torch.empty(6, 30), torch.empty(6, 30), None,
                                          "forward_kl", 0.5, 0.1, 1.0, -100, "sum", True,
                                          token_weights=torch.empty(5))


@require_row_extras("fused")
def test_compiled_fused_loss_with_weights_and_entropy():
    """torch.compile(fullgraph=True) keeps the op whole with the new arguments: the same loss,
    entropy and gradients as eager."""
    g = _gen(7)
    bt, h, v = 6, 8, 33
    xs0, ws = spread((bt, h), g), spread((v, h), g) * 0.3
    xt, wt = spread((bt, h), g), spread((v, h), g) * 0.3
    labels = torch.randint(0, v, (bt,), generator=g)
    w = _weights(bt, g)

    def f(xs):
        return F.fused_linear_distill_loss(xs, ws, xt, wt, labels, divergence="reverse_kl",
                                           token_weights=w, return_entropy=True)
    xe, xc = xs0.clone().requires_grad_(), xs0.clone().requires_grad_()
    le, ee = f(xe)
    lc, ec = torch.compile(f, fullgraph=True, backend="eager")(xc)
    le.backward()
    lc.backward()
    assert_close(lc, le, 0, what="compiled loss")
    assert_close(ec, ee, 0, what="compiled entropy")
    assert_close(xc.grad, xe.grad, 0, what="compiled gradient")
