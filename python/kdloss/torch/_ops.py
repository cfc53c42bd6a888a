"""kdloss's losses as torch.library custom ops (namespace `kdloss`), so that torch.compile
(fullgraph=True, no graph breaks), torch.export, FakeTensor and meta tensors see them as single
opaque ops: the ctypes call happens only inside each op's implementation, on real tensors.

    torch.ops.kdloss.kl_div, jsd, distill_loss, topk_distill_loss          (losses on logits)
    torch.ops.kdloss.fused_linear_distill, fused_linear_topk_distill        (fused LM head)

Each op takes tensors and plain scalars (float / int / bool / str; Optional tensors for labels
and biases), mutates nothing, and returns the loss together with the gradient(s) of the student
tensor(s) formed in the same C pass (an empty float32 tensor of shape (0,) for a gradient not
asked for: want_* False). register_autograd's backward only scales the saved gradients by the
upstream gradient; as the eager autograd Functions, it is first-order only (functional's
_first_order_only: double backward raises). The fake (meta) implementations give the outputs'
shapes and dtypes from the inputs' and check what can be checked without data (shapes, dtypes).
The backend (CPU, CUDA, a registered one) is chosen by device inside the op, as before.

The vocabulary-parallel calls (process_group=) do not go through these ops (their C call runs
torch.distributed collectives from a ctypes callback): they stay eager. functional.py calls the
ops; this module is private.
"""

from typing import Optional, Tuple

import torch

from .. import _lib
from . import functional as F

_LIB = "kdloss"
_F32 = torch.float32


def _no_grad_out(like):
    """The placeholder for a gradient that was not asked for."""
    return torch.empty(0, dtype=_F32, device=like.device)


def _grad_or_none(g, want, like):
    return g if want and g is not None else _no_grad_out(like)


def _fake_grad(t, want):
    return t.new_empty(t.shape, dtype=t.dtype) if want else t.new_empty((0,), dtype=_F32)


def _saved(g):
    """A saved gradient, None for the (0,) placeholder of one not formed."""
    return g if g.dim() != 1 or g.numel() != 0 else None


def _scaled(g, grad_output):
    return None if g is None else F._scale(g, grad_output)


# ---- kl_div ---------------------------------------------------------------------------------------

@torch.library.custom_op(f"{_LIB}::kl_div", mutates_args=())
def kl_div(input: torch.Tensor, target: torch.Tensor, reduction: str, log_target: bool,
           eps: float, want_grad: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    out, grad = F._kl_compute(input, target, reduction, log_target, eps, want_grad)
    return out, _grad_or_none(grad, want_grad, input)


@kl_div.register_fake
def _(input, target, reduction, log_target, eps, want_grad):
    F.reduction_code(reduction)
    if input.shape != target.shape:
        raise F._shape_error(f"kl_div: input {tuple(input.shape)} vs target "
                             f"{tuple(target.shape)}")
    F.float_code(input, "input"), F.float_code(target, "target")
    if reduction == "none":
        out = input.new_empty(input.shape, dtype=F._promoted(input, target))
    else:
        out = input.new_empty((), dtype=_F32)
    return out, _fake_grad(input, want_grad)


def _kl_setup(ctx, inputs, output):
    ctx.elementwise = inputs[2] == "none"
    ctx.save_for_backward(output[1], inputs[0])  # the student: _first_order_only's anchor
    ctx.mark_non_differentiable(output[1])


@F._first_order_only
def _kl_backward(ctx, grad_output, _grad_grad):
    grad = _saved(ctx.saved_tensors[0])
    if grad is not None:
        if ctx.elementwise:
            grad = grad * grad_output.to(grad.dtype)
        else:
            grad = F._scale(grad, grad_output)
    return grad, None, None, None, None, None


kl_div.register_autograd(_kl_backward, setup_context=_kl_setup)


# ---- jsd ------------------------------------------------------------------------------------------

@torch.library.custom_op(f"{_LIB}::jsd", mutates_args=())
def jsd(input: torch.Tensor, target: torch.Tensor, shift_labels: Optional[torch.Tensor],
        beta: float, ignore_index: int, want_grad: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    out, grad = F._jsd_compute(input, target, shift_labels, beta, ignore_index, want_grad)
    return out, _grad_or_none(grad, want_grad, input)


@jsd.register_fake
def _(input, target, shift_labels, beta, ignore_index, want_grad):
    if input.shape != target.shape:
        raise F._shape_error(f"jsd: input (log_q) {tuple(input.shape)} vs target (log_p) "
                             f"{tuple(target.shape)}")
    F.float_code(input, "input (log_q)"), F.float_code(target, "target (log_p)")
    return input.new_empty((), dtype=_F32), _fake_grad(input, want_grad)


def _student_setup(ctx, inputs, output):
    """One student tensor (inputs[0]) and its gradient (output[1]); ctx.rowwise: the loss is
    one value per row (reduction "none" of distill_loss / topk_distill_loss)."""
    ctx.save_for_backward(output[1], inputs[0])
    ctx.mark_non_differentiable(output[1])


def _jsd_setup(ctx, inputs, output):
    ctx.rowwise = False
    _student_setup(ctx, inputs, output)


@F._first_order_only
def _student_backward(ctx, grad_output, _grad_grad):
    dz = _saved(ctx.saved_tensors[0])
    if dz is not None:
        if ctx.rowwise:
            dz = dz * grad_output.to(dz.dtype).unsqueeze(-1)
        else:
            dz = F._scale(dz, grad_output)
    return (dz,) + (None,) * ctx.n_other


def _with_others(setup, n_other):
    def wrapped(ctx, inputs, output):
        ctx.n_other = n_other
        setup(ctx, inputs, output)
    return wrapped


jsd.register_autograd(_student_backward, setup_context=_with_others(_jsd_setup, 5))


# ---- distill_loss, topk_distill_loss ------------------------------------------------------------

def _row_loss_fake(zs, reduction):
    if reduction == "none":
        return zs.new_empty(zs.shape[:-1], dtype=_F32)
    return zs.new_empty((), dtype=_F32)


def _check_reduction(reduction, fname):
    if reduction not in F._DISTILL_REDUCTIONS:
        raise _lib.KdlossError(_lib.ERR_INVALID_REDUCTION, f"reduction={reduction!r} "
                               f"({fname} takes batchmean, sum, mean or none)")


@torch.library.custom_op(f"{_LIB}::distill_loss", mutates_args=())
def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                 labels: Optional[torch.Tensor], divergence: str, beta: float, alpha: float,
                 temperature: float, ignore_index: int, reduction: str,
                 want_grad: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    div = _lib.div_params(divergence, beta, alpha)
    out, dz = F._distill_compute(student_logits, teacher_logits, labels, div, temperature,
                                 ignore_index, reduction, want_grad)
    return out, _grad_or_none(dz, want_grad, student_logits)


@distill_loss.register_fake
def _(student_logits, teacher_logits, labels, divergence, beta, alpha, temperature,
      ignore_index, reduction, want_grad):
    _check_reduction(reduction, "distill_loss")
    F.float_code(student_logits, "student_logits")
    F._teacher_logits(student_logits, teacher_logits, "distill_loss")  # more columns: sliced
    F.float_code(teacher_logits, "teacher_logits")
    return _row_loss_fake(student_logits, reduction), _fake_grad(student_logits, want_grad)


def _rowwise_setup(reduction_at, n_other):
    def setup(ctx, inputs, output):
        ctx.rowwise = inputs[reduction_at] == "none"
        ctx.n_other = n_other
        _student_setup(ctx, inputs, output)
    return setup


distill_loss.register_autograd(_student_backward, setup_context=_rowwise_setup(8, 9))


@torch.library.custom_op(f"{_LIB}::topk_distill_loss", mutates_args=())
def topk_distill_loss(student_logits: torch.Tensor, teacher_ids: torch.Tensor,
                      teacher_logprobs: torch.Tensor, labels: Optional[torch.Tensor],
                      divergence: str, tail: str, beta: float, alpha: float, temperature: float,
                      ignore_index: int, reduction: str,
                      want_grad: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    div = _lib.div_params(divergence, beta, alpha)
    code = _lib.topk_tail(tail)
    out, dz = F._topk_compute(student_logits, teacher_ids, teacher_logprobs, labels, div, code,
                              temperature, ignore_index, reduction, want_grad)
    return out, _grad_or_none(dz, want_grad, student_logits)


def _topk_shapes_fake(ids, lps, lead):
    if ids.dim() == 0 or ids.shape != lps.shape or tuple(ids.shape[:-1]) != tuple(lead):
        raise F._shape_error(f"teacher_ids {tuple(ids.shape)} and teacher_logprobs "
                             f"{tuple(lps.shape)}: expected both (..., K) with the "
                             f"student's leading dims {tuple(lead)}")
    F.float_code(lps, "teacher_logprobs")


@topk_distill_loss.register_fake
def _(student_logits, teacher_ids, teacher_logprobs, labels, divergence, tail, beta, alpha,
      temperature, ignore_index, reduction, want_grad):
    _check_reduction(reduction, "topk_distill_loss")
    F.float_code(student_logits, "student_logits")
    _topk_shapes_fake(teacher_ids, teacher_logprobs, student_logits.shape[:-1])
    return _row_loss_fake(student_logits, reduction), _fake_grad(student_logits, want_grad)


topk_distill_loss.register_autograd(_student_backward, setup_context=_rowwise_setup(10, 11))


# ---- fused LM head + loss -------------------------------------------------------------------------

_FusedOut = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                  torch.Tensor]


def _fused_out(results, want, xs, ws, bs):
    loss, soft, hard, dxs, dws, dbs = results
    return (loss, soft, hard, _grad_or_none(dxs, want[0], xs), _grad_or_none(dws, want[1], ws),
            _grad_or_none(dbs, want[2] and bs is not None, ws))


def _lm_head_fake(x, w, b, who):
    F._check_weight(w, who)
    v, h = w.shape
    if x.shape[-1] != h:
        raise F._shape_error(f"{who}_input {tuple(x.shape)} / {who}_weight {tuple(w.shape)}: "
                             "hidden sizes differ")
    F._lm_dtype(x, w, who)
    if b is not None and b.numel() != v:
        raise F._shape_error(f"{who}_bias has {b.numel()} elements, expected V={v}")
    return v


def _fused_fake(xs, ws, bs, want):
    scalar = xs.new_empty((), dtype=_F32)
    return (scalar, scalar.new_empty(()), scalar.new_empty(()), _fake_grad(xs, want[0]),
            _fake_grad(ws, want[1]),
            _fake_grad(bs, want[2]) if bs is not None else ws.new_empty((0,), dtype=_F32))


@torch.library.custom_op(f"{_LIB}::fused_linear_distill", mutates_args=())
def fused_linear_distill(student_input: torch.Tensor, student_weight: torch.Tensor,
                         teacher_input: torch.Tensor, teacher_weight: torch.Tensor,
                         labels: Optional[torch.Tensor], student_bias: Optional[torch.Tensor],
                         teacher_bias: Optional[torch.Tensor], divergence: str, beta: float,
                         alpha: float, temperature: float, weight_hard_loss: float,
                         weight_soft_loss: float, ignore_index: int, chunk_size: int,
                         t2_scale: bool, want_dx: bool, want_dw: bool, want_db: bool,
                         student_scale: float = 1.0, student_softcap: float = 0.0,
                         teacher_scale: float = 1.0, teacher_softcap: float = 0.0) -> _FusedOut:
    div = _lib.div_params(divergence, beta, alpha)
    want = (want_dx, want_dw, want_db and student_bias is not None)
    maps = (student_scale, student_softcap, teacher_scale, teacher_softcap)
    results = F._fld_compute(student_input, student_weight, teacher_input, teacher_weight, labels,
                             student_bias, teacher_bias, div, temperature, weight_hard_loss,
                             weight_soft_loss, ignore_index, chunk_size, t2_scale, None, want,
                             maps)
    return _fused_out(results, want, student_input, student_weight, student_bias)


@fused_linear_distill.register_fake
def _(student_input, student_weight, teacher_input, teacher_weight, labels, student_bias,
      teacher_bias, divergence, beta, alpha, temperature, weight_hard_loss, weight_soft_loss,
      ignore_index, chunk_size, t2_scale, want_dx, want_dw, want_db, student_scale=1.0,
      student_softcap=0.0, teacher_scale=1.0, teacher_softcap=0.0):
    _lm_head_fake(student_input, student_weight, student_bias, "student")
    _lm_head_fake(teacher_input, teacher_weight, teacher_bias, "teacher")
    F._teacher_head(student_weight, teacher_weight, teacher_bias)  # more rows: the first V
    if student_input.shape[:-1] != teacher_input.shape[:-1]:
        raise F._shape_error(f"student_input {tuple(student_input.shape)} and teacher_input "
                             f"{tuple(teacher_input.shape)} have different token counts")
    return _fused_fake(student_input, student_weight, student_bias,
                       (want_dx, want_dw, want_db and student_bias is not None))


def _fused_setup(bias_at, n_inputs):
    def setup(ctx, inputs, output):
        ctx.bias_at, ctx.n_inputs = bias_at, n_inputs
        ctx.save_for_backward(*output[3:], inputs[0], inputs[1])
        ctx.mark_non_differentiable(*output[1:])  # soft, hard: not differentiated separately
    return setup


@F._first_order_only
def _fused_backward(ctx, grad_loss, *_others):
    dxs, dws, dbs = (_saved(g) for g in ctx.saved_tensors[:3])
    grads = [None] * ctx.n_inputs
    grads[0], grads[1] = _scaled(dxs, grad_loss), _scaled(dws, grad_loss)
    grads[ctx.bias_at] = _scaled(dbs, grad_loss)
    return tuple(grads)


fused_linear_distill.register_autograd(_fused_backward, setup_context=_fused_setup(5, 23))


@torch.library.custom_op(f"{_LIB}::fused_linear_topk_distill", mutates_args=())
def fused_linear_topk_distill(student_input: torch.Tensor, student_weight: torch.Tensor,
                              teacher_ids: torch.Tensor, teacher_logprobs: torch.Tensor,
                              labels: Optional[torch.Tensor], student_bias: Optional[torch.Tensor],
                              divergence: str, tail: str, beta: float, alpha: float,
                              temperature: float, weight_hard_loss: float,
                              weight_soft_loss: float, ignore_index: int, chunk_size: int,
                              t2_scale: bool, want_hard: bool, want_dx: bool, want_dw: bool,
                              want_db: bool, student_scale: float = 1.0,
                              student_softcap: float = 0.0) -> _FusedOut:
    div = _lib.div_params(divergence, beta, alpha)
    code = _lib.topk_tail(tail)
    want = (want_dx, want_dw, want_db and student_bias is not None)
    results = F._fltk_compute(student_input, student_weight, teacher_ids, teacher_logprobs,
                              labels, student_bias, div, code, temperature, weight_hard_loss,
                              weight_soft_loss, ignore_index, chunk_size, t2_scale, want_hard,
                              None, want, (student_scale, student_softcap))
    return _fused_out(results, want, student_input, student_weight, student_bias)


@fused_linear_topk_distill.register_fake
def _(student_input, student_weight, teacher_ids, teacher_logprobs, labels, student_bias,
      divergence, tail, beta, alpha, temperature, weight_hard_loss, weight_soft_loss,
      ignore_index, chunk_size, t2_scale, want_hard, want_dx, want_dw, want_db, student_scale=1.0,
      student_softcap=0.0):
    _lm_head_fake(student_input, student_weight, student_bias, "student")
    _topk_shapes_fake(teacher_ids, teacher_logprobs, student_input.shape[:-1])
    return _fused_fake(student_input, student_weight, student_bias,
                       (want_dx, want_dw, want_db and student_bias is not None))


fused_linear_topk_distill.register_autograd(_fused_backward, setup_context=_fused_setup(5, 22))


# ---- meta tensors outside FakeTensorMode --------------------------------------------------------
# register_fake also made each op's Meta kernel; eager meta tensors get the library's rule instead,
# as before the ops: the backend registered for "meta" (register_backend), else
# KdlossError(UNSUPPORTED). FakeTensorMode, torch.compile and torch.export use the fake
# implementations above (FakeTensorMode looks them up before any Meta kernel).

_META = torch.library.Library(_LIB, "FRAGMENT")


def _meta_as_before(op):
    impl = op._init_fn

    def meta(*args):
        from ._backend import backend_for
        backend_for(torch.device("meta"))
        return impl(*args)
    try:
        _META.impl(op._qualname, meta, "Meta", allow_override=True)
    except TypeError:  # an older torch without allow_override: meta tensors get the shapes
        pass


for _op in (kl_div, jsd, distill_loss, topk_distill_loss, fused_linear_distill,
            fused_linear_topk_distill):
    _meta_as_before(_op)
