"""nn.Module wrappers with Liger-Kernel's constructor arguments, defaults and forward signatures,
so `from kdloss.torch import JSD as LigerJSD` is a drop-in swap. See functional.py for the math.

The fused-linear loss modules take `process_group=None`: given a torch.distributed group, the
weights (and biases) passed to forward are this rank's block of a vocabulary-parallel LM head
(functional.py's module docstring has the contract). It is an attribute, not a constructor-only
setting: it can be changed later, and nothing about the group is cached.

The forward of every module here but KLDivLoss and JSD also takes `num_items_in_batch=`
(keyword): the non-ignored tokens of all the gradient-accumulation micro-batches of one step;
given, the loss is this call's sum divided by it (functional.py's docstrings; the HF Trainer
passes it to compute_loss).

Per-row weights and the student's entropy (functional.py's module docstring): the forward of
DistillLoss, TopKDistillLoss and every fused-linear loss module but FusedLinearJSD takes
`token_weights=` (keyword; a tensor with one weight per row, >= 0; no gradient reaches it), and
their constructors `return_entropy=False` (keyword, an attribute): True makes forward return
(loss, entropy), or (loss, soft, hard, entropy) with return_soft_hard_loss."""

import torch

from . import _args, _ops
from . import functional as F

__all__ = ["KLDivLoss", "JSD", "FusedLinearJSD", "FusedLinearJSDLoss", "DistillLoss",
           "FusedLinearDistillLoss", "TopKDistillLoss", "FusedLinearTopKDistillLoss"]


class KLDivLoss(torch.nn.KLDivLoss):
    """torch.nn.KLDivLoss computed by kdloss (loss and gradient in one pass).

    Arguments as Liger's LigerKLDIVLoss: `eps` comes first, then nn.KLDivLoss's own
    (size_average and reduce are the deprecated torch spellings of `reduction`).
    forward(y_pred, y_true): y_pred student log-probs, y_true target (log-)probs, same shape.
    "batchmean" divides by y_pred.size(0), as torch (B for a (B, T, V) input; kdloss before
    divided by B*T). The loss is float32 ("none": torch's promotion of the two dtypes).
    """

    def __init__(self, eps=1e-10, size_average=None, reduce=None, reduction="mean",
                 log_target=False):
        super().__init__(size_average=size_average, reduce=reduce, reduction=reduction,
                         log_target=log_target)
        F.reduction_code(self.reduction)  # fail at construction on an unknown reduction
        self.eps = eps

    def forward(self, y_pred, y_true):
        return F.kl_div(y_pred, y_true, reduction=self.reduction, log_target=self.log_target,
                        eps=self.eps)


class JSD(torch.nn.Module):
    """Generalized Jensen-Shannon divergence JSD(beta), as Liger's LigerJSD.
    forward(log_q, log_p, shift_labels=None): student log-probs first, teacher second. The loss
    is float32 whatever the inputs' dtypes (Liger's is in the input's dtype)."""

    def __init__(self, beta=0.5, ignore_index=-100):
        super().__init__()
        self.beta = beta
        self.ignore_index = ignore_index

    def forward(self, log_q, log_p, shift_labels=None):
        return F.jsd(log_q, log_p, shift_labels, self.beta, self.ignore_index)

    def extra_repr(self):
        return f"beta={self.beta}, ignore_index={self.ignore_index}"


class FusedLinearJSD(torch.nn.Module):
    """Fused LM head + JSD soft loss, as Liger's LigerFusedLinearJSD (no hard loss).
    forward(student_input, student_weight, teacher_input, teacher_weight, shift_labels=None).
    accum_dtype: accepted as Liger's (None or a floating dtype) and not needed: kdloss
    accumulates dW in fp32 across chunks whatever the weight's dtype, and the loss in double.
    memory_budget (keyword): the chunked workspace's bytes, 0 = the library's choice
    (functional.fused_linear_jsd). Without shift_labels every row counts."""

    def __init__(self, jsd_beta=0.5, ignore_index=-100, temperature=1.0, accum_dtype=None, *,
                 memory_budget=0):
        super().__init__()
        _args.check_temperature(temperature)
        F._check_accum_dtype(accum_dtype)
        self.jsd_beta = jsd_beta
        self.ignore_index = ignore_index
        self.temperature = temperature
        self.accum_dtype = accum_dtype
        self.memory_budget = F._budget(memory_budget)

    def forward(self, student_input, student_weight, teacher_input, teacher_weight,
                shift_labels=None, *, num_items_in_batch=None):
        return F.fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight,
                                  shift_labels, self.jsd_beta, self.ignore_index, self.temperature,
                                  self.accum_dtype, num_items_in_batch=num_items_in_batch,
                                  memory_budget=self.memory_budget)

    def extra_repr(self):
        return (f"jsd_beta={self.jsd_beta}, ignore_index={self.ignore_index}, "
                f"temperature={self.temperature}")


class FusedLinearJSDLoss(torch.nn.Module):
    """Chunked fused-linear distillation loss, as Liger's LigerFusedLinearJSDLoss:
    w_hard * CE + w_soft * JSD(beta) at temperature T, averaged over valid rows.
    `compiled` is accepted and ignored (there is nothing to compile). chunk_size: rows per
    chunk; None (the default; Liger's is 1024) lets the library pick it from memory_budget,
    a number given wins. memory_budget (keyword): the chunked workspace's bytes, 0 (the
    default) = the library's choice. process_group: the vocabulary-parallel group (module
    docstring). Logit maps: functional.fused_linear_jsd_loss (a scale of 0.0 acts as 1).
    forward(student_input, student_weight, teacher_input, teacher_weight, true_labels,
            student_bias=None, teacher_bias=None)."""

    def __init__(self, weight_hard_loss=0.5, weight_soft_loss=0.5, beta=0.5, ignore_index=-100,
                 temperature=1.0, compiled=True, chunk_size=None, return_soft_hard_loss=False,
                 process_group=None, *, student_logit_scale=1.0, student_softcap=None,
                 teacher_logit_scale=1.0, teacher_softcap=None, memory_budget=0,
                 return_entropy=False):
        super().__init__()
        _args.check_temperature(temperature)
        self.return_entropy = return_entropy
        self.memory_budget = F._budget(memory_budget)
        self.logit_maps = F._logit_map_keywords(student_logit_scale, student_softcap,
                                                teacher_logit_scale, teacher_softcap)
        self.weight_hard_loss = weight_hard_loss
        self.weight_soft_loss = weight_soft_loss
        self.beta = beta
        self.ignore_index = ignore_index
        self.temperature = temperature
        self.compiled = compiled
        self.chunk_size = chunk_size
        self.return_soft_hard_loss = return_soft_hard_loss
        self.process_group = process_group

    def forward(self, student_input, student_weight, teacher_input, teacher_weight, true_labels,
                student_bias=None, teacher_bias=None, *, num_items_in_batch=None,
                token_weights=None):
        return F.fused_linear_jsd_loss(
            student_input, student_weight, teacher_input, teacher_weight, true_labels,
            student_bias, teacher_bias, self.weight_hard_loss, self.weight_soft_loss, self.beta,
            self.ignore_index, self.temperature, self.compiled, self.chunk_size,
            self.return_soft_hard_loss, self.process_group,
            num_items_in_batch=num_items_in_batch, memory_budget=self.memory_budget,
            token_weights=token_weights, return_entropy=self.return_entropy, **self.logit_maps)

    def extra_repr(self):
        return (f"weight_hard_loss={self.weight_hard_loss}, "
                f"weight_soft_loss={self.weight_soft_loss}, beta={self.beta}, "
                f"ignore_index={self.ignore_index}, temperature={self.temperature}, "
                f"chunk_size={self.chunk_size}")


class DistillLoss(torch.nn.Module):
    """A divergence of the family between the tempered softmaxes of teacher and student logits
    (functional.distill_loss). forward(student_logits, teacher_logits, labels=None)."""

    def __init__(self, divergence="forward_kl", beta=0.5, alpha=0.1, temperature=1.0,
                 ignore_index=-100, reduction="batchmean", *, return_entropy=False):
        super().__init__()
        _args.check_names(divergence, beta, alpha)  # an unknown divergence fails here
        self.return_entropy = return_entropy
        self.divergence = divergence
        self.beta = beta
        self.alpha = alpha
        self.temperature = temperature
        self.ignore_index = ignore_index
        self.reduction = reduction

    def forward(self, student_logits, teacher_logits, labels=None, *, num_items_in_batch=None,
                token_weights=None):
        return F.distill_loss(student_logits, teacher_logits, labels, divergence=self.divergence,
                              beta=self.beta, alpha=self.alpha, temperature=self.temperature,
                              ignore_index=self.ignore_index, reduction=self.reduction,
                              num_items_in_batch=num_items_in_batch, token_weights=token_weights,
                              return_entropy=self.return_entropy)

    def extra_repr(self):
        return (f"divergence={self.divergence!r}, beta={self.beta}, alpha={self.alpha}, "
                f"temperature={self.temperature}, ignore_index={self.ignore_index}, "
                f"reduction={self.reduction!r}")


class FusedLinearDistillLoss(torch.nn.Module):
    """Fused LM head + distillation loss with any divergence of the family:
    (w_hard * CE_sum + w_soft * soft_sum * (T^2 if t2_scale else 1)) / max(1, n_kept).
    chunk_size None (or 0): the library's budgeted chunk. process_group: the
    vocabulary-parallel group (module docstring). student_logit_scale, student_softcap,
    teacher_logit_scale, teacher_softcap: the heads' logit maps (Cohere's logit_scale, Gemma 2's
    final_logit_softcapping; functional.fused_linear_jsd_loss; a scale of 0.0 acts as 1).
    memory_budget: the chunked workspace's bytes, 0 (the default) = the library's choice.
    forward(student_input, student_weight, teacher_input, teacher_weight, true_labels,
            student_bias=None, teacher_bias=None, *, num_items_in_batch=None,
            token_weights=None, teacher_index=None).
    Several teachers: teacher_weight a list of heads, teacher_bias None or a list of one
    entry (or None) per head, and teacher_index one head per row (functional.
    fused_linear_distill_loss, "Several teachers in one call"; CPU tensors, no
    process_group)."""

    def __init__(self, divergence="jsd", beta=0.5, alpha=0.1, weight_hard_loss=0.5,
                 weight_soft_loss=0.5, ignore_index=-100, temperature=1.0, t2_scale=False,
                 return_soft_hard_loss=False, chunk_size=None, process_group=None, *,
                 student_logit_scale=1.0, student_softcap=None, teacher_logit_scale=1.0,
                 teacher_softcap=None, memory_budget=0, return_entropy=False):
        super().__init__()
        self.return_entropy = return_entropy
        self.memory_budget = F._budget(memory_budget)
        self.logit_maps = F._logit_map_keywords(student_logit_scale, student_softcap,
                                                teacher_logit_scale, teacher_softcap)
        _args.check_names(divergence, beta, alpha)  # an unknown divergence fails here
        self.divergence = divergence
        self.beta = beta
        self.alpha = alpha
        self.weight_hard_loss = weight_hard_loss
        self.weight_soft_loss = weight_soft_loss
        self.ignore_index = ignore_index
        self.temperature = temperature
        self.t2_scale = t2_scale
        self.return_soft_hard_loss = return_soft_hard_loss
        self.chunk_size = chunk_size
        self.process_group = process_group

    def forward(self, student_input, student_weight, teacher_input, teacher_weight, true_labels,
                student_bias=None, teacher_bias=None, *, num_items_in_batch=None,
                token_weights=None, teacher_index=None):
        return F.fused_linear_distill_loss(
            student_input, student_weight, teacher_input, teacher_weight, true_labels,
            student_bias, teacher_bias, divergence=self.divergence, beta=self.beta,
            alpha=self.alpha, weight_hard_loss=self.weight_hard_loss,
            weight_soft_loss=self.weight_soft_loss, ignore_index=self.ignore_index,
            temperature=self.temperature, t2_scale=self.t2_scale, chunk_size=self.chunk_size,
            return_soft_hard_loss=self.return_soft_hard_loss, process_group=self.process_group,
            num_items_in_batch=num_items_in_batch, memory_budget=self.memory_budget,
            token_weights=token_weights, return_entropy=self.return_entropy,
            teacher_index=teacher_index, **self.logit_maps)

    def extra_repr(self):
        return (f"divergence={self.divergence!r}, beta={self.beta}, alpha={self.alpha}, "
                f"weight_hard_loss={self.weight_hard_loss}, "
                f"weight_soft_loss={self.weight_soft_loss}, ignore_index={self.ignore_index}, "
                f"temperature={self.temperature}, t2_scale={self.t2_scale}")



class _TopKModule(torch.nn.Module):
    """The sparse-teacher modules' shared part: the constructor's arguments are validated (an
    unknown divergence or tail mode fails here), kept as attributes (so they can be changed
    later) and passed to the functional form as keywords."""

    def __init__(self, **args):
        super().__init__()
        _args.check_names(args["divergence"], args["beta"], args["alpha"], args["tail"])
        self._arg_names = tuple(args)
        for name, value in args.items():
            setattr(self, name, value)

    def _args(self):
        return {name: getattr(self, name) for name in self._arg_names}

    def extra_repr(self):
        return ", ".join(f"{k}={v!r}" for k, v in self._args().items())


class TopKDistillLoss(_TopKModule):
    """A divergence of the family between a stored sparse top-k teacher and the student's tempered
    softmax (functional.topk_distill_loss, docs/MATH.md section 8).
    forward(student_logits, teacher_ids, teacher_logprobs, labels=None)."""

    def __init__(self, divergence="forward_kl", tail="bucket", beta=0.5, alpha=0.1,
                 temperature=1.0, ignore_index=-100, reduction="batchmean", *,
                 return_entropy=False):
        super().__init__(divergence=divergence, tail=tail, beta=beta, alpha=alpha,
                         temperature=temperature, ignore_index=ignore_index, reduction=reduction,
                         return_entropy=return_entropy)

    def forward(self, student_logits, teacher_ids, teacher_logprobs, labels=None, *,
                num_items_in_batch=None, token_weights=None):
        return F.topk_distill_loss(student_logits, teacher_ids, teacher_logprobs, labels,
                                   num_items_in_batch=num_items_in_batch,
                                   token_weights=token_weights, **self._args())


class FusedLinearTopKDistillLoss(_TopKModule):
    """Fused LM head + sparse top-k teacher loss (functional.fused_linear_topk_distill_loss):
    (w_hard * CE_sum + w_soft * soft_sum * (T^2 if t2_scale else 1)) / max(1, n_kept).
    process_group: the vocabulary-parallel group (module docstring; teacher_ids are global).
    chunk_size None (the default, or 0): the library's budgeted chunk; a number given wins.
    memory_budget: the chunked workspace's bytes, 0 (the default) = the library's choice.
    student_logit_scale 0.0 acts as 1.
    forward(student_input, student_weight, teacher_ids, teacher_logprobs, true_labels=None,
            student_bias=None); true_labels None keeps every row and needs weight_hard_loss 0."""

    def __init__(self, divergence="forward_kl", tail="bucket", beta=0.5, alpha=0.1,
                 weight_hard_loss=0.0, weight_soft_loss=1.0, ignore_index=-100, temperature=1.0,
                 t2_scale=False, process_group=None, chunk_size=None, *,
                 student_logit_scale=1.0, student_softcap=None, memory_budget=0,
                 return_entropy=False):
        super().__init__(divergence=divergence, tail=tail, beta=beta, alpha=alpha,
                         weight_hard_loss=weight_hard_loss, weight_soft_loss=weight_soft_loss,
                         ignore_index=ignore_index, temperature=temperature, t2_scale=t2_scale,
                         chunk_size=chunk_size, student_logit_scale=student_logit_scale,
                         student_softcap=student_softcap,
                         memory_budget=F._budget(memory_budget), return_entropy=return_entropy)
        F._maps(student_logit_scale, student_softcap)  # a non-number fails here
        self.process_group = process_group  # not one of _args(): a group has no useful repr

    def forward(self, student_input, student_weight, teacher_ids, teacher_logprobs,
                true_labels=None, student_bias=None, *, num_items_in_batch=None,
                token_weights=None):
        return F.fused_linear_topk_distill_loss(student_input, student_weight, teacher_ids,
                                                teacher_logprobs, true_labels, student_bias,
                                                process_group=self.process_group,
                                                num_items_in_batch=num_items_in_batch,
                                                token_weights=token_weights, **self._args())


# ---- fused losses declared by a spec -----------------------------------------------------------

DECLARED = {}  # spec name -> (functional form, module class) of each declare_fused() loss


class _SpecModule(torch.nn.Module):
    """The module of a spec-declared fused loss: its keywords (the spec's scalars,
    ignore_index, chunk_size, memory_budget, return_soft_hard_loss, process_group) are
    constructor arguments kept as attributes; forward takes the tensors as the functional
    form does, and num_items_in_batch."""

    _keywords = ()

    def __init__(self, **kwargs):
        super().__init__()
        unknown = sorted(set(kwargs) - {n for n, _ in self._keywords})
        if unknown:
            raise TypeError(f"{type(self).__name__}() got unexpected keyword(s) {unknown}")
        for name, default in self._keywords:
            setattr(self, name, kwargs.get(name, default))

    def forward(self, *tensors, num_items_in_batch=None, token_weights=None):
        kw = {n: getattr(self, n) for n, _ in self._keywords}
        return type(self)._fn(*tensors, num_items_in_batch=num_items_in_batch,
                              token_weights=token_weights, **kw)

    def extra_repr(self):
        return ", ".join(f"{n}={getattr(self, n)!r}" for n, _ in self._keywords
                         if n != "process_group")


def declare_fused(spec, module_name):
    """A fused LM-head loss from its one declaration, spec (a _calls.FusedSpec): its custom op
    kdloss::`spec.name` (_ops.define_fused), its functional form functional.`spec.name`_loss
    (functional.fused_form) and its module `module_name` (here), both also set as attributes
    of functional and of this module. Returns (function, module class)."""
    fn = F.fused_form(spec, _ops.define_fused(spec))
    keywords = tuple(spec.scalars) + (("ignore_index", -100), ("chunk_size", None),
                                      ("memory_budget", 0), ("return_soft_hard_loss", False),
                                      ("process_group", None), ("return_entropy", False))
    cls = type(module_name, (_SpecModule,), {
        "_fn": staticmethod(fn), "_keywords": keywords, "__module__": __name__,
        "__doc__": f"The module of functional.{fn.__name__} (declare_fused)."})
    setattr(F, fn.__name__, fn)
    globals()[module_name] = cls
    DECLARED[spec.name] = (fn, cls)
    return fn, cls
