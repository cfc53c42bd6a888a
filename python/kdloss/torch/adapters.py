"""Stored top-k teachers from other tools, as kdloss's sparse teacher.

kdloss's top-k losses (topk_distill_loss, TopKDistillLoss, FusedLinearTopKDistillLoss) take
teacher_ids (..., K), int32/int64, -1 for an unused slot, and teacher_logprobs (..., K): the
teacher's log-probs at those ids AT THE TRAINING TEMPERATURE. The functions here turn other
tools' stored formats into that:

    from_axolotl(target_token_ids, target_logprobs, target_mask, ...)   axolotl's KD datasets
    from_sparse(ids, values, ...)                                       DistillKit-style sparse
                                                                        ids / values
    retemper(logprobs, valid, generation_temperature, training_temperature)

and, for the fused losses, logit_map_kwargs(student_config, teacher_config): the models'
logit_scale / final_logit_softcapping as the losses' keywords. For TRL's trainers:
generalized_jsd_loss (GKDTrainer's loss on logits) and chunked_divergence_loss
(DistillationTrainer's fused loss on hidden states and LM heads), each with TRL's signature.

Re-tempering (what is done, and why). A stored log-prob generated at temperature T_gen is
lp_gen(i) = z_i / T_gen - log Z_gen, with z the teacher's logits. At the training temperature
T_train, lp(i) = z_i / T_train - log Z_train = s * lp_gen(i) + c with s = T_gen / T_train
(p_train is proportional to p_gen ** (T_gen / T_train)) and c a per-row constant. c depends on
the whole vocabulary (log Z_train), which K stored values do not determine. So, when T_gen !=
T_train, retemper returns s * lp_gen renormalized over the row's kept slots, in log space and in
float64: lp(i) = s * lp_gen(i) - logsumexp_{kept j}(s * lp_gen(j)). These are EXACT log-probs of
the teacher's distribution conditioned on the kept ids (the constant c cancels), and they sum to
1 over the kept slots. Consequences for kdloss's tail modes: "renorm_teacher" and "renorm_both"
renormalize over the kept ids anyway, so their losses are exactly those of the true T_train
teacher (this is the recommended use of a re-tempered teacher); "bucket" sees an empty tail bin
(the teacher's missing mass is unknown after re-tempering and is taken as 0). When T_gen ==
T_train nothing is changed (the stored values keep their full-vocabulary normalization, and
"bucket" its tail) unless renormalize=True is asked for.

Unused slots (masked, or ids < 0) come back with id -1 and log-prob 0 (kdloss ignores both);
rows without any kept slot contribute 0 to kdloss's losses. Ids repeated within a row among the
kept slots raise ValueError naming the row (kdloss refuses duplicates). The log-probs come back
in float32 (computed in float64), on the input's device; ids keep their integer dtype (int32 or
int64; others widened to int64).
"""

import math

import torch

from . import _args
from . import functional as F

__all__ = ["retemper", "from_axolotl", "from_sparse", "logit_map_kwargs",
           "generalized_jsd_loss", "chunked_divergence_loss"]


def generalized_jsd_loss(student_logits, teacher_logits, labels=None, beta=0.5, temperature=1.0,
                         reduction="batchmean", num_items_in_batch=None):
    """TRL's GKDTrainer.generalized_jsd_loss, same signature and semantics, on kdloss:
    `GKDTrainer.generalized_jsd_loss = staticmethod(generalized_jsd_loss)` (README, TRL).
    JSD(beta) of softmax(teacher_logits / T) and softmax(student_logits / T), TRL's beta (0:
    KL(teacher || student), 1: KL(student || teacher)), rows whose label is -100 left out.
    - num_items_in_batch given: the sum over the kept tokens divided by it, whatever the
      reduction (as TRL);
    - "batchmean": the sum over the kept tokens / max(1, their count) with labels, / size(0)
      without; "sum"; "mean": the sum / (kept tokens x V) (torch's mean of the elements);
    - "none": TRL's elementwise terms, (kept tokens, V) with labels, else the logits' shape.
      kdloss's C kernels form per-row sums only, so this one reduction is computed by torch
      (log-softmax, the mixture in log space, float32 or the logits' dtype), materializing what
      TRL does; the others are one fused kdloss pass (distill_loss)."""
    if num_items_in_batch is not None:
        return F.distill_loss(student_logits, teacher_logits, labels, divergence="jsd",
                              beta=beta, temperature=temperature, reduction="batchmean",
                              num_items_in_batch=num_items_in_batch)
    if reduction != "none":
        return F.distill_loss(student_logits, teacher_logits, labels, divergence="jsd",
                              beta=beta, temperature=temperature, reduction=reduction)
    x = torch.log_softmax(student_logits / temperature, -1)
    y = torch.log_softmax(teacher_logits / temperature, -1)
    if beta == 0:
        terms = y.exp() * (y - x)
    elif beta == 1:
        terms = x.exp() * (x - y)
    else:  # log M = logaddexp(log(1 - beta) + X, log(beta) + Y)
        m = torch.logaddexp(x + math.log1p(-beta), y + math.log(beta))
        terms = beta * y.exp() * (y - m) + (1 - beta) * x.exp() * (x - m)
    return terms[labels != -100] if labels is not None else terms


def _trl_divergence(beta):
    """kdloss's divergence for TRL's beta: 0 forward KL(teacher || student), 1 reverse KL, else
    the JSD(beta) of the mixture M = beta P + (1 - beta) Q (TRL's (1 - beta) p_s + beta p_t,
    docs/MATH.md section 3: the same mixture, the same weights)."""
    beta = float(beta)
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta={beta!r}: in [0, 1]")
    return {0.0: "forward_kl", 1.0: "reverse_kl"}.get(beta, "jsd"), beta


def _trl_head(weight, bias, hidden, what):
    """An LM head as TRL's _chunked_divergence_loss projects with it: a DTensor gathered (the
    functional forms' gather, differentiable), then the weight in the hidden states' dtype (TRL
    casts each weight tile to it; under autocast both go to the autocast dtype later, in the
    fused loss). The bias is kept as it is (TRL adds it in float32)."""
    weight, bias = _args.gathered(weight, what + "_weight"), _args.gathered(bias, what + "_bias")
    if weight.dtype != hidden.dtype and hidden.dtype.is_floating_point:
        weight = weight.to(hidden.dtype)
    return weight, bias


def chunked_divergence_loss(student_hidden_states, teacher_hidden_states,
                            student_lm_head_weight, teacher_lm_head_weight, completion_mask,
                            beta, num_items_in_batch=None, student_lm_head_bias=None,
                            teacher_lm_head_bias=None, student_logit_scale=1.0,
                            teacher_logit_scale=1.0, student_final_logit_softcapping=None,
                            teacher_final_logit_softcapping=None, temperature=1.0):
    """TRL's DistillationTrainer loss (trl.trainer.distillation_trainer._chunked_divergence_loss,
    trl 1.16.0), same signature and returns, as one fused kdloss call:
    `distillation_trainer._chunked_divergence_loss = chunked_divergence_loss` (README, TRL).

    student_hidden_states (B, K, Hs), teacher_hidden_states (B, K, Ht): the backbones' outputs
    at the completion tokens; the LM heads (V, Hs) and (V, Ht) (DTensors gathered), biases [V]
    or None; completion_mask (B, K): the positions != 0 count. beta: 0 forward KL(teacher ||
    student), 1 reverse KL (TRL's default), else the generalized JSD (_trl_divergence). The
    logits are scale -> softcap -> temperature (kdloss_logit_map, then / T: TRL's order); a
    softcap of None is none; a logit scale of 0.0 is refused (kdloss reads 0 as "unset", TRL
    would zero the logits). Returns (loss, entropy_sum, n_valid): the divergence summed over the
    valid positions and divided by num_items_in_batch when given (an int or a tensor: the
    valid tokens of the global batch), else by max(1, n_valid); the student's entropy at T
    summed over the valid positions (float32, detached: TRL logs it, no gradient); n_valid,
    the valid positions (an int64 tensor). The entropy comes from the same C pass as the loss
    (return_entropy). Dtypes as TRL's: each head is used in its hidden states' dtype, and under
    torch.autocast both in the autocast dtype (functional's module docstring); kdloss forms the
    logits in its fp32 accumulator where TRL (since trl #6863) rounds them to bf16 first."""
    divergence, beta = _trl_divergence(beta)
    for name, scale in (("student_logit_scale", student_logit_scale),
                        ("teacher_logit_scale", teacher_logit_scale)):
        if scale is not None and float(scale) == 0.0:
            raise ValueError(f"{name}=0.0: kdloss's logit map reads a scale of 0 as unset (1)")
    ws, bs = _trl_head(student_lm_head_weight, student_lm_head_bias, student_hidden_states,
                       "student_lm_head")
    wt, bt = _trl_head(teacher_lm_head_weight, teacher_lm_head_bias, teacher_hidden_states,
                       "teacher_lm_head")
    valid = completion_mask.reshape(-1) != 0
    n_valid = valid.sum()
    # the mask as labels: a kept position gets a token id that is not ignore_index (the hard
    # loss has weight 0, so which id does not matter), a masked one ignore_index
    labels = torch.where(valid, 0, -100).to(torch.int64)
    loss, entropy = F.fused_linear_distill_loss(
        student_hidden_states, ws, teacher_hidden_states, wt, labels, bs, bt,
        divergence=divergence, beta=beta, weight_hard_loss=0.0, weight_soft_loss=1.0,
        temperature=temperature, num_items_in_batch=num_items_in_batch,
        student_logit_scale=student_logit_scale, student_softcap=student_final_logit_softcapping,
        teacher_logit_scale=teacher_logit_scale, teacher_softcap=teacher_final_logit_softcapping,
        return_entropy=True)
    return loss, entropy.double().sum().float(), n_valid


def _config_map(config, who):
    """(logit_scale, final_logit_softcapping) of a Hugging Face config (or None: the identity).
    A missing or None logit_scale is 1 (TRL #6629: Cohere's configs set it, others do not)."""
    if config is None:
        return 1.0, None
    scale = getattr(config, "logit_scale", None)
    cap = getattr(config, "final_logit_softcapping", None)
    if scale is not None and not isinstance(scale, (int, float)):
        raise TypeError(f"{who} config logit_scale={scale!r}: a number or None")
    if cap is not None and not isinstance(cap, (int, float)):
        raise TypeError(f"{who} config final_logit_softcapping={cap!r}: a number or None")
    return (1.0 if scale is None else float(scale)), (None if cap is None else float(cap))


def logit_map_kwargs(student_config=None, teacher_config=None):
    """The fused losses' logit-map keywords (student_logit_scale, student_softcap,
    teacher_logit_scale, teacher_softcap) from the two models' Hugging Face configs: each
    model's `logit_scale` (Cohere) and `final_logit_softcapping` (Gemma 2), so that a loss that
    reads lm_head.weight directly computes the logits the model's forward does (TRL #6629).
    Pass `model.config`, not a wrapper's (a DeepSpeed engine's .config is DeepSpeed's).

        loss_fn = FusedLinearDistillLoss(**logit_map_kwargs(student.config, teacher.config))
    """
    ss, sc = _config_map(student_config, "student")
    ts, tc = _config_map(teacher_config, "teacher")
    return {"student_logit_scale": ss, "student_softcap": sc, "teacher_logit_scale": ts,
            "teacher_softcap": tc}


def _check_temperature(t, what):
    t = float(t)
    if not (t > 0.0 and math.isfinite(t)):
        raise ValueError(f"{what}={t!r}: a finite temperature > 0")
    return t


def retemper(logprobs, valid, generation_temperature=1.0, training_temperature=1.0, *,
             renormalize=None):
    """Stored log-probs (..., K) generated at generation_temperature, as log-probs at
    training_temperature (module docstring): s * logprobs renormalized over the row's `valid`
    slots in log space, s = generation_temperature / training_temperature. renormalize: None
    (renormalize exactly when the temperatures differ), True or False (False with different
    temperatures raises: the result would not be log-probs of anything). Invalid slots get 0.
    Returns float32 (..., K)."""
    t_gen = _check_temperature(generation_temperature, "generation_temperature")
    t_train = _check_temperature(training_temperature, "training_temperature")
    if logprobs.shape != valid.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)} and mask {tuple(valid.shape)} "
                         "differ")
    if renormalize is None:
        renormalize = t_gen != t_train
    elif not renormalize and t_gen != t_train:
        raise ValueError("renormalize=False with generation_temperature != "
                         "training_temperature: the full-vocabulary normalizer of the "
                         "re-tempered log-probs is not known from K stored values")
    valid = valid.to(torch.bool)
    x = logprobs.double()
    if not renormalize:
        return torch.where(valid, x, torch.zeros_like(x)).float()
    x = torch.where(valid, x * (t_gen / t_train), torch.full_like(x, -math.inf))
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    _check_mass(lse, valid)
    out = torch.where(valid, x - lse, torch.zeros_like(x))  # rows with no valid slot: all 0
    return out.float()


def _check_mass(lse, valid):
    """ValueError naming the first row (flat index over the leading dims) that has kept slots
    but no mass to renormalize (every kept log-prob -inf, or NaN): its log-probs would be NaN."""
    bad = valid.any(dim=-1) & ~torch.isfinite(lse.squeeze(-1))
    if bool(bad.any()):
        r = int(bad.reshape(-1).nonzero()[0])
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(r), valid.shape[:-1])) \
            if valid.dim() > 1 else ()
        raise ValueError(f"row {r} (index {idx}): every kept log-prob is -inf (or one is NaN), "
                         "so the row cannot be re-tempered or renormalized; mask such slots out "
                         "or drop the row")


def _ids(ids):
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"token ids are {ids.dtype}; use an integer dtype")
    return ids if ids.dtype in (torch.int32, torch.int64) else ids.to(torch.int64)


def _check_unique(ids):
    """ValueError naming the first row (flat index over the leading dims) where a kept id
    repeats."""
    if ids.numel() == 0 or ids.shape[-1] < 2:
        return
    flat = ids.reshape(-1, ids.shape[-1])
    s, _ = flat.sort(dim=-1)
    dup = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)
    rows = dup.any(dim=-1).nonzero()
    if rows.numel():
        r = int(rows[0])
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(r), ids.shape[:-1]))
        raise ValueError(f"row {r} (index {idx}) repeats token id "
                         f"{int(s[r, 1:][dup[r]][0])}: kdloss takes each id once per row "
                         f"(ids {flat[r].tolist()})")


def _topk(ids, logprobs, valid, generation_temperature, training_temperature, renormalize,
          vocab_size):
    if ids.shape != logprobs.shape:
        raise ValueError(f"ids {tuple(ids.shape)} and log-probs {tuple(logprobs.shape)} differ")
    ids = _ids(ids)
    valid = valid.to(torch.bool) & (ids >= 0)
    if vocab_size is not None:
        bad = valid & (ids >= vocab_size)
        if bool(bad.any()):
            r = int(bad.reshape(-1, ids.shape[-1]).any(-1).nonzero()[0])
            raise ValueError(f"row {r}: token id >= vocab_size {vocab_size} "
                             f"(ids {ids.reshape(-1, ids.shape[-1])[r].tolist()})")
    out_ids = torch.where(valid, ids, torch.full_like(ids, -1))
    _check_unique(out_ids)
    lps = retemper(logprobs, valid, generation_temperature, training_temperature,
                   renormalize=renormalize)
    return out_ids, lps


def from_axolotl(target_token_ids, target_logprobs, target_mask, *, generation_temperature=1.0,
                 training_temperature=1.0, renormalize=None, vocab_size=None):
    """axolotl's stored KD teacher, (B, T, K) each: target_token_ids (int), target_logprobs
    (the teacher's log-probs at those ids, generated at generation_temperature) and target_mask
    (nonzero = a slot to use), as (teacher_ids, teacher_logprobs) for kdloss's top-k losses at
    training_temperature (the temperature= given to the kdloss loss). Masked slots get id -1.
    Re-tempering and renormalize: module docstring. vocab_size: when given, kept ids >= it
    raise ValueError naming the row. Align positions as for the student's logits (axolotl's
    targets are per label position)."""
    if target_mask.shape != target_token_ids.shape:
        raise ValueError(f"target_mask {tuple(target_mask.shape)} and target_token_ids "
                         f"{tuple(target_token_ids.shape)} differ")
    return _topk(target_token_ids, target_logprobs, target_mask != 0, generation_temperature,
                 training_temperature, renormalize, vocab_size)


def from_sparse(ids, values, mask=None, *, values_are="logprobs", generation_temperature=1.0,
                training_temperature=1.0, renormalize=None, vocab_size=None, pad_id=None):
    """A sparse top-k teacher as DistillKit-style tools store it: ids (..., K) and values
    (..., K) per position, unused slots marked by `mask` (nonzero = used), by ids < 0, or by
    `pad_id`. values_are: "logprobs" (the teacher's log-probs at generation_temperature, as
    from_axolotl) or "logits" (the teacher's raw logits at those ids: log-probs at
    training_temperature are then log_softmax(values / training_temperature) over the kept
    slots, the same renormalization over the kept ids, exact for the teacher conditioned on
    them; generation_temperature is not used). Returns (teacher_ids, teacher_logprobs) for
    kdloss's top-k losses at training_temperature."""
    if ids.shape != values.shape:
        raise ValueError(f"ids {tuple(ids.shape)} and values {tuple(values.shape)} differ")
    valid = torch.ones(ids.shape, dtype=torch.bool, device=ids.device) if mask is None \
        else mask != 0
    if pad_id is not None:
        valid = valid & (ids != pad_id)
    if values_are == "logprobs":
        return _topk(ids, values, valid, generation_temperature, training_temperature,
                     renormalize, vocab_size)
    if values_are == "logits":
        if renormalize is False:
            raise ValueError("values_are='logits' needs renormalize (the normalizer of K "
                             "logits is only known over the kept ids)")
        t_train = _check_temperature(training_temperature, "training_temperature")
        # logits / T = log-probs at T up to a per-row constant: retemper's renormalization with
        # s = 1 on values / T gives log_softmax over the kept slots
        return _topk(ids, values.double() / t_train, valid, 1.0, 1.0, True, vocab_size)
    raise ValueError(f"values_are={values_are!r}: 'logprobs' or 'logits'")
