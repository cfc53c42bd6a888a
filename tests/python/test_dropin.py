"""Drop-in means drop-in: Liger-Kernel's keyword
names, positional orders and autograd Functions; losses in float32 whatever the input dtype; torch's
type promotion for kl_div(reduction="none"); torch's batchmean (/ input.size(0)) and mean; the
budgeted chunk as every fused module's default; fp16 and mixed dtypes; DTensor weights; the hint
for FSDP1 / ZeRO-3 placeholders. References: float64 torch, torch's own kl_div, and Liger's
chunked JSD loss on the CPU (pure torch) when liger_kernel is installed."""

import math

import pytest
import torch

import kdloss
from conftest import UNIT, assert_close
from kdloss.torch import (JSD, DistillLoss, FusedLinearDistillLoss, FusedLinearJSD,
                          FusedLinearJSDFunction, FusedLinearJSDLoss, FusedLinearJSDLossFunction,
                          FusedLinearTopKDistillLoss, JSDFunction, KLDivFunction, KLDivLoss,
                          _args, functional as F, liger)
import reference as ref

HALF = [torch.bfloat16, torch.float16]


def logprobs(shape, gen, scale=1.0):
    return torch.log_softmax(scale * torch.randn(*shape, generator=gen, dtype=torch.float64), -1)


def heads(gen, bt=12, hs=16, ht=24, v=40, dtype=torch.float32):
    xs = torch.randn(bt, hs, generator=gen).to(dtype)
    ws = (0.3 * torch.randn(v, hs, generator=gen)).to(dtype)
    xt = torch.randn(bt, ht, generator=gen).to(dtype)
    wt = (0.3 * torch.randn(v, ht, generator=gen)).to(dtype)
    labels = torch.randint(0, v, (bt,), generator=gen)
    labels[::4] = -100
    return xs, ws, xt, wt, labels


def leaf(t, dtype=None):
    return t.detach().to(dtype or t.dtype).clone().requires_grad_()


# ---- Liger's names, keyword names, positional orders ---------------------------------------------

def test_jsd_keywords_positional_and_function(gen):
    x, y = logprobs((9, 30), gen).float(), logprobs((9, 30), gen).float()
    labels = torch.randint(0, 30, (9,), generator=gen)
    labels[::3] = 42
    a, b, c, d = leaf(x), leaf(x), leaf(x), leaf(x)
    la = liger.liger_jsd(input=a, target=y, shift_labels=labels, beta=0.3, ignore_index=42)
    lb = F.jsd(b, y, labels, 0.3, 42)
    lc = JSDFunction.apply(c, y, labels, 0.3, 42)  # Liger's test: apply(x, t, label, beta, ii)
    ld = F.jsd(log_q=d, log_p=y, shift_labels=labels, beta=0.3, ignore_index=42)  # old names
    xd = leaf(x, torch.float64)
    want = ref.jsd(xd, y.double(), 0.3, labels, 42)
    want.backward()
    for out, t in ((la, a), (lb, b), (lc, c), (ld, d)):
        assert out.dtype == torch.float32
        assert_close(out, want, 1e-5, what="loss")
        (2.0 * out).backward()
        assert_close(t.grad, 2 * xd.grad, 1e-5, what="grad")
    with pytest.raises(TypeError):
        F.jsd(x, y, log_q=x)


def test_liger_jsd_names_return_the_input_dtype(gen):
    # Liger's JSD returns its loss in the input's dtype (its own tests compare dtypes); kdloss's
    # own names return float32. Same value, same gradient.
    x = logprobs((8, 40), gen).to(torch.bfloat16)
    y = logprobs((8, 40), gen).to(torch.bfloat16)
    own = F.jsd(leaf(x), y)
    assert own.dtype == torch.float32
    a, b, c = leaf(x), leaf(x), leaf(x)
    outs = (liger.liger_jsd(a, y), liger.LigerJSDFunction.apply(b, y), liger.LigerJSD()(c, y))
    for out, t in zip(outs, (a, b, c)):
        assert out.dtype == torch.bfloat16
        assert out.item() == own.to(torch.bfloat16).item()
        out.backward()
        assert t.grad is not None and t.grad.dtype == torch.bfloat16


def test_kl_div_liger_positional_order(gen):
    y, t = logprobs((6, 20), gen).float(), logprobs((6, 20), gen).float()
    torch_sum = torch.nn.functional.kl_div(y.double(), t.double(), reduction="sum",
                                           log_target=True)
    # liger_kl_div(input, target, size_average, reduce, reduction, log_target, eps)
    got = liger.liger_kl_div(y, t, True, True, "sum", True, 1e-10)
    assert_close(got, torch_sum, 1e-6, what="Liger positional order")
    assert_close(F.kl_div(input=y, target=t, reduction="sum", log_target=True), torch_sum, 1e-6)
    # kdloss's earlier order: kl_div(y_pred, y_true, reduction, log_target, eps), and its names
    assert_close(F.kl_div(y, t, "sum", True, 1e-10), torch_sum, 1e-6, what="old positional")
    assert_close(F.kl_div(y_pred=y, y_true=t, reduction="sum", log_target=True), torch_sum, 1e-6)
    # a False legacy flag means what it means in torch
    with pytest.warns(UserWarning):
        none = F.kl_div(y, t, reduce=False, log_target=True)
    assert none.shape == y.shape
    # Liger's Function: apply(y_pred, y_true, reduction="batchmean", log_target, eps)
    a = leaf(y)
    out = KLDivFunction.apply(a, t, "batchmean", True)
    assert_close(out, torch_sum / 6, 1e-6, what="KLDivFunction batchmean")
    out.backward()
    assert_close(a.grad, -t.exp() / 6, 1e-6, what="KLDivFunction grad")
    assert liger.LigerKLDivLossFunction is KLDivFunction and liger.LigerKLDIVLoss is KLDivLoss


def test_fused_linear_jsd_liger_signatures(gen):
    xs, ws, xt, wt, labels = heads(gen)
    outs, grads = [], []
    calls = [
        lambda x, w: liger.liger_fused_linear_jsd(
            student_input=x, student_weight=w, teacher_input=xt, teacher_weight=wt,
            shift_labels=labels, jsd_beta=0.2, ignore_index=-100, temperature=2.0),
        lambda x, w: FusedLinearJSDFunction.apply(x, w, xt, wt, labels, 0.2, -100, 2.0),
        lambda x, w: FusedLinearJSDFunction.apply(x, w, xt, wt, labels, 0.2, -100, 2.0,
                                                  torch.float32, None, None),
        lambda x, w: FusedLinearJSD(jsd_beta=0.2, temperature=2.0,
                                    accum_dtype=torch.float32)(x, w, xt, wt, labels),
        lambda x, w: F.fused_linear_jsd(x, w, xt, wt, labels, 0.2, -100, 2.0, torch.bfloat16),
    ]
    for call in calls:
        x, w = leaf(xs), leaf(ws)
        out = call(x, w)
        assert out.dtype == torch.float32
        out.backward()
        outs.append(out.detach())
        grads.append((x.grad, w.grad))
    for out, (gx, gw) in zip(outs[1:], grads[1:]):
        assert torch.equal(out, outs[0])  # accum_dtype changes nothing: fp32 accumulation
        assert torch.equal(gx, grads[0][0]) and torch.equal(gw, grads[0][1])
    with pytest.raises(kdloss.KdlossError, match="accum_dtype"):
        FusedLinearJSD(accum_dtype=torch.int32)


@pytest.mark.parametrize("bias", [False, True])
def test_chunked_jsd_function_matches_module(bias, gen):
    xs, ws, xt, wt, labels = heads(gen)
    bs = torch.randn(ws.shape[0], generator=gen) if bias else None
    bt = torch.randn(ws.shape[0], generator=gen) if bias else None
    args = (labels,)
    runs = []
    for kind in ("function", "liger_functional", "module"):
        x, w = leaf(xs), leaf(ws)
        b = leaf(bs) if bias else None
        if kind == "function":  # Liger's chunked LigerFusedLinearJSDFunction.apply order
            out = FusedLinearJSDLossFunction.apply(x, w, xt, wt, *args, b, bt, 0.1, 0.9, 0.5, -100,
                                                   2.0, True, None, True)
        elif kind == "liger_functional":
            out = liger.chunked_loss.liger_fused_linear_jsd(x, w, xt, wt, *args, b, bt, 0.1, 0.9,
                                                            0.5, -100, 2.0, True, None, True)
        else:
            out = FusedLinearJSDLoss(0.1, 0.9, 0.5, -100, 2.0, return_soft_hard_loss=True)(
                x, w, xt, wt, *args, b, bt)
        assert all(o.dtype == torch.float32 for o in out)
        out[0].backward()
        runs.append((out, x.grad, w.grad, b.grad if bias else None))
    for out, gx, gw, gb in runs[1:]:
        for a, b in zip(out, runs[0][0]):
            assert torch.equal(a, b)
        assert torch.equal(gx, runs[0][1]) and torch.equal(gw, runs[0][2])
        if bias:
            assert torch.equal(gb, runs[0][3])


def test_chunked_jsd_matches_liger_on_cpu(gen):
    """Liger's chunked JSD loss is plain torch: it runs on the CPU (compiled=False)."""
    chunked = pytest.importorskip("liger_kernel.chunked_loss")
    xs, ws, xt, wt, labels = heads(gen, bt=20, v=64)
    for beta, temperature, w_hard in ((0.5, 1.0, 0.5), (0.8, 2.0, 0.0), (0.2, 0.5, 1.0)):
        got = []
        for cls, kw in ((chunked.LigerFusedLinearJSDLoss, {"compiled": False}),
                        (FusedLinearJSDLoss, {})):
            x, w = leaf(xs), leaf(ws)
            m = cls(weight_hard_loss=w_hard, weight_soft_loss=1 - w_hard, beta=beta,
                    temperature=temperature, **kw)
            out = m(x, w, xt, wt, labels)
            out.backward()
            got.append((out.detach(), x.grad, w.grad))
        (lo, lx, lw), (ko, kx, kw_) = got
        assert ko.dtype == lo.dtype == torch.float32
        assert_close(ko, lo, 1e-5, what="loss vs Liger")
        assert_close(kx, lx, 1e-4, 1e-5, what="dx vs Liger")
        assert_close(kw_, lw, 1e-4, 1e-5, what="dW vs Liger")


# ---- dtypes --------------------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["sum", "batchmean", "mean"])
@pytest.mark.parametrize("log_target", [False, True])
def test_fp16_kl_loss_is_fp32_without_overflow(reduction, log_target, gen):
    """fp16 KL with log_target and sum gave inf (the true value past 65504): the loss is fp32."""
    y = logprobs((1024, 1024), gen, 40.0)
    t = logprobs((1024, 1024), gen, 40.0)
    if not log_target:
        t = t.exp()
    y16, t16 = y.half(), t.half()
    out = F.kl_div(y16, t16, reduction=reduction, log_target=log_target)
    assert out.dtype == torch.float32
    want = torch.nn.functional.kl_div(y16.double(), t16.double(), reduction=reduction,
                                      log_target=log_target)
    assert math.isfinite(out.item())
    assert_close(out, want, 1e-5, what="fp16 KL")
    if reduction == "sum" and log_target:
        assert want.item() > 65504  # the case that overflowed


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_losses_keep_fp32_digits(dtype, gen):
    """The loss of half inputs is the fp32 computation on the rounded inputs, not rounded to
    3 significant digits: compare with float64 on the same (exactly representable) values."""
    zs = (6 * torch.randn(8, 5, 301, generator=gen)).to(dtype)
    zt = (6 * torch.randn(8, 5, 301, generator=gen)).to(dtype)
    for reduction in ("sum", "batchmean", "mean"):
        out = F.distill_loss(zs, zt, reduction=reduction, temperature=0.5)
        assert out.dtype == torch.float32
        x = torch.log_softmax(zs.double() / 0.5, -1)
        y = torch.log_softmax(zt.double() / 0.5, -1)
        rows = (y.exp() * (y - x)).sum(-1)
        want = {"sum": rows.sum(), "batchmean": rows.sum() / 8,
                "mean": rows.sum() / rows.numel() / 301}[reduction]
        assert_close(out, want, 2e-5, what=f"{dtype} distill {reduction}")
    x, y = logprobs((40, 300), gen, 3.0).to(dtype), logprobs((40, 300), gen, 3.0).to(dtype)
    out = F.jsd(x, y, beta=0.3)
    assert out.dtype == torch.float32
    assert_close(out, ref.jsd(x.double(), y.double(), 0.3), 2e-5, what=f"{dtype} jsd")


def test_fp16_distill_sum_does_not_overflow(gen):
    zs = (50 * torch.randn(1024, 512, generator=gen)).half()
    zt = (50 * torch.randn(1024, 512, generator=gen)).half()
    out = F.distill_loss(zs, zt, reduction="sum")
    x, y = torch.log_softmax(zs.double(), -1), torch.log_softmax(zt.double(), -1)
    want = (y.exp() * (y - x)).sum()
    assert want.item() > 65504 and out.dtype == torch.float32
    assert_close(out, want, 1e-5, what="fp16 distill sum")


@pytest.mark.parametrize("yd", [torch.float32] + HALF, ids=str)
@pytest.mark.parametrize("td", [torch.float32] + HALF, ids=str)
def test_kl_div_dtypes_follow_torch_promotion(yd, td, gen):
    y, t = logprobs((7, 33), gen), logprobs((7, 33), gen).exp()
    y, t = y.to(yd), t.to(td)
    a = leaf(y)
    none = F.kl_div(a, t, reduction="none")
    assert none.dtype == torch.nn.functional.kl_div(y, t, reduction="none").dtype
    assert none.dtype == torch.promote_types(yd, td)
    tol = 2 * max(UNIT[yd], UNIT[td], UNIT[none.dtype])
    want = torch.nn.functional.kl_div(y.double(), t.double(), reduction="none")
    assert_close(none, want, tol, what="none")
    (none.float() * 3).sum().backward()
    assert a.grad.dtype == yd
    for reduction in ("sum", "mean", "batchmean"):
        out = KLDivLoss(reduction=reduction)(y, t)
        assert out.dtype == torch.float32
        want = torch.nn.functional.kl_div(y.double(), t.double(), reduction=reduction)
        assert_close(out, want, 1e-5, what=reduction)


# ---- batchmean and mean --------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(3, 5, 17), (2, 2, 3, 9), (17,), (4, 17)])
@pytest.mark.parametrize("reduction", ["batchmean", "mean", "sum"])
def test_kl_div_reductions_match_torch_nd(shape, reduction, gen):
    y, t = logprobs(shape, gen).float(), logprobs(shape, gen).float()
    a = leaf(y)
    out = KLDivLoss(reduction=reduction, log_target=True)(a, t)
    out.backward()
    yd = leaf(y, torch.float64)
    want = torch.nn.functional.kl_div(yd, t.double(), reduction=reduction, log_target=True)
    want.backward()
    assert_close(out, want, 1e-5, what=f"{reduction} {shape}")
    assert_close(a.grad, yd.grad, 1e-5, what=f"{reduction} grad {shape}")


def trl_generalized_jsd(zs, zt, labels=None, beta=0.5, temperature=1.0, reduction="batchmean"):
    """TRL's GKDTrainer.generalized_jsd_loss, written out in float64 (beta 0 / 1: the KLs)."""
    x = torch.log_softmax(zs / temperature, -1)
    y = torch.log_softmax(zt / temperature, -1)
    if beta == 0:
        jsd = torch.nn.functional.kl_div(x, y, reduction="none", log_target=True)
    elif beta == 1:
        jsd = torch.nn.functional.kl_div(y, x, reduction="none", log_target=True)
    else:
        m = torch.logsumexp(torch.stack([x + math.log(1 - beta), y + math.log(beta)]), 0)
        jsd = beta * torch.nn.functional.kl_div(m, y, reduction="none", log_target=True) + \
            (1 - beta) * torch.nn.functional.kl_div(m, x, reduction="none", log_target=True)
    if labels is not None:
        mask = labels != -100
        jsd = jsd[mask]
    if reduction == "batchmean":
        return jsd.sum() / mask.sum() if labels is not None else jsd.sum() / jsd.size(0)
    if reduction == "sum":
        return jsd.sum()
    if reduction == "mean":
        return jsd.mean()
    return jsd


@pytest.mark.parametrize("with_labels", [False, True])
@pytest.mark.parametrize("reduction", ["batchmean", "mean", "sum"])
def test_distill_jsd_reductions_match_trl_3d(reduction, with_labels, gen):
    zs = torch.randn(3, 7, 50, generator=gen, dtype=torch.float64)
    zt = torch.randn(3, 7, 50, generator=gen, dtype=torch.float64)
    labels = None
    if with_labels:
        labels = torch.randint(0, 50, (3, 7), generator=gen)
        labels[:, :2] = -100
    a = leaf(zs, torch.float32)
    out = F.distill_loss(a, zt.float(), labels, divergence="jsd", beta=0.4, temperature=2.0,
                         reduction=reduction)
    out.backward()
    zd = leaf(zs)
    want = trl_generalized_jsd(zd, zt, labels, beta=0.4, temperature=2.0, reduction=reduction)
    want.backward()
    assert out.dtype == torch.float32
    assert_close(out, want, 2e-5, what=f"{reduction} loss")
    assert_close(a.grad, zd.grad, 2e-5, what=f"{reduction} grad")
    if reduction == "batchmean" and not with_labels:  # / B, not / (B*T)
        rows = F.distill_loss(zs.float(), zt.float(), divergence="jsd", beta=0.4,
                              temperature=2.0, reduction="none")
        assert_close(out, rows.double().sum() / 3, 1e-6)


def test_topk_mean_and_batchmean_3d(gen):
    zs = torch.randn(2, 4, 30, generator=gen)
    lp = torch.log_softmax(torch.randn(2, 4, 30, generator=gen), -1)
    top, ids = torch.topk(lp, 5, -1)
    rows = F.topk_distill_loss(zs, ids, top, reduction="none")
    assert rows.dtype == torch.float32 and rows.shape == (2, 4)
    s = rows.double().sum()
    assert_close(F.topk_distill_loss(zs, ids, top, reduction="batchmean"), s / 2, 1e-6)
    assert_close(F.topk_distill_loss(zs, ids, top, reduction="mean"), s / (8 * 30), 1e-6)
    flat = F.topk_distill_loss(zs.view(8, 30), ids.view(8, 5), top.view(8, 5))
    assert_close(flat, s / 8, 1e-6, what="2-D batchmean: per row")
    one = F.distill_loss(zs[0, 0], zs[1, 1])  # 1-D logits: one row, batchmean is its loss
    assert_close(one, F.distill_loss(zs[0, 0], zs[1, 1], reduction="sum"), 1e-7, what="1-D")


# ---- fp16 and mixed dtypes in the fused losses ---------------------------------------------------

@pytest.mark.parametrize("sdt, wdt", [
    (torch.bfloat16, torch.float32), (torch.float16, torch.float32), (torch.float16, torch.float16),
    (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float16)], ids=str)
def test_fused_mixed_and_fp16_cast_once(sdt, wdt, gen):
    """Mixed or fp16 (activations, head) pairs compute as their promoted dtype (fp16 -> fp32):
    the same numbers as the caller casting first, gradients back in each operand's dtype."""
    xs, ws, xt, wt, labels = heads(gen)
    bs = torch.randn(ws.shape[0], generator=gen)
    xs, ws, xt, bs = xs.to(sdt), ws.to(wdt), xt.to(sdt), bs.to(wdt)
    ct = torch.promote_types(sdt, wdt)
    ct = torch.float32 if ct == torch.float16 else ct
    tct = torch.float32  # teacher: xt (sdt) with wt (fp32)
    x, w, b = leaf(xs), leaf(ws), leaf(bs)
    out = FusedLinearJSDLoss(beta=0.3, return_soft_hard_loss=True)(x, w, xt, wt, labels, b)
    out[0].backward()
    x2, w2, b2 = leaf(xs, ct), leaf(ws, ct), leaf(bs, ct)
    want = FusedLinearJSDLoss(beta=0.3, return_soft_hard_loss=True)(x2, w2, xt.to(tct), wt,
                                                                     labels, b2)
    want[0].backward()
    for o, e in zip(out, want):
        assert o.dtype == torch.float32 and torch.equal(o, e)
    assert x.grad.dtype == sdt and w.grad.dtype == wdt and b.grad.dtype == wdt
    assert torch.equal(x.grad, x2.grad.to(sdt))
    assert torch.equal(w.grad, w2.grad.to(wdt))
    assert torch.equal(b.grad, b2.grad.to(wdt))


def test_fused_under_cpu_autocast(gen):
    """Liger's test_amp on the CPU: bf16 activations, fp32 heads, inside torch.autocast."""
    xs, ws, xt, wt, labels = heads(gen, hs=32, ht=64, v=96)
    xs, xt = xs.bfloat16(), xt.bfloat16()
    x1, x2 = leaf(xs), leaf(xs)
    w1, w2 = leaf(ws), leaf(ws)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = FusedLinearJSD(jsd_beta=0.5)(x1, w1, xt, wt, labels)
        out.backward()
        # torch reference under autocast (its linears in bf16), as Liger's test computes it
        zs = torch.nn.functional.linear(x2, w2).float()
        zt = torch.nn.functional.linear(xt, wt).float()
        keep = labels != -100
        rows = ref.jsd_rows(torch.log_softmax(zs, -1), torch.log_softmax(zt, -1), 0.5)
        want = (rows * keep).sum() / keep.sum()
        want.backward()
    assert out.dtype == torch.float32 and x1.grad.dtype == torch.bfloat16
    assert_close(out, want, 5e-2, 5e-3, what="autocast loss")  # Liger's test_amp tolerances
    assert_close(x1.grad, x2.grad, 5e-2, 5e-3, what="autocast dx")
    assert_close(w1.grad, w2.grad, 5e-2, 5e-3, what="autocast dW")
    # under autocast the heads are taken in bf16, as torch's linear takes them; without autocast
    # the same call on bf16 heads is the same computation, bit for bit
    as_bf16 = FusedLinearJSD(jsd_beta=0.5)(xs, ws.bfloat16(), xt, wt.bfloat16(), labels)
    assert torch.equal(out.detach(), as_bf16)
    plain = FusedLinearJSD(jsd_beta=0.5)(xs, ws, xt, wt, labels)  # fp32 heads: promoted
    assert not torch.equal(plain, as_bf16)


def test_row_losses_take_fp16_and_mixed_natively(gen):
    zs, zt = torch.randn(6, 40, generator=gen), torch.randn(6, 40, generator=gen)
    for sd, td in ((torch.float16, torch.float32), (torch.bfloat16, torch.float16),
                   (torch.float16, torch.float16)):
        a = leaf(zs, sd)
        out = DistillLoss(divergence="reverse_kl")(a, zt.to(td))
        out.backward()
        zd = leaf(a, torch.float64)
        x, y = torch.log_softmax(zd, -1), torch.log_softmax(zt.to(td).double(), -1)
        want = (x.exp() * (x - y)).sum(-1).mean()
        want.backward()
        assert out.dtype == torch.float32 and a.grad.dtype == sd
        assert_close(out, want, 1e-5, what=f"{sd}/{td} loss")
        assert_close(a.grad, zd.grad, 4 * UNIT[sd], 4 * UNIT[sd], what=f"{sd}/{td} grad")


def test_float64_refused_naming_operands(gen):
    xs, ws, xt, wt, labels = heads(gen)
    with pytest.raises(kdloss.KdlossError, match="student_weight"):
        F.fused_linear_jsd_loss(xs, ws.double(), xt, wt, labels)
    with pytest.raises(kdloss.KdlossError, match="target"):
        F.kl_div(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.float64))


# ---- the budgeted chunk by default ---------------------------------------------------------------

def _chunk_of(spy):
    name, args = spy.calls[-1]
    assert name.startswith("fused_linear")
    return args[1].chunk_size


def test_fused_modules_default_to_the_budgeted_chunk(spy, gen):
    xs, ws, xt, wt, labels = heads(gen)
    ids = torch.topk(torch.randn(xs.shape[0], ws.shape[0], generator=gen), 4, -1).indices
    lps = torch.full(ids.shape, -3.0)
    dense = [(FusedLinearJSDLoss, {}), (FusedLinearDistillLoss, {"divergence": "tvd"})]
    for cls, kw in dense:
        assert cls(**kw).chunk_size is None
        cls(**kw)(xs, ws, xt, wt, labels)
        assert _chunk_of(spy) == 0  # 0: the library picks it from its memory budget
        cls(chunk_size=3, **kw)(xs, ws, xt, wt, labels)
        assert _chunk_of(spy) == 3  # the caller's wins
    FusedLinearJSD()(xs, ws, xt, wt, labels)
    assert _chunk_of(spy) == 0
    assert FusedLinearTopKDistillLoss().chunk_size is None
    FusedLinearTopKDistillLoss()(xs, ws, ids, lps)
    assert _chunk_of(spy) == 0
    FusedLinearTopKDistillLoss(chunk_size=5)(xs, ws, ids, lps)
    assert _chunk_of(spy) == 5
    F.fused_linear_jsd_loss(xs, ws, xt, wt, labels)
    assert _chunk_of(spy) == 0


# ---- DTensor, FSDP1 and ZeRO-3 placeholders ------------------------------------------------------

@pytest.fixture
def gloo_mesh(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    try:
        from torch.distributed.device_mesh import init_device_mesh
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                                world_size=1)
    except Exception as e:  # noqa: BLE001 - any failure to set up means: not feasible here
        pytest.skip(f"cannot start a 1-process gloo group: {e}")
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_dtensor_weights_are_gathered(gloo_mesh, gen, monkeypatch):
    from torch.distributed.tensor import Shard, distribute_tensor
    xs, ws, xt, wt, labels = heads(gen)
    w_dt = torch.nn.Parameter(distribute_tensor(ws, gloo_mesh, [Shard(0)]))
    wt_dt = distribute_tensor(wt, gloo_mesh, [Shard(0)])
    x1, x2, w2 = leaf(xs), leaf(xs), leaf(ws)
    out = FusedLinearJSDLoss()(x1, w_dt, xt, wt_dt, labels)
    out.backward()
    want = FusedLinearJSDLoss()(x2, w2, xt, wt, labels)
    want.backward()
    assert torch.equal(out.detach(), want.detach())
    assert torch.equal(x1.grad, x2.grad)
    assert torch.equal(w_dt.grad.to_local(), w2.grad)  # back through full_tensor()'s autograd
    # row losses too
    y = distribute_tensor(logprobs((6, 9), gen).float(), gloo_mesh, [Shard(0)])
    t = logprobs((6, 9), gen).float()
    assert torch.equal(F.jsd(y, t), F.jsd(y.full_tensor(), t))
    # a DTensor handed straight to an autograd Function: a clear error, not a null pointer
    with pytest.raises(kdloss.KdlossError, match="DTensor"):
        FusedLinearJSDFunction.apply(xs, w_dt, xt, wt, labels)
    # too big to gather: the error says DTensor and points to process_group=
    monkeypatch.setattr(_args, "free_bytes", lambda device: 1024)
    with pytest.raises(kdloss.KdlossError, match="DTensor") as e:
        FusedLinearJSDLoss()(xs, w_dt, xt, wt, labels)
    assert "process_group=" in str(e.value) and e.value.status_name == "KDLOSS_ERR_UNSUPPORTED"


def test_flat_and_zero3_placeholders_get_a_hint(gen):
    xs, ws, xt, wt, labels = heads(gen)
    with pytest.raises(kdloss.KdlossError, match="FSDP1") as e:
        FusedLinearJSDLoss()(xs, ws.reshape(-1), xt, wt, labels)
    assert "must be 2-D" in str(e.value) and "ZeRO-3" in str(e.value)
    placeholder = torch.nn.Parameter(torch.empty(0))
    placeholder.ds_shape = ws.shape  # what DeepSpeed ZeRO-3 leaves outside its forward
    with pytest.raises(kdloss.KdlossError, match="ZeRO-3") as e:
        FusedLinearJSDLoss()(xs, placeholder, xt, wt, labels)
    assert str(tuple(ws.shape)) in str(e.value)
    with pytest.raises(kdloss.KdlossError, match="teacher_weight must be 2-D"):
        FusedLinearJSDLoss()(xs, ws, xt, wt.reshape(-1), labels)
