"""kdloss.torch.adapters: axolotl's and DistillKit-style stored top-k teachers as kdloss's sparse
teacher, with re-tempering, against a float64 reference built from the full
teacher logits. Tolerances: the adapter computes in float64 from float32 stored log-probs and
returns float32: a few fp32 ulps, 1e-6 relative (1e-6 of the largest entry absolute)."""

import math

import pytest
import torch

from kdloss.torch import adapters, topk_distill_loss

from conftest import assert_close, require

B, T, V, K = 2, 3, 40, 6


def _teacher(seed=0, t_gen=0.7):
    """Full teacher logits (float64), the top-K log-probs at t_gen (float32, as stored), their
    ids, and a mask with a few slots off."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 3
    lp_gen = torch.log_softmax(z / t_gen, -1)
    top, ids = lp_gen.topk(K, -1)
    mask = torch.ones(B, T, K, dtype=torch.int64)
    mask[0, 1, -2:] = 0
    mask[1, 2, 0] = 0
    mask[1, 0, :] = 0  # a position with nothing stored
    return z, ids, top.float(), mask


def _truth(z, ids, mask, t_train):
    """log-probs of softmax(z / t_train) conditioned on the kept ids (float64)."""
    lp = torch.log_softmax(z / t_train, -1).gather(-1, ids)
    keep = mask.bool()
    lp = torch.where(keep, lp, torch.full_like(lp, -math.inf))
    out = lp - torch.logsumexp(lp, -1, keepdim=True)
    return torch.where(keep, out, torch.zeros_like(out))


@pytest.mark.parametrize("t_gen,t_train", [(0.7, 2.0), (1.0, 0.5), (1.3, 1.3)])
def test_from_axolotl_retempers_against_float64(t_gen, t_train):
    z, ids, top, mask = _teacher(t_gen=t_gen)
    out_ids, lps = adapters.from_axolotl(ids, top, mask, generation_temperature=t_gen,
                                         training_temperature=t_train)
    assert out_ids.dtype == ids.dtype and lps.dtype == torch.float32
    assert bool((out_ids[mask == 0] == -1).all()) and bool((out_ids[mask != 0] >= 0).all())
    if t_gen == t_train:  # nothing changed: the stored full-vocabulary log-probs
        assert torch.equal(lps[mask != 0], top[mask != 0])
        assert bool((lps[mask == 0] == 0).all())
        return
    assert_close(lps, _truth(z, ids, mask, t_train), 1e-6, what="re-tempered log-probs")
    kept = mask.bool()
    sums = torch.where(kept, lps.double().exp(), torch.zeros(())).sum(-1)
    has = kept.any(-1)
    assert_close(sums[has], torch.ones_like(sums[has]), 1e-6, what="sum over kept")


@require("kdloss_topk_distill_logits")
@pytest.mark.parametrize("tail", ["renorm_teacher", "renorm_both"])
def test_retempered_teacher_gives_the_true_renorm_loss(tail):
    """With a renormalizing tail, the loss from re-tempered stored log-probs equals the loss from
    the true T_train log-probs at the same ids (the per-row constant cancels)."""
    t_gen, t_train = 0.8, 2.0
    z, ids, top, mask = _teacher(1, t_gen)
    zs = torch.randn(B, T, V, generator=torch.Generator().manual_seed(5))
    out_ids, lps = adapters.from_axolotl(ids, top, mask, generation_temperature=t_gen,
                                         training_temperature=t_train)
    true_lps = torch.log_softmax(z / t_train, -1).gather(-1, ids).float()
    div = "forward_kl" if tail == "renorm_teacher" else "jsd"
    got = topk_distill_loss(zs, out_ids, lps, tail=tail, divergence=div, temperature=t_train)
    want = topk_distill_loss(zs, out_ids, true_lps, tail=tail, divergence=div,
                             temperature=t_train)
    assert_close(got, want, 1e-6)


def test_from_sparse_logprobs_and_logits():
    t_gen, t_train = 0.6, 1.7
    z, ids, top, mask = _teacher(2, t_gen)
    want = _truth(z, ids, mask, t_train)
    # DistillKit-style: unused slots as a pad id
    pad_ids = torch.where(mask.bool(), ids, torch.full_like(ids, V + 7))
    out_ids, lps = adapters.from_sparse(pad_ids, top, pad_id=V + 7,
                                        generation_temperature=t_gen,
                                        training_temperature=t_train)
    assert torch.equal(out_ids, torch.where(mask.bool(), ids, torch.full_like(ids, -1)))
    assert_close(lps, want, 1e-6, what="logprobs")
    # raw logits at the ids, unused slots as ids < 0
    neg_ids = torch.where(mask.bool(), ids, torch.full_like(ids, -1)).to(torch.int32)
    out_ids, lps = adapters.from_sparse(neg_ids, z.gather(-1, ids).float(), values_are="logits",
                                        training_temperature=t_train)
    assert out_ids.dtype == torch.int32
    assert_close(lps, want, 1e-6, what="logits")


def test_adapter_errors_name_the_row():
    z, ids, top, mask = _teacher(3)
    dup = ids.clone()
    dup[1, 1, 3] = dup[1, 1, 0]
    with pytest.raises(ValueError, match=r"row 4 \(index \(1, 1\)\) repeats token id"):
        adapters.from_axolotl(dup, top, mask)
    dup[1, 1, 3] = -1  # an unused slot is not a duplicate
    adapters.from_axolotl(dup, top, mask)
    with pytest.raises(ValueError, match="row 0: token id >= vocab_size"):
        adapters.from_axolotl(ids, top, mask, vocab_size=int(ids[0, 0].max()))
    with pytest.raises(ValueError, match="renormalize=False"):
        adapters.from_axolotl(ids, top, mask, generation_temperature=0.5, renormalize=False)
    with pytest.raises(ValueError, match="generation_temperature"):
        adapters.retemper(top, mask, 0.0, 1.0)
    with pytest.raises(ValueError, match="values_are"):
        adapters.from_sparse(ids, top, values_are="probs")


# ---- generalized_jsd_loss: TRL's GKDTrainer.generalized_jsd_loss semantics ----------------------

def _gkd_terms(zs, zt, beta, t):
    """TRL's elementwise JSD terms in float64 (beta weights the teacher in the mixture)."""
    lq = torch.log_softmax(zs.double() / t, -1)
    lp = torch.log_softmax(zt.double() / t, -1)
    m = torch.logaddexp(lq + math.log1p(-beta), lp + math.log(beta)) if 0 < beta < 1 else None
    if beta == 0:
        return lp.exp() * (lp - lq)
    if beta == 1:
        return lq.exp() * (lq - lp)
    return beta * lp.exp() * (lp - m) + (1 - beta) * lq.exp() * (lq - m)


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean", "none"])
@pytest.mark.parametrize("with_labels", [False, True])
def test_generalized_jsd_loss_has_trls_semantics(beta, reduction, with_labels):
    g = torch.Generator().manual_seed(13)
    zs, zt = (3 * torch.randn(2, 5, 11, generator=g) for _ in range(2))
    labels = torch.randint(0, 11, (2, 5), generator=g) if with_labels else None
    if with_labels:
        labels[0, 1:3] = -100
    terms = _gkd_terms(zs, zt, beta, 1.5)
    kept = terms[labels != -100] if with_labels else terms
    n = int((labels != -100).sum()) if with_labels else zs.size(0)
    want = {"batchmean": kept.sum() / n, "sum": kept.sum(), "mean": kept.mean(),
            "none": kept}[reduction]
    got = adapters.generalized_jsd_loss(zs, zt, labels, beta=beta, temperature=1.5, reduction=reduction)
    assert got.shape == want.shape
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)
    items = torch.tensor(7)  # num_items_in_batch: the sum over it, whatever the reduction
    got = adapters.generalized_jsd_loss(zs, zt, labels, beta=beta, temperature=1.5, reduction=reduction,
                               num_items_in_batch=items)
    assert torch.allclose(got.double(), kept.sum() / 7, rtol=1e-5, atol=1e-6)
