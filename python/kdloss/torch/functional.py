"""Functional forms of the kdloss losses, with autograd.

Every loss makes ONE C call in forward that returns the loss and, when a gradient will be needed,
the gradient with respect to the student in the same pass. The gradient is kept for backward, which
only multiplies it by the upstream gradient (skipped when that is exactly 1). When no gradient can
be needed (torch.no_grad(), or no student tensor requires grad) the C call gets NULL gradient
outputs and does no gradient work at all.

Shapes follow Liger-Kernel: (B, T, V) inputs are treated as (B*T, V) rows and (B, T, H) hidden
states as (B*T, H); labels may be (B*T,) or (B, T). Teacher tensors (and the KL target) never
receive a gradient. Losses come back in the student's dtype (PyTorch's convention); they are
computed in fp32 with double accumulation by the library.

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
from ._backend import (as_rows, backend_for, cmat, float_code, labels_view, out_mat, ptr,
                       same_device, scalar_out, topk_teacher, vocab_parallel)

__all__ = ["kl_div", "jsd", "distill_loss", "fused_linear_jsd", "fused_linear_jsd_loss",
           "fused_linear_distill_loss", "topk_distill_loss", "fused_linear_topk_distill_loss"]


def _needs_grad(*tensors):
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _scale(saved, grad_output):
    """saved * grad_output for a scalar loss, without a pass over `saved` when grad_output == 1."""
    if saved is None:
        return None
    if grad_output.numel() == 1 and float(grad_output) == 1.0:
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


# ---- KL divergence ------------------------------------------------------------------------------

def reduction_code(reduction):
    code = _lib.REDUCTIONS.get(reduction)
    if code is None:
        raise KdlossError(_lib.ERR_INVALID_REDUCTION, f"reduction={reduction!r}")
    return code


def _kl_compute(y_pred, y_true, reduction, log_target, eps, want_grad):
    code = reduction_code(reduction)
    device = same_device([("y_pred", y_pred), ("y_true", y_true)])
    if y_pred.shape != y_true.shape:
        raise _shape_error(f"kl_div: y_pred {tuple(y_pred.shape)} vs y_true {tuple(y_true.shape)}")
    yp, bt, v, ldp = as_rows(y_pred, "y_pred")
    yt, _, _, ldt = as_rows(y_true, "y_true")
    pc, tc = float_code(y_pred, "y_pred"), float_code(y_true, "y_true")
    params = _lib.kl_params(code, log_target, float(eps))
    loss = elem = None
    if code == _lib.REDUCTIONS["none"]:
        elem = torch.empty(bt, v, dtype=torch.float32, device=device)
    else:
        loss = scalar_out(device)
    grad = torch.empty(bt, v, dtype=y_pred.dtype, device=device) if want_grad else None
    backend_for(device).kl_div(device, params, bt, v, cmat(yp, ldp, pc), cmat(yt, ldt, tc),
                               ptr(loss), None, out_mat(elem), out_mat(grad))
    out = loss[0] if elem is None else elem.view(y_pred.shape)
    out = out.to(y_pred.dtype)
    return out, (grad.view(y_pred.shape) if grad is not None else None)


class _KLDivFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y_pred, y_true, reduction, log_target, eps):
        out, grad = _kl_compute(y_pred, y_true, reduction, log_target, eps, want_grad=True)
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


def kl_div(y_pred, y_true, reduction="mean", log_target=False, eps=1e-10):
    """KL(y_true || exp(y_pred)) with torch.nn.KLDivLoss semantics (docs/MATH.md section 2).

    y_pred: (..., V) student log-probs; y_true: same shape, probabilities (or log-probs when
    log_target). reduction: "none" (loss of y_pred's shape), "sum", "mean" (/ numel) or
    "batchmean" (/ number of rows, i.e. B*T for a (B, T, V) input: the per-token KL; torch's own
    nn.KLDivLoss divides by size(0) instead). Gradient flows to y_pred only.
    """
    if _needs_grad(y_pred):
        return _KLDivFunction.apply(y_pred, y_true, reduction, log_target, eps)
    return _kl_compute(y_pred, y_true, reduction, log_target, eps, want_grad=False)[0]


# ---- JSD ----------------------------------------------------------------------------------------

def _jsd_compute(log_q, log_p, shift_labels, beta, ignore_index, want_grad):
    device = same_device([("log_q", log_q), ("log_p", log_p)])
    if log_q.shape != log_p.shape:
        raise _shape_error(f"jsd: log_q {tuple(log_q.shape)} vs log_p {tuple(log_p.shape)}")
    q, bt, v, ldq = as_rows(log_q, "log_q")
    p, _, _, ldp = as_rows(log_p, "log_p")
    qc, pc = float_code(log_q, "log_q"), float_code(log_p, "log_p")
    labels, lview = labels_view(shift_labels, bt, device, "shift_labels")
    params = _lib.jsd_params(float(beta), int(ignore_index))
    loss = scalar_out(device)
    grad = torch.empty(bt, v, dtype=log_q.dtype, device=device) if want_grad else None
    backend_for(device).jsd(device, params, bt, v, cmat(q, ldq, qc), cmat(p, ldp, pc), lview,
                            ptr(loss), None, out_mat(grad))
    out = loss[0].to(log_q.dtype)
    return out, (grad.view(log_q.shape) if grad is not None else None)


class _JSDFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, log_q, log_p, shift_labels, beta, ignore_index):
        out, grad = _jsd_compute(log_q, log_p, shift_labels, beta, ignore_index, want_grad=True)
        ctx.save_for_backward(grad, log_q)  # log_q: for _first_order_only's error node
        return out

    @staticmethod
    @_first_order_only  # the saved gradient is a constant: no double backward
    def backward(ctx, grad_output):
        grad = ctx.saved_tensors[0]
        return _scale(grad, grad_output), None, None, None, None


def jsd(log_q, log_p, shift_labels=None, beta=0.5, ignore_index=-100):
    """Generalized JSD(beta) between student log-probs `log_q` and teacher log-probs `log_p`
    (docs/MATH.md section 3): beta = 0 is KL(P||Q), beta = 1 is KL(Q||P). Row sums averaged over
    the rows whose shift_labels != ignore_index (all rows without labels). Gradient to log_q only.
    """
    if _needs_grad(log_q):
        return _JSDFunction.apply(log_q, log_p, shift_labels, beta, ignore_index)
    return _jsd_compute(log_q, log_p, shift_labels, beta, ignore_index, want_grad=False)[0]


# ---- fused linear JSD -----------------------------------------------------------------------------

def _lm_head(x, w, b, who):
    """C views of one model's hidden states x (..., H), LM head w (V, H) and bias b [V] or None
    (cast to w's dtype, as the C API takes it). Returns (kept tensors, x view, w view, bias, rows,
    H, V); the kept tensors must outlive the C call (they may be contiguous copies)."""
    if w.dim() != 2:
        raise _shape_error(f"{who}_weight must be 2-D (V, H), got {tuple(w.shape)}")
    v, h = w.shape
    if x.shape[-1] != h:
        raise _shape_error(f"{who}_input {tuple(x.shape)} / {who}_weight {tuple(w.shape)}: "
                           "hidden sizes differ")
    x2, rows, _, ldx = as_rows(x, f"{who}_input")
    w2, _, _, ldw = as_rows(w, f"{who}_weight")
    xv = cmat(x2, ldx, float_code(x, f"{who}_input"))
    wv = cmat(w2, ldw, float_code(w, f"{who}_weight"))
    if b is not None:
        if b.numel() != v:
            raise _shape_error(f"{who}_bias has {b.numel()} elements, expected V={v}")
        b = b.reshape(v).to(w.dtype).contiguous()
    return (x2, w2, b), xv, wv, b, rows, h, v


def _fused_outputs(want, xs, ws, bs, rows, want_hard=True):
    """Fresh outputs of a fused-linear call: loss, soft, hard ([1] fp32; hard zero and not passed
    to C unless want_hard) and the wanted gradients, with the FldOut that points at them."""
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


def _fused_results(outputs, xs, bs):
    """(loss, soft, hard, dxs, dws, dbs): losses in xs's dtype, gradients shaped like inputs."""
    loss, soft, hard, dxs, dws, dbs = outputs
    if dxs is not None:
        dxs = dxs.view(xs.shape)
    if dbs is not None:
        dbs = dbs.to(bs.dtype).view(bs.shape)
    dt = xs.dtype
    return loss[0].to(dt), soft[0].to(dt), hard[0].to(dt), dxs, dws, dbs


def _fld_compute(xs, ws, xt, wt, labels, bs, bt_bias, div, temperature, w_hard, w_soft,
                 ignore_index, chunk_size, t2_scale, vp, want):
    """One kdloss_fused_linear_distill call (div: a _lib.DivParams; vp: a VocabParallel or
    None). `want` = (dxs, dws, dbs). Returns (loss, soft, hard, dxs, dws, dbs) with the
    gradients shaped like their inputs."""
    device = same_device([("student_input", xs), ("student_weight", ws), ("teacher_input", xt),
                          ("teacher_weight", wt), ("student_bias", bs), ("teacher_bias", bt_bias)])
    backend = backend_for(device, vp)
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
                             int(ignore_index), int(chunk_size or 0), t2_scale)
    outputs, out = _fused_outputs(want, xs, ws, bs, rows)
    backend.fused_linear_distill(device, params, rows, hs, ht, v, xs_v, ws_v, ptr(bs2), xt_v,
                                 wt_v, ptr(bt2), lview, out, xs_v.dtype, any(want))
    return _fused_results(outputs, xs, bs)


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


def _fused_apply(xs, ws, bs, compute):
    """(loss, soft, hard) of compute(want), through autograd when a student tensor needs a
    gradient; want = which of (dxs, dws, dbs) to form."""
    grad_on = torch.is_grad_enabled()
    want = (grad_on and xs.requires_grad, grad_on and ws.requires_grad,
            grad_on and bs is not None and bs.requires_grad)
    if any(want):
        return _FusedLinearFunction.apply(xs, ws, bs, compute, want)
    return compute(want)[:3]


def _fld(xs, ws, xt, wt, labels, bs, bt_bias, beta, temperature, w_hard, w_soft, ignore_index,
         chunk_size, divergence="jsd", alpha=0.1, t2_scale=False, vp=None):
    div = _lib.div_params(divergence, beta, alpha)
    return _fused_apply(xs, ws, bs, functools.partial(
        _fld_compute, xs, ws, xt, wt, labels, bs, bt_bias, div, temperature, w_hard, w_soft,
        ignore_index, chunk_size, t2_scale, vp))


def fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight,
                     shift_labels=None, jsd_beta=0.5, ignore_index=-100, temperature=1.0):
    """Pure soft distillation loss (Liger's LigerFusedLinearJSD): JSD(jsd_beta) between
    log_softmax(student_input @ student_weight.T / T) and the teacher's, averaged over the rows
    whose shift_labels != ignore_index, without ever forming the full logits.
    Gradients for student_input and student_weight."""
    return _fld(student_input, student_weight, teacher_input, teacher_weight, shift_labels,
                None, None, jsd_beta, temperature, 0.0, 1.0, ignore_index, 0)[0]


# the vocabulary-parallel entry points (process_group) of the fused losses
_VP_DENSE, _VP_TOPK = "kdloss_fused_linear_distill_vp", "kdloss_fused_linear_topk_distill_vp"


def _require_labels(true_labels, weight_hard_loss):
    if true_labels is None and weight_hard_loss != 0:
        raise KdlossError(_lib.ERR_NULL_POINTER,
                          "true_labels is required when weight_hard_loss != 0")


def fused_linear_jsd_loss(student_input, student_weight, teacher_input, teacher_weight,
                          true_labels, student_bias=None, teacher_bias=None, weight_hard_loss=0.5,
                          weight_soft_loss=0.5, beta=0.5, ignore_index=-100, temperature=1.0,
                          compiled=True, chunk_size=1024, return_soft_hard_loss=False,
                          process_group=None):
    """Chunked fused-linear distillation loss (Liger's LigerFusedLinearJSDLoss, docs/MATH.md
    section 4): w_hard * CE(student logits, labels) + w_soft * JSD(beta) of the tempered
    distributions, each averaged over the valid rows. Gradients for student_input,
    student_weight and student_bias. `compiled` is accepted for compatibility and ignored.
    `chunk_size` rows per chunk (None or 0: the library picks it from a 256 MiB budget).
    Returns the loss, or (loss, soft_loss, hard_loss) when return_soft_hard_loss.
    process_group: vocabulary-parallel LM heads (see the module docstring)."""
    with vocab_parallel(process_group, _VP_DENSE) as vp:
        if temperature == 0:
            raise KdlossError(_lib.ERR_INVALID_PARAM, "temperature=0")
        _require_labels(true_labels, weight_hard_loss)
        loss, soft, hard = _fld(student_input, student_weight, teacher_input, teacher_weight,
                                true_labels, student_bias, teacher_bias, beta, temperature,
                                weight_hard_loss, weight_soft_loss, ignore_index, chunk_size,
                                vp=vp)
    return (loss, soft, hard) if return_soft_hard_loss else loss


def fused_linear_distill_loss(student_input, student_weight, teacher_input, teacher_weight,
                              true_labels, student_bias=None, teacher_bias=None, *,
                              divergence="jsd", beta=0.5, alpha=0.1, weight_hard_loss=0.5,
                              weight_soft_loss=0.5, ignore_index=-100, temperature=1.0,
                              t2_scale=False, chunk_size=0, return_soft_hard_loss=False,
                              process_group=None):
    """The fused-linear distillation loss with any divergence of the family (docs/MATH.md
    sections 4 and 7): (w_hard * CE_sum + w_soft * soft_sum * (T^2 if t2_scale else 1)) /
    max(1, n_kept); CE on the untempered student logits, the divergence on the tempered ones, both
    over the rows whose label is not ignore_index. Returns the loss, or (loss, soft, hard).
    process_group: vocabulary-parallel LM heads (see the module docstring)."""
    with vocab_parallel(process_group, _VP_DENSE) as vp:
        _require_labels(true_labels, weight_hard_loss)
        loss, soft, hard = _fld(student_input, student_weight, teacher_input, teacher_weight,
                                true_labels, student_bias, teacher_bias, beta, temperature,
                                weight_hard_loss, weight_soft_loss, ignore_index, chunk_size,
                                divergence, alpha, t2_scale, vp)
    return (loss, soft, hard) if return_soft_hard_loss else loss


# ---- distillation loss on logits ------------------------------------------------------------------

_DISTILL_REDUCTIONS = ("batchmean", "sum", "none")


def _logits_frame(zs, labels, ignore_index, reduction, device, fname):
    """The part every loss on student logits shares: the reduction check, the logits as a
    (bt x v) view, the labels, and the C grad_scale that makes the gradient the reduction's
    (the C gradient is scaled by grad_scale / max(1, n_kept)). Returns
    (kept tensors, logits view, bt, v, labels view, grad_scale)."""
    if reduction not in _DISTILL_REDUCTIONS:
        raise KdlossError(_lib.ERR_INVALID_REDUCTION, f"reduction={reduction!r} "
                          f"({fname} takes batchmean, sum or none)")
    zc = float_code(zs, "student_logits")
    zs2, bt, v, ldz = as_rows(zs.detach(), "student_logits")
    labels, lview = labels_view(labels, bt, device, "labels")
    n_kept = bt if labels is None else int((labels != ignore_index).sum())
    gscale = 1.0 if reduction == "batchmean" else float(max(1, n_kept))
    return (zs2, labels), cmat(zs2, ldz, zc), bt, v, lview, gscale


def _reduced(loss, rows, reduction, zs):
    """The loss in zs's dtype from the C call's loss (sum / max(1, kept)) and row losses."""
    if reduction == "batchmean":
        out = loss[0]
    elif reduction == "sum":
        out = rows.double().sum().float()
    else:
        out = rows.view(zs.shape[:-1])
    return out.to(zs.dtype)


def _distill_compute(zs, zt, labels, div, temperature, ignore_index, reduction, want_grad):
    """Returns (loss, dz or None): dz = dloss/dzs for upstream 1 ("none": per row, unscaled).
    Backends with distill_logits (the CPU's and the CUDA one's) make one call on the logits that
    writes dz in the student's dtype; others (a backend registered without it) get log-probs from
    torch, kdloss_distill and the chain rule here."""
    device = same_device([("student_logits", zs), ("teacher_logits", zt)])
    keep, zs_v, bt, v, lview, gscale = _logits_frame(zs, labels, ignore_index, reduction, device,
                                                     "distill_loss")
    if zs.shape != zt.shape:
        raise _shape_error(f"distill_loss: student_logits {tuple(zs.shape)} vs teacher_logits "
                           f"{tuple(zt.shape)}")
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
    return _reduced(loss, rows, reduction, zs), dz


class _LogitsLossFunction(torch.autograd.Function):
    """Autograd of a loss on student logits whose gradient `compute(want_grad)` forms in
    forward: compute returns (loss, dz), dz per row (unscaled) when `rowwise` (reduction none)."""

    @staticmethod
    def forward(ctx, zs, compute, rowwise):
        out, dz = compute(True)
        ctx.rowwise = rowwise
        ctx.save_for_backward(dz, zs)  # zs: for _first_order_only's error node
        return out

    @staticmethod
    @_first_order_only  # the saved gradient is a constant: no double backward
    def backward(ctx, grad_output):
        dz = ctx.saved_tensors[0]
        if ctx.rowwise:
            dz = dz * grad_output.to(dz.dtype).unsqueeze(-1)
        else:
            dz = _scale(dz, grad_output)
        return dz, None, None


def _logits_apply(zs, reduction, compute):
    """compute(want_grad)'s loss, through autograd when zs needs a gradient."""
    if _needs_grad(zs):
        return _LogitsLossFunction.apply(zs, compute, reduction == "none")
    return compute(False)[0]


def distill_loss(student_logits, teacher_logits, labels=None, *, divergence="forward_kl", beta=0.5,
                 alpha=0.1, temperature=1.0, ignore_index=-100, reduction="batchmean"):
    """A divergence of the family (docs/MATH.md section 7) between softmax(teacher_logits / T)
    (P) and softmax(student_logits / T) (Q), per row over the last dim. divergence: forward_kl,
    reverse_kl, jsd (beta), skew_forward_kl, skew_reverse_kl (alpha), tvd. Rows whose label
    equals ignore_index are skipped. reduction: "batchmean" (sum over kept rows / max(1, kept)),
    "sum", "none" (one loss per row, 0 for skipped rows). Gradient to student_logits only, formed
    in the forward pass."""
    div = _lib.div_params(divergence, beta, alpha)
    return _logits_apply(student_logits, reduction, functools.partial(
        _distill_compute, student_logits, teacher_logits, labels, div, temperature, ignore_index,
        reduction))


# ---- sparse top-k teacher ------------------------------------------------------------------------

def _topk_compute(zs, ids, lps, labels, div, tail, temperature, ignore_index, reduction,
                  want_grad):
    """One kdloss_topk_distill_logits call: (loss, dz or None) as _distill_compute's."""
    device = same_device([("student_logits", zs), ("teacher_ids", ids),
                          ("teacher_logprobs", lps)])
    keep, zs_v, bt, v, lview, gscale = _logits_frame(zs, labels, ignore_index, reduction, device,
                                                     "topk_distill_loss")
    keep_t, teacher = topk_teacher(ids, lps, zs.shape[:-1])
    params = _lib.topk_distill_params(div, tail, float(temperature), int(ignore_index), gscale)
    loss, rows = scalar_out(device), torch.empty(bt, dtype=torch.float32, device=device)
    g = torch.empty(bt, v, dtype=zs.dtype, device=device) if want_grad else None
    backend_for(device).topk_distill_logits(device, params, bt, v, zs_v, teacher, lview,
                                            ptr(loss), ptr(rows), out_mat(g))
    return _reduced(loss, rows, reduction, zs), (g.view(zs.shape) if g is not None else None)


def topk_distill_loss(student_logits, teacher_ids, teacher_logprobs, labels=None, *,
                      divergence="forward_kl", tail="bucket", beta=0.5, alpha=0.1,
                      temperature=1.0, ignore_index=-100, reduction="batchmean"):
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
    checked on the device instead: the loss is NaN, include/kdloss.h)."""
    div = _lib.div_params(divergence, beta, alpha)
    code = _lib.topk_tail(tail)
    return _logits_apply(student_logits, reduction, functools.partial(
        _topk_compute, student_logits, teacher_ids, teacher_logprobs, labels, div, code,
        temperature, ignore_index, reduction))


def _fltd_compute(xs, ws, ids, lps, labels, bs, div, tail, temperature, w_hard, w_soft,
                  ignore_index, chunk_size, t2_scale, want_hard, vp, want):
    """One kdloss_fused_linear_topk_distill call; returns what _fld_compute does. labels None
    passes no labels (every row kept; the C call then needs w_hard 0 and no hard-loss output)."""
    device = same_device([("student_input", xs), ("student_weight", ws), ("teacher_ids", ids),
                          ("teacher_logprobs", lps), ("student_bias", bs)])
    backend = backend_for(device, vp)
    keep_s, xs_v, ws_v, bs2, rows, hs, v = _lm_head(xs, ws, bs, "student")
    keep_t, teacher = topk_teacher(ids, lps, xs.shape[:-1])
    labels, lview = labels_view(labels, rows, device, "true_labels")
    params = _lib.fltd_params(div, tail, float(temperature), float(w_hard), float(w_soft),
                              int(ignore_index), int(chunk_size or 0), t2_scale)
    # the hard loss is asked for only when wanted: any cross-entropy output turns renorm_both's
    # sparse path (K gathered weight rows, no BT x V logits) off
    outputs, out = _fused_outputs(want, xs, ws, bs, rows, want_hard and labels is not None)
    backend.fused_linear_topk_distill(device, params, rows, hs, v, xs_v, ws_v, ptr(bs2), teacher,
                                      lview, out, xs_v.dtype, any(want))
    return _fused_results(outputs, xs, bs)


def fused_linear_topk_distill_loss(student_input, student_weight, teacher_ids, teacher_logprobs,
                                   true_labels=None, student_bias=None, *,
                                   divergence="forward_kl", tail="bucket", beta=0.5, alpha=0.1,
                                   weight_hard_loss=0.0, weight_soft_loss=1.0, ignore_index=-100,
                                   temperature=1.0, t2_scale=False, chunk_size=0,
                                   return_soft_hard_loss=False, process_group=None):
    """The fused LM head + sparse top-k teacher loss (docs/MATH.md sections 4 and 8): student
    logits zs = student_input @ student_weight.T + student_bias formed chunk by chunk, never in
    full; (w_hard * CE_sum + w_soft * soft_sum * (T^2 if t2_scale else 1)) / max(1, n_kept), CE on
    the untempered logits, the soft part as topk_distill_loss's on the tempered ones, over the
    rows whose true_label is not ignore_index (every row when true_labels is None, which needs
    weight_hard_loss 0). Gradients for student_input, student_weight and student_bias.
    Returns the loss, or (loss, soft_loss, hard_loss) when return_soft_hard_loss (hard_loss 0
    without labels). process_group: vocabulary-parallel LM heads (see the module docstring;
    teacher_ids are global token ids, the same on every rank)."""
    with vocab_parallel(process_group, _VP_TOPK) as vp:
        div = _lib.div_params(divergence, beta, alpha)
        code = _lib.topk_tail(tail)
        compute = functools.partial(
            _fltd_compute, student_input, student_weight, teacher_ids, teacher_logprobs,
            true_labels, student_bias, div, code, temperature, weight_hard_loss, weight_soft_loss,
            ignore_index, chunk_size, t2_scale, return_soft_hard_loss, vp)
        loss, soft, hard = _fused_apply(student_input, student_weight, student_bias, compute)
    return (loss, soft, hard) if return_soft_hard_loss else loss
