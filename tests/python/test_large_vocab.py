"""256k vocabularies (Gemma's 262144, Qwen3.5's 248320: a power of two and not) on the Python paths
the CPU runs: the fused dense loss in fp32 and bf16, the fused top-k loss, and the losses on logits
(distill_loss, topk_distill_loss), against float64 references written from the definitions
(docs/MATH.md sections 4, 7, 8). Small BT and hidden sizes keep each case to about a second (the
double reference forms BT x V logits; the library's chunks span the whole vocabulary).

Tolerances: fp32 1e-4 relative (+ 1e-4 of the largest entry) on losses and gradients: fp32 logits
with double row sums, the error a few fp32 ulps per term summed over 256k terms, well below; bf16
operands against the reference on the same bf16-rounded values: losses 2e-3, gradients 2e-2 (the
gradients are written in bf16: one rounding, 2^-9, plus the fp32 GEMMs' accumulation over V in
the dX product). Fresh random inputs (the seed printed; KDLOSS_TEST_SEED reruns)."""

import os
import random

import pytest
import torch

from kdloss.torch import functional as F

import reference as ref
from conftest import assert_close, require, spread

SEED = int(os.environ.get("KDLOSS_TEST_SEED") or random.SystemRandom().randrange(2**31))
print(f"test_large_vocab: KDLOSS_TEST_SEED={SEED}")
VOCABS = (262144, 248320)


@require("kdloss_fused_linear_distill")
@pytest.mark.parametrize("v", VOCABS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_dense_large_vocab(v, dtype):
    g = torch.Generator().manual_seed(SEED + v)
    bt, h, t = 4, 16, 1.5
    xs0, ws0 = spread((bt, h), g, dtype=dtype), spread((v, h), g, 0.5, dtype)
    xt, wt = spread((bt, h), g, dtype=dtype), spread((v, h), g, 0.5, dtype)
    labels = torch.randint(0, v, (bt,), generator=g)
    labels[1] = -100
    xs, ws = xs0.clone().requires_grad_(), ws0.clone().requires_grad_()
    loss = F.fused_linear_distill_loss(xs, ws, xt, wt, labels, divergence="reverse_kl",
                                       weight_hard_loss=0.25, weight_soft_loss=0.75,
                                       temperature=t)
    loss.backward()
    xd, wd = xs0.double().requires_grad_(), ws0.double().requires_grad_()
    zs, zt = xd @ wd.T, xt.double() @ wt.double().T
    kept = labels != -100
    soft = ref.div_rows(torch.log_softmax(zt / t, -1), torch.log_softmax(zs / t, -1),
                        "reverse_kl")
    ce = -torch.log_softmax(zs, -1).gather(1, labels.clamp(min=0)[:, None])[:, 0]
    want = ((0.25 * ce + 0.75 * soft) * kept).sum() / int(kept.sum())
    want.backward()
    lt, gt = (1e-4, 1e-4) if dtype == torch.float32 else (2e-3, 2e-2)
    assert_close(loss, want, lt, what=f"V {v} {dtype} loss")
    assert_close(xs.grad, xd.grad, gt, what=f"V {v} {dtype} dxs")
    assert_close(ws.grad, wd.grad, gt, what=f"V {v} {dtype} dws")


def _topk(zt, k, t, g):
    """(ids, log-probs at T) of the teacher's top-k, one slot of row 0 unused."""
    lp = torch.log_softmax(zt.double() / t, -1)
    vals, ids = lp.topk(k, -1)
    ids[0, -1] = -1
    return ids, vals.float()


@require("kdloss_fused_linear_topk_distill")
@pytest.mark.parametrize("v", VOCABS)
def test_fused_topk_large_vocab(v):
    g = torch.Generator().manual_seed(SEED + 2 * v)
    bt, h, k, t = 4, 16, 8, 1.0
    xs0, ws0 = spread((bt, h), g), spread((v, h), g, 0.5)
    ids, lps = _topk(spread((bt, v), g, 3.0), k, t, g)
    xs, ws = xs0.clone().requires_grad_(), ws0.clone().requires_grad_()
    loss = F.fused_linear_topk_distill_loss(xs, ws, ids, lps, temperature=t)
    loss.backward()
    xd, wd = xs0.double().requires_grad_(), ws0.double().requires_grad_()
    want = ref.topk_rows(xd @ wd.T, ids, lps, "forward_kl", "bucket", t=t).mean()
    want.backward()
    assert_close(loss, want, 1e-4, what=f"V {v} fused top-k loss")
    assert_close(xs.grad, xd.grad, 1e-4, what=f"V {v} fused top-k dxs")
    assert_close(ws.grad, wd.grad, 1e-4, what=f"V {v} fused top-k dws")


@require("kdloss_distill_logits")
@pytest.mark.parametrize("v", VOCABS)
def test_losses_on_logits_large_vocab(v):
    g = torch.Generator().manual_seed(SEED + 3 * v)
    bt, t = 3, 2.0
    zs0, zt = spread((bt, v), g, 3.0), spread((bt, v), g, 3.0)
    zs = zs0.clone().requires_grad_()
    loss = F.distill_loss(zs, zt, divergence="jsd", beta=0.4, temperature=t, reduction="sum")
    loss.backward()
    zd = zs0.double().requires_grad_()
    want = ref.div_rows(torch.log_softmax(zt.double() / t, -1), torch.log_softmax(zd / t, -1),
                        "jsd", 0.4).sum()
    want.backward()
    assert_close(loss, want, 1e-4, what=f"V {v} distill_loss")
    assert_close(zs.grad, zd.grad, 1e-4, what=f"V {v} distill_loss dz")
    ids, lps = _topk(zt, 16, t, g)
    zs.grad = None
    loss = F.topk_distill_loss(zs, ids, lps, temperature=t, tail="bucket")
    loss.backward()
    zd.grad = None
    want = ref.topk_rows(zd, ids, lps, "forward_kl", "bucket", t=t).sum() / bt
    want.backward()
    assert_close(loss, want, 1e-4, what=f"V {v} topk_distill_loss")
    assert_close(zs.grad, zd.grad, 1e-4, what=f"V {v} topk_distill_loss dz")
