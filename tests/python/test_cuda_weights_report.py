"""CudaBackend (python/kdloss/torch/_backend.py) with token_weights: on CUDA the weights' values
are device memory, checked on the device, so a bad weight comes back through the workspace's
status word (include/kdloss.h, CUDA section). The backend must read that word whenever the
params carry row weights, labels or not (a call without labels or weights needs no read: its
word is always OK). No device needed: the C call is replaced by a recorder of what the backend
asks for."""
import ctypes

from kdloss import _lib
from kdloss.torch import _backend


def _recording_backend():
    b = _backend.CudaBackend()
    calls = []
    b._run = lambda device, name, size_args, args, may_report=True: calls.append(
        (name, may_report))
    return b, calls


def test_weights_without_labels_read_the_status_word():
    b, calls = _recording_backend()
    none = _lib.Labels(None, _lib.I64)
    w = (ctypes.c_float * 4)(1.0, 0.0, 2.5, 1.0)
    p = _lib.DistillLogitsParams()
    b.distill_logits(None, p, 4, 8, None, None, none, None, None, None)
    p.row_weights = ctypes.addressof(w)
    b.distill_logits(None, p, 4, 8, None, None, none, None, None, None)
    f = _lib.FldParams()
    b.fused(None, "kdloss_fused_linear_distill", 8, (), (ctypes.byref(f),), False)
    f.row_weights = ctypes.addressof(w)
    b.fused(None, "kdloss_fused_linear_distill", 8, (), (ctypes.byref(f),), False)
    assert calls == [("distill_logits", False), ("distill_logits", True),
                     ("fused_linear_distill", False), ("fused_linear_distill", True)], calls


def test_weighted_reads_structs_and_byref():
    f = _lib.FltkParams()
    assert not _backend.weighted(f) and not _backend.weighted(ctypes.byref(f))
    w = ctypes.c_float(1.0)
    f.row_weights = ctypes.addressof(w)
    assert _backend.weighted(f) and _backend.weighted(ctypes.byref(f))
