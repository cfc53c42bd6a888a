"""Functional forms of the kdloss losses, with autograd.

Every loss makes ONE C call in forward that returns the loss and, when a gradient will be needed,
the gradient with respect to the student in the same pass. The gradient is kept for backward, which
only multiplies it by the upstream gradient (skipped when that is exactly 1). When no gradient can
be needed (torch.no_grad(), or no student tensor requires grad) the C call gets NULL gradient
outputs and does no gradient work at all.

Shapes follow Liger-Kernel: (B, T, V) inputs are treated as (B*T, V) rows and (B, T, H) hidden
states as (B*T, H); labels may be (B*T,) or (B, T). Teacher tensors (and the KL target) never
receive a gradient.

Dtypes. Every loss comes back as float32 whatever the inputs' dtypes (as torch's reductions and
Liger-Kernel's losses; the library computes in fp32 with double accumulation, and a half-precision
loss would overflow fp16 past 65504 or keep 3 significant digits in bf16). The one exception is
kl_div(reduction="none"), elementwise, whose output takes torch's type promotion of input and
target, as torch.nn.functional.kl_div's. Gradients come back in the dtype of the tensor they
belong to. The row losses (kl_div, jsd, distill_loss, topk_distill_loss) take float32, bfloat16
or float16 for each operand independently (mixed dtypes included), natively, without a copy.
The fused-linear losses take each model's (hidden states, LM head weight) pair natively when both
are float32 or both bfloat16; any other pair (float16, or mixed: bf16 activations with an fp32
head, as under CPU autocast) is cast ONCE per call to torch.promote_types of the two, float16
widened to float32. Cost: one copy of the narrower operand in that dtype (BT x H for the
activations, V x H for a head) and, for the student, its gradient cast back to the operand's
dtype; the result is what the wider dtype gives. Under torch.autocast (enabled for the
operands' device) the fused losses take the hidden states and LM heads in the autocast dtype,
as torch's matmul in the model's forward would: bfloat16 natively, float16 rounded to float16
and widened to float32 (the CPU GEMMs have no float16); biases stay as given. An autocast
caller thus gets the loss of its own low-precision logits (what TRL's DistillationTrainer loss
computes); without autocast nothing changes. The losses on logits take their logits as given.
float64 is refused (KdlossError naming the operand): cast it with .float().

Per-row weights and the student's entropy (include/kdloss.h, docs/MATH.md section 12): every
loss on logits (distill_loss, topk_distill_loss) and every fused loss takes token_weights=, a
floating tensor with one weight per row ((B, T) or (B*T,); cast once to float32), each finite
and >= 0: a row of weight 0 is ignored as a row whose label is ignore_index (it is not counted
in the mean's divisor), a row of weight w > 0 adds w times its loss and w times its gradients;
the divisor stays the count of the kept rows (weights of 0 and 1 are a mask). Weights are data:
they are detached, no gradient reaches them, whatever their requires_grad. return_entropy=True
makes the call return (result, entropy) where result is what it returns otherwise (the loss, or
(loss, soft, hard) with return_soft_hard_loss, flattened: (loss, soft, hard, entropy)) and
entropy is the student's entropy H(softmax(z / T)) per row in nats at the call's temperature
(after the logit map), float32, shaped like the rows (the student's leading dims), 0 on ignored
rows, from the same C pass as the loss, and without gradient (a detached tensor: it is for
logging). On the fused top-k loss it runs the full-vocabulary path.

DTensor arguments (FSDP2, tensor parallelism) are gathered with full_tensor(), which is
differentiable (the gradient goes back to the shards through DTensor's autograd), when the full
tensor takes at most half the free memory of its device; otherwise KdlossError (ERR_UNSUPPORTED)
says DTensor and points to process_group= (a vocabulary-sharded head: each rank's block,
.to_local(), with replicated hidden states). FSDP reduces across ranks the gradients of the
parameters it unsharded for its own forward: calling the loss inside the wrapped module's forward
gets that and needs no gather. A 1-D or empty LM head weight (an FSDP1 FlatParameter view or a
DeepSpeed ZeRO-3 placeholder seen outside the forward) raises KdlossError with that hint.

Several teachers in one call (docs/MATH.md section 13; kdloss_fused_linear_distill_multi), in
fused_linear_distill_loss and FusedLinearDistillLoss: teacher_weight a list or tuple of heads
[W_0, ..., W_{n-1}] (one vocabulary; each (>= V, Ht), a padded one used through its first V
rows as one head is), teacher_bias None or a list or tuple of one entry per head (a [V] bias,
or None: that head has none), and teacher_index= an integer tensor of one head per row ((B, T)
or (B*T,), values in [0, n)). Row r is distilled from head j = teacher_index[r] applied to
teacher_input's row r (each row's hidden state comes from its own teacher, so the teachers share
the hidden size Ht): zt_r = teacher_input_r @ W_j.T + b_j. Everything else is as with one head:
labels and ignore_index, token_weights, the mean over the kept rows of the whole batch,
num_items_in_batch, the logit maps (the teacher's shared by the heads), temperature, t2_scale,
every divergence, return_soft_hard_loss, return_entropy. So the result equals one single-head
call per teacher on its own rows (the others ignored), each loss and gradient weighted by its
teacher's share of the kept rows, summed. teacher_input and the heads are cast to one dtype as
one head and its input are (above); the gradients are the student's only (the teachers get
none, as one head gets none). teacher_index is copied once to host memory as int32 (the C call
decides on the host which rows share a teacher GEMM; for a device tensor the copy is a stream
synchronization); a value outside [0, n), in an ignored row too, raises
KdlossError(ERR_INVALID_ID) naming the row before anything is computed. Rows grouped by teacher
(a teacher per sequence) cost one teacher's GEMMs; rows alternating teachers cost a small GEMM
each. CPU tensors (kdloss_fused_linear_distill_multi) and CUDA tensors
(kdloss_cuda_fused_linear_distill_multi; simulator-tested, not yet run on a GPU); process_group
raises KdlossError(ERR_UNSUPPORTED) (its entry, kdloss_fused_linear_distill_vp, takes one head). teacher_index with a single teacher_weight
tensor, or a list without teacher_index, raises KdlossError; a single tensor without it is the
one-head call, unchanged. Names: the heads keep the one-head names (teacher_weight,
teacher_bias: a list where one tensor was, so a call is written the same way for one teacher or
several), and the row's head is teacher_index, not teacher_ids (the top-k losses' name for token
ids) nor teacher_weights (token_weights= weighs rows): an index into the list, as the C API's
kdloss_teacher_heads.index.

Vocabulary parallelism (docs/MATH.md section 9): the fused-linear losses take process_group, a
torch.distributed group whose ranks split the LM heads by vocabulary rows (CPU tensors with a
CPU-capable group such as gloo; CUDA tensors go to the kdloss_cuda_*_vp entry points, whose
all-reduces see device memory, on torch's current stream: NCCL, or gloo; that path has not run on
a GPU yet). The weights (and biases)
each rank passes are then its contiguous block of rows, blocks in rank order, sizes free: every
call all-gathers them, so nothing goes stale. Hidden states, labels and teachers are the same on
every rank, with global token ids. Every rank gets the same loss, the full student_input gradient
(already summed over the ranks inside the call: do not all-reduce it again) and the gradients of
its own weight and bias blocks; the results equal one process's on the concatenated heads. The
C call's collectives run through torch.distributed.all_reduce on the group. A rank whose
arguments are bad raises its own error and every other rank KdlossError(KDLOSS_ERR_PEER), even
when the error is found in Python before the C call.
"""

import inspect

import torch

from .. import _lib
from .._lib import KdlossError
from . import _args as A, _ops
from ._backend import is_dtensor, vocab_parallel
from ._calls import check_distill_reduction, reduction_code

__all__ = ["kl_div", "jsd", "distill_loss", "fused_linear_jsd", "fused_linear_jsd_loss",
           "fused_linear_distill_loss", "topk_distill_loss", "fused_linear_topk_distill_loss",
           "KLDivFunction", "JSDFunction", "FusedLinearJSDFunction", "FusedLinearJSDLossFunction"]

LOSS_DTYPE = torch.float32  # the dtype of every loss kdloss returns (module docstring)


# ---- KL divergence and JSD ------------------------------------------------------------------------

class KLDivFunction:
    """The KL divergence with Liger's LigerKLDivLossFunction.apply signature:
    KLDivFunction.apply(y_pred, y_true, reduction="batchmean", log_target=False, eps=1e-10)
    (kl_div's semantics and dtypes; note Liger's default reduction here is batchmean, kl_div's
    and torch's is mean). apply calls the kdloss::kl_div op, whose autograd is the only one
    (_ops.py); DTensors are refused here (kl_div gathers them)."""

    @staticmethod
    def apply(y_pred, y_true, reduction="batchmean", log_target=False, eps=1e-10):
        reduction_code(reduction)
        A.refuse_dtensors(("input", y_pred), ("target", y_true))
        return _ops.kl_div(y_pred, A.detached(y_true), reduction, bool(log_target), float(eps),
                           A.needs_grad(y_pred))[0]


_KLDivFunction = KLDivFunction  # the name before it was public


def _operands(fname, input, target, input_alias, target_alias):
    """input and target of `fname`, each given by Liger's name or by kdloss's earlier keyword
    (input_alias, target_alias: (name, value)); TypeError when one is given twice or missing."""
    (a_name, a), (t_name, t) = input_alias, target_alias
    if a is not None:
        if input is not None:
            raise TypeError(f"{fname}() got both input and {a_name}")
        input = a
    if t is not None:
        if target is not None:
            raise TypeError(f"{fname}() got both target and {t_name}")
        target = t
    if input is None or target is None:
        raise TypeError(f"{fname}() needs input and target")
    return input, target


def kl_div(input=None, target=None, size_average=None, reduce=None, reduction="mean",
           log_target=False, eps=1e-10, *, y_pred=None, y_true=None):
    """KL(target || exp(input)) with torch.nn.functional.kl_div semantics (docs/MATH.md
    section 2), in Liger's liger_kl_div positional order: kl_div(input, target, size_average,
    reduce, reduction="mean", log_target=False, eps=1e-10).

    input: (..., V) student log-probs; target: same shape, probabilities (or log-probs when
    log_target); y_pred= / y_true= are accepted for input / target (kdloss's earlier names).
    reduction: "none" (elementwise, the shape of input), "sum", "mean" (/ numel) or "batchmean"
    (/ input.size(0), as torch: B for a (B, T, V) input, where kdloss before divided by B*T; for
    the per-token KL pass the input as (B*T, V)). size_average / reduce are torch's deprecated
    spellings: None or True (Liger's placeholders, whose defaults are True) leave reduction as
    given, as liger_kl_div does; a False overrides it as in torch (reduce=False: "none",
    size_average=False: "sum"). For
    compatibility with kdloss's earlier kl_div(y_pred, y_true, reduction, log_target, eps), a
    string in the third position is the reduction and the two after it log_target and eps.
    Dtypes: float32, bfloat16, float16, each operand its own; the loss is float32 (a reduction)
    or torch's promotion of the two dtypes ("none"); the gradient is in input's dtype.
    Gradient flows to input only.
    """
    input, target = _operands("kl_div", input, target, ("y_pred", y_pred), ("y_true", y_true))
    if isinstance(size_average, str):  # kdloss's earlier positional form
        old_reduction = size_average
        if reduce is not None:
            log_target = reduce
        if not isinstance(reduction, str):
            eps = reduction
        reduction = old_reduction
    elif size_average is False or reduce is False:
        reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
    input, target = A.gathered(input, "input"), A.gathered(target, "target")
    reduction_code(reduction)  # an unknown reduction: KdlossError, before the op's str check
    return _ops.kl_div(input, A.detached(target), reduction, bool(log_target), float(eps),
                       A.needs_grad(input))[0]


class JSDFunction:
    """JSD(beta) with Liger's LigerJSDFunction.apply signature: JSDFunction.apply(input, target,
    shift_labels=None, beta=0.5, ignore_index=-100, jsd_impl=None, jsd_mode=None); jsd_impl /
    jsd_mode (Liger's kernel choice) are ignored. apply calls the kdloss::jsd op (the one
    autograd route); DTensors are refused here (jsd gathers them)."""

    @staticmethod
    def apply(input, target, shift_labels=None, beta=0.5, ignore_index=-100, jsd_impl=None,
              jsd_mode=None):
        A.refuse_dtensors(("input (log_q)", input), ("target (log_p)", target))
        return _ops.jsd(input, A.detached(target), shift_labels, float(beta), A.index(ignore_index),
                        A.needs_grad(input))[0]


_JSDFunction = JSDFunction  # the name before it was public


def jsd(input=None, target=None, shift_labels=None, beta=0.5, ignore_index=-100, *, log_q=None,
        log_p=None):
    """Generalized JSD(beta) between student log-probs `input` (log_q) and teacher log-probs
    `target` (log_p) (docs/MATH.md section 3), with Liger's liger_jsd signature: jsd(input,
    target, shift_labels=None, beta=0.5, ignore_index=-100); log_q= / log_p= are accepted for
    input / target (kdloss's earlier names, and LigerJSD.forward's). beta = 0 is KL(P||Q),
    beta = 1 is KL(Q||P). Row sums averaged over the rows whose shift_labels != ignore_index (all
    rows without labels). Each operand float32, bfloat16 or float16; the loss is float32
    (Liger's returns the input's dtype); the gradient, to input only, in input's dtype.
    """
    input, target = _operands("jsd", input, target, ("log_q", log_q), ("log_p", log_p))
    input, target = A.gathered(input, "input"), A.gathered(target, "target")
    return _ops.jsd(input, A.detached(target), shift_labels, float(beta), A.index(ignore_index),
                    A.needs_grad(input))[0]


# ---- fused linear losses --------------------------------------------------------------------------

def _wanted(xs, ws, bs):
    """Which of (dxs, dws, dbs) a fused loss must form: those of the student tensors that
    require grad, when grad mode is on."""
    grad_on = torch.is_grad_enabled()
    return (grad_on and xs.requires_grad, grad_on and ws.requires_grad,
            grad_on and bs is not None and bs.requires_grad)


def _maps(student_logit_scale=1.0, student_softcap=None, teacher_logit_scale=1.0,
          teacher_softcap=None):
    """The heads' logit maps as the C call and the custom ops take them: (student scale, student
    softcap, teacher scale, teacher softcap), floats; a softcap of None is 0.0 (none), a scale
    of None 1.0. z = softcap * tanh(scale * u / softcap), or scale * u (kdloss_logit_map)."""
    def num(x, none, name):
        if x is None:
            return none
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise KdlossError(_lib.ERR_INVALID_PARAM, f"{name}={x!r}: a number or None")
        return float(x)
    return (num(student_logit_scale, 1.0, "student_logit_scale"),
            num(student_softcap, 0.0, "student_softcap"),
            num(teacher_logit_scale, 1.0, "teacher_logit_scale"),
            num(teacher_softcap, 0.0, "teacher_softcap"))


def _logit_map_keywords(student_logit_scale=1.0, student_softcap=None, teacher_logit_scale=1.0,
                        teacher_softcap=None):
    """The four logit-map keywords as a dict (what the fused modules keep and pass on), checked
    by _maps here: a non-number fails when the module is built, not at its first call."""
    kw = dict(student_logit_scale=student_logit_scale, student_softcap=student_softcap,
              teacher_logit_scale=teacher_logit_scale, teacher_softcap=teacher_softcap)
    _maps(**kw)
    return kw


_MEMORY = ("memory_budget: bytes the call may use for its chunked workspace; 0 (the "
           "default) lets the library choose, as the C API's memory_budget 0")


def _budget(memory_budget):
    """memory_budget as the C API's size_t; KdlossError for a negative or non-integer one."""
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, int) \
            or not 0 <= memory_budget < 2**64:
        raise KdlossError(_lib.ERR_INVALID_PARAM, f"memory_budget={memory_budget!r}: an int "
                          ">= 0 (bytes; 0 lets the library choose)")
    return memory_budget


def _fld(xs, ws, xt, wt, labels, bs, bt_bias, beta, temperature, w_hard, w_soft, ignore_index,
         chunk_size, divergence="jsd", alpha=0.1, t2_scale=False, vp=None,
         maps=(1.0, 0.0, 1.0, 0.0), memory_budget=0, weights=None, want_entropy=False,
         index=None):
    """(loss, soft, hard, entropy) of one dense fused call through the
    kdloss::fused_linear_distill op (its autograd is the only one), with `vp` lent to it for a
    vocabulary-parallel call; entropy [rows] (the (0,) placeholder unless want_entropy). With
    `index` (several teachers: wt and bt_bias lists, _heads) the kdloss::fused_linear_distill_multi
    op instead, the same arguments but the vocabulary-parallel handle."""
    A.check_names(divergence, beta, alpha)
    if index is not None:
        out = _ops.fused_linear_distill_multi(
            xs, ws, A.detached(xt), [A.detached(w) for w in wt], labels, bs,
            [A.detached(b) for b in bt_bias], A.detached(index), divergence, float(beta),
            float(alpha), float(temperature), float(w_hard), float(w_soft), A.index(ignore_index),
            int(chunk_size or 0), bool(t2_scale), *_wanted(xs, ws, bs), *maps,
            _budget(memory_budget), A.detached(weights), bool(want_entropy))
        return out[:3] + (out[6],)
    with _ops.vocab_call(vp) as handle:
        out = _ops.fused_linear_distill(
            xs, ws, A.detached(xt), A.detached(wt), labels, bs, A.detached(bt_bias), divergence,
            float(beta), float(alpha), float(temperature), float(w_hard), float(w_soft),
            A.index(ignore_index), int(chunk_size or 0), bool(t2_scale), *_wanted(xs, ws, bs),
            *maps, _budget(memory_budget), handle, A.detached(weights), bool(want_entropy))
    return out[:3] + (out[6],)


def _check_accum_dtype(accum_dtype):
    """Liger's accum_dtype (the dtype of its dW accumulation buffers): accepted, None or a
    floating torch.dtype, and otherwise unused: kdloss accumulates dW in fp32 across chunks
    whatever the weights' dtype (cast once at the end) and the losses in double."""
    if accum_dtype is not None and not (isinstance(accum_dtype, torch.dtype)
                                        and accum_dtype.is_floating_point):
        raise KdlossError(_lib.ERR_INVALID_DTYPE, f"accum_dtype={accum_dtype!r}: None or a "
                          "floating torch.dtype")


def _gather_all(process_group, named):
    """The tensors of `named` ((name, tensor) pairs) with every DTensor gathered (A.gathered);
    with a process_group a DTensor is refused (the group's ranks pass their own blocks)."""
    out = []
    for name, t in named:
        if isinstance(t, list):  # several teachers' heads or biases: each gathered
            out.append([A.gathered(x, f"{name}[{j}]") for j, x in enumerate(t)])
            continue
        if process_group is not None and is_dtensor(t):
            raise KdlossError(_lib.ERR_UNSUPPORTED,
                              f"{name} is a DTensor and process_group is given: pass this "
                              f"rank's block of rows ({name}.to_local()), not the DTensor")
        out.append(A.gathered(t, name))
    return out


def fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight,
                     shift_labels=None, jsd_beta=0.5, ignore_index=-100, temperature=1.0,
                     accum_dtype=None, *, num_items_in_batch=None, memory_budget=0):
    """Pure soft distillation loss (Liger's liger_fused_linear_jsd / LigerFusedLinearJSD, same
    signature): JSD(jsd_beta) between log_softmax(student_input @ student_weight.T / T) and the
    teacher's, averaged over the rows whose shift_labels != ignore_index, without ever forming
    the full logits. Gradients for student_input and student_weight. accum_dtype: accepted for
    Liger's signature; kdloss accumulates in fp32 or better anyway (_check_accum_dtype). The
    loss is float32; dtypes, mixed operands and DTensors as in the module docstring. A teacher
    head with more rows than the student's (a padded vocabulary) is used through its first V
    rows (a view).
    num_items_in_batch (gradient accumulation, TRL #6006): the non-ignored tokens of ALL the
    micro-batches of one optimizer step together (an int, or a tensor as the HF Trainer passes
    it); given, the loss is the sum over this call's kept rows divided by it, instead of by this
    call's own kept rows (soft and hard alike), so that the micro-batches' losses and gradients
    add up to the full batch's. Cost: one multiply over the saved gradients in backward.
    Without shift_labels every row counts, whatever ignore_index is.
    memory_budget: bytes the call may use for its chunked workspace; 0 (the default) lets the
    library choose (the C API's memory_budget 0, include/kdloss.h); a chunk_size given wins."""
    _check_accum_dtype(accum_dtype)
    return _dense_call(_dense_named(student_input, student_weight, teacher_input, teacher_weight),
                       shift_labels, None, num_items_in_batch, False, beta=jsd_beta,
                       temperature=temperature, w_hard=0.0, w_soft=1.0,
                       ignore_index=ignore_index, chunk_size=0, memory_budget=memory_budget)


class FusedLinearJSDFunction:
    """fused_linear_jsd with the apply signature of Liger's
    liger_kernel.ops.fused_linear_jsd.LigerFusedLinearJSDFunction: apply(student_input,
    student_weight, teacher_input, teacher_weight, shift_labels=None, jsd_beta=0.5,
    ignore_index=-100, temperature=1.0, accum_dtype=None, jsd_impl=None, jsd_mode=None)
    (jsd_impl / jsd_mode, Liger's kernel choice, are ignored). apply calls the
    kdloss::fused_linear_distill op (the one autograd route). DTensors are not gathered here
    (the functional and module forms do it)."""

    @staticmethod
    def apply(student_input, student_weight, teacher_input, teacher_weight, shift_labels=None,
              jsd_beta=0.5, ignore_index=-100, temperature=1.0, accum_dtype=None, jsd_impl=None,
              jsd_mode=None):
        _check_accum_dtype(accum_dtype)
        A.refuse_dtensors(("student_input", student_input), ("student_weight", student_weight),
                         ("teacher_input", teacher_input), ("teacher_weight", teacher_weight))
        return _dense_call(_dense_named(student_input, student_weight, teacher_input,
                                        teacher_weight), shift_labels, None, None, False,
                           beta=jsd_beta, temperature=temperature, w_hard=0.0, w_soft=1.0,
                           ignore_index=ignore_index, chunk_size=0)


# the vocabulary-parallel entry points (process_group) of the fused losses
_VP_DENSE, _VP_TOPK = "kdloss_fused_linear_distill_vp", "kdloss_fused_linear_topk_distill_vp"


def _require_labels(true_labels, weight_hard_loss):
    if true_labels is None and weight_hard_loss != 0:
        raise KdlossError(_lib.ERR_NULL_POINTER,
                          "true_labels is required when weight_hard_loss != 0")


def _dense_named(xs, ws, xt, wt, bs=None, bt_bias=None):
    return [("student_input", xs), ("student_weight", ws), ("teacher_input", xt),
            ("teacher_weight", wt), ("student_bias", bs), ("teacher_bias", bt_bias)]


def _heads(named, index, process_group):
    """_dense_named's pairs with several teachers' heads made lists (docs/MATH.md section 13):
    teacher_weight a list or tuple of heads needs `index` (teacher_index=), and teacher_bias is
    then None (no biases) or a list or tuple of one entry per head, each a bias or None; a
    single teacher_weight tensor refuses `index`. Several heads with process_group raise: the
    C library's vocabulary-parallel entry takes one teacher head. No value is read (traced)."""
    t = dict(named)
    wt, bt = t["teacher_weight"], t["teacher_bias"]
    if not isinstance(wt, (list, tuple)):
        if index is not None:
            raise KdlossError(_lib.ERR_INVALID_PARAM, "teacher_index is given but teacher_weight "
                              "is one head: pass the heads as a list, teacher_weight=[w0, w1, "
                              "...], with teacher_index choosing one per row")
        return named
    if index is None:
        raise KdlossError(_lib.ERR_INVALID_PARAM, f"teacher_weight is a list of {len(wt)} heads "
                          "but teacher_index is not given (one head per row, in [0, "
                          f"{len(wt)}); fused_linear_distill_loss and FusedLinearDistillLoss "
                          "take it)")
    if not isinstance(index, torch.Tensor):
        raise KdlossError(_lib.ERR_INVALID_DTYPE, "teacher_index: an integer tensor of one head "
                          f"per row, not {type(index).__name__}")
    for j, w in enumerate(wt):
        if not isinstance(w, torch.Tensor):
            raise KdlossError(_lib.ERR_NULL_POINTER, f"teacher_weight[{j}] is "
                              f"{type(w).__name__}, not a tensor (a (V, Ht) head)")
    if isinstance(bt, torch.Tensor) or bt is not None and len(bt) != len(wt):
        raise KdlossError(_lib.ERR_INVALID_PARAM, f"teacher_bias with {len(wt)} teacher heads: "
                          "None, or a list of one bias (or None) per head")
    if process_group is not None:
        raise KdlossError(_lib.ERR_UNSUPPORTED, f"several teacher heads with process_group: "
                          f"the vocabulary-parallel entry ({_VP_DENSE}) takes one teacher head, "
                          "and kdloss has none for several (kdloss_fused_linear_distill_multi "
                          "is single-process)")
    t["teacher_weight"] = list(wt)
    t["teacher_bias"] = [None] * len(wt) if bt is None else list(bt)
    return list(t.items())


def _dense_call(named, labels, process_group, num_items_in_batch, soft_hard, refuse_t0=False,
                **fld):
    """The body of every dense fused loss: its checks inside the vocabulary-parallel context
    (a rank that fails lets its peers know), DTensors gathered, the operands cast as autocast
    would (module docstring), one _fld call (fld: its keywords, weights and want_entropy among
    them), then num_items_in_batch. Returns the loss, or (loss, soft, hard) when soft_hard,
    with the entropy after it when fld["want_entropy"] (A.with_entropy)."""
    with vocab_parallel(process_group, _VP_DENSE) as vp:
        named = _heads(named, fld.get("index"), process_group)
        if refuse_t0:
            A.check_temperature(fld["temperature"])
        _require_labels(labels, fld["w_hard"])
        A.check_items(num_items_in_batch)
        names = [n for n, _ in named]
        gathered = _gather_all(process_group, named)
        xs, ws, xt, wt, bs, bt_bias = (t for _, t in A.autocast_heads(list(zip(names,
                                                                              gathered))))
        *results, entropy = _fld(xs, ws, xt, wt, labels, bs, bt_bias, vp=vp, **fld)
    results = A.fused_over_items(tuple(results), labels, fld["ignore_index"], xs,
                                num_items_in_batch, fld.get("weights"))
    return A.with_entropy(results if soft_hard else results[0], entropy, xs.shape[:-1],
                         fld.get("want_entropy", False))


def fused_linear_jsd_loss(student_input, student_weight, teacher_input, teacher_weight,
                          true_labels, student_bias=None, teacher_bias=None, weight_hard_loss=0.5,
                          weight_soft_loss=0.5, beta=0.5, ignore_index=-100, temperature=1.0,
                          compiled=True, chunk_size=None, return_soft_hard_loss=False,
                          process_group=None, *, num_items_in_batch=None,
                          student_logit_scale=1.0, student_softcap=None,
                          teacher_logit_scale=1.0, teacher_softcap=None, memory_budget=0,
                          token_weights=None, return_entropy=False):
    """Chunked fused-linear distillation loss (Liger's chunked LigerFusedLinearJSDLoss and its
    functional liger_kernel.chunked_loss.functional.liger_fused_linear_jsd, same positional
    order; docs/MATH.md section 4): w_hard * CE(student logits, labels) + w_soft * JSD(beta) of
    the tempered distributions, each averaged over the valid rows. Gradients for student_input,
    student_weight and student_bias. `compiled` is accepted for compatibility and ignored.
    `chunk_size` rows per chunk; None or 0 (the default: Liger's is 1024) lets the library pick
    it from memory_budget, a number given here wins. Returns the loss (float32), or (loss,
    soft_loss, hard_loss) when return_soft_hard_loss. process_group: vocabulary-parallel LM heads
    (see the module docstring). A teacher head (and bias) with more rows than the student's (a
    padded vocabulary) is used through its first V rows (a view).
    num_items_in_batch (gradient accumulation, TRL #6006): the non-ignored tokens of ALL the
    micro-batches of one optimizer step together (an int, or a tensor as the HF Trainer passes
    it); given, the loss is the sum over this call's kept rows divided by it, instead of by this
    call's own kept rows (soft and hard alike), so that the micro-batches' losses and gradients
    add up to the full batch's. Cost: one multiply over the saved gradients in backward.
    student_logit_scale, student_softcap, teacher_logit_scale, teacher_softcap: each model's
    last step from its LM head to its logits, as its forward applies it (Cohere's logit_scale,
    Gemma 2's final_logit_softcapping; TRL #6629): logits = softcap * tanh(scale * (x W^T + b) /
    softcap), or scale * (x W^T + b) without a softcap (None), before the temperature; the
    gradients flow through it. kdloss.torch.adapters.logit_map_kwargs(student_config,
    teacher_config) reads them from Hugging Face configs. A scale of 0.0 acts as 1 (the C API's
    kdloss_logit_map: 0 is "unset"), as does None.
    memory_budget: bytes the call may use for its chunked workspace; 0 (the default) lets the
    library choose (the C API's memory_budget 0, include/kdloss.h); a chunk_size given wins.
    token_weights, return_entropy: per-row weights and the student's entropy (module
    docstring, "Per-row weights and the student's entropy")."""
    return _dense_call(
        _dense_named(student_input, student_weight, teacher_input, teacher_weight, student_bias,
                     teacher_bias), true_labels, process_group, num_items_in_batch,
        return_soft_hard_loss, True, beta=beta, temperature=temperature,
        w_hard=weight_hard_loss, w_soft=weight_soft_loss, ignore_index=ignore_index,
        chunk_size=chunk_size, maps=_maps(student_logit_scale, student_softcap,
                                          teacher_logit_scale, teacher_softcap),
        memory_budget=memory_budget, weights=token_weights, want_entropy=bool(return_entropy))


class FusedLinearJSDLossFunction:
    """fused_linear_jsd_loss with the apply signature of Liger's chunked
    liger_kernel.chunked_loss.jsd_loss.LigerFusedLinearJSDFunction: apply(student_input,
    student_weight, teacher_input, teacher_weight, true_labels, student_bias=None,
    teacher_bias=None, weight_hard_loss=0.5, weight_soft_loss=0.5, beta=0.5, ignore_index=-100,
    temperature=1.0, compiled=True, chunk_size=None, return_soft_hard_loss=False) (chunk_size
    None: the library's budgeted chunk). apply calls the kdloss::fused_linear_distill op (the
    one autograd route). No process_group; DTensors are not gathered here (the functional and
    module forms do both)."""

    @staticmethod
    def apply(student_input, student_weight, teacher_input, teacher_weight, true_labels,
              student_bias=None, teacher_bias=None, weight_hard_loss=0.5, weight_soft_loss=0.5,
              beta=0.5, ignore_index=-100, temperature=1.0, compiled=True, chunk_size=None,
              return_soft_hard_loss=False):
        named = _dense_named(student_input, student_weight, teacher_input, teacher_weight,
                             student_bias, teacher_bias)
        A.check_temperature(temperature)
        A.refuse_dtensors(*named)
        return _dense_call(named, true_labels, None, None, return_soft_hard_loss, beta=beta,
                           temperature=temperature, w_hard=weight_hard_loss,
                           w_soft=weight_soft_loss, ignore_index=ignore_index,
                           chunk_size=chunk_size)


def fused_linear_distill_loss(student_input, student_weight, teacher_input, teacher_weight,
                              true_labels, student_bias=None, teacher_bias=None, *,
                              divergence="jsd", beta=0.5, alpha=0.1, weight_hard_loss=0.5,
                              weight_soft_loss=0.5, ignore_index=-100, temperature=1.0,
                              t2_scale=False, chunk_size=None, return_soft_hard_loss=False,
                              process_group=None, num_items_in_batch=None,
                              student_logit_scale=1.0, student_softcap=None,
                              teacher_logit_scale=1.0, teacher_softcap=None, memory_budget=0,
                              token_weights=None, return_entropy=False, teacher_index=None):
    """The fused-linear distillation loss with any divergence of the family (docs/MATH.md
    sections 4 and 7): (w_hard * CE_sum + w_soft * soft_sum * (T^2 if t2_scale else 1)) /
    max(1, n_kept); CE on the untempered student logits, the divergence on the tempered ones, both
    over the rows whose label is not ignore_index. Returns the loss (float32), or (loss, soft,
    hard). chunk_size None or 0: the library's budgeted chunk. process_group:
    vocabulary-parallel LM heads (see the module docstring). A teacher head (and bias) with more
    rows than the student's (a padded vocabulary) is used through its first V rows (a view).
    num_items_in_batch (gradient accumulation, TRL #6006): the non-ignored tokens of ALL the
    micro-batches of one optimizer step together (an int, or a tensor as the HF Trainer passes
    it); given, the loss is the sum over this call's kept rows divided by it, instead of by this
    call's own kept rows (soft and hard alike), so that the micro-batches' losses and gradients
    add up to the full batch's. Cost: one multiply over the saved gradients in backward.
    student_logit_scale, student_softcap, teacher_logit_scale, teacher_softcap: the heads' logit
    maps, as fused_linear_jsd_loss's (a scale of 0.0 acts as 1). Without true_labels (and
    weight_hard_loss 0) every row counts, whatever ignore_index is, and hard_loss is 0.
    memory_budget: bytes the call may use for its chunked workspace; 0 (the default) lets the
    library choose (the C API's memory_budget 0, include/kdloss.h); a chunk_size given wins.
    token_weights, return_entropy: per-row weights and the student's entropy (module
    docstring, "Per-row weights and the student's entropy").

    teacher_index, and teacher_weight / teacher_bias as lists: several teachers in one call
    (module docstring, "Several teachers in one call")."""
    return _dense_call(
        _dense_named(student_input, student_weight, teacher_input, teacher_weight, student_bias,
                     teacher_bias), true_labels, process_group, num_items_in_batch,
        return_soft_hard_loss, beta=beta, temperature=temperature, w_hard=weight_hard_loss,
        w_soft=weight_soft_loss, ignore_index=ignore_index, chunk_size=chunk_size,
        divergence=divergence, alpha=alpha, t2_scale=t2_scale,
        maps=_maps(student_logit_scale, student_softcap, teacher_logit_scale, teacher_softcap),
        memory_budget=memory_budget, weights=token_weights, want_entropy=bool(return_entropy),
        index=teacher_index)


def _op_tensors(names, t, labels):
    """A spec op's tensor arguments in order: the teacher's detached (it gets no gradient)."""
    student = ("student_input", "student_weight", "student_bias")
    return [labels if n == "labels" else t[n] if n in student else A.detached(t[n])
            for n in names]


def fused_form(spec, op):
    """The functional form of a spec-declared fused loss (_calls.FusedSpec; op: its custom
    op): `spec.name`_loss(student_input, student_weight, <the teacher form's tensors>,
    labels=None, student_bias=None, *, <spec.scalars>, ignore_index=-100, chunk_size=None,
    memory_budget=0, return_soft_hard_loss=False, process_group=None,
    num_items_in_batch=None, token_weights=None, return_entropy=False), with the dense fused
    losses' conventions (module docstring)."""
    tensors, scalars, _ = _ops.spec_arguments(spec)
    teacher = spec.form.tensors
    P = inspect.Parameter
    params = [P(n, P.POSITIONAL_OR_KEYWORD) for n in tensors[:2] + tuple(
        t for t in teacher if t not in spec.form.optional)]
    params += [P(n, P.POSITIONAL_OR_KEYWORD, default=None)
               for n in ("labels", "student_bias") + spec.form.optional]
    params += [P(n, P.KEYWORD_ONLY, default=d) for n, d in spec.scalars + (
        ("ignore_index", -100), ("chunk_size", None), ("memory_budget", 0),
        ("return_soft_hard_loss", False), ("process_group", None),
        ("num_items_in_batch", None), ("token_weights", None), ("return_entropy", False))]
    sig = inspect.Signature(params)
    kinds = dict(spec.scalars)

    def loss(*args, **kwargs):
        a = sig.bind(*args, **kwargs)
        a.apply_defaults()
        a = a.arguments
        group = a["process_group"]
        with vocab_parallel(group, spec.c_name + "_vp") as vp:
            A.check_items(a["num_items_in_batch"])
            named = [(n, a[n]) for n in tensors if n != "labels"]
            names = [n for n, _ in named]
            t = dict(A.autocast_heads(list(zip(names, _gather_all(group, named)))))
            xs, ws, bs = t["student_input"], t["student_weight"], t["student_bias"]
            values = [type(kinds[n])(a[n]) for n, _ in spec.scalars]
            with _ops.vocab_call(vp) as handle:
                out = op(*_op_tensors(tensors, t, a["labels"]), *values,
                         A.index(a["ignore_index"]), int(a["chunk_size"] or 0),
                         _budget(a["memory_budget"]), *_wanted(xs, ws, bs), handle,
                         A.detached(a["token_weights"]), bool(a["return_entropy"]))
        results = A.fused_over_items(out[:3], a["labels"], a["ignore_index"], xs,
                                    a["num_items_in_batch"], a["token_weights"])
        return A.with_entropy(results if a["return_soft_hard_loss"] else results[0], out[6],
                             xs.shape[:-1], a["return_entropy"])
    loss.__name__ = loss.__qualname__ = spec.name + "_loss"
    loss.__signature__, loss.__doc__ = sig, spec.doc
    return loss


# ---- losses on logits -----------------------------------------------------------------------------

def _items_reduction(reduction, num_items_in_batch, zs, fname):
    """(the reduction the op computes, the factor of num_items_in_batch in the divisor, None
    when no num_items_in_batch): with one, the op sums and the caller divides."""
    if num_items_in_batch is None:
        return reduction, None
    A.check_items(num_items_in_batch)
    if reduction == "none":
        raise KdlossError(_lib.ERR_INVALID_REDUCTION, f"{fname}: num_items_in_batch with "
                          "reduction='none' (per-row losses have no divisor)")
    return "sum", float(zs.shape[-1]) if reduction == "mean" else 1.0


def distill_loss(student_logits, teacher_logits, labels=None, *, divergence="forward_kl", beta=0.5,
                 alpha=0.1, temperature=1.0, ignore_index=-100, reduction="batchmean",
                 num_items_in_batch=None, token_weights=None, return_entropy=False):
    """A divergence of the family (docs/MATH.md section 7) between softmax(teacher_logits / T)
    (P) and softmax(student_logits / T) (Q), per row over the last dim. divergence: one of
    kdloss._lib.divergences() (the C registry; beta and alpha as kdloss.h says). Rows whose label
    equals ignore_index are skipped. reduction (torch's and TRL's generalized_jsd_loss's
    meanings): "batchmean" with labels: sum over the kept rows / max(1, kept), the per-token
    mean; without labels: sum / student_logits.size(0), as torch's batchmean (B for (B, T, V)
    logits, where kdloss before divided by B*T; pass (B*T, V) logits for the per-token mean);
    "mean": sum / (kept rows * V), the mean over every element; "sum"; "none" (one loss per row,
    0 for skipped rows). Each operand float32, bfloat16 or float16; the loss (and the per-row
    losses of "none") float32. Gradient to student_logits only, in its dtype, formed in the
    forward pass. teacher_logits with more columns than the student's (a padded vocabulary, as
    Qwen2.5's 152064 against 151936) are used through their first V columns, as TRL slices them
    (TRL #3028): a strided view, passed with its row stride, no copy.
    num_items_in_batch (gradient accumulation, TRL #6006; TRL's generalized_jsd_loss takes the
    same): the non-ignored tokens of ALL the micro-batches of one optimizer step together (an
    int, or a tensor as the HF Trainer passes it). Given, it replaces this call's divisor: the
    loss is (sum over the kept rows) / num_items_in_batch for reduction "batchmean" (the
    default) and "sum" alike, (sum) / (num_items_in_batch * V) for "mean"; "none" refuses it.
    The micro-batches' losses and gradients then add up to the full batch's. Cost: one multiply
    over the saved gradient in backward.
    token_weights, return_entropy: per-row weights and the student's entropy (module docstring,
    "Per-row weights and the student's entropy"); with weights, "batchmean" and "mean" keep
    their divisors (the kept rows: label not ignored, weight > 0) and "none" returns each row's
    loss times its weight."""
    A.check_names(divergence, beta, alpha)
    student_logits = A.gathered(student_logits, "student_logits")
    teacher_logits = A.gathered(teacher_logits, "teacher_logits")
    check_distill_reduction(reduction, "distill_loss")
    reduction, times = _items_reduction(reduction, num_items_in_batch, student_logits,
                                        "distill_loss")
    loss, _, entropy = _ops.distill_loss(
        student_logits, A.detached(teacher_logits), labels, divergence, float(beta), float(alpha),
        float(temperature), A.index(ignore_index), reduction, A.needs_grad(student_logits),
        A.detached(token_weights), bool(return_entropy))
    loss = loss if times is None else A.over_items(loss, num_items_in_batch, times)
    return A.with_entropy(loss, entropy, student_logits.shape[:-1], return_entropy)


def topk_distill_loss(student_logits, teacher_ids, teacher_logprobs, labels=None, *,
                      divergence="forward_kl", tail="bucket", beta=0.5, alpha=0.1,
                      temperature=1.0, ignore_index=-100, reduction="batchmean",
                      num_items_in_batch=None, token_weights=None, return_entropy=False):
    """A divergence of the family between a sparse top-k teacher and softmax(student_logits / T)
    (docs/MATH.md section 8), per row over the last dim.

    teacher_ids (..., K) int32/int64: token ids in [0, V), -1 = unused slot (no id twice in a
    row); teacher_logprobs (..., K) float32/bfloat16/float16: the teacher's log-probs at those ids,
    normalized over the FULL vocabulary at the distillation temperature (log_softmax(teacher
    logits / T), then gathered; they are not re-tempered). tail: "bucket" (the used ids plus one
    bin for the rest of the vocabulary), "renorm_both" (both renormalized over the used ids) or
    "renorm_teacher" (the teacher renormalized, against the student's full log-probs; forward_kl
    only). divergence, beta, alpha, labels / ignore_index and reduction as distill_loss's. A row
    with no used slot contributes 0. Gradient to student_logits only, formed in the forward pass.
    Invalid ids or shapes raise KdlossError before anything is computed (on CUDA the ids are
    checked on the device instead: the loss is NaN, include/kdloss.h). num_items_in_batch,
    token_weights, return_entropy: as distill_loss's (the entropy over the full vocabulary)."""
    A.check_names(divergence, beta, alpha, tail)
    student_logits = A.gathered(student_logits, "student_logits")
    check_distill_reduction(reduction, "topk_distill_loss")
    reduction, times = _items_reduction(reduction, num_items_in_batch, student_logits,
                                        "topk_distill_loss")
    loss, _, entropy = _ops.topk_distill_loss(
        student_logits, teacher_ids, A.detached(teacher_logprobs), labels, divergence, tail,
        float(beta), float(alpha), float(temperature), A.index(ignore_index), reduction,
        A.needs_grad(student_logits), A.detached(token_weights), bool(return_entropy))
    loss = loss if times is None else A.over_items(loss, num_items_in_batch, times)
    return A.with_entropy(loss, entropy, student_logits.shape[:-1], return_entropy)


def fused_linear_topk_distill_loss(student_input, student_weight, teacher_ids, teacher_logprobs,
                                   true_labels=None, student_bias=None, *,
                                   divergence="forward_kl", tail="bucket", beta=0.5, alpha=0.1,
                                   weight_hard_loss=0.0, weight_soft_loss=1.0, ignore_index=-100,
                                   temperature=1.0, t2_scale=False, chunk_size=None,
                                   return_soft_hard_loss=False, process_group=None,
                                   num_items_in_batch=None, student_logit_scale=1.0,
                                   student_softcap=None, memory_budget=0, token_weights=None,
                                   return_entropy=False):
    """The fused LM head + sparse top-k teacher loss (docs/MATH.md sections 4 and 8): student
    logits zs = student_input @ student_weight.T + student_bias formed chunk by chunk, never in
    full; (w_hard * CE_sum + w_soft * soft_sum * (T^2 if t2_scale else 1)) / max(1, n_kept), CE on
    the untempered logits, the soft part as topk_distill_loss's on the tempered ones, over the
    rows whose true_label is not ignore_index (every row when true_labels is None, which needs
    weight_hard_loss 0). Gradients for student_input, student_weight and student_bias.
    Returns the loss (float32), or (loss, soft_loss, hard_loss) when return_soft_hard_loss
    (hard_loss 0 without labels). chunk_size None or 0: the library's budgeted chunk.
    process_group: vocabulary-parallel LM heads (see the module docstring; teacher_ids are
    global token ids, the same on every rank).
    num_items_in_batch (gradient accumulation, TRL #6006): the non-ignored tokens of ALL the
    micro-batches of one optimizer step together (an int, or a tensor as the HF Trainer passes
    it); given, the loss is the sum over this call's kept rows divided by it, instead of by this
    call's own kept rows (soft and hard alike), so that the micro-batches' losses and gradients
    add up to the full batch's. Cost: one multiply over the saved gradients in backward.
    student_logit_scale, student_softcap: the student head's logit map, as
    fused_linear_jsd_loss's (the teacher's log-probs come already mapped). With one, the
    renorm_both tail runs the full-vocabulary path (not the K-gathered-rows one). A scale of
    0.0 acts as 1, as does None.
    memory_budget: bytes the call may use for its chunked workspace; 0 (the default) lets the
    library choose (the C API's memory_budget 0, include/kdloss.h); a chunk_size given wins.
    token_weights, return_entropy: per-row weights and the student's entropy (module
    docstring; the entropy runs the full-vocabulary path)."""
    smap = _maps(student_logit_scale, student_softcap)[:2]
    with vocab_parallel(process_group, _VP_TOPK) as vp:
        A.check_names(divergence, beta, alpha, tail)
        A.check_items(num_items_in_batch)
        names = ("student_input", "student_weight", "student_bias", "teacher_ids",
                 "teacher_logprobs")
        gathered = _gather_all(process_group, list(zip(names, (
            student_input, student_weight, student_bias, teacher_ids, teacher_logprobs))))
        xs, ws, bs, ids, lps = (t for _, t in A.autocast_heads(list(zip(names, gathered))))
        with _ops.vocab_call(vp) as handle:  # the op: its autograd is the only one
            out = _ops.fused_linear_topk_distill(
                xs, ws, ids, A.detached(lps), true_labels, bs, divergence, tail, float(beta),
                float(alpha), float(temperature), float(weight_hard_loss),
                float(weight_soft_loss), A.index(ignore_index), int(chunk_size or 0),
                bool(t2_scale), bool(return_soft_hard_loss), *_wanted(xs, ws, bs), *smap,
                _budget(memory_budget), handle, A.detached(token_weights), bool(return_entropy))
    loss, soft, hard = A.fused_over_items(out[:3], true_labels, ignore_index, xs,
                                         num_items_in_batch, token_weights)
    return A.with_entropy((loss, soft, hard) if return_soft_hard_loss else loss, out[6],
                         xs.shape[:-1], return_entropy)
