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
    if labels.dtype not in LABEL_CODES:
        # bool is not a token id (True would silently become label 1): integers only
        if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
            raise KdlossError(_lib.ERR_INVALID_DTYPE, f"{what} is {labels.dtype}; use an integer dtype")
        labels = labels.to(torch.int64)
    labels = labels.reshape(rows).contiguous()
    return labels, _lib.Labels(labels.data_ptr(), LABEL_CODES[labels.dtype])


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

    def _workspace(self, params, bt, hs, ht, v, student_dtype, want_grad):
        size = ctypes.c_size_t()
        _lib.check(_lib.fn("kdloss_fused_linear_distill_workspace_size")(
            ctypes.byref(params), bt, hs, ht, v, student_dtype, int(want_grad),
            ctypes.byref(size)), "kdloss_fused_linear_distill_workspace_size")
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.numel() < size.value:
            self._local.buf = None  # free the old one before the new one is allocated
            buf = self._local.buf = torch.empty(max(size.value, 1), dtype=torch.uint8)
        return buf

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
        work = self._workspace(params, bt, hs, ht, v, student_dtype, want_grad)
        _lib.check(_lib.fn("kdloss_fused_linear_distill")(ctypes.byref(params), bt, hs, ht, v, xs,
                                                          ws, bs, xt, wt, bt_bias, labels,
                                                          ctypes.byref(out),
                                                          ctypes.c_void_p(work.data_ptr()),
                                                          work.numel()),
                   "kdloss_fused_linear_distill")


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

    def kl_div(self, device, params, bt, v, inp, tgt, loss, row_loss, elem, grad):
        ctx, index = self._ctx(device)
        size = ctypes.c_size_t()
        _lib.check(_lib.fn("kdloss_cuda_kl_div_workspace_size")(bt, v, ctypes.byref(size)),
                   "kdloss_cuda_kl_div_workspace_size")
        ws, n = self._workspace(size.value, device)
        _lib.check(_lib.fn("kdloss_cuda_kl_div")(ctx, self._stream(index), ctypes.byref(params), bt,
                                                 v, inp, tgt, loss, row_loss, elem, grad, ptr(ws), n),
                   "kdloss_cuda_kl_div")

    def jsd(self, device, params, bt, v, student, teacher, labels, loss, row_loss, grad):
        ctx, index = self._ctx(device)
        size = ctypes.c_size_t()
        _lib.check(_lib.fn("kdloss_cuda_jsd_workspace_size")(bt, v, ctypes.byref(size)),
                   "kdloss_cuda_jsd_workspace_size")
        ws, n = self._workspace(size.value, device)
        _lib.check(_lib.fn("kdloss_cuda_jsd")(ctx, self._stream(index), ctypes.byref(params), bt, v,
                                              student, teacher, labels, loss, row_loss, grad,
                                              ptr(ws), n), "kdloss_cuda_jsd")

    def distill(self, device, params, bt, v, student, teacher, labels, loss, row_loss, grad):
        ctx, index = self._ctx(device)
        size = ctypes.c_size_t()
        _lib.check(_lib.fn("kdloss_cuda_distill_workspace_size")(bt, v, ctypes.byref(size)),
                   "kdloss_cuda_distill_workspace_size")
        ws, n = self._workspace(size.value, device)
        _lib.check(_lib.fn("kdloss_cuda_distill")(ctx, self._stream(index), ctypes.byref(params),
                                                  bt, v, student, teacher, labels, loss, row_loss,
                                                  grad, ptr(ws), n), "kdloss_cuda_distill")

    def fused_linear_distill(self, device, params, bt, hs, ht, v, xs, ws, bs, xt, wt, bt_bias,
                             labels, out, student_dtype, want_grad):
        ctx, index = self._ctx(device)
        size = ctypes.c_size_t()
        _lib.check(_lib.fn("kdloss_cuda_fused_linear_distill_workspace_size")(
            ctypes.byref(params), bt, hs, ht, v, student_dtype, int(want_grad),
            ctypes.byref(size)), "kdloss_cuda_fused_linear_distill_workspace_size")
        work, n = self._workspace(size.value, device)
        _lib.check(_lib.fn("kdloss_cuda_fused_linear_distill")(ctx, self._stream(index),
                                                               ctypes.byref(params), bt, hs, ht,
                                                               v, xs, ws, bs, xt, wt, bt_bias,
                                                               labels, ctypes.byref(out),
                                                               ptr(work), n),
                   "kdloss_cuda_fused_linear_distill")


_CPU = CpuBackend()
_CUDA = None
_BACKENDS = {}  # device type -> backend object; register_backend() adds more


def register_backend(device_type, backend):
    """Route tensors on `device_type` (e.g. "cuda", "xpu") to `backend`, an object with the
    kl_div / jsd / distill / fused_linear_distill methods of CpuBackend. Overrides the built-in choice."""
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
