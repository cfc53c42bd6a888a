"""The calls floor of kdloss.torch: each function here turns one operation's tensors into the
C API's views, params and fresh outputs and makes ONE backend call (the backend floor,
_backend.py, makes the ctypes call on the tensors' device). Nothing here records autograd or
reads a Python argument's default: the custom ops (_ops.py) call these with plain values, and
their fake implementations reuse the shape checks. One function per operation, named as its
custom op (kl_div, jsd, distill_loss, topk_distill_loss, fused_linear_distill,
fused_linear_topk_distill), each returning (loss(es), gradient(s) or None).

Imports only downward: _backend and _lib.
"""

import ctypes
import dataclasses
from typing import Callable, Tuple

import torch

from .. import _lib
from .._lib import KdlossError
from . import _backend
from ._backend import (as_rows, backend_for, cmat, filled_labels, float_code, label_matches,
                       labels_view, out_empty, out_mat, ptr, reports, same_device, scalar_out,
                       topk_teacher, weights_view, entropy_out)


def promoted(*tensors):
    """torch's type promotion over the given float tensors (None skipped)."""
    dt = None
    for t in tensors:
        if t is not None:
            dt = t.dtype if dt is None else torch.promote_types(dt, t.dtype)
    return dt


def shape_error(what):
    return KdlossError(_lib.ERR_SHAPE_MISMATCH, what)


def reduction_code(reduction):
    code = _lib.REDUCTIONS.get(reduction)
    if code is None:
        raise KdlossError(_lib.ERR_INVALID_REDUCTION, f"reduction={reduction!r}")
    return code


def check_weight(w, who):
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
    raise shape_error(msg)


NATIVE_LM_DTYPES = (torch.float32, torch.bfloat16)


def lm_dtype(x, w, who):
    """The dtype one model's GEMMs run in: x's when x and w are both float32 or both bfloat16,
    else torch.promote_types(x, w) with float16 widened to float32 (module docstring: the
    narrower operand is then cast once per call)."""
    return operands_dtype([(f"{who}_input", x), (f"{who}_weight", w)])


def operands_dtype(named):
    """lm_dtype over (name, tensor) pairs: one hidden-state tensor and the head(s) it meets (the
    several teachers' heads share their hidden states, so all take one dtype)."""
    for name, t in named:
        float_code(t, name)  # float64 or an integer dtype: refused, naming the operand
    dts = {t.dtype for _, t in named}
    if len(dts) == 1 and named[0][1].dtype in NATIVE_LM_DTYPES:
        return named[0][1].dtype
    dt = named[0][1].dtype
    for _, t in named[1:]:
        dt = torch.promote_types(dt, t.dtype)
    return torch.float32 if dt == torch.float16 else dt


def lm_head(x, w, b, who):
    """C views of one model's hidden states x (..., H), LM head w (V, H) and bias b [V] or None,
    all in lm_dtype(x, w) (the bias in the weight's, as the C API takes it). Returns (kept
    tensors, x view, w view, bias, rows, H, V); the kept tensors (x and w as (rows x H) and
    (V x H) in that dtype, the bias) must outlive the C call (they may be copies)."""
    check_weight(w, who)
    v, h = w.shape
    if x.shape[-1] != h:
        raise shape_error(f"{who}_input {tuple(x.shape)} / {who}_weight {tuple(w.shape)}: "
                           "hidden sizes differ")
    dt = lm_dtype(x, w, who)
    x2, rows, _, ldx = as_rows(x.to(dt), f"{who}_input")
    xv = cmat(x2, ldx, float_code(x2, f"{who}_input"))
    w2, wv, b = head_view(w, b, dt, f"{who}_weight", f"{who}_bias")
    return (x2, w2, b), xv, wv, b, rows, h, v


def head_view(w, b, dt, wname, bname):
    """(w as (V x H) in dtype dt, its C view, b as [V] in dt or None): one LM head (V, H) and
    its bias for lm_head, or one of several teachers' heads."""
    v = w.shape[0]
    w2, _, _, ldw = as_rows(w.to(dt), wname)
    wv = cmat(w2, ldw, float_code(w2, wname))
    if b is not None:
        if b.numel() != v:
            raise shape_error(f"{bname} has {b.numel()} elements, expected V={v}")
        b = b.reshape(v).to(dt).contiguous()
    return w2, wv, b


def teacher_head(ws, wt, bt, vp=None):
    """(teacher_weight, teacher_bias) cut to the student's V rows. A teacher head with MORE rows
    than the student's (a padded vocabulary: Qwen2.5's 152064 against 151936) is used through
    its first V rows, as TRL slices the teacher's logits (TRL #3028): wt[:V] and bt[:V] are views
    (contiguous for a contiguous head), never copies. Fewer rows: KdlossError naming both shapes.
    With process_group (vocabulary-parallel blocks) the rows must match per rank: the blocks'
    split of a padded head need not be the student's."""
    check_weight(ws, "student")
    check_weight(wt, "teacher")
    v, vt = ws.shape[0], wt.shape[0]
    if vt == v:
        return wt, bt
    if vt < v or vp is not None:
        why = ("fewer rows: the teacher's head must cover the student's vocabulary (a teacher "
               "with MORE rows, a padded vocabulary, is used through its first V rows)"
               if vt < v else
               "different rows: with process_group each rank's teacher block must have its "
               "student block's rows (slice a padded teacher head before splitting it)")
        raise shape_error(f"teacher_weight {tuple(wt.shape)} and student_weight "
                           f"{tuple(ws.shape)}: {why}")
    if bt is not None:
        if bt.numel() != vt:
            raise shape_error(f"teacher_bias has {bt.numel()} elements, expected one per row "
                               f"of teacher_weight {tuple(wt.shape)}")
        bt = bt.reshape(vt)[:v]
    return wt[:v], bt


def teacher_logits(zs, zt, fname):
    """teacher_logits cut to the student's V columns: teacher logits with MORE columns (a
    padded vocabulary) are used through their first V, as TRL slices them (TRL #3028). The slice
    zt[..., :V] is a strided view that goes to C with the teacher's own row stride (ld = its
    padded width), without a copy. Other shape differences: KdlossError naming both shapes."""
    if zs.shape == zt.shape:
        return zt
    if (zs.dim() == zt.dim() and zs.dim() > 0 and zs.shape[:-1] == zt.shape[:-1]
            and zt.shape[-1] > zs.shape[-1]):
        return zt[..., :zs.shape[-1]]
    raise shape_error(f"{fname}: student_logits {tuple(zs.shape)} vs teacher_logits "
                       f"{tuple(zt.shape)} (the teacher may have more columns, a padded "
                       "vocabulary: its first V are used; nothing else may differ)")


def kl_div(y_pred, y_true, reduction, log_target, eps, want_grad):
    code = reduction_code(reduction)
    device = same_device([("input", y_pred), ("target", y_true)])
    if y_pred.shape != y_true.shape:
        raise shape_error(f"kl_div: input {tuple(y_pred.shape)} vs target "
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
        elem = out_empty((bt, v), torch.float32, device)
    else:
        loss = scalar_out(device)
    grad = out_empty((bt, v), y_pred.dtype, device) if want_grad else None
    backend_for(device).kl_div(device, params, bt, v, cmat(yp, ldp, pc), cmat(yt, ldt, tc),
                               ptr(loss), None, out_mat(elem), out_mat(grad))
    if elem is None:  # the loss: fp32 whatever the dtypes
        out = loss[0] if scale == 1.0 else (loss[0].double() * scale).float()
    else:  # elementwise: torch's type promotion of input and target, as F.kl_div
        out = elem.view(y_pred.shape).to(promoted(y_pred, y_true))
    return out, (grad.view(y_pred.shape) if grad is not None else None)


def jsd(log_q, log_p, shift_labels, beta, ignore_index, want_grad):
    device = same_device([("input", log_q), ("target", log_p)])
    if log_q.shape != log_p.shape:
        raise shape_error(f"jsd: input (log_q) {tuple(log_q.shape)} vs target (log_p) "
                           f"{tuple(log_p.shape)}")
    q, bt, v, ldq = as_rows(log_q, "input (log_q)")
    p, _, _, ldp = as_rows(log_p, "target (log_p)")
    qc, pc = float_code(log_q, "input (log_q)"), float_code(log_p, "target (log_p)")
    labels, lview = labels_view(shift_labels, bt, device, "shift_labels")
    params = _lib.jsd_params(float(beta), int(ignore_index))
    loss = scalar_out(device)
    grad = out_empty((bt, v), log_q.dtype, device) if want_grad else None
    backend_for(device).jsd(device, params, bt, v, cmat(q, ldq, qc), cmat(p, ldp, pc), lview,
                            ptr(loss), None, out_mat(grad))
    return loss[0], (grad.view(log_q.shape) if grad is not None else None)  # loss: fp32


DISTILL_REDUCTIONS = ("batchmean", "sum", "mean", "none")


def check_distill_reduction(reduction, fname):
    if not (isinstance(reduction, str) and reduction in DISTILL_REDUCTIONS):
        raise KdlossError(_lib.ERR_INVALID_REDUCTION, f"reduction={reduction!r} "
                          f"({fname} takes batchmean, sum, mean or none)")


def logits_frame(zs, labels, ignore_index, reduction, device, fname, weights=None):
    """The part every loss on student logits shares: the reduction check, the logits as a
    (bt x v) view, the labels, the per-row weights, the reduction's divisor (None: the C call's
    own, max(1, n_kept)) and the C grad_scale that makes the gradient the reduction's (the C
    gradient is scaled by grad_scale / max(1, n_kept)). Returns (kept tensors, logits view, bt,
    v, labels view, grad_scale, divisor); the kept tensors are (logits, labels, weights).
    n_kept counts the rows the C call keeps: label not ignore_index and weight > 0 (a weight of
    0 ignores its row, include/kdloss.h).

    Divisors: batchmean with labels max(1, n_kept) (the per-token mean over the kept rows, as
    TRL's generalized_jsd_loss), without labels student_logits.size(0) (torch's batchmean: B for
    (B, T, V) logits, the rows for 2-D, 1 for 1-D); mean: the kept rows times V (every element, as torch's
    and TRL's mean); sum 1; none: per row, unscaled."""
    check_distill_reduction(reduction, fname)
    zc = float_code(zs, "student_logits")
    zs2, bt, v, ldz = as_rows(zs.detach(), "student_logits")
    labels, lview = labels_view(labels, bt, device, "labels")
    weights, _ = weights_view(weights, bt, device)
    n_kept = bt
    if labels is not None or weights is not None:  # one host read: the sum's and the
        kept_rows = torch.ones(bt, dtype=torch.bool, device=device)  # gradient's scale need it
        if labels is not None:
            kept_rows &= ~label_matches(labels, ignore_index)
        if weights is not None:
            kept_rows &= weights > 0
        n_kept = _backend.host_read(kept_rows.sum())
    kept = max(1, n_kept)
    batch = zs.shape[0] if zs.dim() > 1 else 1  # 1-D logits: one row (one distribution)
    divisor = {"batchmean": kept if labels is not None else batch,
               "sum": 1, "mean": kept * v, "none": 1}[reduction]
    gscale = float(kept) / max(1, divisor)
    if reduction == "batchmean" and divisor == kept:
        divisor = None  # the C call's loss is already this one
    return (zs2, labels, weights), cmat(zs2, ldz, zc), bt, v, lview, gscale, divisor


def reduced(loss, rows, reduction, divisor, zs, weights=None):
    """The loss, float32 whatever zs's dtype, from the C call's loss (sum / max(1, kept), the
    rows weighted) or the row losses (reduced in double). The C call's row losses are
    unweighted: with weights they are multiplied here (reduction "none" returns w_r * loss_r,
    the rows whose sum the gradient is of)."""
    if weights is not None and (reduction == "none" or divisor is not None):
        rows = rows * weights
    if reduction == "none":
        return rows.view(zs.shape[:-1])
    if divisor is None:
        return loss[0]
    return (rows.double().sum() / max(1, divisor)).float()


def _logits_extras(params, keep, want_entropy, bt, device):
    """Sets the per-row weights (keep[2], or none) and the entropy output of a loss on logits'
    params struct (members of the params there, include/kdloss.h); returns the entropy tensor
    ([bt] float32, or None when not wanted)."""
    params.row_weights = ptr(keep[2])
    entropy, params.row_entropy = entropy_out(want_entropy, bt, device)
    return entropy


def distill_loss(zs, zt, labels, div, temperature, ignore_index, reduction, want_grad,
                 weights=None, want_entropy=False):
    """Returns (loss, dz or None, entropy or None): dz = dloss/dzs for upstream 1 ("none": per
    row, unscaled); weights: [bt] per-row weights or None; entropy: the student's [bt] entropy
    at T when want_entropy. Backends with distill_logits (the CPU's and the CUDA one's) make one
    call on the logits that writes dz in the student's dtype; others (a backend registered
    without it) get log-probs from torch, kdloss_distill and the chain rule here (no weights
    nor entropy there: refused)."""
    device = same_device([("student_logits", zs), ("teacher_logits", zt), ("labels", labels),
                          ("token_weights", weights)])
    keep, zs_v, bt, v, lview, gscale, divisor = logits_frame(zs, labels, ignore_index,
                                                             reduction, device, "distill_loss",
                                                             weights)
    zt = teacher_logits(zs, zt, "distill_loss")  # a padded teacher: its first V columns
    tc = float_code(zt, "teacher_logits")
    backend = backend_for(device)
    zt2, _, _, ldt = as_rows(zt.detach(), "teacher_logits")
    loss, rows = scalar_out(device), torch.empty(bt, dtype=torch.float32, device=device)
    t = float(temperature)
    if hasattr(backend, "distill_logits"):
        params = _lib.distill_logits_params(div, t, int(ignore_index), gscale)
        entropy = _logits_extras(params, keep, want_entropy, bt, device)
        g = out_empty((bt, v), zs.dtype, device) if want_grad else None
        backend.distill_logits(device, params, bt, v, zs_v, cmat(zt2, ldt, tc), lview, ptr(loss),
                               ptr(rows), out_mat(g))
        dz = g.view(zs.shape) if g is not None else None
    else:
        if keep[2] is not None or want_entropy:
            raise KdlossError(_lib.ERR_UNSUPPORTED, f"the backend for {device.type} has no "
                              "distill_logits: token_weights and return_entropy need it")
        entropy = None
        if not t > 0.0 or t == float("inf"):  # NaN fails too; the C library's message
            raise KdlossError(_lib.ERR_INVALID_PARAM, f"temperature={temperature!r}")
        # log-probs in fp32; the divergence and its gradient in X come from one C pass
        x = torch.log_softmax(keep[0].float() / t, dim=-1)
        y = torch.log_softmax(zt2.float() / t, dim=-1)
        params = _lib.distill_params(div, int(ignore_index), gscale)
        g = out_empty((bt, v), torch.float32, device) if want_grad else None
        backend.distill(device, params, bt, v, cmat(x, v, _lib.F32), cmat(y, v, _lib.F32), lview,
                        ptr(loss), ptr(rows), out_mat(g))
        dz = None
        if g is not None:  # chain rule of X = log_softmax(z / T): (g - softmax * sum(g)) / T
            dz = (g - x.exp() * g.sum(-1, keepdim=True)) / t
            dz = dz.to(zs.dtype).view(zs.shape)
    return reduced(loss, rows, reduction, divisor, zs, keep[2]), dz, entropy


def topk_distill_loss(zs, ids, lps, labels, div, tail, temperature, ignore_index, reduction,
                      want_grad, weights=None, want_entropy=False):
    """One kdloss_topk_distill_logits call: (loss, dz or None, entropy or None) as
    distill_loss's."""
    device = same_device([("student_logits", zs), ("teacher_ids", ids),
                          ("teacher_logprobs", lps), ("labels", labels),
                          ("token_weights", weights)])
    keep, zs_v, bt, v, lview, gscale, divisor = logits_frame(
        zs, labels, ignore_index, reduction, device, "topk_distill_loss", weights)
    keep_t, teacher = topk_teacher(ids, lps, zs.shape[:-1])
    params = _lib.topk_distill_params(div, tail, float(temperature), int(ignore_index), gscale)
    entropy = _logits_extras(params, keep, want_entropy, bt, device)
    loss, rows = scalar_out(device), torch.empty(bt, dtype=torch.float32, device=device)
    g = out_empty((bt, v), zs.dtype, device) if want_grad else None
    backend_for(device).topk_distill_logits(device, params, bt, v, zs_v, teacher, lview,
                                            ptr(loss), ptr(rows), out_mat(g))
    return (reduced(loss, rows, reduction, divisor, zs, keep[2]),
            g.view(zs.shape) if g is not None else None, entropy)


def fused_outputs(want, xs, ws, bs, rows, want_hard=True, want_entropy=False):
    """Fresh outputs of a fused-linear call: loss, soft, hard ([1] fp32; hard zero and not passed
    to C unless want_hard), the wanted gradients and the student's entropy ([rows] fp32 when
    want_entropy, else None), with the FldOut that points at them. xs, ws: the operands as the C
    call sees them (lm_head's kept tensors: the gradients' dtypes)."""
    device = xs.device
    v, hs = ws.shape
    loss, soft = scalar_out(device), scalar_out(device)
    hard = scalar_out(device) if want_hard else torch.zeros(1, device=device)
    dxs = out_empty((rows, hs), xs.dtype, device) if want[0] else None
    dws = out_empty((v, hs), ws.dtype, device) if want[1] else None
    dbs = torch.empty(v, dtype=ws.dtype, device=device) if want[2] and bs is not None else None
    entropy, entropy_ptr = entropy_out(want_entropy, rows, device)
    out = _lib.FldOut(loss.data_ptr(), soft.data_ptr(), hard.data_ptr() if want_hard else None,
                      out_mat(dxs), out_mat(dws), ptr(dbs), None, None, None, entropy_ptr)
    return (loss, soft, hard, dxs, dws, dbs, entropy), out


def fused_results(outputs, xs, ws, bs):
    """(loss, soft, hard, dxs, dws, dbs, entropy): losses fp32, gradients shaped like the
    caller's xs, ws, bs and in their dtypes (cast back once when lm_head computed in another);
    entropy [rows] fp32 or None."""
    loss, soft, hard, dxs, dws, dbs, entropy = outputs
    if dxs is not None:
        dxs = dxs.view(xs.shape).to(xs.dtype)
    if dws is not None:
        dws = dws.to(ws.dtype)
    if dbs is not None:
        dbs = dbs.to(bs.dtype).view(bs.shape)
    return loss[0], soft[0], hard[0], dxs, dws, dbs, entropy


def fused_linear_distill(xs, ws, xt, wt, labels, bs, bt_bias, div, temperature, w_hard, w_soft,
                         ignore_index, chunk_size, t2_scale, vp, want,
                         maps=(1.0, 0.0, 1.0, 0.0), memory_budget=0, weights=None,
                         want_entropy=False):
    """One kdloss_fused_linear_distill call (div: a _lib.DivParams; vp: a VocabParallel or
    None). Shapes: xs (..., Hs), ws (V, Hs), xt (..., Ht), wt (>= V, Ht), labels (...) or None,
    biases [V] or None. `want` = (dxs, dws, dbs); maps: the heads' logit maps (functional's
    _maps); memory_budget: bytes, 0 = the library's choice. Returns (loss, soft, hard, dxs, dws,
    dbs, entropy) with the gradients shaped like their inputs; weights: [rows] per-row weights
    or None; entropy: the student's [rows] entropy when want_entropy, else None."""
    device = same_device([("student_input", xs), ("student_weight", ws), ("teacher_input", xt),
                          ("teacher_weight", wt), ("student_bias", bs), ("teacher_bias", bt_bias),
                          ("token_weights", weights)])
    backend = backend_for(device, vp)
    wt, bt_bias = teacher_head(ws, wt, bt_bias, vp)  # a padded teacher: its first V rows
    keep_s, xs_v, ws_v, bs2, rows, hs, v = lm_head(xs, ws, bs, "student")
    keep_t, xt_v, wt_v, bt2, _, ht, vt = lm_head(xt, wt, bt_bias, "teacher")
    if vt != v:
        raise shape_error(f"student_weight has V={v} rows, teacher_weight {vt}")
    token_counts(xs, xt)
    kept, lview, params, out = fld_frame(
        labels, rows, v, device, vp, (div, temperature, w_hard, w_soft, ignore_index, chunk_size,
                                      t2_scale, maps, memory_budget), want, keep_s, bs, weights,
        want_entropy)
    backend.fused_linear_distill(device, params, rows, hs, ht, v, xs_v, ws_v, ptr(bs2), xt_v,
                                 wt_v, ptr(bt2), lview, out, xs_v.dtype, any(want))
    return fused_results(kept[2], xs, ws, bs)


def token_counts(xs, xt):
    if xs.shape[:-1] != xt.shape[:-1]:
        raise shape_error(f"student_input {tuple(xs.shape)} and teacher_input {tuple(xt.shape)} "
                          "have different token counts")


def fld_frame(labels, rows, v, device, vp, loss_args, want, keep_s, bs, weights, want_entropy):
    """What every dense fused call (one teacher or several) builds around its operands: the
    labels view (without labels every row counts: filled ids, the CE weight 0), the params
    (loss_args: div, temperature, w_hard, w_soft, ignore_index, chunk_size, t2_scale, maps,
    memory_budget) with the per-row weights, and the fresh outputs. Returns (kept tensors:
    (labels, weights, outputs), labels view, params, FldOut); the kept ones must outlive the
    C call."""
    div, temperature, w_hard, w_soft, ignore_index, chunk_size, t2_scale, maps, budget = loss_args
    given = labels is not None
    if not given:  # every row counts (the C call needs labels; the CE weight is 0)
        labels, lview = filled_labels(rows, ignore_index, vp is None and v == 1, device)
    else:
        labels, lview = labels_view(labels, rows, device, "labels")
    params = _lib.fld_params(div, float(temperature), float(w_hard), float(w_soft),
                             int(ignore_index), int(chunk_size or 0), t2_scale, int(budget),
                             maps=maps)
    weights, params.row_weights = weights_view(weights, rows, device)
    # without labels the hard loss is 0, not the cross-entropy against the filled ids
    outputs, out = fused_outputs(want, keep_s[0], keep_s[1], bs, rows, given, want_entropy)
    return (labels, weights, outputs), lview, params, out


def fused_linear_topk_distill(xs, ws, ids, lps, labels, bs, div, tail, temperature, w_hard,
                              w_soft, ignore_index, chunk_size, t2_scale, want_hard, vp, want,
                              student_map=(1.0, 0.0), memory_budget=0, weights=None,
                              want_entropy=False):
    """One kdloss_fused_linear_topk_distill call; returns what fused_linear_distill does.
    Shapes: xs (..., H), ws (V, H), ids and lps (..., K), labels (...) or None. labels None
    passes no labels (every row kept; the C call then needs w_hard 0 and no hard-loss output)."""
    device = same_device([("student_input", xs), ("student_weight", ws), ("teacher_ids", ids),
                          ("teacher_logprobs", lps), ("student_bias", bs),
                          ("token_weights", weights)])
    backend = backend_for(device, vp)
    keep_s, xs_v, ws_v, bs2, rows, hs, v = lm_head(xs, ws, bs, "student")
    keep_t, teacher = topk_teacher(ids, lps, xs.shape[:-1])
    labels, lview = labels_view(labels, rows, device, "true_labels")
    params = _lib.fltk_params(div, tail, float(temperature), float(w_hard), float(w_soft),
                              int(ignore_index), int(chunk_size or 0), t2_scale,
                              int(memory_budget), student_map=student_map)
    weights, params.row_weights = weights_view(weights, rows, device)
    # the hard loss is asked for only when wanted: any cross-entropy output turns renorm_both's
    # sparse path (K gathered weight rows, no BT x V logits) off (so does the entropy)
    outputs, out = fused_outputs(want, keep_s[0], keep_s[1], bs, rows,
                                 want_hard and labels is not None, want_entropy)
    backend.fused_linear_topk_distill(device, params, rows, hs, v, xs_v, ws_v, ptr(bs2), teacher,
                                      lview, out, xs_v.dtype, any(want))
    return fused_results(outputs, xs, ws, bs)


def lm_head_shapes(x, w, b, who):
    """lm_head's checks that need no data (the fake implementations'): returns V."""
    check_weight(w, who)
    v, h = w.shape
    if x.shape[-1] != h:
        raise shape_error(f"{who}_input {tuple(x.shape)} / {who}_weight {tuple(w.shape)}: "
                          "hidden sizes differ")
    lm_dtype(x, w, who)
    if b is not None and b.numel() != v:
        raise shape_error(f"{who}_bias has {b.numel()} elements, expected V={v}")
    return v


def topk_shapes(ids, lps, lead):
    """topk_teacher's checks that need no data."""
    if ids.dim() == 0 or ids.shape != lps.shape or tuple(ids.shape[:-1]) != tuple(lead):
        raise shape_error(f"teacher_ids {tuple(ids.shape)} and teacher_logprobs "
                          f"{tuple(lps.shape)}: expected both (..., K) with the "
                          f"student's leading dims {tuple(lead)}")
    float_code(lps, "teacher_logprobs")


# ---- several teachers in one call (docs/MATH.md section 13) -------------------------------------

MULTI = "kdloss_fused_linear_distill_multi"


def multi_backend(device):
    """The backend of a several-teacher call on `device`: one with fused_linear_distill_multi
    (the CPU's, the CUDA one's: kdloss_cuda_fused_linear_distill_multi, or a registered one);
    KdlossError(UNSUPPORTED) for a backend without it."""
    backend = backend_for(device)
    if hasattr(backend, "fused_linear_distill_multi"):
        return backend
    raise KdlossError(_lib.ERR_UNSUPPORTED, f"several teacher heads (teacher_index=) on "
                      f"{device} tensors: the {device.type} backend has no "
                      f"fused_linear_distill_multi ({MULTI} and its kdloss_cuda_ twin are the "
                      "C library's); call the loss once per teacher on its own rows")


def index_shape(index, rows):
    """teacher_index's checks that need no data: an integer tensor, one entry per row."""
    if not isinstance(index, torch.Tensor) or index.is_floating_point() or index.is_complex() \
            or index.dtype == torch.bool:
        raise KdlossError(_lib.ERR_INVALID_DTYPE, "teacher_index: an integer tensor of one "
                          "teacher per row, not "
                          f"{getattr(index, 'dtype', type(index).__name__)}")
    if index.numel() != rows:
        raise shape_error(f"teacher_index has {index.numel()} elements {tuple(index.shape)}, "
                          f"expected one per row ({rows}; a teacher per sequence of (B, T) "
                          "rows: index[:, None].expand(B, T))")


def host_index(index, rows, n, device):
    """teacher_index as the C call takes it: [rows] int32 in host memory, copied there once
    (for a device tensor a stream synchronization: the index decides which rows share a teacher
    GEMM before anything runs, include/kdloss.h). It may be on the host or on the inputs'
    device. A value int32 cannot hold is refused here (the cast would wrap it into range); the
    others are checked by the C call (KDLOSS_ERR_INVALID_ID, its row and value)."""
    index_shape(index, rows)
    if index.device.type != "cpu" and index.device != device:
        raise KdlossError(_lib.ERR_UNSUPPORTED, f"teacher_index is on {index.device}, the "
                          f"inputs on {device} (it may be on either, or on the host)")
    idx = index.detach().reshape(rows).to("cpu")
    if idx.dtype != torch.int32:
        idx = idx.to(torch.int64)  # compared in int64: a narrower dtype would wrap the bounds
        wide = (idx < -2**31) | (idx >= 2**31)
        if rows and _backend.host_read(wide.any()):
            r = _backend.host_read(wide.nonzero()[0, 0])
            raise KdlossError(_lib.ERR_INVALID_ID, f"teacher_index[{r}] = "
                              f"{_backend.host_read(idx[r])} is not in [0, {n}) (nor in int32)")
        idx = idx.to(torch.int32)
    return idx.contiguous()


def heads_shapes(xs, ws, xt, wts, bts):
    """The several heads' checks that need no data (the fake implementation's too): at least
    one, each 2-D with at least the student's V rows (more: a padded vocabulary, its first V
    used, as teacher_head) and teacher_input's hidden size, each bias one value per row of its
    head, and one token count for both inputs."""
    if len(wts) == 0 or len(bts) != len(wts):
        raise KdlossError(_lib.ERR_INVALID_PARAM, f"{len(wts)} teacher heads and {len(bts)} "
                          "teacher biases: at least one head, one bias entry (or None) each")
    check_weight(ws, "student")
    for j, (w, b) in enumerate(zip(wts, bts)):
        if w.dim() != 2:
            raise shape_error(f"teacher_weight[{j}] must be 2-D (V, Ht), got {tuple(w.shape)}")
        if w.shape[0] < ws.shape[0] or w.shape[1] != xt.shape[-1]:
            raise shape_error(f"teacher_weight[{j}] {tuple(w.shape)}: expected (>= V, Ht) with "
                              f"the student's V = {ws.shape[0]} and teacher_input "
                              f"{tuple(xt.shape)}'s Ht")
        if b is not None and b.numel() != w.shape[0]:
            raise shape_error(f"teacher_bias[{j}] has {b.numel()} elements, expected one per "
                              f"row of teacher_weight[{j}] {tuple(w.shape)}")
    token_counts(xs, xt)


def teacher_heads(ws, xt, wts, bts):
    """(kept tensors, xt's view, TeacherHeads without its index, Ht): the several heads cut to
    the student's V rows (teacher_head) and, with teacher_input, in one dtype (operands_dtype:
    the C call takes every head in xt's)."""
    cut = [teacher_head(ws, w, b) for w, b in zip(wts, bts)]
    dt = operands_dtype([("teacher_input", xt)] + [(f"teacher_weight[{j}]", w)
                                                   for j, (w, _) in enumerate(cut)])
    x2, _, ht, ldx = as_rows(xt.to(dt), "teacher_input")
    views = [head_view(w, b, dt, f"teacher_weight[{j}]", f"teacher_bias[{j}]")
             for j, (w, b) in enumerate(cut)]
    n = len(views)
    mats = (_lib.CMat * n)(*(wv for _, wv, _ in views))
    biases = None
    if any(b is not None for _, _, b in views):
        biases = (ctypes.c_void_p * n)(*(ptr(b) for _, _, b in views))
    heads = _lib.TeacherHeads(n, mats, ctypes.cast(biases, ctypes.c_void_p) if biases else None,
                              None)
    return (x2, views, mats, biases), cmat(x2, ldx, float_code(x2, "teacher_input")), heads, ht


def fused_linear_distill_multi(xs, ws, xt, wts, labels, bs, bts, index, div, temperature,
                               w_hard, w_soft, ignore_index, chunk_size, t2_scale, want,
                               maps=(1.0, 0.0, 1.0, 0.0), memory_budget=0, weights=None,
                               want_entropy=False):
    """One kdloss_fused_linear_distill_multi call: fused_linear_distill's (no vocabulary
    parallelism) with several teachers. Shapes: wts [n] heads, each (>= V, Ht); bts [n] biases
    ([V] or None each); index (...) integer, one teacher per row, in [0, n) (host_index).
    Returns what fused_linear_distill does."""
    named = [("student_input", xs), ("student_weight", ws), ("teacher_input", xt)]
    named += [(f"teacher_weight[{j}]", w) for j, w in enumerate(wts)]
    named += [(f"teacher_bias[{j}]", b) for j, b in enumerate(bts)]
    device = same_device(named + [("student_bias", bs), ("token_weights", weights)])
    backend = multi_backend(device)
    heads_shapes(xs, ws, xt, wts, bts)
    keep_s, xs_v, ws_v, bs2, rows, hs, v = lm_head(xs, ws, bs, "student")
    keep_t, xt_v, heads, ht = teacher_heads(ws, xt, wts, bts)
    idx = host_index(index, rows, len(wts), device)
    heads.index = idx.data_ptr()
    kept, lview, params, out = fld_frame(
        labels, rows, v, device, None, (div, temperature, w_hard, w_soft, ignore_index,
                                        chunk_size, t2_scale, maps, memory_budget), want,
        keep_s, bs, weights, want_entropy)
    backend.fused_linear_distill_multi(device, params, rows, hs, ht, v, xs_v, ws_v, ptr(bs2),
                                       xt_v, heads, lview, out, xs_v.dtype, any(want))
    return fused_results(kept[2], xs, ws, bs)


# ---- fused losses declared by a spec ------------------------------------------------------------

class DenseTeacher:
    """A teacher given as its hidden states and LM head (kdloss_fused_linear_distill's form):
    C size arguments (bt, hs, ht, v, ...), call arguments (..., xs, ws, bs, xt, wt, bt_bias)."""

    tensors = ("teacher_input", "teacher_weight", "teacher_bias")
    optional = ("teacher_bias",)
    labels_required = True  # the C call takes labels; without them every row is kept
    always_reports = False

    @staticmethod
    def shapes(xs, ws, t):
        lm_head_shapes(t["teacher_input"], t["teacher_weight"], t["teacher_bias"], "teacher")
        teacher_head(ws, t["teacher_weight"], t["teacher_bias"])
        if xs.shape[:-1] != t["teacher_input"].shape[:-1]:
            raise shape_error(f"student_input {tuple(xs.shape)} and teacher_input "
                              f"{tuple(t['teacher_input'].shape)} have different token counts")

    @staticmethod
    def views(xs, ws, t, vp):
        """(kept tensors, the size query's dims, the call's dims, the teacher's call
        arguments) for the student's xs, ws."""
        DenseTeacher.shapes(xs, ws, t)
        wt, bt_bias = teacher_head(ws, t["teacher_weight"], t["teacher_bias"], vp)
        keep, xt_v, wt_v, bt2, rows, ht, v = lm_head(t["teacher_input"], wt, bt_bias, "teacher")
        dims = (rows, xs.shape[-1], ht, v)
        return keep, dims, dims, (xt_v, wt_v, ptr(bt2))


class TopkTeacher:
    """A stored sparse teacher, ids and log-probs (..., K) (kdloss_fused_linear_topk_distill's
    form): C size arguments (bt, hs, v, k, ...), call arguments (..., xs, ws, bs, teacher)."""

    tensors = ("teacher_ids", "teacher_logprobs")
    optional = ()
    labels_required = False
    always_reports = True  # the ids are checked on the device: the status word can report them

    @staticmethod
    def shapes(xs, ws, t):
        topk_shapes(t["teacher_ids"], t["teacher_logprobs"], xs.shape[:-1])

    @staticmethod
    def views(xs, ws, t, vp):
        keep, teacher = topk_teacher(t["teacher_ids"], t["teacher_logprobs"], xs.shape[:-1])
        rows, hs, v = xs.numel() // max(1, xs.shape[-1]), xs.shape[-1], ws.shape[0]
        return keep, (rows, hs, v, teacher.k), (rows, hs, v), (teacher,)


TEACHER_FORMS = {"dense": DenseTeacher, "topk": TopkTeacher}


@dataclasses.dataclass(frozen=True)
class FusedSpec:
    """A fused LM-head loss declared once: modules.declare_fused(spec) makes its custom op
    (kdloss::`name`), its functional form (functional.`name`_loss), its module and its backend
    call from this record. c_name: the C entry point (its size query c_name + "_workspace_size",
    its CUDA twin kdloss_cuda_..., its vocabulary-parallel form c_name + "_vp"); teacher: a key
    of TEACHER_FORMS (the teacher's tensors and their place in the C call); params: builds the
    C params struct from the scalars (every one of `scalars`, plus ignore_index, chunk_size,
    memory_budget) as keywords; scalars: ((name, default), ...), the loss's own keyword
    arguments, each a float, int, bool or str as its default; doc: the functional form's
    docstring."""

    name: str
    c_name: str
    teacher: str
    params: Callable
    scalars: Tuple[Tuple[str, object], ...] = ()
    doc: str = ""

    @property
    def form(self):
        return TEACHER_FORMS[self.teacher]


def fused_call(spec, tensors, labels, scalars, vp, want, weights=None, want_entropy=False):
    """One call of a spec-declared fused loss. tensors: name -> tensor (student_input (..., H),
    student_weight (V, H), student_bias [V] or None, and the teacher form's); labels (...) or
    None (every row kept); scalars: name -> value (spec.params's keywords); weights and
    want_entropy as fused_linear_distill's. Returns (loss, soft, hard, dxs, dws, dbs, entropy)
    as fused_linear_distill."""
    form = spec.form
    xs, ws, bs = tensors["student_input"], tensors["student_weight"], tensors["student_bias"]
    device = same_device(list(tensors.items()))
    backend = backend_for(device, vp)
    keep_s, xs_v, ws_v, bs2, rows, hs, v = lm_head(xs, ws, bs, "student")
    keep_t, size_dims, call_dims, teacher_args = form.views(xs, ws, tensors, vp)
    given = labels is not None
    if given:
        labels, lview = labels_view(labels, rows, device, "labels")
    elif form.labels_required:
        labels, lview = filled_labels(rows, scalars["ignore_index"], vp is None and v == 1,
                                      device)
    else:
        lview = _lib.Labels(None, _lib.I64)
    params = spec.params(**scalars)
    weights, wptr = weights_view(weights, rows, device)
    if wptr is not None:
        if "row_weights" not in (f[0] for f in type(params)._fields_):
            raise KdlossError(_lib.ERR_UNSUPPORTED, f"{spec.name}: token_weights, but its params "
                              f"({type(params).__name__}) have no row_weights")
        params.row_weights = wptr
    outputs, out = fused_outputs(want, keep_s[0], keep_s[1], bs, rows, given, want_entropy)
    p = ctypes.byref(params)
    backend.fused(device, spec.c_name, v, (p, *size_dims, xs_v.dtype, int(any(want))),
                  (p, *call_dims, xs_v, ws_v, ptr(bs2), *teacher_args, lview, ctypes.byref(out)),
                  form.always_reports or reports(lview))
    return fused_results(outputs, xs, ws, bs)
