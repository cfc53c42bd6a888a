"""The backend floor of kdloss.torch, the only place where torch tensors meet the C API: it
checks tensors and fills the C API's plain structs (the kernels never see a framework object),
and makes the ctypes call for a device. Above it, _calls.py turns each operation's tensors into
these views; below it there is only kdloss._lib (docs/ARCHITECTURE.md, "The Python binding").

Tensors are passed by data pointer, never copied, when their layout allows it: a tensor whose last
dimension is contiguous and whose leading dimensions collapse to one uniform row stride goes in as
a (rows x cols) view with `ld` = that stride (sliced, padded and transposed-batch views included).
Anything else (a strided last dimension, stride-0 broadcasts, non-collapsible leading dims) is made
contiguous first. Outputs are always fresh contiguous tensors on the input's device.

Device dispatch: `backend_for(device)` returns the object that makes the C call. CPU tensors go to
the kdloss_* functions; CUDA tensors go to kdloss_cuda_* when the loaded library was built with
CUDA (kdloss_cuda_available() == 1) and otherwise raise a KdlossError saying so. Both backends take
the same arguments (views, params, output pointers); the CUDA one adds its context, the current
stream and a caller-owned workspace, as the header asks. A vocabulary-parallel call (process_group)
goes through VocabParallel on either device.

Host reads. Every read of a tensor's value on the host goes through host_read (for device memory
that is a stream synchronization): the CUDA path reads the status word only after a call whose
status word can carry an error (labels or teacher ids given), and nothing else in a call's
forward or backward reads the device (docs/ARCHITECTURE.md, "Host synchronizations").
"""

import contextlib
import ctypes
import math
import sys
import threading

import torch

from .. import _lib
from .._lib import KdlossError

FLOAT_CODES = {torch.float32: _lib.F32, torch.bfloat16: _lib.BF16, torch.float16: _lib.F16}
LABEL_CODES = {torch.int64: _lib.I64, torch.int32: _lib.I32}


def host_read(t):
    """The value of a one-element tensor as a Python number: the binding's one door from tensor
    values to the host (for device memory a stream synchronization; tests count the calls)."""
    return t.item()


def is_host(t):
    """True when reading `t`'s value costs no synchronization (host memory)."""
    return t.device.type == "cpu"


def float_code(t, what):
    """kdloss dtype code of a float tensor; KdlossError(INVALID_DTYPE) for any other dtype."""
    code = FLOAT_CODES.get(t.dtype)
    if code is None:
        raise KdlossError(_lib.ERR_INVALID_DTYPE,
                          f"{what} is {t.dtype}; kdloss takes float32, bfloat16 or float16 "
                          "(it computes in fp32: cast float64 tensors with .float())")
    return code


def is_dtensor(t):
    """True for a torch.distributed DTensor (FSDP2 / tensor-parallel parameters). No import: a
    DTensor can exist only once torch.distributed.tensor is loaded."""
    mod = sys.modules.get("torch.distributed.tensor")
    return mod is not None and isinstance(t, getattr(mod, "DTensor", ()))


def as_rows(t, what):
    """(view, rows, cols, ld): `t` seen as a row-major (rows x cols) matrix without copying when
    possible. rows = product of the leading dims (1 for a 1-D tensor), cols = t.shape[-1]."""
    if is_dtensor(t):  # its data_ptr is the local shard's: never hand it to C
        raise KdlossError(_lib.ERR_UNSUPPORTED,
                          f"{what} is a DTensor {tuple(t.shape)} with placements "
                          f"{tuple(t.placements)}: the functional and module forms of "
                          "kdloss.torch gather it with full_tensor(); for an LM head sharded by "
                          "vocabulary rows pass each rank's block (.to_local()) with "
                          "process_group=")
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


def weights_view(weights, rows, device, what="token_weights"):
    """(tensor, pointer) for per-row weights (include/kdloss.h, "Per-row weights and the
    student's entropy"): `weights` flattened to [rows] float32, contiguous (a floating tensor of
    another dtype is cast once), detached (weights are data: no gradient reaches them). None
    gives (None, None). Their values (finite, >= 0) are checked by the C call."""
    if weights is None:
        return None, None
    if not isinstance(weights, torch.Tensor) or not weights.is_floating_point():
        raise KdlossError(_lib.ERR_INVALID_DTYPE, f"{what}: a floating tensor of one weight per "
                          f"row, not {getattr(weights, 'dtype', type(weights).__name__)}")
    if weights.device != device:
        raise KdlossError(_lib.ERR_SHAPE_MISMATCH,
                          f"{what} is on {weights.device}, the inputs on {device}")
    if weights.numel() != rows:
        raise KdlossError(_lib.ERR_SHAPE_MISMATCH,
                          f"{what} has {weights.numel()} elements {tuple(weights.shape)}, "
                          f"expected one per row ({rows})")
    w = weights.detach().reshape(rows).to(torch.float32).contiguous()
    return w, w.data_ptr()


def entropy_out(want, rows, device):
    """The [rows] float32 output the C call writes the student's entropy into (None, None when
    not wanted): (tensor, pointer)."""
    if not want:
        return None, None
    e = torch.empty(rows, dtype=torch.float32, device=device)
    return e, e.data_ptr()


def label_matches(labels, ignore_index):
    """labels == ignore_index compared as the C call compares, in int64: an ignore_index outside
    the labels' integer range matches no label (torch would wrap it to that range)."""
    if not labels.dtype.is_floating_point and labels.dtype != torch.bool:
        info = torch.iinfo(labels.dtype)
        if not info.min <= ignore_index <= info.max:
            return torch.zeros(labels.shape, dtype=torch.bool, device=labels.device)
    return labels == ignore_index


def filled_labels(rows, ignore_index, one_token, device):
    """(tensor, kdloss_labels) for a call that needs labels when the caller has none: every row
    kept, so one id that is not ignore_index: 0, or 1 when ignore_index is 0 (with a one-token
    vocabulary, `one_token`, the only id, 0: its losses are 0 either way). The same on every
    rank of a vocabulary-parallel call (pass one_token False there: a rank's block says nothing
    of the whole vocabulary). The view is marked `filled`: its status word can report nothing."""
    fill = 1 if ignore_index == 0 and not one_token else 0
    labels = torch.full((rows,), fill, dtype=torch.int32, device=device)
    view = _lib.Labels(labels.data_ptr(), _lib.I32)
    view.filled = True
    return labels, view


def reports(labels):
    """Whether a CUDA call's status word can carry an error: its labels are the caller's."""
    return labels.data is not None and not getattr(labels, "filled", False)


def weighted(params):
    """Whether a call's params (a ctypes struct, or ctypes.byref of one) carry per-row weights:
    on CUDA their values are checked on the device, so a bad weight (not finite, or < 0) comes
    back through the status word, as a bad label does (include/kdloss.h, CUDA section)."""
    p = getattr(params, "_obj", params)
    return bool(getattr(p, "row_weights", None))


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


class _OutputPool:
    """Host memory for large fresh outputs, reused once nothing references it. First-touching a
    fresh multi-megabyte allocation maps it page by page, and on a virtual machine those faults
    can cost several times the kernel that fills it (docs/ARCHITECTURE.md, "Output buffers").
    The pool keeps the storages of the outputs it handed out (at most SLOTS); one whose only
    reference is the pool's (torch's storage use count is 1: every tensor, view or .grad on it
    is gone) backs the next output of the same size, its pages already mapped. Each output is a
    new tensor on the storage, so autograd still takes a saved gradient as the leaf's .grad
    without a copy. Thread-safe; release() returns the free storages to torch's allocator."""

    MIN_BYTES = 4 << 20
    SLOTS = 8

    def __init__(self):
        self._lock = threading.Lock()
        self._slots = []  # UntypedStorage, least recently handed out first

    @staticmethod
    def _free(st):
        return torch._C._storage_Use_Count(st._cdata) == 1

    def take(self, shape, dtype, nbytes):
        """A contiguous tensor of `shape` on a storage of exactly nbytes that nothing else
        references: a free pooled one, or a fresh one (pooled when a slot is free or a free one
        can be evicted). The tensor is made under the lock: until it exists, a storage handed
        out would still look free to another thread."""
        stride = torch.empty(shape, dtype=dtype, device="meta").stride()
        with self._lock:
            at = next((i for i, old in enumerate(self._slots)
                       if old.nbytes() == nbytes and self._free(old)), None)
            if at is not None:
                st = self._slots.pop(at)
            else:
                st = torch.empty(nbytes, dtype=torch.uint8).untyped_storage()
                free = [i for i, old in enumerate(self._slots) if self._free(old)]
                if len(self._slots) >= self.SLOTS and free:
                    self._slots.pop(free[0])
            if len(self._slots) < self.SLOTS:
                self._slots.append(st)
            return torch.empty(0, dtype=dtype).set_(st, 0, shape, stride)

    def release(self):
        """Drops the pool's free storages (torch's allocator frees them); in-use ones stay."""
        with self._lock:
            self._slots = [st for st in self._slots if not self._free(st)]


_POOL = _OutputPool()


def release_output_buffers():
    """Returns the host memory kdloss keeps for reuse as outputs (_OutputPool) to torch."""
    _POOL.release()


def out_empty(shape, dtype, device):
    """A fresh contiguous output tensor of `shape` for a C call to fill; in host memory one of
    _OutputPool.MIN_BYTES or more sits on a pooled storage."""
    device = torch.device(device)
    nbytes = math.prod(shape) * dtype.itemsize
    if device.type != "cpu" or nbytes < _OutputPool.MIN_BYTES:
        return torch.empty(shape, dtype=dtype, device=device)
    return _POOL.take(shape, dtype, nbytes)


def scalar_out(device):
    return torch.empty(1, dtype=torch.float32, device=device)


# ---- backends -------------------------------------------------------------------------------------

class CpuBackend:
    """kdloss_* on host memory. The fused loss gets a workspace kept per Python thread and grown
    when a call needs more: a fresh one per call would cost the page faults of first touching
    hundreds of MB on every training step (the library's own allocation is returned to the OS
    when freed). One per thread because calls release the GIL and may run concurrently; shared
    by every CpuBackend object (a vocabulary-parallel call makes a fresh one per call)."""

    name = "cpu"
    _local = threading.local()

    def _workspace(self, size_name, size_args, strict=True):
        """(pointer, bytes) of this thread's workspace, grown to what `size_name`(size_args)
        asks. A failing size query raises, or gives (None, 0) when not `strict` (the call it
        sizes then reports the same error itself: with NULL it would allocate its own)."""
        size = ctypes.c_size_t()
        st = _lib.fn(size_name)(*size_args, ctypes.byref(size))
        if st != _lib.OK and not strict:
            return None, 0
        _lib.check(st, size_name)
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.numel() < size.value:
            self._local.buf = None  # free the old one before the new one is allocated
            buf = self._local.buf = torch.empty(max(size.value, 1), dtype=torch.uint8)
        return ctypes.c_void_p(buf.data_ptr()), buf.numel()

    def _fused(self, name, v, size_args, args):
        """C function `name` with this thread's workspace, sized by `name`_workspace_size
        (size_args) and appended to `args`. v: the LM head's rows (VocabParallel uses it)."""
        _lib.check(_lib.fn(name)(*args, *self._workspace(name + "_workspace_size", size_args)),
                   name)

    def fused(self, device, c_name, v, size_args, args, may_report):
        """Any fused C entry point `c_name` (a spec-declared fused loss, _calls.FusedSpec) with
        this thread's workspace, sized by `c_name`_workspace_size(size_args)."""
        self._fused(c_name, v, size_args, args)

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
        self._fused("kdloss_fused_linear_distill", v,
                    (p, bt, hs, ht, v, student_dtype, int(want_grad)),
                    (p, bt, hs, ht, v, xs, ws, bs, xt, wt, bt_bias, labels, ctypes.byref(out)))

    def fused_linear_distill_multi(self, device, params, bt, hs, ht, v, xs, ws, bs, xt, heads,
                                   labels, out, student_dtype, want_grad):
        """params: FldParams, heads: TeacherHeads (its index in host memory), out: FldOut
        (kdloss_fused_linear_distill_multi, docs/MATH.md section 13). Its workspace is the
        single-teacher call's for the same params and shapes (include/kdloss.h), so it is sized
        by that call's query."""
        p = ctypes.byref(params)
        name = "kdloss_fused_linear_distill_multi"
        ws_args = self._workspace("kdloss_fused_linear_distill_workspace_size",
                                  (p, bt, hs, ht, v, student_dtype, int(want_grad)))
        _lib.check(_lib.fn(name)(p, bt, hs, ht, v, xs, ws, bs, xt, ctypes.byref(heads), labels,
                                 ctypes.byref(out), *ws_args), name)

    def topk_distill_logits(self, device, params, bt, v, student, teacher, labels, loss, row_loss,
                            grad):
        """params: TopkDistillParams, teacher: TopkTeacher (kdloss_topk_distill_logits)."""
        _lib.check(_lib.fn("kdloss_topk_distill_logits")(ctypes.byref(params), bt, v, student,
                                                         teacher, labels, loss, row_loss, grad),
                   "kdloss_topk_distill_logits")

    def fused_linear_topk_distill(self, device, params, bt, hs, v, xs, ws, bs, teacher, labels,
                                  out, student_dtype, want_grad):
        """params: FltkParams, out: FldOut (kdloss_fused_linear_topk_distill)."""
        p = ctypes.byref(params)
        self._fused("kdloss_fused_linear_topk_distill", v,
                    (p, bt, hs, v, teacher.k, student_dtype, int(want_grad)),
                    (p, bt, hs, v, xs, ws, bs, teacher, labels, ctypes.byref(out)))


# Whether CudaBackend reads the device status word after each call (a stream sync).
_CUDA_STATUS_CHECK = [True]


def set_cuda_status_check(on=True):
    """Whether CUDA calls with labels or teacher ids read their status word and raise on a bad
    label or id (default True: one stream synchronization such a call). Off, such a call returns NaN losses, as kdloss.h
    describes, and nothing is raised. Process-wide."""
    _CUDA_STATUS_CHECK[0] = bool(on)


def raise_status_word(word, fname):
    """KdlossError for a nonzero device status word of kdloss_cuda_`fname`."""
    if word != _lib.OK:
        raise _lib.KdlossError(word, f"{fname}: reported by the device (status word; the losses "
                                     f"are NaN)")


class CudaBackend:
    """kdloss_cuda_* on device memory: one context per device, torch's current stream, workspace
    allocated through torch's caching allocator. Only used when the library reports CUDA.
    After a call with labels, teacher ids or per-row weights the workspace's status word
    (kdloss.h, CUDA section: an out-of-range label, a bad teacher id or a weight that is not
    finite and >= 0, found on the device) is read and raised as KdlossError, which synchronizes
    the stream once; a call without any (kl_div, jsd or distill without labels, a fused loss
    without labels or weights) is not read: its word is always OK. token_weights and
    return_entropy reach the C calls through their params (row_weights, row_entropy), as on the
    CPU (the vocabulary-parallel CUDA calls read the weights to the host themselves).
    set_cuda_status_check(False) skips the read (the losses are NaN then, as the header says),
    and it is skipped while a CUDA graph is being captured."""

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

    def _run(self, device, name, size_args, args, may_report=True, size_name=None):
        """kdloss_cuda_`name` on this device's context and torch's current stream, with a fresh
        workspace of kdloss_cuda_`name`_workspace_size(size_args) bytes. Invalid labels or
        teacher ids are not reported by the C call: it returns OK and writes the status word
        into the workspace (include/kdloss.h, CUDA section), with NaN losses. The word is read
        (one host synchronization) only when `may_report`: a call without labels or ids writes
        OK there, so reading it would only stall the stream."""
        ctx, index = self._ctx(device)
        fname = "kdloss_cuda_" + name
        size = ctypes.c_size_t()
        sname = "kdloss_cuda_" + (size_name or name) + "_workspace_size"
        _lib.check(_lib.fn(sname)(*size_args, ctypes.byref(size)), sname)
        ws, n = self._workspace(size.value, device)
        _lib.check(_lib.fn(fname)(ctx, self._stream(index), *args, ptr(ws), n), fname)
        capturing = ws is not None and ws.is_cuda and torch.cuda.is_current_stream_capturing()
        if may_report and ws is not None and _CUDA_STATUS_CHECK[0] and not capturing:
            raise_status_word(int(host_read(ws[:4].view(torch.int32))), fname)

    def fused(self, device, c_name, v, size_args, args, may_report):
        """Any fused entry point's kdloss_cuda_ twin (a spec-declared fused loss), its status
        word read when `may_report` or when the params (args[0]) carry row weights."""
        self._run(device, c_name[len("kdloss_"):], size_args, args,
                  may_report or weighted(args[0]))

    def kl_div(self, device, params, bt, v, inp, tgt, loss, row_loss, elem, grad):
        self._run(device, "kl_div", (bt, v),
                  (ctypes.byref(params), bt, v, inp, tgt, loss, row_loss, elem, grad), False)

    def jsd(self, device, params, bt, v, student, teacher, labels, loss, row_loss, grad):
        self._run(device, "jsd", (bt, v),
                  (ctypes.byref(params), bt, v, student, teacher, labels, loss, row_loss, grad),
                  reports(labels))

    def distill(self, device, params, bt, v, student, teacher, labels, loss, row_loss, grad):
        self._run(device, "distill", (bt, v),
                  (ctypes.byref(params), bt, v, student, teacher, labels, loss, row_loss, grad),
                  reports(labels))

    def distill_logits(self, device, params, bt, v, student, teacher, labels, loss, row_loss,
                       grad):
        """params: DistillLogitsParams (kdloss_cuda_distill_logits: the loss on logits)."""
        self._run(device, "distill_logits", (bt, v),
                  (ctypes.byref(params), bt, v, student, teacher, labels, loss, row_loss, grad),
                  reports(labels) or weighted(params))

    def fused_linear_distill(self, device, params, bt, hs, ht, v, xs, ws, bs, xt, wt, bt_bias,
                             labels, out, student_dtype, want_grad):
        p = ctypes.byref(params)
        self._run(device, "fused_linear_distill", (p, bt, hs, ht, v, student_dtype, int(want_grad)),
                  (p, bt, hs, ht, v, xs, ws, bs, xt, wt, bt_bias, labels, ctypes.byref(out)),
                  reports(labels) or weighted(params))

    def fused_linear_distill_multi(self, device, params, bt, hs, ht, v, xs, ws, bs, xt, heads,
                                   labels, out, student_dtype, want_grad):
        """kdloss_cuda_fused_linear_distill_multi: heads' weights and biases device memory, its
        index host memory; the single-teacher call's workspace (include/kdloss.h)."""
        p = ctypes.byref(params)
        self._run(device, "fused_linear_distill_multi",
                  (p, bt, hs, ht, v, student_dtype, int(want_grad)),
                  (p, bt, hs, ht, v, xs, ws, bs, xt, ctypes.byref(heads), labels,
                   ctypes.byref(out)), reports(labels), size_name="fused_linear_distill")

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


_COMM_TYPES = {_lib.F32: (ctypes.c_float, torch.float32, "<f4"),
               _lib.F64: (ctypes.c_double, torch.float64, "<f8")}


class _DeviceBuffer:
    """n elements at a device pointer, described by __cuda_array_interface__ (version 2: no
    stream to wait for; the C call and torch use the same stream), for torch.as_tensor to view
    without a copy."""

    def __init__(self, ptr, n, typestr):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": typestr, "data": (ptr, False),
                                         "strides": None, "version": 2}


def _allreduce_callback(dist, group, errors, where):
    """kdloss_comm's all-reduce as a ctypes callback: the C buffer seen as a tensor (no copy),
    reduced in place by dist.all_reduce on `group`. The buffer is host memory, or device memory
    on where["device"] for the CUDA entry points (which call it with the work that fills the
    buffer queued on torch's current stream, the stream dist.all_reduce orders itself after).
    An exception is appended to `errors` and the C call gets non-zero. It refers to no
    VocabParallel: a cycle through the callback would keep the group alive until a garbage
    collection, and a gloo group destroyed by the interpreter's teardown can abort the process
    ("terminate called without an active exception")."""
    ops = {_lib.COMM_SUM: dist.ReduceOp.SUM, _lib.COMM_MAX: dist.ReduceOp.MAX}

    def allreduce(ctx, buf, n, dtype, op):
        try:
            if n > 0:
                ctype, tdtype, typestr = _COMM_TYPES[dtype]
                device = where.get("device")
                if device is None:
                    t = torch.frombuffer((ctype * n).from_address(buf), dtype=tdtype)
                else:
                    t = torch.as_tensor(_DeviceBuffer(buf, n, typestr), device=device)
                dist.all_reduce(t, op=ops[op], group=group)
            return 0
        except BaseException as e:  # nothing may unwind through the C frames
            if not errors:
                errors.append(e)
            return 1
    return _lib.ALLREDUCE(allreduce)


class VocabParallel(CpuBackend):
    """The backend of one vocabulary-parallel call (include/kdloss.h, "Vocabulary-parallel
    fused losses"): the student's and teacher's LM heads are split by rows across the ranks of a
    torch.distributed process group, and the fused calls go to the kdloss_*_vp entry points, or
    to kdloss_cuda_*_vp for CUDA tensors (bind(); the CUDA backend's context, torch's current
    stream and a workspace from its allocator; the all-reduces then see device memory).

    Made fresh for every call and caching nothing: the call all-gathers every rank's row count
    (in rank order: this rank's block starts after the lower ranks' rows, the vocabulary is their
    sum), then the C call runs its collectives through _allreduce_callback's function. An
    exception there is kept and re-raised once the C call has returned (KDLOSS_ERR_COMM).

    `c_name` is the entry point the call will use; `meet_peers` lets a rank that failed before
    reaching it still join its peers' collectives, so that they fail too instead of waiting."""

    def __init__(self, group, c_name):
        import torch.distributed as dist
        self._dist = dist
        self.group = group
        self._c_name = c_name
        self._fn = _lib.fn(c_name)  # UNSUPPORTED here, before any collective, without it
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        if rank < 0:
            raise KdlossError(_lib.ERR_INVALID_PARAM, "this process is not in process_group")
        self._errors = []  # what the callback raised
        self._where = {"device": None}  # the callback's buffers: device memory once bound to CUDA
        self._callback = _allreduce_callback(dist, group, self._errors, self._where)
        self.comm = _lib.Comm(rank, size, self._callback, None)
        self.shard = None  # the kdloss_vocab_shard, once the row counts are gathered
        self.gathered = self.called = False
        self._cuda = None  # (CudaBackend, device) once bound to a CUDA device

    def bind(self, device):
        """This call's backend for tensors on `device`: itself. On the CPU it calls `c_name`; on
        CUDA the same entry point's kdloss_cuda_ twin (KdlossError(UNSUPPORTED), before any
        collective, when the library has no CUDA backend); other devices raise
        NotImplementedError."""
        if device.type == "cuda":
            cuda = _cuda_backend(device)
            self._fn = _lib.fn(self._c_name.replace("kdloss_", "kdloss_cuda_", 1))
            self._cuda = (cuda, device)
            self._where["device"] = device
        elif device.type != "cpu":
            raise NotImplementedError(
                f"kdloss: process_group (a vocabulary-parallel loss) takes CPU or CUDA tensors "
                f"only; got {device} tensors")
        return self

    def _collective_device(self):
        """Where the all-gather's tensors live: the call's CUDA device, the current one for an
        NCCL group (CUDA tensors only) that failed before binding, else the CPU."""
        if self._cuda is not None:
            return self._cuda[1]
        if str(self._dist.get_backend(self.group)) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _c_args(self, name, size_args, args):
        """The C call's arguments: the shard after the params; on CUDA the context and stream
        first. The workspace is sized by the entry point's query; a failing query still makes
        the call, with none, which reports the error and tells the other ranks. Returns (args,
        the workspace to keep alive during the call)."""
        if self._cuda is None:
            ws = self._workspace(name + "_workspace_size", size_args, strict=False)
            return (args[0], ctypes.byref(self.shard), *args[1:], *ws), None
        cuda, device = self._cuda
        ctx, index = cuda._ctx(device)
        size = ctypes.c_size_t()
        size_name = "kdloss_cuda_" + name[len("kdloss_"):] + "_vp_workspace_size"
        ok = _lib.fn(size_name)(*size_args, ctypes.byref(size)) == _lib.OK
        ws, n = cuda._workspace(size.value, device) if ok else (None, 0)
        return (ctx, cuda._stream(index), args[0], ctypes.byref(self.shard), *args[1:], ptr(ws),
                n), ws

    def _gather(self, v):
        """The shard of this rank's v rows, from every rank's row count. A rank that failed
        before its call sends -1 instead (meet_peers), and the others raise KDLOSS_ERR_PEER."""
        self.gathered = True  # even if it raises: the group is then broken for every rank
        device = self._collective_device()
        counts = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(self.comm.size)]
        self._dist.all_gather(counts, torch.tensor([v], dtype=torch.int64, device=device),
                              group=self.group)
        counts = [int(host_read(c)) for c in counts]
        if min(counts) < 0:
            failed = [r for r, c in enumerate(counts) if c < 0]
            raise KdlossError(_lib.ERR_PEER, f"rank(s) {failed} of process_group failed before "
                              "their kdloss call")
        self.shard = _lib.VocabShard(ctypes.pointer(self.comm), sum(counts),
                                     sum(counts[:self.comm.rank]))

    def _fused(self, name, v, size_args, args):
        """`name`_vp (or its CUDA twin) with the shard inserted after the params (_c_args)."""
        self._gather(v)
        call, keep = self._c_args(name, size_args, args)
        self.called = True
        st = self._fn(*call)
        del keep  # the CUDA workspace: its memory is reused in stream order after the call
        if self._errors:
            raise self._errors.pop()  # the list no longer holds it: no reference cycle
        _lib.check(st, name + "_vp")

    def meet_peers(self):
        """For a rank that raised before its C call: before the all-gather, join it with -1
        rows (the others then raise KDLOSS_ERR_PEER and skip their C calls); after it, join
        the C call's agreement through a call whose arguments are all zero or NULL but the
        shard: this rank's C call rejects them, the others return KDLOSS_ERR_PEER. The caller
        raises its own exception. Nothing to do once the C call was made."""
        if self.called:
            return
        self.called = True
        try:
            if not self.gathered:
                self._gather(-1)
            elif self.shard is not None:
                args = [t() for t in self._fn.argtypes]
                at = 1 if self._cuda is None else 3  # after the params (and ctx, stream)
                args[at] = ctypes.byref(self.shard)
                if self._cuda is not None:  # a context: without one the call returns at once
                    cuda, device = self._cuda
                    ctx, index = cuda._ctx(device)
                    args[0], args[1] = ctx, cuda._stream(index)
                self._fn(*args)
        except Exception:  # the exception being raised is the one to report
            pass
        self._errors.clear()


def vocab_parallel(group, c_name):
    """A VocabParallel for `group` (None without one) around the code that prepares and makes a
    vocabulary-parallel call: whatever that code raises first lets the peers know. Without a
    group a nullcontext (yielding None), which torch.compile traces."""
    if group is None:
        return contextlib.nullcontext()
    return _vocab_parallel(group, c_name)


@contextlib.contextmanager
def _vocab_parallel(group, c_name):
    vp = VocabParallel(group, c_name)
    try:
        yield vp
    except BaseException:
        vp.meet_peers()
        raise


_CPU = CpuBackend()
_CUDA = None
_BACKENDS = {}  # device type -> backend object; register_backend() adds more


def register_backend(device_type, backend):
    """Route tensors on `device_type` (e.g. "cuda", "xpu") to `backend`, an object with the
    kl_div / jsd / distill / fused_linear_distill methods of CpuBackend (and distill_logits for
    one call on logits, topk_distill_logits / fused_linear_topk_distill for the sparse-teacher
    losses, fused_linear_distill_multi for several teachers, fused for a loss declared by a spec,
    modules.declare_fused). Overrides the built-in
    choice."""
    _BACKENDS[device_type] = backend


def _cuda_backend(device):
    """The CUDA backend (made on first use); KdlossError(UNSUPPORTED) when the library has none."""
    global _CUDA
    if _lib.has("kdloss_cuda_available") and _lib.lib().kdloss_cuda_available():
        if _CUDA is None:
            _CUDA = CudaBackend()
        return _CUDA
    raise KdlossError(_lib.ERR_UNSUPPORTED,
                      f"kdloss got CUDA tensors ({device}) but {_lib.library_path()} has no "
                      f"CUDA backend ({_lib.cuda_info()['reason']}); move the tensors to the "
                      "CPU, or install a kdloss wheel built with nvcc (make wheel)")


def backend_for(device, vp=None):
    """The backend for tensors on `device`; with `vp` (a VocabParallel), that one bound to the
    device (CPU or CUDA)."""
    if vp is not None:
        return vp.bind(device)
    if device.type in _BACKENDS:
        return _BACKENDS[device.type]
    if device.type == "cpu":
        return _CPU
    if device.type == "cuda":
        return _cuda_backend(device)
    raise KdlossError(_lib.ERR_UNSUPPORTED, f"kdloss has no backend for {device.type} tensors")
