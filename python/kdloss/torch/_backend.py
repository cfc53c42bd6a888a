"""The only place where torch tensors meet the C API (STYLE.md: one binding file that checks
tensors and fills plain structs; the kernels never see a framework object).

Tensors are passed by data pointer, never copied, when their layout allows it: a tensor whose last
dimension is contiguous and whose leading dimensions collapse to one uniform row stride goes in as
a (rows x cols) view with `ld` = that stride (sliced, padded and transposed-batch views included).
Anything else (a strided last dimension, stride-0 broadcasts, non-collapsible leading dims) is made
contiguous first. Outputs are always fresh contiguous tensors on the input's device.

Device dispatch: `backend_for(device)` returns the object that makes the C call. CPU tensors go to
the kdloss_* functions; CUDA tensors go to kdloss_cuda_* when the loaded library was built with
CUDA (kdloss_cuda_available() == 1) and otherwise raise a KdlossError saying so. Both backends take
the same arguments (views, params, output pointers); the CUDA one adds its context, the current
stream and a caller-owned workspace, as the header asks.
"""

import ctypes
import threading

import torch

from .. import _lib
from .._lib import KdlossError

FLOAT_CODES = {torch.float32: _lib.F32, torch.bfloat16: _lib.BF16, torch.float16: _lib.F16}
LABEL_CODES = {torch.int64: _lib.I64, torch.int32: _lib.I32}


def float_code(t, what):
    """kdloss dtype code of a float tensor; KdlossError(INVALID_DTYPE) for any other dtype."""
    code = FLOAT_CODES.get(t.dtype)
    if code is None:
        raise KdlossError(_lib.ERR_INVALID_DTYPE,
                          f"{what} is {t.dtype}; kdloss takes float32, bfloat16 or float16 "
                          "(it computes in fp32: cast float64 tensors with .float())")
    return code


def as_rows(t, what):
    """(view, rows, cols, ld): `t` seen as a row-major (rows x cols) matrix without copying when
    possible. rows = product of the leading dims (1 for a 1-D tensor), cols = t.shape[-1]."""
    if t.dim() == 0:
        raise KdlossError(_lib.ERR_SHAPE_MISMATCH, f"{what} is a 0-dim tensor")
    cols = t.shape[-1]
    rows = t.numel() // cols if cols else 0
    if cols > 1 and t.stride(-1) != 1:
        t = t.contiguous()
    try:
        m = t.view(rows, cols)  # succeeds exactly when the leading dims share one row stride
    except RuntimeError:
        m = t.reshape(rows, cols)
    ld = m.stride(0) if rows > 1 else cols
    if cols > 1 and m.stride(1) != 1 or ld < cols:  # cols == 1 layouts, stride-0 broadcasts
        m = m.contiguous()
        ld = cols
    return m, rows, cols, ld


def cmat(m, ld, code):
    return _lib.CMat(m.data_ptr(), code, ld)


def out_mat(m):
    """A writable view of a fresh contiguous 2-D tensor, or the NULL view for None."""
    if m is None:
        return _lib.Mat(None, _lib.F32, 0)
    return _lib.Mat(m.data_ptr(), FLOAT_CODES[m.dtype], m.shape[1])


def ptr(t):
    return None if t is None else t.data_ptr()


def token_ids(t, what):
    """`t` as int32 or int64 token ids (other integer dtypes widened to int64)."""
    if t.dtype in LABEL_CODES:
        return t
    # bool is not a token id (True would silently become id 1): integers only
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise KdlossError(_lib.ERR_INVALID_DTYPE, f"{what} is {t.dtype}; use an integer dtype")
    return t.to(torch.int64)


def labels_view(labels, rows, device, what):
    """(tensor, kdloss_labels): labels flattened to [rows], int64 or int32, contiguous."""
    if labels is None:
        return None, _lib.Labels(None, _lib.I64)
    if labels.device != device:
        raise KdlossError(_lib.ERR_SHAPE_MISMATCH,
                          f"{what} is on {labels.device}, the inputs on {device}")
    if labels.numel() != rows:
        raise KdlossError(_lib.ERR_SHAPE_MISMATCH,
                          f"{what} has {labels.numel()} elements {tuple(labels.shape)}, "
                          f"expected one per row ({rows})")
    labels = token_ids(labels, what).reshape(rows).contiguous()
    return labels, _lib.Labels(labels.data_ptr(), LABEL_CODES[labels.dtype])


def topk_teacher(ids, logprobs, lead):
    """(kept tensors, kdloss_topk_teacher) for a sparse teacher: ids (..., K) int32/int64 (-1 =
    unused slot) and logprobs (..., K) float on one device (the caller checks it), whose leading
    dims must be `lead` (the student's). Both go in as (rows x K) views with their own ld, without
    a copy when the layout allows. The ids' values are checked by the C library
    (KDLOSS_ERR_INVALID_ID)."""
    if ids.dim() == 0 or ids.shape != logprobs.shape or tuple(ids.shape[:-1]) != tuple(lead):
        raise KdlossError(_lib.ERR_SHAPE_MISMATCH,
                          f"teacher_ids {tuple(ids.shape)} and teacher_logprobs "
                          f"{tuple(logprobs.shape)}: expected both (..., K) with the "
                          f"student's leading dims {tuple(lead)}")
    lcode = float_code(logprobs, "teacher_logprobs")
    ids, _, k, ldi = as_rows(token_ids(ids, "teacher_ids"), "teacher_ids")
    lps, _, _, ldl = as_rows(logprobs, "teacher_logprobs")
    view = _lib.TopkTeacher(k, _lib.CMat(ids.data_ptr(), LABEL_CODES[ids.dtype], ldi),
                            cmat(lps, ldl, lcode))
    return (ids, lps), view


def same_device(what_tensors):
    """The common device of (name, tensor) pairs (None tensors skipped)."""
    device = None
    for name, t in what_tensors:
        if t is None:
            continue
        if device is None:
            device = t.device
        elif t.device != device:
            raise KdlossError(_lib.ERR_UNSUPPORTED,
                              f"{name} is on {t.device} but the other inputs are on {device}")
    return device


def scalar_out(device):
    return torch.empty(1, dtype=torch.float32, device=device)


# ---- backends -------------------------------------------------------------------------------------

class CpuBackend:
    """kdloss_* on host memory. The fused loss gets a workspace kept per Python thread and grown
    when a call needs more: a fresh one per call would cost the page faults of first touching
    hundreds of MB on every training step (the library's own allocation is returned to the OS
    when freed). One per thread because calls release the GIL and may run concurrently."""

    name = "cpu"

    def __init__(self):
        self._local = threading.local()

    def _fused(self, name, size_args, args):
        """C function `name` with this thread's workspace, sized by `name`_workspace_size
        (size_args) and appended to `args`."""
        size = ctypes.c_size_t()
        _lib.check(_lib.fn(name + "_workspace_size")(*size_args, ctypes.byref(size)),
                   name + "_workspace_size")
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.numel() < size.value:
            self._local.buf = None  # free the old one before the new one is allocated
            buf = self._local.buf = torch.empty(max(size.value, 1), dtype=torch.uint8)
        _lib.check(_lib.fn(name)(*args, ctypes.c_void_p(buf.data_ptr()), buf.numel()), name)

    def kl_div(self, device, params, bt, v, inp, tgt, loss, row_loss, elem, grad):
        _lib.check(_lib.fn("kdloss_kl_div")(ctypes.byref(params), bt, v, inp, tgt, loss, row_loss,
                                            elem, grad), "kdloss_kl_div")

    def jsd(self, device, params, bt, v, student, teacher, labels, loss, row_loss, grad):
        _lib.check(_lib.fn("kdloss_jsd")(ctypes.byref(params), bt, v, student, teacher, labels,
                                         loss, row_loss, grad), "kdloss_jsd")

    def distill(self, device, params, bt, v, student, teacher, labels, loss, row_loss, grad):
        _lib.check(_lib.fn("kdloss_distill")(ctypes.byref(params), bt, v, student, teacher, labels,
                                             loss, row_loss, grad), "kdloss_distill")

    def distill_logits(self, device, params, bt, v, student, teacher, labels, loss, row_loss,
                       grad):
        """params: DistillLogitsParams (kdloss_distill_logits: the loss on logits, one pass)."""
        _lib.check(_lib.fn("kdloss_distill_logits")(ctypes.byref(params), bt, v, student, teacher,
                                                    labels, loss, row_loss, grad),
                   "kdloss_distill_logits")

    def fused_linear_distill(self, device, params, bt, hs, ht, v, xs, ws, bs, xt, wt, bt_bias,
                             labels, out, student_dtype, want_grad):
        """params: FldParams, out: FldOut (kdloss_fused_linear_distill)."""
        p = ctypes.byref(params)
        self._fused("kdloss_fused_linear_distill",
                    (p, bt, hs, ht, v, student_dtype, int(want_grad)),
                    (p, bt, hs, ht, v, xs, ws, bs, xt, wt, bt_bias, labels, ctypes.byref(out)))

    def topk_distill_logits(self, device, params, bt, v, student, teacher, labels, loss, row_loss,
                            grad):
        """params: TopkDistillParams, teacher: TopkTeacher (kdloss_topk_distill_logits)."""
        _lib.check(_lib.fn("kdloss_topk_distill_logits")(ctypes.byref(params), bt, v, student,
                                                         teacher, labels, loss, row_loss, grad),
                   "kdloss_topk_distill_logits")

    def fused_linear_topk_distill(self, device, params, bt, hs, v, xs, ws, bs, teacher, labels,
                                  out, student_dtype, want_grad):
        """params: FltdParams, out: FldOut (kdloss_fused_linear_topk_distill)."""
        p = ctypes.byref(params)
        self._fused("kdloss_fused_linear_topk_distill",
                    (p, bt, hs, v, teacher.k, student_dtype, int(want_grad)),
                    (p, bt, hs, v, xs, ws, bs, teacher, labels, ctypes.byref(out)))


class CudaBackend:
    """kdloss_cuda_* on device memory: one context per device, torch's current stream, workspace
    allocated through torch's caching allocator. Only used when the library reports CUDA.
    (The CUDA kernels are being written separately; this path follows the header and is
    exercised by tests only on a CUDA build.)"""

    name = "cuda"

    def __init__(self):
        self._contexts = {}
        self._lock = threading.Lock()

    def _ctx(self, device):
        index = device.index if device.index is not None else torch.cuda.current_device()
        with self._lock:
            ctx = self._contexts.get(index)
            if ctx is None:
                handle = ctypes.c_void_p()
                _lib.check(_lib.fn("kdloss_cuda_context_create")(index, ctypes.byref(handle)),
                           f"kdloss_cuda_context_create({index})")
                ctx = self._contexts[index] = handle
        return ctx, index

    @staticmethod
    def _stream(index):
        return ctypes.c_void_p(torch.cuda.current_stream(index).cuda_stream)

    @staticmethod
    def _workspace(nbytes, device):
        if nbytes == 0:
            return None, 0
        ws = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return ws, nbytes

    def _run(self, device, name, size_args, args):
        """kdloss_cuda_`name` on this device's context and torch's current stream, with a fresh
        workspace of kdloss_cuda_`name`_workspace_size(size_args) bytes. Invalid labels or
        teacher ids are not reported here: the C call returns OK and writes the status word
        into the workspace (include/kdloss.h, CUDA section), with NaN losses."""
        ctx, index = self._ctx(device)
        fname = "kdloss_cuda_" + name
        size = ctypes.c_size_t()
        _lib.check(_lib.fn(fname + "_workspace_size")(*size_args, ctypes.byref(size)),
                   fname + "_workspace_size")
        ws, n = self._workspace(size.value, device)
        _lib.check(_lib.fn(fname)(ctx, self._stream(index), *args, ptr(ws), n), fname)

    def kl_div(self, device, params, bt, v, inp, tgt, loss, row_loss, elem, grad):
        self._run(device, "kl_div", (bt, v),
                  (ctypes.byref(params), bt, v, inp, tgt, loss, row_loss, elem, grad))

    def jsd(self, device, params, bt, v, student, teacher, labels, loss, row_loss, grad):
        self._run(device, "jsd", (bt, v),
                  (ctypes.byref(params), bt, v, student, teacher, labels, loss, row_loss, grad))

    def distill(self, device, params, bt, v, student, teacher, labels, loss, row_loss, grad):
        self._run(device, "distill", (bt, v),
                  (ctypes.byref(params), bt, v, student, teacher, labels, loss, row_loss, grad))

    def fused_linear_distill(self, device, params, bt, hs, ht, v, xs, ws, bs, xt, wt, bt_bias,
                             labels, out, student_dtype, want_grad):
        p = ctypes.byref(params)
        self._run(device, "fused_linear_distill", (p, bt, hs, ht, v, student_dtype, int(want_grad)),
                  (p, bt, hs, ht, v, xs, ws, bs, xt, wt, bt_bias, labels, ctypes.byref(out)))

    def topk_distill_logits(self, device, params, bt, v, student, teacher, labels, loss, row_loss,
                            grad):
        self._run(device, "topk_distill_logits", (bt, v, teacher.k),
                  (ctypes.byref(params), bt, v, student, teacher, labels, loss, row_loss, grad))

    def fused_linear_topk_distill(self, device, params, bt, hs, v, xs, ws, bs, teacher, labels,
                                  out, student_dtype, want_grad):
        p = ctypes.byref(params)
        self._run(device, "fused_linear_topk_distill",
                  (p, bt, hs, v, teacher.k, student_dtype, int(want_grad)),
                  (p, bt, hs, v, xs, ws, bs, teacher, labels, ctypes.byref(out)))


_CPU = CpuBackend()
_CUDA = None
_BACKENDS = {}  # device type -> backend object; register_backend() adds more


def register_backend(device_type, backend):
    """Route tensors on `device_type` (e.g. "cuda", "xpu") to `backend`, an object with the
    kl_div / jsd / distill / fused_linear_distill methods of CpuBackend (and topk_distill_logits /
    fused_linear_topk_distill for the sparse-teacher losses). Overrides the built-in choice."""
    _BACKENDS[device_type] = backend


def backend_for(device):
    global _CUDA
    if device.type in _BACKENDS:
        return _BACKENDS[device.type]
    if device.type == "cpu":
        return _CPU
    if device.type == "cuda":
        if _lib.has("kdloss_cuda_available") and _lib.lib().kdloss_cuda_available():
            if _CUDA is None:
                _CUDA = CudaBackend()
            return _CUDA
        raise KdlossError(_lib.ERR_UNSUPPORTED,
                          f"kdloss got CUDA tensors ({device}) but {_lib.library_path()} has no "
                          "CUDA backend (built without -DKDLOSS_CUDA=ON, or no device visible); "
                          "move the tensors to the CPU, or reinstall with "
                          "KDLOSS_CMAKE_ARGS=-DKDLOSS_CUDA=ON pip install .")
    raise KdlossError(_lib.ERR_UNSUPPORTED, f"kdloss has no backend for {device.type} tensors")
