"""Arguments at their edges, each once silently wrong or answered by torch instead of kdloss:
labels None with ignore_index 0 in the dense fused losses, num_items_in_batch tensors, int32
labels against an ignore_index outside int32, an ignore_index outside int64, skew divergences at
alpha = 1, the logit scale 0.0, and from_axolotl's re-tempering of a row without mass."""

import math

import pytest
import torch

import kdloss
from kdloss.torch import FusedLinearJSD, adapters
from kdloss.torch import functional as F


def _heads(gen, bt=6, hs=5, ht=7, v=13):
    xs = torch.randn(bt, hs, generator=gen).requires_grad_()
    ws = torch.randn(v, hs, generator=gen).requires_grad_()
    return xs, ws, torch.randn(bt, ht, generator=gen), torch.randn(v, ht, generator=gen)


def _grads(loss, *ts):
    return torch.autograd.grad(loss, ts)


# ---- labels None: every row counts, whatever ignore_index ----------------------------------------

def test_fused_without_labels_counts_every_row_at_ignore_index_0(gen):
    xs, ws, xt, wt = _heads(gen)
    calls = {
        "fused_linear_jsd": lambda ii: F.fused_linear_jsd(xs, ws, xt, wt, None, 0.3, ii),
        "FusedLinearJSD": lambda ii: FusedLinearJSD(0.3, ii)(xs, ws, xt, wt),
        "fused_linear_distill_loss": lambda ii: F.fused_linear_distill_loss(
            xs, ws, xt, wt, None, weight_hard_loss=0.0, divergence="forward_kl",
            ignore_index=ii),
    }
    for name, call in calls.items():
        ref, at0 = call(-100), call(0)
        assert ref.item() > 0, name
        assert torch.equal(at0, ref), (name, at0.item(), ref.item())
        for g0, g in zip(_grads(at0, xs, ws), _grads(ref, xs, ws)):
            assert torch.equal(g0, g), name


def test_fused_without_labels_one_token_vocabulary(gen):
    # V = 1: the only id is 0, which ignore_index 0 matches; the losses are 0 either way
    xs, ws, xt, wt = _heads(gen, v=1)
    for ii in (0, -100):
        loss = F.fused_linear_jsd(xs, ws, xt, wt, None, 0.5, ii)
        assert loss.item() == 0.0
        assert all(float(g.abs().max()) == 0.0 for g in _grads(loss, xs, ws))


# ---- num_items_in_batch as a tensor ------------------------------------------------------------

@pytest.mark.parametrize("bad", [torch.tensor(0), torch.tensor(-3.0), torch.tensor([7.0, 14.0]),
                                 torch.tensor(True), torch.tensor(float("nan"))])
def test_num_items_tensor_checked(gen, bad):
    xs, ws, xt, wt = _heads(gen)
    labels = torch.randint(0, 13, (6,), generator=gen)
    zs, zt = torch.randn(6, 13, generator=gen, requires_grad=True), torch.randn(6, 13)
    for call in (lambda: F.fused_linear_jsd_loss(xs, ws, xt, wt, labels, num_items_in_batch=bad),
                 lambda: F.fused_linear_jsd(xs, ws, xt, wt, labels, num_items_in_batch=bad),
                 lambda: F.distill_loss(zs, zt, labels, num_items_in_batch=bad)):
        with pytest.raises(kdloss.KdlossError, match="num_items_in_batch"):
            call()


def test_num_items_tensor_equals_the_number(gen):
    xs, ws, xt, wt = _heads(gen)
    labels = torch.randint(0, 13, (6,), generator=gen)
    a = F.fused_linear_jsd_loss(xs, ws, xt, wt, labels, num_items_in_batch=17)
    for n in (torch.tensor(17), torch.tensor(17.0), torch.tensor([17])):
        b = F.fused_linear_jsd_loss(xs, ws, xt, wt, labels, num_items_in_batch=n)
        assert b.shape == () and torch.equal(a, b)


# ---- int32 labels and an ignore_index outside int32 --------------------------------------------

@pytest.mark.parametrize("ii", [-2**63, 2**40, -2**31 - 1])
def test_int32_labels_count_as_the_c_call(gen, ii):
    zs = torch.randn(6, 13, generator=gen, requires_grad=True)
    zt = torch.randn(6, 13, generator=gen)
    l64 = torch.randint(0, 13, (6,), generator=gen)
    l64[2] = 0
    l32 = l64.to(torch.int32)
    for red in ("sum", "mean", "batchmean"):
        a = F.distill_loss(zs, zt, l64, ignore_index=ii, reduction=red)
        b = F.distill_loss(zs, zt, l32, ignore_index=ii, reduction=red)
        assert torch.equal(a, b), red
        assert torch.equal(_grads(a, zs)[0], _grads(b, zs)[0]), red
    xs, ws, xt, wt = _heads(gen)
    a = F.fused_linear_distill_loss(xs, ws, xt, wt, l64, ignore_index=ii, num_items_in_batch=4)
    b = F.fused_linear_distill_loss(xs, ws, xt, wt, l32, ignore_index=ii, num_items_in_batch=4)
    assert torch.equal(a, b)


# ---- an ignore_index outside int64 -------------------------------------------------------------

@pytest.mark.parametrize("ii", [2**63, -2**63 - 1, 10**30])
def test_ignore_index_outside_int64_is_kdloss_error(gen, ii):
    zs, zt = torch.randn(4, 9, generator=gen, requires_grad=True), torch.randn(4, 9)
    xs, ws, xt, wt = _heads(gen, bt=4, v=9)
    labels = torch.zeros(4, dtype=torch.int64)
    y = torch.log_softmax(zt, -1)
    ids = torch.zeros(4, 2, dtype=torch.int64)
    ids[:, 1] = 1
    for call in (lambda: F.distill_loss(zs, zt, labels, ignore_index=ii),
                 lambda: F.jsd(torch.log_softmax(zs, -1), y, labels, ignore_index=ii),
                 lambda: F.fused_linear_jsd_loss(xs, ws, xt, wt, labels, ignore_index=ii),
                 lambda: F.fused_linear_jsd(xs, ws, xt, wt, labels, ignore_index=ii),
                 lambda: F.topk_distill_loss(zs, ids, y.gather(-1, ids), ignore_index=ii),
                 lambda: F.fused_linear_topk_distill_loss(xs, ws, ids, y.gather(-1, ids),
                                                          ignore_index=ii)):
        with pytest.raises(kdloss.KdlossError, match="ignore_index=.*outside int64"):
            call()


# ---- skew divergences at alpha = 1 keep their graph ----------------------------------------------

@pytest.mark.parametrize("divergence", ["skew_forward_kl", "skew_reverse_kl"])
def test_skew_alpha_1_keeps_grad_fn(gen, divergence):
    zs, zt = torch.randn(4, 9, generator=gen, requires_grad=True), torch.randn(4, 9)
    xs, ws, xt, wt = _heads(gen, bt=4, v=9)
    ids = torch.stack([torch.randperm(9, generator=gen)[:3] for _ in range(4)])
    lps = torch.log_softmax(zt, -1).gather(-1, ids)
    for loss in (F.distill_loss(zs, zt, divergence=divergence, alpha=1.0),
                 F.topk_distill_loss(zs, ids, lps, divergence=divergence, alpha=1.0),
                 F.fused_linear_distill_loss(xs, ws, xt, wt, None, weight_hard_loss=0.0,
                                             divergence=divergence, alpha=1.0),
                 F.fused_linear_topk_distill_loss(xs, ws, ids, lps, divergence=divergence,
                                                  alpha=1.0)):
        assert loss.grad_fn is not None
        loss.backward()


# ---- the logit scale 0.0 ------------------------------------------------------------------------

def test_logit_scale_0_acts_as_1_and_says_so(gen):
    xs, ws, xt, wt = _heads(gen)
    labels = torch.randint(0, 13, (6,), generator=gen)
    a = F.fused_linear_distill_loss(xs, ws, xt, wt, labels)
    b = F.fused_linear_distill_loss(xs, ws, xt, wt, labels, student_logit_scale=0.0,
                                    teacher_logit_scale=0.0)
    assert torch.equal(a, b)
    for fn in (F.fused_linear_jsd_loss, F.fused_linear_distill_loss,
               F.fused_linear_topk_distill_loss):
        assert "0.0 acts as 1" in " ".join(fn.__doc__.split()), fn.__name__


# ---- memory_budget ------------------------------------------------------------------------------

def test_memory_budget_reaches_the_call_and_keeps_the_result(gen, spy):
    xs, ws, xt, wt = _heads(gen)
    labels = torch.randint(0, 13, (6,), generator=gen)
    a = F.fused_linear_distill_loss(xs, ws, xt, wt, labels)
    b = F.fused_linear_distill_loss(xs, ws, xt, wt, labels, memory_budget=1 << 20)
    assert [c[1][1].memory_budget for c in spy.calls] == [0, 1 << 20]
    assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
    with pytest.raises(kdloss.KdlossError, match="memory_budget"):
        F.fused_linear_jsd_loss(xs, ws, xt, wt, labels, memory_budget=-1)


# ---- from_axolotl: a kept row without mass -----------------------------------------------------

def test_from_axolotl_names_a_kept_row_without_mass():
    ids = torch.tensor([[[3, 5], [1, 2]], [[4, 6], [7, 8]]])
    lps = torch.tensor([[[-0.5, -1.5], [-0.2, -2.0]], [[-math.inf, -math.inf], [-1.0, -0.7]]])
    mask = torch.ones_like(ids)
    with pytest.raises(ValueError, match=r"row 2 \(index \(1, 0\)\)"):
        adapters.from_axolotl(ids, lps, mask, generation_temperature=1.0,
                              training_temperature=2.0)
    mask[1, 0] = 0  # masked out: a row without kept slots is fine (it contributes 0)
    out_ids, out_lps = adapters.from_axolotl(ids, lps, mask, generation_temperature=1.0,
                                             training_temperature=2.0)
    assert torch.isfinite(out_lps).all() and (out_ids[1, 0] == -1).all()
