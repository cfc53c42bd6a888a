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
dtype; the result is what the wider dtype gives. Autocast itself is not consulted (kdloss never
computes in less than its operands' precision). float64 is refused (KdlossError naming the
operand): cast it with .float().

DTensor arguments (FSDP2, tensor parallelism) are gathered with full_tensor(), which is
differentiable (the gradient goes back to the shards through DTensor's autograd), when the full
tensor takes at most half the free memory of its device; otherwise KdlossError (ERR_UNSUPPORTED)
says DTensor and points to process_group= (a vocabulary-sharded head: each rank's block,
.to_local(), with replicated hidden states). FSDP reduces across ranks the gradients of the
parameters it unsharded for its own forward: calling the loss inside the wrapped module's forward
gets that and needs no gather. A 1-D or empty LM head weight (an FSDP1 FlatParameter view or a
DeepSpeed ZeRO-3 placeholder seen outside the forward) raises KdlossError with that hint.

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

import functools

import torch

from .. import _lib
from .._lib import KdlossError
from ._backend import (as_rows, backend_for, cmat, float_code, is_dtensor, labels_view, out_mat,
                       ptr, same_device, scalar_out, topk_teacher, vocab_parallel)

__all__ = ["kl_div", "jsd", "distill_loss", "fused_linear_jsd", "fused_linear_jsd_loss",
           "fused_linear_distill_loss", "topk_distill_loss", "fused_linear_topk_distill_loss",
           "KLDivFunction", "JSDFunction", "FusedLinearJSDFunction", "FusedLinearJSDLossFunction"]

LOSS_DTYPE = torch.float32  # the dtype of every loss kdloss returns (module docstring)


def _free_bytes(device):
    """Free memory of `device` in bytes (None when unknown): MemAvailable for the CPU,
    cudaMemGetInfo for CUDA."""
    try:
        if device.type == "cuda":
            return torch.cuda.mem_get_info(device)[0]
        if device.type == "cpu":
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
    except (OSError, RuntimeError, ValueError):
        pass
    return None


def _gathered(t, what):
    """`t`, or for a DTensor its full tensor (full_tensor(): differentiable) when that takes at
    most half the free memory of its device; KdlossError(UNSUPPORTED) naming DTensor and
    process_group= otherwise."""
    if t is None or not is_dtensor(t):
        return t
    nbytes = t.numel() * t.element_size()
    local = t.to_local()
    free = _free_bytes(local.device)
    if free is not None and nbytes > free // 2:
        raise KdlossError(
            _lib.ERR_UNSUPPORTED,
            f"{what} is a DTensor {tuple(t.shape)} {t.dtype} with placements "
            f"{tuple(t.placements)} on {t.device_mesh}: gathering it with full_tensor() takes "
            f"{nbytes / 2**20:.0f} MiB, more than half of the {free / 2**20:.0f} MiB free on "
            f"{local.device}. For an LM head sharded by vocabulary rows (Shard(0)) pass each "
            f"rank's block ({what}.to_local()) with process_group=<the mesh's group> and the "
            "hidden states replicated over it; with FSDP2, call the loss inside the wrapped "
            "module's forward, where the weight is already unsharded")
    # The gradient back to the shards is the AVERAGE over the mesh of the ranks' gradients:
    # under FSDP2 / HSDP each rank's loss is its own batch's, and FSDP2 averages (its default
    # gradient divide factor; a custom factor set with set_gradient_divide_factor is not seen
    # here); under tensor parallelism every rank's gradient is the same, so the average changes
    # nothing. full_tensor()'s default (Replicate) would keep each rank's own, never reduced:
    # FSDP2 did not unshard this weight, so it reduces nothing either (tests/python/test_fsdp2.py).
    try:
        from torch.distributed.tensor import Partial
    except ImportError:  # torch 2.4
        from torch.distributed._tensor import Partial
    return t.full_tensor(grad_placements=[Partial("avg")] * t.device_mesh.ndim)


def _refuse_dtensors(*named):
    """KdlossError naming the DTensor among (name, tensor) pairs (as_rows's message), before an
    op would see it: the autograd Functions do not gather (the functional forms do)."""
    for name, t in named:
        if t is not None and is_dtensor(t):
            as_rows(t, name)


def _promoted(*tensors):
    """torch's type promotion over the given float tensors (None skipped)."""
    dt = None
    for t in tensors:
        if t is not None:
            dt = t.dtype if dt is None else torch.promote_types(dt, t.dtype)
    return dt


def _needs_grad(*tensors):
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _detached(t):
    """A tensor that receives no gradient (teachers, targets) as the ops get it: detached, so
    that one requiring grad neither records a graph nor gets a gradient (None stays None)."""
    return None if t is None else t.detach()


_NO_TAIL = object()


def _check_names(divergence, beta, alpha, tail=_NO_TAIL):
    """An unknown divergence (or tail) name raises KdlossError here, through the C lookup, as
    before the ops were there. Skipped while torch.compile / torch.export trace (no ctypes call
    in a graph): the op's implementation makes the same lookup and raises at run time."""
    if torch.compiler.is_compiling():
        return
    _lib.div_params(divergence, beta, alpha)
    if tail is not _NO_TAIL:
        _lib.topk_tail(tail)


def _traced(t):
    """True while `t` is being traced (torch.compile, torch.export, make_fx, FakeTensor): its
    value is then unknown, or reading it would freeze one value into the graph."""
    if torch.compiler.is_compiling() or type(t) is not torch.Tensor:
        return True
    if torch._is_functional_tensor(t):
        return True
    from torch.fx.experimental.proxy_tensor import get_proxy_mode
    return get_proxy_mode() is not None


def _scale(saved, grad_output):
    """saved * grad_output for a scalar loss, without a pass over `saved` when grad_output == 1
    (eager only: a traced grad_output is always multiplied)."""
    if saved is None:
        return None
    if grad_output.numel() == 1 and not _traced(grad_output) and float(grad_output) == 1.0:
        return saved
    return saved * grad_output.to(saved.dtype)


_TWICE = ("kdloss: these losses are differentiable once only (backward returns the gradient "
          "saved by forward, a constant); double backward, e.g. a gradient penalty through the "
          "loss, is not supported")


def _first_order_only(backward):
    """Marks an autograd backward first-order only, like torch's @once_differentiable, but also
    when the upstream gradient does not require grad: under create_graph=True every returned
    gradient gets a node that raises _TWICE if anything differentiates through it. That node's
    inputs are the tensors forward saved (the student inputs among them) and the upstream
    gradients, so torch.autograd.grad(..., inputs=x) reaches it too instead of pruning it and
    silently dropping the second-order term. (Plain @once_differentiable leaves gradients
    without a grad_fn when the upstream gradient is a constant: a gradient penalty then fails
    with a misleading "does not require grad" error.)"""
    @functools.wraps(backward)
    def wrapper(ctx, *grad_outputs):
        create_graph = torch.is_grad_enabled()
        with torch.no_grad():
            grads = backward(ctx, *grad_outputs)
        if not create_graph:
            return grads
        idx = [i for i, g in enumerate(grads) if isinstance(g, torch.Tensor)]
        anchors = [t for t in tuple(ctx.saved_tensors) + tuple(grad_outputs)
                   if isinstance(t, torch.Tensor) and t.requires_grad]
        if not idx:
            return grads
        if not anchors:  # nothing to differentiate through anyway; still mark the gradients
            anchors = [grads[idx[0]].detach().requires_grad_()]
        err = torch._C._functions.DelayedError(_TWICE.encode(), len(idx) + len(anchors))
        wrapped = err(*[grads[i] for i in idx], *anchors)
        out = list(grads)
        for i, w in zip(idx, wrapped):
            out[i] = w
        return tuple(out)
    return wrapper


def _shape_error(what):
    return KdlossError(_lib.ERR_SHAPE_MISMATCH, what)


# ---- a teacher with a larger (padded) vocabulary -------------------------------------------------

def _teacher_head(ws, wt, bt, vp=None):
    """(teacher_weight, teacher_bias) cut to the student's V rows. A teacher head with MORE rows
    than the student's (a padded vocabulary: Qwen2.5's 152064 against 151936) is used through
    its first V rows, as TRL slices the teacher's logits (TRL #3028): wt[:V] and bt[:V] are views
    (contiguous for a contiguous head), never copies. Fewer rows: KdlossError naming both shapes.
    With process_group (vocabulary-parallel blocks) the rows must match per rank: the blocks'
    split of a padded head need not be the student's."""
    _check_weight(ws, "student")
    _check_weight(wt, "teacher")
    v, vt = ws.shape[0], wt.shape[0]
    if vt == v:
        return wt, bt
    if vt < v or vp is not None:
        why = ("fewer rows: the teacher's head must cover the student's vocabulary (a teacher "
               "with MORE rows, a padded vocabulary, is used through its first V rows)"
               if vt < v else
               "different rows: with process_group each rank's teacher block must have its "
               "student block's rows (slice a padded teacher head before splitting it)")
        raise _shape_error(f"teacher_weight {tuple(wt.shape)} and student_weight "
                           f"{tuple(ws.shape)}: {why}")
    if bt is not None:
        if bt.numel() != vt:
            raise _shape_error(f"teacher_bias has {bt.numel()} elements, expected one per row "
                               f"of teacher_weight {tuple(wt.shape)}")
        bt = bt.reshape(vt)[:v]
    return wt[:v], bt


def _teacher_logits(zs, zt, fname):
    """teacher_logits cut to the student's V columns: teacher logits with MORE columns (a
    padded vocabulary) are used through their first V, as TRL slices them (TRL #3028). The slice
    zt[..., :V] is a strided view that goes to C with the teacher's own row stride (ld = its
    padded width), without a copy. Other shape differences: KdlossError naming both shapes."""
    if zs.shape == zt.shape:
        return zt
    if (zs.dim() == zt.dim() and zs.dim() > 0 and zs.shape[:-1] == zt.shape[:-1]
            and zt.shape[-1] > zs.shape[-1]):
        return zt[..., :zs.shape[-1]]
    raise _shape_error(f"{fname}: student_logits {tuple(zs.shape)} vs teacher_logits "
                       f"{tuple(zt.shape)} (the teacher may have more columns, a padded "
                       "vocabulary: its first V are used; nothing else may differ)")


# ---- gradient accumulation: num_items_in_batch ---------------------------------------------------

def _check_items(num_items_in_batch):
    """KdlossError for a Python number that is not > 0 (a tensor is not read: no sync)."""
    n = num_items_in_batch
    if n is None or isinstance(n, torch.Tensor):
        return
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not n > 0:
        raise KdlossError(_lib.ERR_INVALID_PARAM, f"num_items_in_batch={n!r}: a number > 0 "
                          "(or a tensor holding one), the non-ignored tokens of every "
                          "accumulation micro-batch together")


def _over_items(loss, num_items_in_batch, times=1.0):
    """loss / (num_items_in_batch * times), computed in double and returned in float32;
    differentiable (backward scales the saved gradient once)."""
    n = num_items_in_batch
    if isinstance(n, torch.Tensor):
        d = n.detach().to(device=loss.device, dtype=torch.float64) * times
    else:
        d = float(n) * times
    return (loss.double() / d).float()


def _kept_rows(labels, ignore_index, rows):
    """max(1, rows whose label != ignore_index) (all rows without labels): the divisor the fused
    losses' per-call mean used; a tensor (no sync) when labels are given."""
    if labels is None:
        return float(max(1, rows))
    return (labels.detach() != ignore_index).sum().clamp(min=1).double()


def _fused_over_items(results, labels, ignore_index, xs, num_items_in_batch):
    """The fused losses' (loss, soft, hard), each a per-call mean over the kept rows, turned
    into sums / num_items_in_batch (gradient accumulation: TRL #6006)."""
    if num_items_in_batch is None:
        return results
    kept = _kept_rows(labels, ignore_index, xs.numel() // max(1, xs.shape[-1]))
    return tuple(_over_items(r.double() * kept, num_items_in_batch) for r in results)


# ---- KL divergence ------------------------------------------------------------------------------

def reduction_code(reduction):
    code = _lib.REDUCTIONS.get(reduction)
    if code is None:
        raise KdlossError(_lib.ERR_INVALID_REDUCTION, f"reduction={reduction!r}")
    return code


def _kl_compute(y_pred, y_true, reduction, log_target, eps, want_grad):
    code = reduction_code(reduction)
    device = same_device([("input", y_pred), ("target", y_true)])
    if y_pred.shape != y_true.shape:
        raise _shape_error(f"kl_div: input {tuple(y_pred.shape)} vs target "
                           f"{tuple(y_true.shape)}")
    yp, bt, v, ldp = as_rows(y_pred, "input")
    yt, _, _, ldt = as_rows(y_true, "target")
    pc, tc = float_code(y_pred, "input"), float_code(y_true, "target")
    # batchmean divides by input.size(0) as torch does (B for a (B, T, V) input): the C
    # batchmean divides by the rows, so other shapes take the C sum scaled by 1 / size(0)
    scale = 1.0
    if code == _lib.REDUCTIONS["batchmean"] and y_pred.dim() != 2:
        code, scale = _lib.REDUCTIONS["sum"], 1.0 / max(1, y_pred.shape[0])
    params = _lib.kl_params(code, log_target, float(eps), scale)
    loss = elem = None
    if code == _lib.REDUCTIONS["none"]:
        elem = torch.empty(bt, v, dtype=torch.float32, device=device)
    else:
        loss = scalar_out(device)
    grad = torch.empty(bt, v, dtype=y_pred.dtype, device=device) if want_grad else None
    backend_for(device).kl_div(device, params, bt, v, cmat(yp, ldp, pc), cmat(yt, ldt, tc),
                               ptr(loss), None, out_mat(elem), out_mat(grad))
    if elem is None:  # the loss: fp32 whatever the dtypes
        out = loss[0] if scale == 1.0 else (loss[0].double() * scale).float()
    else:  # elementwise: torch's type promotion of input and target, as F.kl_div
        out = elem.view(y_pred.shape).to(_promoted(y_pred, y_true))
    return out, (grad.view(y_pred.shape) if grad is not None else None)


class KLDivFunction(torch.autograd.Function):
    """The KL divergence as an autograd Function with Liger's LigerKLDivLossFunction.apply
    signature: KLDivFunction.apply(y_pred, y_true, reduction="batchmean", log_target=False,
    eps=1e-10) (kl_div's semantics and dtypes; note Liger's default reduction here is
    batchmean, kl_div's and torch's is mean). The gradient is formed in forward."""

    @staticmethod
    def forward(ctx, y_pred, y_true, reduction="batchmean", log_target=False, eps=1e-10):
        reduction_code(reduction)
        _refuse_dtensors(("input", y_pred), ("target", y_true))
        out, grad = _ops.kl_div(y_pred, y_true, reduction, bool(log_target), float(eps),
                                ctx.needs_input_grad[0])  # the op: torch.compile traces it
        grad = _ops._saved(grad)
        ctx.elementwise = reduction == "none"
        ctx.save_for_backward(grad, y_pred)  # y_pred: for _first_order_only's error node
        return out

    @staticmethod
    @_first_order_only  # the saved gradient is a constant: no double backward
    def backward(ctx, grad_output):
        grad = ctx.saved_tensors[0]
        if ctx.elementwise:
            grad = grad * grad_output.to(grad.dtype)
        else:
            grad = _scale(grad, grad_output)
        return grad, None, None, None, None


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
    input, target = _gathered(input, "input"), _gathered(target, "target")
    reduction_code(reduction)  # an unknown reduction: KdlossError, before the op's str check
    return _ops.kl_div(input, _detached(target), reduction, bool(log_target), float(eps),
                       _needs_grad(input))[0]


# ---- JSD ----------------------------------------------------------------------------------------

def _jsd_compute(log_q, log_p, shift_labels, beta, ignore_index, want_grad):
    device = same_device([("input", log_q), ("target", log_p)])
    if log_q.shape != log_p.shape:
        raise _shape_error(f"jsd: input (log_q) {tuple(log_q.shape)} vs target (log_p) "
                           f"{tuple(log_p.shape)}")
    q, bt, v, ldq = as_rows(log_q, "input (log_q)")
    p, _, _, ldp = as_rows(log_p, "target (log_p)")
    qc, pc = float_code(log_q, "input (log_q)"), float_code(log_p, "target (log_p)")
    labels, lview = labels_view(shift_labels, bt, device, "shift_labels")
    params = _lib.jsd_params(float(beta), int(ignore_index))
    loss = scalar_out(device)
    grad = torch.empty(bt, v, dtype=log_q.dtype, device=device) if want_grad else None
    backend_for(device).jsd(device, params, bt, v, cmat(q, ldq, qc), cmat(p, ldp, pc), lview,
                            ptr(loss), None, out_mat(grad))
    return loss[0], (grad.view(log_q.shape) if grad is not None else None)  # loss: fp32


class JSDFunction(torch.autograd.Function):
    """JSD(beta) as an autograd Function with Liger's LigerJSDFunction.apply signature:
    JSDFunction.apply(input, target, shift_labels=None, beta=0.5, ignore_index=-100,
    jsd_impl=None, jsd_mode=None); jsd_impl / jsd_mode (Liger's kernel choice) are ignored.
    The gradient is formed in forward."""

    @staticmethod
    def forward(ctx, input, target, shift_labels=None, beta=0.5, ignore_index=-100,
                jsd_impl=None, jsd_mode=None):
        _refuse_dtensors(("input (log_q)", input), ("target (log_p)", target))
        out, grad = _ops.jsd(input, target, shift_labels, float(beta), int(ignore_index),
                             ctx.needs_input_grad[0])  # the op: torch.compile traces it
        grad = _ops._saved(grad)
        ctx.save_for_backward(grad, input)  # input: for _first_order_only's error node
        return out

    @staticmethod
    @_first_order_only  # the saved gradient is a constant: no double backward
    def backward(ctx, grad_output):
        grad = ctx.saved_tensors[0]
        return _scale(grad, grad_output), None, None, None, None, None, None


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
    input, target = _gathered(input, "input"), _gathered(target, "target")
    return _ops.jsd(input, _detached(target), shift_labels, float(beta), int(ignore_index),
                    _needs_grad(input))[0]


# ---- fused linear JSD -----------------------------------------------------------------------------

def _check_weight(w, who):
    """KdlossError unless the LM head weight is 2-D; a 1-D one (an FSDP1 flat parameter's view,
    a DeepSpeed ZeRO-3 placeholder of shape (0,)) gets a hint."""
    if w.dim() == 2:
        return
    msg = f"{who}_weight must be 2-D (V, H), got {tuple(w.shape)}"
    if w.dim() == 1:
        if hasattr(w, "ds_shape"):
            kind = f"a DeepSpeed ZeRO-3 partitioned parameter (full shape {tuple(w.ds_shape)})"
        elif type(w).__name__ == "FlatParameter":
            kind = "an FSDP1 FlatParameter"
        else:
            kind = ("a sharded parameter's local placeholder (an FSDP1 flat parameter's view, a "
                    "DeepSpeed ZeRO-3 partition)")
        msg += (f": this looks like {kind} seen outside the wrapped module's forward. Call the "
                "loss inside that forward, where the weight is gathered, or gather it first "
                "(FSDP.summon_full_params, deepspeed.zero.GatheredParameters); FSDP2 weights "
                "(DTensor) kdloss gathers itself")
    raise _shape_error(msg)


_NATIVE_LM_DTYPES = (torch.float32, torch.bfloat16)


def _lm_dtype(x, w, who):
    """The dtype one model's GEMMs run in: x's when x and w are both float32 or both bfloat16,
    else torch.promote_types(x, w) with float16 widened to float32 (module docstring: the
    narrower operand is then cast once per call)."""
    float_code(x, f"{who}_input")  # float64 or an integer dtype: refused, naming the operand
    float_code(w, f"{who}_weight")
    if x.dtype == w.dtype and x.dtype in _NATIVE_LM_DTYPES:
        return x.dtype
    dt = torch.promote_types(x.dtype, w.dtype)
    return torch.float32 if dt == torch.float16 else dt


def _lm_head(x, w, b, who):
    """C views of one model's hidden states x (..., H), LM head w (V, H) and bias b [V] or None,
    all in _lm_dtype(x, w) (the bias in the weight's, as the C API takes it). Returns (kept
    tensors, x view, w view, bias, rows, H, V); the kept tensors (x and w as (rows x H) and
    (V x H) in that dtype, the bias) must outlive the C call (they may be copies)."""
    _check_weight(w, who)
    v, h = w.shape
    if x.shape[-1] != h:
        raise _shape_error(f"{who}_input {tuple(x.shape)} / {who}_weight {tuple(w.shape)}: "
                           "hidden sizes differ")
    dt = _lm_dtype(x, w, who)
    x2, rows, _, ldx = as_rows(x.to(dt), f"{who}_input")
    w2, _, _, ldw = as_rows(w.to(dt), f"{who}_weight")
    xv = cmat(x2, ldx, float_code(x2, f"{who}_input"))
    wv = cmat(w2, ldw, float_code(w2, f"{who}_weight"))
    if b is not None:
        if b.numel() != v:
            raise _shape_error(f"{who}_bias has {b.numel()} elements, expected V={v}")
        b = b.reshape(v).to(dt).contiguous()
    return (x2, w2, b), xv, wv, b, rows, h, v


def _fused_outputs(want, xs, ws, bs, rows, want_hard=True):
    """Fresh outputs of a fused-linear call: loss, soft, hard ([1] fp32; hard zero and not passed
    to C unless want_hard) and the wanted gradients, with the FldOut that points at them. xs, ws:
    the operands as the C call sees them (_lm_head's kept tensors: the gradients' dtypes)."""
    device = xs.device
    v, hs = ws.shape
    loss, soft = scalar_out(device), scalar_out(device)
    hard = scalar_out(device) if want_hard else torch.zeros(1, device=device)
    dxs = torch.empty(rows, hs, dtype=xs.dtype, device=device) if want[0] else None
    dws = torch.empty(v, hs, dtype=ws.dtype, device=device) if want[1] else None
    dbs = torch.empty(v, dtype=ws.dtype, device=device) if want[2] and bs is not None else None
    out = _lib.FldOut(loss.data_ptr(), soft.data_ptr(), hard.data_ptr() if want_hard else None,
                      out_mat(dxs), out_mat(dws), ptr(dbs), None, None, None)
    return (loss, soft, hard, dxs, dws, dbs), out


def _fused_results(outputs, xs, ws, bs):
    """(loss, soft, hard, dxs, dws, dbs): losses fp32, gradients shaped like the caller's xs, ws,
    bs and in their dtypes (cast back once when _lm_head computed in another)."""
    loss, soft, hard, dxs, dws, dbs = outputs
    if dxs is not None:
        dxs = dxs.view(xs.shape).to(xs.dtype)
    if dws is not None:
        dws = dws.to(ws.dtype)
    if dbs is not None:
        dbs = dbs.to(bs.dtype).view(bs.shape)
    return loss[0], soft[0], hard[0], dxs, dws, dbs


def _fld_compute(xs, ws, xt, wt, labels, bs, bt_bias, div, temperature, w_hard, w_soft,
                 ignore_index, chunk_size, t2_scale, vp, want, maps=(1.0, 0.0, 1.0, 0.0)):
    """One kdloss_fused_linear_distill call (div: a _lib.DivParams; vp: a VocabParallel or
    None). `want` = (dxs, dws, dbs); maps: the heads' logit maps (_maps). Returns (loss, soft,
    hard, dxs, dws, dbs) with the gradients shaped like their inputs."""
    device = same_device([("student_input", xs), ("student_weight", ws), ("teacher_input", xt),
                          ("teacher_weight", wt), ("student_bias", bs), ("teacher_bias", bt_bias)])
    backend = backend_for(device, vp)
    wt, bt_bias = _teacher_head(ws, wt, bt_bias, vp)  # a padded teacher: its first V rows
    keep_s, xs_v, ws_v, bs2, rows, hs, v = _lm_head(xs, ws, bs, "student")
    keep_t, xt_v, wt_v, bt2, _, ht, vt = _lm_head(xt, wt, bt_bias, "teacher")
    if vt != v:
        raise _shape_error(f"student_weight has V={v} rows, teacher_weight {vt}")
    if xs.shape[:-1] != xt.shape[:-1]:
        raise _shape_error(f"student_input {tuple(xs.shape)} and teacher_input {tuple(xt.shape)} "
                           "have different token counts")
    if labels is None:  # pure soft loss without labels: every row counts, CE weight is 0
        labels = torch.zeros(rows, dtype=torch.int32, device=device)
    labels, lview = labels_view(labels, rows, device, "labels")
    params = _lib.fld_params(div, float(temperature), float(w_hard), float(w_soft),
                             int(ignore_index), int(chunk_size or 0), t2_scale, maps=maps)
    outputs, out = _fused_outputs(want, keep_s[0], keep_s[1], bs, rows)
    backend.fused_linear_distill(device, params, rows, hs, ht, v, xs_v, ws_v, ptr(bs2), xt_v,
                                 wt_v, ptr(bt2), lview, out, xs_v.dtype, any(want))
    return _fused_results(outputs, xs, ws, bs)


class _FusedLinearFunction(torch.autograd.Function):
    """Autograd of a fused-linear loss whose gradients `compute(want)` forms in forward:
    compute returns (loss, soft, hard, dxs, dws, dbs); backward only scales them."""

    @staticmethod
    def forward(ctx, xs, ws, bs, compute, want):
        loss, soft, hard, dxs, dws, dbs = compute(want)
        ctx.save_for_backward(dxs, dws, dbs, xs, ws, bs)  # inputs: for _first_order_only
        ctx.mark_non_differentiable(soft, hard)  # their gradients are not computed separately
        return loss, soft, hard

    @staticmethod
    @_first_order_only  # the saved gradients are constants: no double backward
    def backward(ctx, grad_loss, grad_soft, grad_hard):
        dxs, dws, dbs = ctx.saved_tensors[:3]
        return _scale(dxs, grad_loss), _scale(dws, grad_loss), _scale(dbs, grad_loss), None, None


def _wanted(xs, ws, bs):
    """Which of (dxs, dws, dbs) a fused loss must form: those of the student tensors that
    require grad, when grad mode is on."""
    grad_on = torch.is_grad_enabled()
    return (grad_on and xs.requires_grad, grad_on and ws.requires_grad,
            grad_on and bs is not None and bs.requires_grad)


def _fused_apply(xs, ws, bs, compute):
    """(loss, soft, hard) of compute(want), through autograd when a student tensor needs a
    gradient; want = which of (dxs, dws, dbs) to form (the vocabulary-parallel calls)."""
    want = _wanted(xs, ws, bs)
    if any(want):
        return _FusedLinearFunction.apply(xs, ws, bs, compute, want)
    return compute(want)[:3]


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


def _fld(xs, ws, xt, wt, labels, bs, bt_bias, beta, temperature, w_hard, w_soft, ignore_index,
         chunk_size, divergence="jsd", alpha=0.1, t2_scale=False, vp=None,
         maps=(1.0, 0.0, 1.0, 0.0)):
    if vp is None:  # one process: the custom op (torch.compile, torch.export, FakeTensor)
        _check_names(divergence, beta, alpha)
        return _ops.fused_linear_distill(
            xs, ws, _detached(xt), _detached(wt), labels, bs, _detached(bt_bias), divergence,
            float(beta), float(alpha), float(temperature), float(w_hard), float(w_soft),
            int(ignore_index), int(chunk_size or 0), bool(t2_scale), *_wanted(xs, ws, bs),
            *maps)[:3]
    div = _lib.div_params(divergence, beta, alpha)
    return _fused_apply(xs, ws, bs, functools.partial(
        _fld_compute, xs, ws, xt, wt, labels, bs, bt_bias, div, temperature, w_hard, w_soft,
        ignore_index, chunk_size, t2_scale, vp, maps=maps))


def _check_accum_dtype(accum_dtype):
    """Liger's accum_dtype (the dtype of its dW accumulation buffers): accepted, None or a
    floating torch.dtype, and otherwise unused: kdloss accumulates dW in fp32 across chunks
    whatever the weights' dtype (cast once at the end) and the losses in double."""
    if accum_dtype is not None and not (isinstance(accum_dtype, torch.dtype)
                                        and accum_dtype.is_floating_point):
        raise KdlossError(_lib.ERR_INVALID_DTYPE, f"accum_dtype={accum_dtype!r}: None or a "
                          "floating torch.dtype")


def _gather_all(process_group, named):
    """The tensors of `named` ((name, tensor) pairs) with every DTensor gathered (_gathered);
    with a process_group a DTensor is refused (the group's ranks pass their own blocks)."""
    out = []
    for name, t in named:
        if process_group is not None and is_dtensor(t):
            raise KdlossError(_lib.ERR_UNSUPPORTED,
                              f"{name} is a DTensor and process_group is given: pass this "
                              f"rank's block of rows ({name}.to_local()), not the DTensor")
        out.append(_gathered(t, name))
    return out


def fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight,
                     shift_labels=None, jsd_beta=0.5, ignore_index=-100, temperature=1.0,
                     accum_dtype=None, *, num_items_in_batch=None):
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
    add up to the full batch's. Cost: one multiply over the saved gradients in backward."""
    _check_accum_dtype(accum_dtype)
    _check_items(num_items_in_batch)
    xs, ws, xt, wt = _gather_all(None, [("student_input", student_input),
                                        ("student_weight", student_weight),
                                        ("teacher_input", teacher_input),
                                        ("teacher_weight", teacher_weight)])
    loss = _fld(xs, ws, xt, wt, shift_labels, None, None, jsd_beta, temperature, 0.0, 1.0,
                ignore_index, 0)[0]
    return _fused_over_items((loss,), shift_labels, ignore_index, xs, num_items_in_batch)[0]


class FusedLinearJSDFunction(torch.autograd.Function):
    """fused_linear_jsd as an autograd Function with the apply signature of Liger's
    liger_kernel.ops.fused_linear_jsd.LigerFusedLinearJSDFunction: apply(student_input,
    student_weight, teacher_input, teacher_weight, shift_labels=None, jsd_beta=0.5,
    ignore_index=-100, temperature=1.0, accum_dtype=None, jsd_impl=None, jsd_mode=None)
    (jsd_impl / jsd_mode, Liger's kernel choice, are ignored). The gradients are formed in
    forward. DTensors are not gathered here (the functional and module forms do it)."""

    @staticmethod
    def forward(ctx, student_input, student_weight, teacher_input, teacher_weight,
                shift_labels=None, jsd_beta=0.5, ignore_index=-100, temperature=1.0,
                accum_dtype=None, jsd_impl=None, jsd_mode=None):
        _check_accum_dtype(accum_dtype)
        _refuse_dtensors(("student_input", student_input), ("student_weight", student_weight),
                         ("teacher_input", teacher_input), ("teacher_weight", teacher_weight))
        loss, _, _, dxs, dws, _ = _ops.fused_linear_distill(  # the op: torch.compile traces it
            student_input, student_weight, teacher_input, teacher_weight, shift_labels, None,
            None, "jsd", float(jsd_beta), 0.1, float(temperature), 0.0, 1.0, int(ignore_index),
            0, False, ctx.needs_input_grad[0], ctx.needs_input_grad[1], False)
        dxs, dws = _ops._saved(dxs), _ops._saved(dws)
        ctx.save_for_backward(dxs, dws, student_input, student_weight)
        return loss

    @staticmethod
    @_first_order_only  # the saved gradients are constants: no double backward
    def backward(ctx, grad_output):
        dxs, dws = ctx.saved_tensors[:2]
        return (_scale(dxs, grad_output), _scale(dws, grad_output)) + (None,) * 9


# the vocabulary-parallel entry points (process_group) of the fused losses
_VP_DENSE, _VP_TOPK = "kdloss_fused_linear_distill_vp", "kdloss_fused_linear_topk_distill_vp"


def _require_labels(true_labels, weight_hard_loss):
    if true_labels is None and weight_hard_loss != 0:
        raise KdlossError(_lib.ERR_NULL_POINTER,
                          "true_labels is required when weight_hard_loss != 0")


def fused_linear_jsd_loss(student_input, student_weight, teacher_input, teacher_weight,
                          true_labels, student_bias=None, teacher_bias=None, weight_hard_loss=0.5,
                          weight_soft_loss=0.5, beta=0.5, ignore_index=-100, temperature=1.0,
                          compiled=True, chunk_size=None, return_soft_hard_loss=False,
                          process_group=None, *, num_items_in_batch=None,
                          student_logit_scale=1.0, student_softcap=None,
                          teacher_logit_scale=1.0, teacher_softcap=None):
    """Chunked fused-linear distillation loss (Liger's chunked LigerFusedLinearJSDLoss and its
    functional liger_kernel.chunked_loss.functional.liger_fused_linear_jsd, same positional
    order; docs/MATH.md section 4): w_hard * CE(student logits, labels) + w_soft * JSD(beta) of
    the tempered distributions, each averaged over the valid rows. Gradients for student_input,
    student_weight and student_bias. `compiled` is accepted for compatibility and ignored.
    `chunk_size` rows per chunk; None or 0 (the default: Liger's is 1024) lets the library pick
    it from its 256 MiB budget, a number given here wins. Returns the loss (float32), or (loss,
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
    teacher_config) reads them from Hugging Face configs."""
    maps = _maps(student_logit_scale, student_softcap, teacher_logit_scale, teacher_softcap)
    with vocab_parallel(process_group, _VP_DENSE) as vp:
        if temperature == 0:
            raise KdlossError(_lib.ERR_INVALID_PARAM, "temperature=0")
        _require_labels(true_labels, weight_hard_loss)
        _check_items(num_items_in_batch)
        xs, ws, xt, wt, bs, bt_bias = _gather_all(process_group, [
            ("student_input", student_input), ("student_weight", student_weight),
            ("teacher_input", teacher_input), ("teacher_weight", teacher_weight),
            ("student_bias", student_bias), ("teacher_bias", teacher_bias)])
        loss, soft, hard = _fld(xs, ws, xt, wt, true_labels, bs, bt_bias, beta, temperature,
                                weight_hard_loss, weight_soft_loss, ignore_index, chunk_size,
                                vp=vp, maps=maps)
    loss, soft, hard = _fused_over_items((loss, soft, hard), true_labels, ignore_index, xs,
                                         num_items_in_batch)
    return (loss, soft, hard) if return_soft_hard_loss else loss


class FusedLinearJSDLossFunction(torch.autograd.Function):
    """fused_linear_jsd_loss as an autograd Function with the apply signature of Liger's
    chunked liger_kernel.chunked_loss.jsd_loss.LigerFusedLinearJSDFunction: apply(student_input,
    student_weight, teacher_input, teacher_weight, true_labels, student_bias=None,
    teacher_bias=None, weight_hard_loss=0.5, weight_soft_loss=0.5, beta=0.5, ignore_index=-100,
    temperature=1.0, compiled=True, chunk_size=None, return_soft_hard_loss=False) (chunk_size
    None: the library's budgeted chunk). No process_group; DTensors are not gathered here (the
    functional and module forms do both)."""

    @staticmethod
    def forward(ctx, student_input, student_weight, teacher_input, teacher_weight, true_labels,
                student_bias=None, teacher_bias=None, weight_hard_loss=0.5, weight_soft_loss=0.5,
                beta=0.5, ignore_index=-100, temperature=1.0, compiled=True, chunk_size=None,
                return_soft_hard_loss=False):
        if temperature == 0:
            raise KdlossError(_lib.ERR_INVALID_PARAM, "temperature=0")
        _require_labels(true_labels, weight_hard_loss)
        need = ctx.needs_input_grad
        _refuse_dtensors(("student_input", student_input), ("student_weight", student_weight),
                         ("teacher_input", teacher_input), ("teacher_weight", teacher_weight),
                         ("student_bias", student_bias), ("teacher_bias", teacher_bias))
        loss, soft, hard, dxs, dws, dbs = _ops.fused_linear_distill(  # torch.compile traces it
            student_input, student_weight, teacher_input, teacher_weight, true_labels,
            student_bias, teacher_bias, "jsd", float(beta), 0.1, float(temperature),
            float(weight_hard_loss), float(weight_soft_loss), int(ignore_index),
            int(chunk_size or 0), False, need[0], need[1], student_bias is not None and need[5])
        dxs, dws, dbs = _ops._saved(dxs), _ops._saved(dws), _ops._saved(dbs)
        ctx.save_for_backward(dxs, dws, dbs, student_input, student_weight, student_bias)
        if not return_soft_hard_loss:
            return loss
        ctx.mark_non_differentiable(soft, hard)
        return loss, soft, hard

    @staticmethod
    @_first_order_only  # the saved gradients are constants: no double backward
    def backward(ctx, grad_loss, *grad_soft_hard):
        dxs, dws, dbs = ctx.saved_tensors[:3]
        return (_scale(dxs, grad_loss), _scale(dws, grad_loss), None, None, None,
                _scale(dbs, grad_loss)) + (None,) * 9


def fused_linear_distill_loss(student_input, student_weight, teacher_input, teacher_weight,
                              true_labels, student_bias=None, teacher_bias=None, *,
                              divergence="jsd", beta=0.5, alpha=0.1, weight_hard_loss=0.5,
                              weight_soft_loss=0.5, ignore_index=-100, temperature=1.0,
                              t2_scale=False, chunk_size=None, return_soft_hard_loss=False,
                              process_group=None, num_items_in_batch=None,
                              student_logit_scale=1.0, student_softcap=None,
                              teacher_logit_scale=1.0, teacher_softcap=None):
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
    maps, as fused_linear_jsd_loss's."""
    maps = _maps(student_logit_scale, student_softcap, teacher_logit_scale, teacher_softcap)
    with vocab_parallel(process_group, _VP_DENSE) as vp:
        _require_labels(true_labels, weight_hard_loss)
        _check_items(num_items_in_batch)
        xs, ws, xt, wt, bs, bt_bias = _gather_all(process_group, [
            ("student_input", student_input), ("student_weight", student_weight),
            ("teacher_input", teacher_input), ("teacher_weight", teacher_weight),
            ("student_bias", student_bias), ("teacher_bias", teacher_bias)])
        loss, soft, hard = _fld(xs, ws, xt, wt, true_labels, bs, bt_bias, beta, temperature,
                                weight_hard_loss, weight_soft_loss, ignore_index, chunk_size,
                                divergence, alpha, t2_scale, vp, maps)
    loss, soft, hard = _fused_over_items((loss, soft, hard), true_labels, ignore_index, xs,
                                         num_items_in_batch)
    return (loss, soft, hard) if return_soft_hard_loss else loss


# ---- distillation loss on logits ------------------------------------------------------------------

_DISTILL_REDUCTIONS = ("batchmean", "sum", "mean", "none")


def _check_distill_reduction(reduction, fname):
    if not (isinstance(reduction, str) and reduction in _DISTILL_REDUCTIONS):
        raise KdlossError(_lib.ERR_INVALID_REDUCTION, f"reduction={reduction!r} "
                          f"({fname} takes batchmean, sum, mean or none)")


def _logits_frame(zs, labels, ignore_index, reduction, device, fname):
    """The part every loss on student logits shares: the reduction check, the logits as a
    (bt x v) view, the labels, the reduction's divisor (None: the C call's own, max(1, n_kept))
    and the C grad_scale that makes the gradient the reduction's (the C gradient is scaled by
    grad_scale / max(1, n_kept)). Returns (kept tensors, logits view, bt, v, labels view,
    grad_scale, divisor).

    Divisors: batchmean with labels max(1, n_kept) (the per-token mean over the kept rows, as
    TRL's generalized_jsd_loss), without labels student_logits.size(0) (torch's batchmean: B for
    (B, T, V) logits, the rows for 2-D, 1 for 1-D); mean: the kept rows times V (every element, as torch's
    and TRL's mean); sum 1; none: per row, unscaled."""
    _check_distill_reduction(reduction, fname)
    zc = float_code(zs, "student_logits")
    zs2, bt, v, ldz = as_rows(zs.detach(), "student_logits")
    labels, lview = labels_view(labels, bt, device, "labels")
    n_kept = bt if labels is None else int((labels != ignore_index).sum())
    kept = max(1, n_kept)
    batch = zs.shape[0] if zs.dim() > 1 else 1  # 1-D logits: one row (one distribution)
    divisor = {"batchmean": kept if labels is not None else batch,
               "sum": 1, "mean": kept * v, "none": 1}[reduction]
    gscale = float(kept) / max(1, divisor)
    if reduction == "batchmean" and divisor == kept:
        divisor = None  # the C call's loss is already this one
    return (zs2, labels), cmat(zs2, ldz, zc), bt, v, lview, gscale, divisor


def _items_reduction(reduction, num_items_in_batch, zs, fname):
    """(the reduction the op computes, the factor of num_items_in_batch in the divisor, None
    when no num_items_in_batch): with one, the op sums and the caller divides."""
    if num_items_in_batch is None:
        return reduction, None
    _check_items(num_items_in_batch)
    if reduction == "none":
        raise KdlossError(_lib.ERR_INVALID_REDUCTION, f"{fname}: num_items_in_batch with "
                          "reduction='none' (per-row losses have no divisor)")
    return "sum", float(zs.shape[-1]) if reduction == "mean" else 1.0


def _reduced(loss, rows, reduction, divisor, zs):
    """The loss, float32 whatever zs's dtype, from the C call's loss (sum / max(1, kept)) or
    the row losses (reduced in double)."""
    if reduction == "none":
        return rows.view(zs.shape[:-1])
    if divisor is None:
        return loss[0]
    return (rows.double().sum() / max(1, divisor)).float()


def _distill_compute(zs, zt, labels, div, temperature, ignore_index, reduction, want_grad):
    """Returns (loss, dz or None): dz = dloss/dzs for upstream 1 ("none": per row, unscaled).
    Backends with distill_logits (the CPU's and the CUDA one's) make one call on the logits that
    writes dz in the student's dtype; others (a backend registered without it) get log-probs from
    torch, kdloss_distill and the chain rule here."""
    device = same_device([("student_logits", zs), ("teacher_logits", zt)])
    keep, zs_v, bt, v, lview, gscale, divisor = _logits_frame(zs, labels, ignore_index,
                                                              reduction, device, "distill_loss")
    zt = _teacher_logits(zs, zt, "distill_loss")  # a padded teacher: its first V columns
    tc = float_code(zt, "teacher_logits")
    backend = backend_for(device)
    zt2, _, _, ldt = as_rows(zt.detach(), "teacher_logits")
    loss, rows = scalar_out(device), torch.empty(bt, dtype=torch.float32, device=device)
    t = float(temperature)
    if hasattr(backend, "distill_logits"):
        params = _lib.distill_logits_params(div, t, int(ignore_index), gscale)
        g = torch.empty(bt, v, dtype=zs.dtype, device=device) if want_grad else None
        backend.distill_logits(device, params, bt, v, zs_v, cmat(zt2, ldt, tc), lview, ptr(loss),
                               ptr(rows), out_mat(g))
        dz = g.view(zs.shape) if g is not None else None
    else:
        if not t > 0.0 or t == float("inf"):  # NaN fails too; the C library's message
            raise KdlossError(_lib.ERR_INVALID_PARAM, f"temperature={temperature!r}")
        # log-probs in fp32; the divergence and its gradient in X come from one C pass
        x = torch.log_softmax(keep[0].float() / t, dim=-1)
        y = torch.log_softmax(zt2.float() / t, dim=-1)
        params = _lib.distill_params(div, int(ignore_index), gscale)
        g = torch.empty(bt, v, dtype=torch.float32, device=device) if want_grad else None
        backend.distill(device, params, bt, v, cmat(x, v, _lib.F32), cmat(y, v, _lib.F32), lview,
                        ptr(loss), ptr(rows), out_mat(g))
        dz = None
        if g is not None:  # chain rule of X = log_softmax(z / T): (g - softmax * sum(g)) / T
            dz = (g - x.exp() * g.sum(-1, keepdim=True)) / t
            dz = dz.to(zs.dtype).view(zs.shape)
    return _reduced(loss, rows, reduction, divisor, zs), dz


def distill_loss(student_logits, teacher_logits, labels=None, *, divergence="forward_kl", beta=0.5,
                 alpha=0.1, temperature=1.0, ignore_index=-100, reduction="batchmean",
                 num_items_in_batch=None):
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
    over the saved gradient in backward."""
    _check_names(divergence, beta, alpha)
    student_logits = _gathered(student_logits, "student_logits")
    teacher_logits = _gathered(teacher_logits, "teacher_logits")
    _check_distill_reduction(reduction, "distill_loss")
    reduction, times = _items_reduction(reduction, num_items_in_batch, student_logits,
                                        "distill_loss")
    loss = _ops.distill_loss(student_logits, _detached(teacher_logits), labels, divergence,
                             float(beta), float(alpha), float(temperature), int(ignore_index),
                             reduction, _needs_grad(student_logits))[0]
    return loss if times is None else _over_items(loss, num_items_in_batch, times)


# ---- sparse top-k teacher ------------------------------------------------------------------------

def _topk_compute(zs, ids, lps, labels, div, tail, temperature, ignore_index, reduction,
                  want_grad):
    """One kdloss_topk_distill_logits call: (loss, dz or None) as _distill_compute's."""
    device = same_device([("student_logits", zs), ("teacher_ids", ids),
                          ("teacher_logprobs", lps)])
    keep, zs_v, bt, v, lview, gscale, divisor = _logits_frame(
        zs, labels, ignore_index, reduction, device, "topk_distill_loss")
    keep_t, teacher = topk_teacher(ids, lps, zs.shape[:-1])
    params = _lib.topk_distill_params(div, tail, float(temperature), int(ignore_index), gscale)
    loss, rows = scalar_out(device), torch.empty(bt, dtype=torch.float32, device=device)
    g = torch.empty(bt, v, dtype=zs.dtype, device=device) if want_grad else None
    backend_for(device).topk_distill_logits(device, params, bt, v, zs_v, teacher, lview,
                                            ptr(loss), ptr(rows), out_mat(g))
    return _reduced(loss, rows, reduction, divisor, zs), (g.view(zs.shape) if g is not None
                                                         else None)


def topk_distill_loss(student_logits, teacher_ids, teacher_logprobs, labels=None, *,
                      divergence="forward_kl", tail="bucket", beta=0.5, alpha=0.1,
                      temperature=1.0, ignore_index=-100, reduction="batchmean",
                      num_items_in_batch=None):
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
    checked on the device instead: the loss is NaN, include/kdloss.h). num_items_in_batch: as
    distill_loss's (gradient accumulation)."""
    _check_names(divergence, beta, alpha, tail)
    student_logits = _gathered(student_logits, "student_logits")
    _check_distill_reduction(reduction, "topk_distill_loss")
    reduction, times = _items_reduction(reduction, num_items_in_batch, student_logits,
                                        "topk_distill_loss")
    loss = _ops.topk_distill_loss(student_logits, teacher_ids, _detached(teacher_logprobs),
                                  labels, divergence, tail, float(beta), float(alpha),
                                  float(temperature), int(ignore_index), reduction,
                                  _needs_grad(student_logits))[0]
    return loss if times is None else _over_items(loss, num_items_in_batch, times)


def _fltk_compute(xs, ws, ids, lps, labels, bs, div, tail, temperature, w_hard, w_soft,
                  ignore_index, chunk_size, t2_scale, want_hard, vp, want, student_map=(1.0, 0.0)):
    """One kdloss_fused_linear_topk_distill call; returns what _fld_compute does. labels None
    passes no labels (every row kept; the C call then needs w_hard 0 and no hard-loss output)."""
    device = same_device([("student_input", xs), ("student_weight", ws), ("teacher_ids", ids),
                          ("teacher_logprobs", lps), ("student_bias", bs)])
    backend = backend_for(device, vp)
    keep_s, xs_v, ws_v, bs2, rows, hs, v = _lm_head(xs, ws, bs, "student")
    keep_t, teacher = topk_teacher(ids, lps, xs.shape[:-1])
    labels, lview = labels_view(labels, rows, device, "true_labels")
    params = _lib.fltk_params(div, tail, float(temperature), float(w_hard), float(w_soft),
                              int(ignore_index), int(chunk_size or 0), t2_scale,
                              student_map=student_map)
    # the hard loss is asked for only when wanted: any cross-entropy output turns renorm_both's
    # sparse path (K gathered weight rows, no BT x V logits) off
    outputs, out = _fused_outputs(want, keep_s[0], keep_s[1], bs, rows,
                                  want_hard and labels is not None)
    backend.fused_linear_topk_distill(device, params, rows, hs, v, xs_v, ws_v, ptr(bs2), teacher,
                                      lview, out, xs_v.dtype, any(want))
    return _fused_results(outputs, xs, ws, bs)


def fused_linear_topk_distill_loss(student_input, student_weight, teacher_ids, teacher_logprobs,
                                   true_labels=None, student_bias=None, *,
                                   divergence="forward_kl", tail="bucket", beta=0.5, alpha=0.1,
                                   weight_hard_loss=0.0, weight_soft_loss=1.0, ignore_index=-100,
                                   temperature=1.0, t2_scale=False, chunk_size=None,
                                   return_soft_hard_loss=False, process_group=None,
                                   num_items_in_batch=None, student_logit_scale=1.0,
                                   student_softcap=None):
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
    renorm_both tail runs the full-vocabulary path (not the K-gathered-rows one)."""
    smap = _maps(student_logit_scale, student_softcap)[:2]
    with vocab_parallel(process_group, _VP_TOPK) as vp:
        _check_names(divergence, beta, alpha, tail)
        _check_items(num_items_in_batch)
        xs, ws, bs, ids, lps = _gather_all(process_group, [
            ("student_input", student_input), ("student_weight", student_weight),
            ("student_bias", student_bias), ("teacher_ids", teacher_ids),
            ("teacher_logprobs", teacher_logprobs)])
        if vp is None:  # one process: the custom op (torch.compile, torch.export, FakeTensor)
            loss, soft, hard = _ops.fused_linear_topk_distill(
                xs, ws, ids, _detached(lps), true_labels, bs, divergence, tail, float(beta),
                float(alpha), float(temperature), float(weight_hard_loss),
                float(weight_soft_loss), int(ignore_index), int(chunk_size or 0),
                bool(t2_scale), bool(return_soft_hard_loss), *_wanted(xs, ws, bs), *smap)[:3]
            loss, soft, hard = _fused_over_items((loss, soft, hard), true_labels, ignore_index,
                                                 xs, num_items_in_batch)
            return (loss, soft, hard) if return_soft_hard_loss else loss
        div = _lib.div_params(divergence, beta, alpha)
        code = _lib.topk_tail(tail)
        compute = functools.partial(
            _fltk_compute, xs, ws, ids, lps, true_labels, bs, div, code, temperature,
            weight_hard_loss, weight_soft_loss, ignore_index, chunk_size, t2_scale,
            return_soft_hard_loss, vp, student_map=smap)
        loss, soft, hard = _fused_apply(xs, ws, bs, compute)
    loss, soft, hard = _fused_over_items((loss, soft, hard), true_labels, ignore_index, xs,
                                         num_items_in_batch)
    return (loss, soft, hard) if return_soft_hard_loss else loss


from . import _ops  # noqa: E402  (the custom ops call this module's compute functions)
