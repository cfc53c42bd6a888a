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
"""

import functools

import torch

from .. import _lib
from .._lib import KdlossError
from ._backend import (as_rows, backend_for, cmat, float_code, labels_view, out_mat, ptr,
                       same_device, scalar_out)

__all__ = ["kl_div", "jsd", "distill_loss", "fused_linear_jsd", "fused_linear_jsd_loss",
           "fused_linear_distill_loss"]


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

def _fljsd_compute(xs, ws, xt, wt, labels, bs, bt_bias, div, temperature, w_hard, w_soft,
                   ignore_index, chunk_size, t2_scale, want):
    """One kdloss_fused_linear_distill call (div: a _lib.DivParams). `want` = (dxs, dws, dbs).
    Returns (loss, soft, hard, dxs, dws, dbs) with the gradients shaped like their inputs."""
    device = same_device([("student_input", xs), ("student_weight", ws), ("teacher_input", xt),
                          ("teacher_weight", wt), ("student_bias", bs), ("teacher_bias", bt_bias)])
    if ws.dim() != 2 or wt.dim() != 2:
        raise _shape_error(f"weights must be 2-D (V, H): student_weight {tuple(ws.shape)}, "
                           f"teacher_weight {tuple(wt.shape)}")
    v, hs = ws.shape
    ht = wt.shape[1]
    if wt.shape[0] != v:
        raise _shape_error(f"student_weight has V={v} rows, teacher_weight {wt.shape[0]}")
    if xs.shape[-1] != hs or xt.shape[-1] != ht:
        raise _shape_error(f"student_input {tuple(xs.shape)} / student_weight {tuple(ws.shape)}, "
                           f"teacher_input {tuple(xt.shape)} / teacher_weight {tuple(wt.shape)}: "
                           "hidden sizes differ")
    if xs.shape[:-1] != xt.shape[:-1]:
        raise _shape_error(f"student_input {tuple(xs.shape)} and teacher_input {tuple(xt.shape)} "
                           "have different token counts")
    xs2, rows, _, ldxs = as_rows(xs, "student_input")
    xt2, _, _, ldxt = as_rows(xt, "teacher_input")
    ws2, _, _, ldws = as_rows(ws, "student_weight")
    wt2, _, _, ldwt = as_rows(wt, "teacher_weight")
    xs_c, ws_c = float_code(xs, "student_input"), float_code(ws, "student_weight")
    xt_c, wt_c = float_code(xt, "teacher_input"), float_code(wt, "teacher_weight")
    bias = []
    for name, b, w in (("student_bias", bs, ws), ("teacher_bias", bt_bias, wt)):
        if b is not None:
            if b.numel() != v:
                raise _shape_error(f"{name} has {b.numel()} elements, expected V={v}")
            b = b.reshape(v).to(w.dtype).contiguous()  # the C API takes the bias in W's dtype
        bias.append(b)
    bs2, bt2 = bias
    if labels is None:  # pure soft loss without labels: every row counts, CE weight is 0
        labels = torch.zeros(rows, dtype=torch.int32, device=device)
    labels, lview = labels_view(labels, rows, device, "labels")
    params = _lib.fld_params(div, float(temperature), float(w_hard), float(w_soft),
                             int(ignore_index), int(chunk_size or 0), t2_scale)
    loss, soft, hard = scalar_out(device), scalar_out(device), scalar_out(device)
    dxs = torch.empty(rows, hs, dtype=xs.dtype, device=device) if want[0] else None
    dws = torch.empty(v, hs, dtype=ws.dtype, device=device) if want[1] else None
    dbs = torch.empty(v, dtype=ws.dtype, device=device) if want[2] and bs is not None else None
    out = _lib.FldOut(loss.data_ptr(), soft.data_ptr(), hard.data_ptr(), out_mat(dxs),
                      out_mat(dws), ptr(dbs), None, None, None)
    backend_for(device).fused_linear_distill(
        device, params, rows, hs, ht, v, cmat(xs2, ldxs, xs_c), cmat(ws2, ldws, ws_c), ptr(bs2),
        cmat(xt2, ldxt, xt_c), cmat(wt2, ldwt, wt_c), ptr(bt2), lview, out, xs_c, any(want))
    if dxs is not None:
        dxs = dxs.view(xs.shape)
    if dbs is not None:
        dbs = dbs.to(bs.dtype).view(bs.shape)
    dt = xs.dtype
    return loss[0].to(dt), soft[0].to(dt), hard[0].to(dt), dxs, dws, dbs


class _FusedLinearJSDFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, xs, ws, xt, wt, labels, bs, bt_bias, div, temperature, w_hard, w_soft,
                ignore_index, chunk_size, t2_scale, want):
        loss, soft, hard, dxs, dws, dbs = _fljsd_compute(
            xs, ws, xt, wt, labels, bs, bt_bias, div, temperature, w_hard, w_soft, ignore_index,
            chunk_size, t2_scale, want)
        ctx.save_for_backward(dxs, dws, dbs, xs, ws, bs)  # inputs: for _first_order_only
        ctx.mark_non_differentiable(soft, hard)  # their gradients are not computed separately
        return loss, soft, hard

    @staticmethod
    @_first_order_only  # the saved gradients are constants: no double backward
    def backward(ctx, grad_loss, grad_soft, grad_hard):
        dxs, dws, dbs = ctx.saved_tensors[:3]
        return (_scale(dxs, grad_loss), _scale(dws, grad_loss), None, None, None,
                _scale(dbs, grad_loss), None, None, None, None, None, None, None, None, None)


def _fljsd(xs, ws, xt, wt, labels, bs, bt_bias, beta, temperature, w_hard, w_soft, ignore_index,
           chunk_size, divergence="jsd", alpha=0.1, t2_scale=False):
    div = _lib.div_params(divergence, beta, alpha)
    grad_on = torch.is_grad_enabled()
    want = (grad_on and xs.requires_grad, grad_on and ws.requires_grad,
            grad_on and bs is not None and bs.requires_grad)
    if any(want):
        return _FusedLinearJSDFunction.apply(xs, ws, xt, wt, labels, bs, bt_bias, div,
                                             temperature, w_hard, w_soft, ignore_index,
                                             chunk_size, t2_scale, want)
    return _fljsd_compute(xs, ws, xt, wt, labels, bs, bt_bias, div, temperature, w_hard, w_soft,
                          ignore_index, chunk_size, t2_scale, want)[:3]


def fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight,
                     shift_labels=None, jsd_beta=0.5, ignore_index=-100, temperature=1.0):
    """Pure soft distillation loss (Liger's LigerFusedLinearJSD): JSD(jsd_beta) between
    log_softmax(student_input @ student_weight.T / T) and the teacher's, averaged over the rows
    whose shift_labels != ignore_index, without ever forming the full logits.
    Gradients for student_input and student_weight."""
    return _fljsd(student_input, student_weight, teacher_input, teacher_weight, shift_labels,
                  None, None, jsd_beta, temperature, 0.0, 1.0, ignore_index, 0)[0]


def fused_linear_jsd_loss(student_input, student_weight, teacher_input, teacher_weight,
                          true_labels, student_bias=None, teacher_bias=None, weight_hard_loss=0.5,
                          weight_soft_loss=0.5, beta=0.5, ignore_index=-100, temperature=1.0,
                          compiled=True, chunk_size=1024, return_soft_hard_loss=False):
    """Chunked fused-linear distillation loss (Liger's LigerFusedLinearJSDLoss, docs/MATH.md
    section 4): w_hard * CE(student logits, labels) + w_soft * JSD(beta) of the tempered
    distributions, each averaged over the valid rows. Gradients for student_input,
    student_weight and student_bias. `compiled` is accepted for compatibility and ignored.
    `chunk_size` rows per chunk (None or 0: the library picks it from a 256 MiB budget).
    Returns the loss, or (loss, soft_loss, hard_loss) when return_soft_hard_loss."""
    if temperature == 0:
        raise KdlossError(_lib.ERR_INVALID_PARAM, "temperature=0")
    if true_labels is None and weight_hard_loss != 0:
        raise KdlossError(_lib.ERR_NULL_POINTER,
                          "true_labels is required when weight_hard_loss != 0")
    loss, soft, hard = _fljsd(student_input, student_weight, teacher_input, teacher_weight,
                              true_labels, student_bias, teacher_bias, beta, temperature,
                              weight_hard_loss, weight_soft_loss, ignore_index, chunk_size)
    return (loss, soft, hard) if return_soft_hard_loss else loss


def fused_linear_distill_loss(student_input, student_weight, teacher_input, teacher_weight,
                              true_labels, student_bias=None, teacher_bias=None, *,
                              divergence="jsd", beta=0.5, alpha=0.1, weight_hard_loss=0.5,
                              weight_soft_loss=0.5, ignore_index=-100, temperature=1.0,
                              t2_scale=False, chunk_size=0, return_soft_hard_loss=False):
    """The fused-linear distillation loss with any divergence of the family (docs/MATH.md
    sections 4 and 7): (w_hard * CE_sum + w_soft * soft_sum * (T^2 if t2_scale else 1)) /
    max(1, n_kept); CE on the untempered student logits, the divergence on the tempered ones, both
    over the rows whose label is not ignore_index. Returns the loss, or (loss, soft, hard)."""
    if true_labels is None and weight_hard_loss != 0:
        raise KdlossError(_lib.ERR_NULL_POINTER,
                          "true_labels is required when weight_hard_loss != 0")
    loss, soft, hard = _fljsd(student_input, student_weight, teacher_input, teacher_weight,
                              true_labels, student_bias, teacher_bias, beta, temperature,
                              weight_hard_loss, weight_soft_loss, ignore_index, chunk_size,
                              divergence, alpha, t2_scale)
    return (loss, soft, hard) if return_soft_hard_loss else loss


# ---- distillation loss on logits ------------------------------------------------------------------

_DISTILL_REDUCTIONS = ("batchmean", "sum", "none")


def _distill_compute(zs, zt, labels, div, temperature, ignore_index, reduction, want_grad):
    """Returns (loss, dz or None): dz = dloss/dzs for upstream 1 ("none": per row, unscaled).
    Backends with distill_logits (the CPU's) make one pass over the logits that writes dz in the
    student's dtype; others get log-probs from torch, kdloss_distill and the chain rule here."""
    if reduction not in _DISTILL_REDUCTIONS:
        raise KdlossError(_lib.ERR_INVALID_REDUCTION, f"reduction={reduction!r} "
                          "(distill_loss takes batchmean, sum or none)")
    device = same_device([("student_logits", zs), ("teacher_logits", zt)])
    if zs.shape != zt.shape:
        raise _shape_error(f"distill_loss: student_logits {tuple(zs.shape)} vs teacher_logits "
                           f"{tuple(zt.shape)}")
    zc, tc = float_code(zs, "student_logits"), float_code(zt, "teacher_logits")
    backend = backend_for(device)
    zs2, bt, v, ldz = as_rows(zs.detach(), "student_logits")
    zt2, _, _, ldt = as_rows(zt.detach(), "teacher_logits")
    labels, lview = labels_view(labels, bt, device, "labels")
    n_kept = bt if labels is None else int((labels != ignore_index).sum())
    denom = max(1, n_kept)
    # the C gradient is scaled by grad_scale / max(1, n_kept): pick grad_scale per reduction
    gscale = 1.0 if reduction == "batchmean" else float(denom)
    loss, rows = scalar_out(device), torch.empty(bt, dtype=torch.float32, device=device)
    t = float(temperature)
    if hasattr(backend, "distill_logits"):
        params = _lib.distill_logits_params(div, t, int(ignore_index), gscale)
        g = torch.empty(bt, v, dtype=zs.dtype, device=device) if want_grad else None
        backend.distill_logits(device, params, bt, v, cmat(zs2, ldz, zc), cmat(zt2, ldt, tc),
                               lview, ptr(loss), ptr(rows), out_mat(g))
        dz = g.view(zs.shape) if g is not None else None
    else:
        if not t > 0.0 or t == float("inf"):  # NaN fails too; the C library's message
            raise KdlossError(_lib.ERR_INVALID_PARAM, f"temperature={temperature!r}")
        # log-probs in fp32; the divergence and its gradient in X come from one C pass
        x = torch.log_softmax(zs2.float() / t, dim=-1)
        y = torch.log_softmax(zt2.float() / t, dim=-1)
        params = _lib.distill_params(div, int(ignore_index), gscale)
        g = torch.empty(bt, v, dtype=torch.float32, device=device) if want_grad else None
        backend.distill(device, params, bt, v, cmat(x, v, _lib.F32), cmat(y, v, _lib.F32), lview,
                        ptr(loss), ptr(rows), out_mat(g))
        dz = None
        if g is not None:  # chain rule of X = log_softmax(z / T): (g - softmax * sum(g)) / T
            dz = (g - x.exp() * g.sum(-1, keepdim=True)) / t
            dz = dz.to(zs.dtype).view(zs.shape)
    if reduction == "batchmean":
        out = loss[0]
    elif reduction == "sum":
        out = rows.double().sum().float()
    else:
        out = rows.view(zs.shape[:-1])
    return out.to(zs.dtype), dz


class _DistillFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, zs, zt, labels, div, temperature, ignore_index, reduction):
        out, dz = _distill_compute(zs, zt, labels, div, temperature, ignore_index, reduction, True)
        ctx.rowwise = reduction == "none"
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
        return dz, None, None, None, None, None, None


def distill_loss(student_logits, teacher_logits, labels=None, *, divergence="forward_kl", beta=0.5,
                 alpha=0.1, temperature=1.0, ignore_index=-100, reduction="batchmean"):
    """A divergence of the family (docs/MATH.md section 7) between softmax(teacher_logits / T)
    (P) and softmax(student_logits / T) (Q), per row over the last dim. divergence: forward_kl,
    reverse_kl, jsd (beta), skew_forward_kl, skew_reverse_kl (alpha), tvd. Rows whose label
    equals ignore_index are skipped. reduction: "batchmean" (sum over kept rows / max(1, kept)),
    "sum", "none" (one loss per row, 0 for skipped rows). Gradient to student_logits only, formed
    in the forward pass."""
    div = _lib.div_params(divergence, beta, alpha)
    if _needs_grad(student_logits):
        return _DistillFunction.apply(student_logits, teacher_logits, labels, div, temperature,
                                      ignore_index, reduction)
    return _distill_compute(student_logits, teacher_logits, labels, div, temperature,
                            ignore_index, reduction, False)[0]
