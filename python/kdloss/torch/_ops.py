"""The ops floor of kdloss.torch: its losses as torch.library custom ops (namespace `kdloss`) and
the autograd helpers they share, so that torch.compile (fullgraph=True, no graph breaks),
torch.export, FakeTensor and meta tensors see each loss as one opaque op: the ctypes call happens
only inside each op's implementation (_calls.py), on real tensors.

    torch.ops.kdloss.kl_div, jsd, distill_loss, topk_distill_loss          (losses on logits)
    torch.ops.kdloss.fused_linear_distill, fused_linear_topk_distill        (fused LM head)
    torch.ops.kdloss.fused_linear_distill_multi              (fused, several teachers, CPU)

Each op takes tensors and plain scalars (float / int / bool / str; Optional tensors for labels
and biases), mutates nothing, and returns the loss together with the gradient(s) of the student
tensor(s) formed in the same C pass (an empty float32 tensor of shape (0,) for a gradient not
asked for: want_* False). register_autograd's backward only scales the saved gradients by the
upstream gradient, and is first-order only (first_order_only: double backward raises). These are
the one autograd route of each operation: the functional forms, the Liger-named Functions'
apply and the vocabulary-parallel calls all go through them. The fake (meta) implementations
give the outputs' shapes and dtypes from the inputs' and check what can be checked without data
(shapes, dtypes). The backend (CPU, CUDA, a registered one) is chosen by device inside the op.

A vocabulary-parallel call (process_group=) cannot hand its group to an op (an op takes tensors
and scalars): functional.py enters it with vocab_call(vp), which lends the op an integer handle
to it for the call; the op's implementation looks the VocabParallel up by that handle (0: none).
Such a call stays eager (its C call runs torch.distributed collectives from a ctypes callback).

Imports only downward: _calls, _backend and _lib.
"""

import contextlib
import functools
import inspect
import itertools
from typing import List, Optional, Tuple

import torch

from .. import _lib
from . import _backend, _calls

def traced(t):
    """True while `t` is being traced (torch.compile, torch.export, make_fx, FakeTensor): its
    value is then unknown, or reading it would freeze one value into the graph."""
    if torch.compiler.is_compiling() or type(t) is not torch.Tensor:
        return True
    if torch._is_functional_tensor(t):
        return True
    from torch.fx.experimental.proxy_tensor import get_proxy_mode
    return get_proxy_mode() is not None


def no_zero_grads(ctx):
    """Every op's outputs after the loss (its saved gradients, the parts, the entropy) carry no
    gradient: without this, autograd would fill a zero tensor of each one's shape on every
    backward (a V x H one for a fused loss's dW) only for the backward to ignore it."""
    ctx.set_materialize_grads(False)


def scale(saved, grad_output):
    """saved * grad_output for a scalar loss. In host memory the pass over `saved` is skipped
    when grad_output == 1 (reading it is free there; eager only: a traced grad_output is always
    multiplied). On a device it is always multiplied there: reading grad_output would
    synchronize the stream, and the multiply costs one pass over the saved gradient
    (docs/ARCHITECTURE.md, "Host synchronizations")."""
    if saved is None or grad_output is None:
        return None
    if (grad_output.numel() == 1 and not traced(grad_output) and _backend.is_host(grad_output)
            and _backend.host_read(grad_output) == 1.0):
        return saved
    return saved * grad_output.to(saved.dtype)


_TWICE = ("kdloss: these losses are differentiable once only (backward returns the gradient "
          "saved by forward, a constant); double backward, e.g. a gradient penalty through the "
          "loss, is not supported")


def first_order_only(backward):
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


_LIB = "kdloss"
_F32 = torch.float32


def _params(op):
    """The names of a custom op's arguments, in order (what its backward returns one gradient
    or None for): counted from its definition, never typed in."""
    return list(inspect.signature(op._init_fn).parameters)


def _no_grad_out(like):
    """The placeholder for a gradient that was not asked for."""
    return torch.empty(0, dtype=_F32, device=like.device)


def _grad_or_none(g, want, like):
    return g if want and g is not None else _no_grad_out(like)


def _fake_grad(t, want):
    return t.new_empty(t.shape, dtype=t.dtype) if want else t.new_empty((0,), dtype=_F32)


def saved(g):
    """A saved gradient, None for the (0,) placeholder of one not formed."""
    return g if g.dim() != 1 or g.numel() != 0 else None


def _scaled(g, grad_output):
    return None if g is None else scale(g, grad_output)


# ---- kl_div ---------------------------------------------------------------------------------------

@torch.library.custom_op(f"{_LIB}::kl_div", mutates_args=())
def kl_div(input: torch.Tensor, target: torch.Tensor, reduction: str, log_target: bool,
           eps: float, want_grad: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    out, grad = _calls.kl_div(input, target, reduction, log_target, eps, want_grad)
    return out, _grad_or_none(grad, want_grad, input)


@kl_div.register_fake
def _(input, target, reduction, log_target, eps, want_grad):
    _calls.reduction_code(reduction)
    if input.shape != target.shape:
        raise _calls.shape_error(f"kl_div: input {tuple(input.shape)} vs target "
                             f"{tuple(target.shape)}")
    _backend.float_code(input, "input"), _backend.float_code(target, "target")
    if reduction == "none":
        out = input.new_empty(input.shape, dtype=_calls.promoted(input, target))
    else:
        out = input.new_empty((), dtype=_F32)
    return out, _fake_grad(input, want_grad)


def _kl_setup(ctx, inputs, output):
    no_zero_grads(ctx)
    ctx.elementwise = inputs[2] == "none"
    ctx.save_for_backward(output[1], inputs[0])  # the student: first_order_only's anchor
    ctx.mark_non_differentiable(output[1])


@first_order_only
def _kl_backward(ctx, grad_output, _grad_grad):
    grad = saved(ctx.saved_tensors[0]) if grad_output is not None else None
    if grad is not None:
        if ctx.elementwise:
            grad = grad * grad_output.to(grad.dtype)
        else:
            grad = scale(grad, grad_output)
    return grad, None, None, None, None, None


kl_div.register_autograd(_kl_backward, setup_context=_kl_setup)


# ---- jsd ------------------------------------------------------------------------------------------

@torch.library.custom_op(f"{_LIB}::jsd", mutates_args=())
def jsd(input: torch.Tensor, target: torch.Tensor, shift_labels: Optional[torch.Tensor],
        beta: float, ignore_index: int, want_grad: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    out, grad = _calls.jsd(input, target, shift_labels, beta, ignore_index, want_grad)
    return out, _grad_or_none(grad, want_grad, input)


@jsd.register_fake
def _(input, target, shift_labels, beta, ignore_index, want_grad):
    if input.shape != target.shape:
        raise _calls.shape_error(f"jsd: input (log_q) {tuple(input.shape)} vs target (log_p) "
                             f"{tuple(target.shape)}")
    _backend.float_code(input, "input (log_q)"), _backend.float_code(target, "target (log_p)")
    return input.new_empty((), dtype=_F32), _fake_grad(input, want_grad)


def _student_setup(ctx, inputs, output):
    """One student tensor (inputs[0]) and its gradient (output[1]); ctx.rowwise: the loss is
    one value per row (reduction "none" of distill_loss / topk_distill_loss). Outputs after the
    gradient (the student's entropy) carry no gradient."""
    no_zero_grads(ctx)
    ctx.save_for_backward(output[1], inputs[0])
    ctx.mark_non_differentiable(*output[1:])


def _jsd_setup(ctx, inputs, output):
    ctx.rowwise = False
    _student_setup(ctx, inputs, output)


@first_order_only
def _student_backward(ctx, grad_output, *_others):
    dz = saved(ctx.saved_tensors[0]) if grad_output is not None else None
    if dz is not None:
        if ctx.rowwise:
            dz = dz * grad_output.to(dz.dtype).unsqueeze(-1)
        else:
            dz = scale(dz, grad_output)
    return (dz,) + (None,) * ctx.n_other


def _with_others(setup, n_other):
    def wrapped(ctx, inputs, output):
        ctx.n_other = n_other
        setup(ctx, inputs, output)
    return wrapped


jsd.register_autograd(_student_backward,
                      setup_context=_with_others(_jsd_setup, len(_params(jsd)) - 1))


# ---- distill_loss, topk_distill_loss ------------------------------------------------------------
# Both take token_weights ([BT] per-row weights, or None) and want_entropy, and return (loss, dz,
# entropy): the student's entropy [BT] float32 when want_entropy, else the (0,) placeholder
# (include/kdloss.h, "Per-row weights and the student's entropy"). Neither gets a gradient.

def _entropy_or_none(e, like):
    return e if e is not None else _no_grad_out(like)


def _fake_entropy(lead, want, like):
    rows = 1
    for d in lead:
        rows *= d
    return like.new_empty((rows,) if want else (0,), dtype=_F32)


def _fake_weights(weights, lead):
    if weights is not None:
        rows = 1
        for d in lead:
            rows *= d
        if weights.numel() != rows:
            raise _calls.shape_error(f"token_weights has {weights.numel()} elements "
                                     f"{tuple(weights.shape)}, expected one per row ({rows})")

def _row_loss_fake(zs, reduction):
    if reduction == "none":
        return zs.new_empty(zs.shape[:-1], dtype=_F32)
    return zs.new_empty((), dtype=_F32)


def _check_reduction(reduction, fname):
    if reduction not in _calls.DISTILL_REDUCTIONS:
        raise _lib.KdlossError(_lib.ERR_INVALID_REDUCTION, f"reduction={reduction!r} "
                               f"({fname} takes batchmean, sum, mean or none)")


@torch.library.custom_op(f"{_LIB}::distill_loss", mutates_args=())
def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                 labels: Optional[torch.Tensor], divergence: str, beta: float, alpha: float,
                 temperature: float, ignore_index: int, reduction: str, want_grad: bool,
                 token_weights: Optional[torch.Tensor] = None, want_entropy: bool = False
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    div = _lib.div_params(divergence, beta, alpha)
    out, dz, ent = _calls.distill_loss(student_logits, teacher_logits, labels, div, temperature,
                                       ignore_index, reduction, want_grad, token_weights,
                                       want_entropy)
    return (out, _grad_or_none(dz, want_grad, student_logits),
            _entropy_or_none(ent, student_logits))


@distill_loss.register_fake
def _(student_logits, teacher_logits, labels, divergence, beta, alpha, temperature,
      ignore_index, reduction, want_grad, token_weights=None, want_entropy=False):
    _check_reduction(reduction, "distill_loss")
    _backend.float_code(student_logits, "student_logits")
    _calls.teacher_logits(student_logits, teacher_logits, "distill_loss")  # more columns: sliced
    _backend.float_code(teacher_logits, "teacher_logits")
    _fake_weights(token_weights, student_logits.shape[:-1])
    return (_row_loss_fake(student_logits, reduction), _fake_grad(student_logits, want_grad),
            _fake_entropy(student_logits.shape[:-1], want_entropy, student_logits))


def _rowwise_setup(op):
    params = _params(op)
    reduction_at, n_other = params.index("reduction"), len(params) - 1

    def setup(ctx, inputs, output):
        ctx.rowwise = inputs[reduction_at] == "none"
        ctx.n_other = n_other
        _student_setup(ctx, inputs, output)
    return setup


distill_loss.register_autograd(_student_backward, setup_context=_rowwise_setup(distill_loss))


@torch.library.custom_op(f"{_LIB}::topk_distill_loss", mutates_args=())
def topk_distill_loss(student_logits: torch.Tensor, teacher_ids: torch.Tensor,
                      teacher_logprobs: torch.Tensor, labels: Optional[torch.Tensor],
                      divergence: str, tail: str, beta: float, alpha: float, temperature: float,
                      ignore_index: int, reduction: str, want_grad: bool,
                      token_weights: Optional[torch.Tensor] = None, want_entropy: bool = False
                      ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    div = _lib.div_params(divergence, beta, alpha)
    code = _lib.topk_tail(tail)
    out, dz, ent = _calls.topk_distill_loss(student_logits, teacher_ids, teacher_logprobs,
                                            labels, div, code, temperature, ignore_index,
                                            reduction, want_grad, token_weights, want_entropy)
    return (out, _grad_or_none(dz, want_grad, student_logits),
            _entropy_or_none(ent, student_logits))


@topk_distill_loss.register_fake
def _(student_logits, teacher_ids, teacher_logprobs, labels, divergence, tail, beta, alpha,
      temperature, ignore_index, reduction, want_grad, token_weights=None, want_entropy=False):
    _check_reduction(reduction, "topk_distill_loss")
    _backend.float_code(student_logits, "student_logits")
    _calls.topk_shapes(teacher_ids, teacher_logprobs, student_logits.shape[:-1])
    _fake_weights(token_weights, student_logits.shape[:-1])
    return (_row_loss_fake(student_logits, reduction), _fake_grad(student_logits, want_grad),
            _fake_entropy(student_logits.shape[:-1], want_entropy, student_logits))


topk_distill_loss.register_autograd(_student_backward,
                                    setup_context=_rowwise_setup(topk_distill_loss))


# ---- fused LM head + loss -------------------------------------------------------------------------

# Every fused op returns (loss, soft, hard, dxs, dws, dbs, entropy): entropy the student's [BT]
# float32 entropy when want_entropy, else the (0,) placeholder; token_weights: [BT] or None.
_FusedOut = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                  torch.Tensor, torch.Tensor]


def _fused_out(results, want, xs, ws, bs):
    loss, soft, hard, dxs, dws, dbs, ent = results
    return (loss, soft, hard, _grad_or_none(dxs, want[0], xs), _grad_or_none(dws, want[1], ws),
            _grad_or_none(dbs, want[2] and bs is not None, ws), _entropy_or_none(ent, xs))


def _fused_fake(xs, ws, bs, want, want_entropy=False, token_weights=None):
    _fake_weights(token_weights, xs.shape[:-1])
    scalar = xs.new_empty((), dtype=_F32)
    return (scalar, scalar.new_empty(()), scalar.new_empty(()), _fake_grad(xs, want[0]),
            _fake_grad(ws, want[1]),
            _fake_grad(bs, want[2]) if bs is not None else ws.new_empty((0,), dtype=_F32),
            _fake_entropy(xs.shape[:-1], want_entropy, xs))


# ---- vocabulary-parallel calls: the group lent to an op by handle -------------------------------

_LENT = {}  # handle -> the VocabParallel of a call in progress
_HANDLES = itertools.count(1)


@contextlib.contextmanager
def vocab_call(vp):
    """The handle a fused op takes as `vocab_parallel` for the VocabParallel `vp` (0 for None),
    valid for the `with` block."""
    if vp is None:
        yield 0
        return
    handle = next(_HANDLES)
    _LENT[handle] = vp
    try:
        yield handle
    finally:
        del _LENT[handle]


def _lent(handle):
    """The VocabParallel lent under `handle` (None for 0)."""
    if handle == 0:
        return None
    vp = _LENT.get(handle)
    if vp is None:
        raise _lib.KdlossError(_lib.ERR_INVALID_PARAM, f"vocab_parallel={handle}: no "
                               "vocabulary-parallel call holds this handle (functional.py "
                               "lends one for the duration of a call)")
    return vp


@torch.library.custom_op(f"{_LIB}::fused_linear_distill", mutates_args=())
def fused_linear_distill(student_input: torch.Tensor, student_weight: torch.Tensor,
                         teacher_input: torch.Tensor, teacher_weight: torch.Tensor,
                         labels: Optional[torch.Tensor], student_bias: Optional[torch.Tensor],
                         teacher_bias: Optional[torch.Tensor], divergence: str, beta: float,
                         alpha: float, temperature: float, weight_hard_loss: float,
                         weight_soft_loss: float, ignore_index: int, chunk_size: int,
                         t2_scale: bool, want_dx: bool, want_dw: bool, want_db: bool,
                         student_scale: float = 1.0, student_softcap: float = 0.0,
                         teacher_scale: float = 1.0, teacher_softcap: float = 0.0,
                         memory_budget: int = 0, vocab_parallel: int = 0,
                         token_weights: Optional[torch.Tensor] = None,
                         want_entropy: bool = False) -> _FusedOut:
    div = _lib.div_params(divergence, beta, alpha)
    want = (want_dx, want_dw, want_db and student_bias is not None)
    maps = (student_scale, student_softcap, teacher_scale, teacher_softcap)
    results = _calls.fused_linear_distill(
        student_input, student_weight, teacher_input, teacher_weight, labels, student_bias,
        teacher_bias, div, temperature, weight_hard_loss, weight_soft_loss, ignore_index,
        chunk_size, t2_scale, _lent(vocab_parallel), want, maps, memory_budget, token_weights,
        want_entropy)
    return _fused_out(results, want, student_input, student_weight, student_bias)


@fused_linear_distill.register_fake
def _(student_input, student_weight, teacher_input, teacher_weight, labels, student_bias,
      teacher_bias, divergence, beta, alpha, temperature, weight_hard_loss, weight_soft_loss,
      ignore_index, chunk_size, t2_scale, want_dx, want_dw, want_db, student_scale=1.0,
      student_softcap=0.0, teacher_scale=1.0, teacher_softcap=0.0, memory_budget=0,
      vocab_parallel=0, token_weights=None, want_entropy=False):
    _calls.lm_head_shapes(student_input, student_weight, student_bias, "student")
    _calls.lm_head_shapes(teacher_input, teacher_weight, teacher_bias, "teacher")
    _calls.teacher_head(student_weight, teacher_weight, teacher_bias)  # more rows: the first V
    if student_input.shape[:-1] != teacher_input.shape[:-1]:
        raise _calls.shape_error(f"student_input {tuple(student_input.shape)} and teacher_input "
                                 f"{tuple(teacher_input.shape)} have different token counts")
    return _fused_fake(student_input, student_weight, student_bias,
                       (want_dx, want_dw, want_db and student_bias is not None), want_entropy,
                       token_weights)


def _fused_setup(op):
    params = _params(op)
    return _fused_setup_at(params.index("student_bias"), len(params))


def _fused_setup_at(bias_at, n_inputs):
    def setup(ctx, inputs, output):
        no_zero_grads(ctx)
        ctx.bias_at, ctx.n_inputs = bias_at, n_inputs
        ctx.save_for_backward(*output[3:6], inputs[0], inputs[1])
        ctx.mark_non_differentiable(*output[1:])  # soft, hard, entropy: no gradient of their own
    return setup


def _fused_grads(ctx, grad_loss):
    """One gradient (or None) per input of a fused op: the saved student gradients scaled."""
    dxs, dws, dbs = (saved(g) for g in ctx.saved_tensors[:3])
    grads = [None] * ctx.n_inputs
    grads[0], grads[1] = _scaled(dxs, grad_loss), _scaled(dws, grad_loss)
    grads[ctx.bias_at] = _scaled(dbs, grad_loss)
    return grads


@first_order_only
def _fused_backward(ctx, grad_loss, *_others):
    return tuple(_fused_grads(ctx, grad_loss))


fused_linear_distill.register_autograd(_fused_backward,
                                      setup_context=_fused_setup(fused_linear_distill))


# Several teachers (docs/MATH.md section 13): fused_linear_distill's arguments with a list of
# heads and one of biases (an entry None: that head has none) and teacher_index, the row's head
# (an integer tensor: the implementation copies it to the host once). No vocabulary-parallel
# handle: the C library has no vocabulary-parallel entry for several teachers.

@torch.library.custom_op(f"{_LIB}::fused_linear_distill_multi", mutates_args=())
def fused_linear_distill_multi(student_input: torch.Tensor, student_weight: torch.Tensor,
                               teacher_input: torch.Tensor, teacher_weight: List[torch.Tensor],
                               labels: Optional[torch.Tensor],
                               student_bias: Optional[torch.Tensor],
                               teacher_bias: List[Optional[torch.Tensor]],
                               teacher_index: torch.Tensor, divergence: str, beta: float,
                               alpha: float, temperature: float, weight_hard_loss: float,
                               weight_soft_loss: float, ignore_index: int, chunk_size: int,
                               t2_scale: bool, want_dx: bool, want_dw: bool, want_db: bool,
                               student_scale: float = 1.0, student_softcap: float = 0.0,
                               teacher_scale: float = 1.0, teacher_softcap: float = 0.0,
                               memory_budget: int = 0,
                               token_weights: Optional[torch.Tensor] = None,
                               want_entropy: bool = False) -> _FusedOut:
    div = _lib.div_params(divergence, beta, alpha)
    want = (want_dx, want_dw, want_db and student_bias is not None)
    maps = (student_scale, student_softcap, teacher_scale, teacher_softcap)
    results = _calls.fused_linear_distill_multi(
        student_input, student_weight, teacher_input, teacher_weight, labels, student_bias,
        teacher_bias, teacher_index, div, temperature, weight_hard_loss, weight_soft_loss,
        ignore_index, chunk_size, t2_scale, want, maps, memory_budget, token_weights,
        want_entropy)
    return _fused_out(results, want, student_input, student_weight, student_bias)


@fused_linear_distill_multi.register_fake
def _(student_input, student_weight, teacher_input, teacher_weight, labels, student_bias,
      teacher_bias, teacher_index, divergence, beta, alpha, temperature, weight_hard_loss,
      weight_soft_loss, ignore_index, chunk_size, t2_scale, want_dx, want_dw, want_db,
      student_scale=1.0, student_softcap=0.0, teacher_scale=1.0, teacher_softcap=0.0,
      memory_budget=0, token_weights=None, want_entropy=False):
    _calls.lm_head_shapes(student_input, student_weight, student_bias, "student")
    _calls.heads_shapes(student_input, student_weight, teacher_input, teacher_weight,
                        teacher_bias)
    _calls.operands_dtype([("teacher_input", teacher_input)] + [
        (f"teacher_weight[{j}]", w) for j, w in enumerate(teacher_weight)])
    _calls.index_shape(teacher_index, student_input.numel() // max(1, student_input.shape[-1]))
    return _fused_fake(student_input, student_weight, student_bias,
                       (want_dx, want_dw, want_db and student_bias is not None), want_entropy,
                       token_weights)


def _multi_setup():
    """_fused_setup's, plus where the list inputs (the heads, the biases) are and how long: the
    backward returns a list of Nones for each list of tensors only (the teachers get no
    gradient); torch's autograd sees a list holding a None as one leaf, whose gradient is
    one None."""
    params = _params(fused_linear_distill_multi)
    fused = _fused_setup(fused_linear_distill_multi)
    lists = (params.index("teacher_weight"), params.index("teacher_bias"))

    def setup(ctx, inputs, output):
        fused(ctx, inputs, output)
        ctx.lists = [(at, len(inputs[at])) for at in lists
                     if all(isinstance(t, torch.Tensor) for t in inputs[at])]
    return setup


@first_order_only
def _multi_backward(ctx, grad_loss, *_others):
    grads = _fused_grads(ctx, grad_loss)
    for at, n in ctx.lists:
        grads[at] = [None] * n
    return tuple(grads)


fused_linear_distill_multi.register_autograd(_multi_backward, setup_context=_multi_setup())


@torch.library.custom_op(f"{_LIB}::fused_linear_topk_distill", mutates_args=())
def fused_linear_topk_distill(student_input: torch.Tensor, student_weight: torch.Tensor,
                              teacher_ids: torch.Tensor, teacher_logprobs: torch.Tensor,
                              labels: Optional[torch.Tensor], student_bias: Optional[torch.Tensor],
                              divergence: str, tail: str, beta: float, alpha: float,
                              temperature: float, weight_hard_loss: float,
                              weight_soft_loss: float, ignore_index: int, chunk_size: int,
                              t2_scale: bool, want_hard: bool, want_dx: bool, want_dw: bool,
                              want_db: bool, student_scale: float = 1.0,
                              student_softcap: float = 0.0, memory_budget: int = 0,
                              vocab_parallel: int = 0,
                              token_weights: Optional[torch.Tensor] = None,
                              want_entropy: bool = False) -> _FusedOut:
    div = _lib.div_params(divergence, beta, alpha)
    code = _lib.topk_tail(tail)
    want = (want_dx, want_dw, want_db and student_bias is not None)
    results = _calls.fused_linear_topk_distill(
        student_input, student_weight, teacher_ids, teacher_logprobs, labels, student_bias, div,
        code, temperature, weight_hard_loss, weight_soft_loss, ignore_index, chunk_size, t2_scale,
        want_hard, _lent(vocab_parallel), want, (student_scale, student_softcap), memory_budget,
        token_weights, want_entropy)
    return _fused_out(results, want, student_input, student_weight, student_bias)


@fused_linear_topk_distill.register_fake
def _(student_input, student_weight, teacher_ids, teacher_logprobs, labels, student_bias,
      divergence, tail, beta, alpha, temperature, weight_hard_loss, weight_soft_loss,
      ignore_index, chunk_size, t2_scale, want_hard, want_dx, want_dw, want_db, student_scale=1.0,
      student_softcap=0.0, memory_budget=0, vocab_parallel=0, token_weights=None,
      want_entropy=False):
    _calls.lm_head_shapes(student_input, student_weight, student_bias, "student")
    _calls.topk_shapes(teacher_ids, teacher_logprobs, student_input.shape[:-1])
    return _fused_fake(student_input, student_weight, student_bias,
                       (want_dx, want_dw, want_db and student_bias is not None), want_entropy,
                       token_weights)


fused_linear_topk_distill.register_autograd(_fused_backward,
                                           setup_context=_fused_setup(fused_linear_topk_distill))


# ---- fused losses declared by a spec (_calls.FusedSpec) ----------------------------------------

_SCHEMA_TYPES = {float: "float", int: "int", bool: "bool", str: "str"}
_SPEC_TAIL = (("ignore_index", -100), ("chunk_size", 0), ("memory_budget", 0))


def spec_arguments(spec):
    """The argument names of a spec's op, in order: the student's tensors, the teacher form's,
    labels and the student bias, the scalars (spec.scalars, ignore_index, chunk_size,
    memory_budget), the wanted gradients, the vocabulary-parallel handle, the per-row weights
    (token_weights, a Tensor?) and want_entropy."""
    tensors = ("student_input", "student_weight") + spec.form.tensors + ("labels", "student_bias")
    scalars = tuple(n for n, _ in spec.scalars + _SPEC_TAIL)
    return tensors, scalars, _SPEC_FLAGS


_SPEC_FLAGS = ("want_dx", "want_dw", "want_db", "vocab_parallel", "token_weights", "want_entropy")


def _spec_schema(spec):
    tensors, _, _ = spec_arguments(spec)
    optional = spec.form.optional + ("labels", "student_bias")
    args = [f"Tensor{'?' if n in optional else ''} {n}" for n in tensors]
    args += [f"{_SCHEMA_TYPES[type(d)]} {n}" for n, d in spec.scalars + _SPEC_TAIL]
    args += ["bool want_dx", "bool want_dw", "bool want_db", "int vocab_parallel",
             "Tensor? token_weights=None", "bool want_entropy=False"]
    return "(" + ", ".join(args) + ") -> (" + ", ".join(["Tensor"] * 7) + ")"


def define_fused(spec):
    """kdloss::`spec.name`: the custom op of a spec-declared fused loss (the one autograd
    route of its functional form and module), with its fake and autograd registrations."""
    tensors, scalars, _ = spec_arguments(spec)
    names = tensors + scalars + _SPEC_FLAGS

    def unpack(args):
        a = dict(zip(names, args))
        a.setdefault("token_weights", None)  # the schema's defaults, for a caller that omits them
        a.setdefault("want_entropy", False)
        want = (a["want_dx"], a["want_dw"], a["want_db"] and a["student_bias"] is not None)
        return a, {n: a[n] for n in tensors if n != "labels"}, want

    def impl(*args):
        a, t, want = unpack(args)
        results = _calls.fused_call(spec, t, a["labels"], {n: a[n] for n in scalars},
                                    _lent(a["vocab_parallel"]), want, a["token_weights"],
                                    a["want_entropy"])
        return _fused_out(results, want, t["student_input"], t["student_weight"],
                          t["student_bias"])

    def fake(*args):
        a, t, want = unpack(args)
        _calls.lm_head_shapes(t["student_input"], t["student_weight"], t["student_bias"],
                              "student")
        spec.form.shapes(t["student_input"], t["student_weight"], t)
        return _fused_fake(t["student_input"], t["student_weight"], t["student_bias"], want,
                           a["want_entropy"], a["token_weights"])

    op = torch.library.custom_op(f"{_LIB}::{spec.name}", impl, mutates_args=(),
                                 schema=_spec_schema(spec))
    op.register_fake(fake)
    op.register_autograd(_fused_backward, setup_context=_fused_setup_at(
        names.index("student_bias"), len(names)))
    _meta_as_before(op, names)
    return op


# ---- meta tensors outside FakeTensorMode --------------------------------------------------------
# register_fake also made each op's Meta kernel; eager meta tensors get the library's rule instead,
# as before the ops: the backend registered for "meta" (register_backend), else
# KdlossError(UNSUPPORTED). FakeTensorMode, torch.compile and torch.export use the fake
# implementations above (FakeTensorMode looks them up before any Meta kernel).

_META = torch.library.Library(_LIB, "FRAGMENT")


def _meta_as_before(op, names=None):
    """names: the op's argument names (counted from its definition when None)."""
    impl = op._init_fn
    names = list(names) if names is not None else _params(op)
    at = names.index("vocab_parallel") if "vocab_parallel" in names else None

    def meta(*args):
        lent = (at is not None and len(args) > at and type(args[at]) is int
                and args[at] in _LENT)
        if not lent:  # a vocabulary-parallel call binds its device itself (and refuses meta)
            _backend.backend_for(torch.device("meta"))
        return impl(*args)
    try:
        _META.impl(op._qualname, meta, "Meta", allow_override=True)
    except TypeError:  # an older torch without allow_override: meta tensors get the shapes
        pass


for _op in (kl_div, jsd, distill_loss, topk_distill_loss, fused_linear_distill,
            fused_linear_distill_multi, fused_linear_topk_distill):
    _meta_as_before(_op)
