"""ctypes view of libkdloss.so: the structs, enums and prototypes of include/kdloss.h.

This module knows C and nothing about any tensor framework. It loads the shared library once,
declares the argument types of every function it finds, and turns a non-zero kdloss_status into a
KdlossError carrying kdloss_status_string()'s message.

Where the library is found, first match wins:
  1. $KDLOSS_LIBRARY (a path to a libkdloss.so), for testing a build without reinstalling;
  2. libkdloss.so next to this file (what `pip install .` puts there);
  3. build/libkdloss.so of the source tree this file sits in (an editable checkout).

The CUDA backend is a second library, libkdloss_cuda.so (the whole C API with the real
kdloss_cuda_* entries; libkdloss.so's are stubs saying KDLOSS_ERR_UNSUPPORTED). It is loaded only
where torch is installed and torch.cuda.is_available() is True, from the directory of the
package (or of the loaded libkdloss.so), or from $KDLOSS_CUDA_LIB (a path: loaded even where
torch sees no device, e.g. the simulator-built library of the dry run). Its CUDA libraries
(libcudart, libcublas, libcublasLt, by soname) are the ones torch's CUDA wheels ship: taken from
the process when torch loaded them, else preloaded from the nvidia/*/lib directories on sys.path.
A CUDA major version other than torch's is refused. Once loaded, its kdloss_cuda_* functions
replace the stubs on the handle lib() returns; every other function stays libkdloss.so's (one
copy of the process-wide CPU settings). cuda_info() says what happened.
"""

import ctypes
import functools
import glob
import json
import os
import sys
import threading

# ---- enums (values copied from include/kdloss.h, which is the single source of truth) ------------

OK = 0
ERR_NULL_POINTER = -1
ERR_INVALID_SIZE = -2
ERR_INVALID_DTYPE = -3
ERR_INVALID_REDUCTION = -4
ERR_INVALID_PARAM = -5
ERR_INVALID_STRIDE = -6
ERR_ALIASING = -7
ERR_LABEL_OUT_OF_RANGE = -8
ERR_SHAPE_MISMATCH = -9
ERR_NO_OUTPUT = -10
ERR_OUT_OF_MEMORY = -11
ERR_WORKSPACE_TOO_SMALL = -12
ERR_UNSUPPORTED = -13
ERR_BLAS = -14
ERR_CUDA = -15
ERR_INTERNAL = -16
ERR_BUDGET_TOO_SMALL = -17
ERR_MISALIGNED = -18
ERR_INVALID_ID = -19
ERR_COMM = -20
ERR_PEER = -21

STATUS_NAMES = {
    OK: "KDLOSS_OK",
    ERR_NULL_POINTER: "KDLOSS_ERR_NULL_POINTER",
    ERR_INVALID_SIZE: "KDLOSS_ERR_INVALID_SIZE",
    ERR_INVALID_DTYPE: "KDLOSS_ERR_INVALID_DTYPE",
    ERR_INVALID_REDUCTION: "KDLOSS_ERR_INVALID_REDUCTION",
    ERR_INVALID_PARAM: "KDLOSS_ERR_INVALID_PARAM",
    ERR_INVALID_STRIDE: "KDLOSS_ERR_INVALID_STRIDE",
    ERR_ALIASING: "KDLOSS_ERR_ALIASING",
    ERR_LABEL_OUT_OF_RANGE: "KDLOSS_ERR_LABEL_OUT_OF_RANGE",
    ERR_SHAPE_MISMATCH: "KDLOSS_ERR_SHAPE_MISMATCH",
    ERR_NO_OUTPUT: "KDLOSS_ERR_NO_OUTPUT",
    ERR_OUT_OF_MEMORY: "KDLOSS_ERR_OUT_OF_MEMORY",
    ERR_WORKSPACE_TOO_SMALL: "KDLOSS_ERR_WORKSPACE_TOO_SMALL",
    ERR_UNSUPPORTED: "KDLOSS_ERR_UNSUPPORTED",
    ERR_BLAS: "KDLOSS_ERR_BLAS",
    ERR_CUDA: "KDLOSS_ERR_CUDA",
    ERR_INTERNAL: "KDLOSS_ERR_INTERNAL",
    ERR_BUDGET_TOO_SMALL: "KDLOSS_ERR_BUDGET_TOO_SMALL",
    ERR_MISALIGNED: "KDLOSS_ERR_MISALIGNED",
    ERR_INVALID_ID: "KDLOSS_ERR_INVALID_ID",
    ERR_COMM: "KDLOSS_ERR_COMM",
    ERR_PEER: "KDLOSS_ERR_PEER",
}

F32, BF16, F16, I32, I64, F64 = 0, 1, 2, 3, 4, 5  # F64: the communicator's statistics only

COMM_SUM, COMM_MAX = 0, 1  # kdloss_comm_op

REDUCTIONS = {"none": 0, "sum": 1, "mean": 2, "batchmean": 3}

ISA_AUTO, ISA_SCALAR, ISA_AVX2, ISA_AVX512 = 0, 1, 2, 3


# ---- structs --------------------------------------------------------------------------------------
# C enums are `int` on every ABI kdloss targets; ctypes adds the same padding the C compiler does.

class CMat(ctypes.Structure):
    """kdloss_cmat: a read-only row-major matrix view (ld in elements, 0 = contiguous)."""
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ld", ctypes.c_int64)]


class Mat(ctypes.Structure):
    """kdloss_mat: a writable view; data = NULL means "not wanted"."""
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ld", ctypes.c_int64)]


class Labels(ctypes.Structure):
    """kdloss_labels: BT contiguous token ids (I64 or I32); data = NULL means "no labels"."""
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int)]


class KlParams(ctypes.Structure):
    _fields_ = [("reduction", ctypes.c_int), ("log_target", ctypes.c_int),
                ("eps", ctypes.c_double), ("grad_scale", ctypes.c_double)]


class JsdParams(ctypes.Structure):
    _fields_ = [("beta", ctypes.c_double), ("ignore_index", ctypes.c_int64),
                ("grad_scale", ctypes.c_double)]


class FldJsdParams(ctypes.Structure):
    _fields_ = [("beta", ctypes.c_double), ("temperature", ctypes.c_double),
                ("weight_hard_loss", ctypes.c_double), ("weight_soft_loss", ctypes.c_double),
                ("ignore_index", ctypes.c_int64), ("chunk_size", ctypes.c_int64),
                ("memory_budget", ctypes.c_size_t), ("grad_scale", ctypes.c_double)]


class DivParams(ctypes.Structure):
    """kdloss_div_params: the divergence (enum) and its beta, alpha."""
    _fields_ = [("divergence", ctypes.c_int), ("beta", ctypes.c_double),
                ("alpha", ctypes.c_double)]


class DistillParams(ctypes.Structure):
    _fields_ = [("div", DivParams), ("ignore_index", ctypes.c_int64),
                ("grad_scale", ctypes.c_double)]


class DistillLogitsParams(ctypes.Structure):
    """kdloss_distill_logits_params."""
    _fields_ = [("div", DivParams), ("temperature", ctypes.c_double),
                ("ignore_index", ctypes.c_int64), ("grad_scale", ctypes.c_double),
                ("row_weights", ctypes.c_void_p), ("row_entropy", ctypes.c_void_p)]


class LogitMap(ctypes.Structure):
    """kdloss_logit_map: z = softcap tanh(scale u / softcap), or scale u (softcap 0)."""
    _fields_ = [("scale", ctypes.c_double), ("softcap", ctypes.c_double)]


class FldParams(ctypes.Structure):
    """kdloss_fused_linear_distill_params."""
    _fields_ = [("div", DivParams), ("temperature", ctypes.c_double),
                ("weight_hard_loss", ctypes.c_double), ("weight_soft_loss", ctypes.c_double),
                ("t2_scale", ctypes.c_int), ("ignore_index", ctypes.c_int64),
                ("chunk_size", ctypes.c_int64), ("memory_budget", ctypes.c_size_t),
                ("grad_scale", ctypes.c_double), ("student_map", LogitMap),
                ("teacher_map", LogitMap), ("row_weights", ctypes.c_void_p)]


class FldOut(ctypes.Structure):
    """kdloss_fused_linear_distill_out."""
    _fields_ = [("loss", ctypes.c_void_p), ("soft_loss", ctypes.c_void_p),
                ("hard_loss", ctypes.c_void_p), ("dxs", Mat), ("dws", Mat), ("dbs", ctypes.c_void_p),
                ("row_soft", ctypes.c_void_p), ("row_hard", ctypes.c_void_p),
                ("row_lse", ctypes.c_void_p), ("row_entropy", ctypes.c_void_p)]


class TopkTeacher(ctypes.Structure):
    """kdloss_topk_teacher: K slots per row, ids (I32/I64, -1 = unused) and their log-probs."""
    _fields_ = [("k", ctypes.c_int64), ("ids", CMat), ("logprobs", CMat)]


class TeacherHeads(ctypes.Structure):
    """kdloss_teacher_heads: n heads (CMat array), optional biases, a host int32 index per row."""
    _fields_ = [("n", ctypes.c_int64), ("wt", ctypes.POINTER(CMat)), ("bias", ctypes.c_void_p),
                ("index", ctypes.c_void_p)]


class TopkDistillParams(ctypes.Structure):
    """kdloss_topk_distill_params."""
    _fields_ = [("div", DivParams), ("tail", ctypes.c_int), ("temperature", ctypes.c_double),
                ("ignore_index", ctypes.c_int64), ("grad_scale", ctypes.c_double),
                ("row_weights", ctypes.c_void_p), ("row_entropy", ctypes.c_void_p)]


class FltkParams(ctypes.Structure):
    """kdloss_fused_linear_topk_distill_params."""
    _fields_ = [("div", DivParams), ("tail", ctypes.c_int), ("temperature", ctypes.c_double),
                ("weight_hard_loss", ctypes.c_double), ("weight_soft_loss", ctypes.c_double),
                ("t2_scale", ctypes.c_int), ("ignore_index", ctypes.c_int64),
                ("chunk_size", ctypes.c_int64), ("memory_budget", ctypes.c_size_t),
                ("grad_scale", ctypes.c_double), ("student_map", LogitMap),
                ("row_weights", ctypes.c_void_p)]


class FldJsdOut(ctypes.Structure):
    _fields_ = [("loss", ctypes.c_void_p), ("soft_loss", ctypes.c_void_p),
                ("hard_loss", ctypes.c_void_p), ("dxs", Mat), ("dws", Mat), ("dbs", ctypes.c_void_p)]


# kdloss_comm's all-reduce: int (*)(void *ctx, void *buf, int64_t n, kdloss_dtype, kdloss_comm_op)
ALLREDUCE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                             ctypes.c_int, ctypes.c_int)


class Comm(ctypes.Structure):
    """kdloss_comm: this rank, the number of ranks, and the all-reduce callback (an ALLREDUCE)."""
    _fields_ = [("rank", ctypes.c_int), ("size", ctypes.c_int), ("allreduce", ALLREDUCE),
                ("ctx", ctypes.c_void_p)]


class VocabShard(ctypes.Structure):
    """kdloss_vocab_shard: this rank's rows [v_begin, v_begin + v) of a v_total-row LM head."""
    _fields_ = [("comm", ctypes.POINTER(Comm)), ("v_total", ctypes.c_int64),
                ("v_begin", ctypes.c_int64)]


class Bf16GemmInfo(ctypes.Structure):
    """kdloss_bf16_gemm_info."""
    _fields_ = [("mode", ctypes.c_int), ("grad", ctypes.c_int), ("native", ctypes.c_int),
                ("grad_native", ctypes.c_int), ("auto_native", ctypes.c_int),
                ("available", ctypes.c_int), ("reference", ctypes.c_int),
                ("measurements", ctypes.c_int), ("native_gflops", ctypes.c_double),
                ("widen_gflops", ctypes.c_double), ("margin", ctypes.c_double),
                ("m", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                ("kernel", ctypes.c_char * 64)]


NULL_MAT = Mat(None, F32, 0)
NULL_LABELS = Labels(None, I64)


# ---- errors ---------------------------------------------------------------------------------------

class KdlossError(ValueError, RuntimeError):
    """A kdloss call failed. `status` is the kdloss_status code, `status_name` its enum name, and
    the message starts with kdloss_status_string(status). Subclasses both ValueError (bad
    arguments are the usual cause) and RuntimeError (what torch code tends to catch)."""

    def __init__(self, status, detail="", c_detail=""):
        self.status = int(status)
        self.status_name = STATUS_NAMES.get(self.status, "unknown")
        # kdloss_error_detail() of the failing call: the argument, row and value the C check
        # names ("labels[17] = 40000 is neither ignore_index (-100) nor in [0, 32768)")
        self.c_detail = c_detail
        msg = status_string(self.status)
        if detail:
            msg = f"{detail}: {msg}"
        if c_detail:
            msg = f"{msg} [{c_detail}]"
        super().__init__(msg)


# The C struct each ctypes Structure above mirrors (tests/python/test_abi.py compares their
# layouts with kdloss_abi_layout of the loaded library).
C_STRUCTS = {CMat: "kdloss_cmat", Mat: "kdloss_mat", Labels: "kdloss_labels",
             KlParams: "kdloss_kl_params", JsdParams: "kdloss_jsd_params",
             FldJsdParams: "kdloss_fljsd_params", DivParams: "kdloss_div_params",
             DistillParams: "kdloss_distill_params",
             DistillLogitsParams: "kdloss_distill_logits_params",
             FldParams: "kdloss_fused_linear_distill_params",
             FldOut: "kdloss_fused_linear_distill_out", TopkTeacher: "kdloss_topk_teacher",
             TopkDistillParams: "kdloss_topk_distill_params",
             FltkParams: "kdloss_fused_linear_topk_distill_params", FldJsdOut: "kdloss_fljsd_out",
             Comm: "kdloss_comm", VocabShard: "kdloss_vocab_shard",
             Bf16GemmInfo: "kdloss_bf16_gemm_info", LogitMap: "kdloss_logit_map",
             TeacherHeads: "kdloss_teacher_heads"}


def abi_layout(c_name):
    """[(field or None, offset, size)] of C struct c_name as the loaded library was compiled:
    first the struct itself (None, 0, sizeof), then its fields in declaration order."""
    out, f = [], fn("kdloss_abi_layout")
    while True:
        name, off, size = ctypes.c_char_p(), ctypes.c_size_t(), ctypes.c_size_t()
        if f(c_name.encode(), len(out), ctypes.byref(name), ctypes.byref(off),
             ctypes.byref(size)) != OK:
            return out
        out.append((name.value.decode() if name.value else None, off.value, size.value))


# ---- loading --------------------------------------------------------------------------------------

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_ST = ctypes.c_int

# name -> (restype, argtypes). Functions missing from the loaded library (a partial build, or a
# kernel not merged yet) are simply absent; calling one raises KdlossError(ERR_UNSUPPORTED).
_PROTOTYPES = {
    "kdloss_version": (ctypes.c_char_p, []),
    "kdloss_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    "kdloss_error_detail": (ctypes.c_char_p, []),
    "kdloss_abi_layout": (_ST, [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p),
                                ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]),
    "kdloss_dtype_size": (ctypes.c_size_t, [ctypes.c_int]),
    "kdloss_cpu_isa_supported": (ctypes.c_int, [ctypes.c_int]),
    "kdloss_cpu_set_isa": (_ST, [ctypes.c_int]),
    "kdloss_cpu_get_isa": (ctypes.c_int, []),
    "kdloss_cpu_isa_name": (ctypes.c_char_p, [ctypes.c_int]),
    "kdloss_gemm_set_bf16": (_ST, [ctypes.c_int]),
    "kdloss_gemm_set_bf16_grad": (_ST, [ctypes.c_int]),
    "kdloss_gemm_bf16_query": (_ST, [ctypes.POINTER(Bf16GemmInfo)]),
    "kdloss_kl_params_default": (None, [ctypes.POINTER(KlParams)]),
    "kdloss_kl_div": (_ST, [ctypes.POINTER(KlParams), _I64, _I64, CMat, CMat, _P, _P, Mat, Mat]),
    "kdloss_jsd_params_default": (None, [ctypes.POINTER(JsdParams)]),
    "kdloss_jsd": (_ST, [ctypes.POINTER(JsdParams), _I64, _I64, CMat, CMat, Labels, _P, _P, Mat]),
    "kdloss_fljsd_params_default": (None, [ctypes.POINTER(FldJsdParams)]),
    "kdloss_fljsd_workspace_size": (_ST, [ctypes.POINTER(FldJsdParams), _I64, _I64, _I64, _I64,
                                          ctypes.c_int, ctypes.c_int,
                                          ctypes.POINTER(ctypes.c_size_t)]),
    "kdloss_fljsd_min_budget": (_ST, [ctypes.POINTER(FldJsdParams), _I64, _I64, _I64, _I64,
                                      ctypes.c_int, ctypes.c_int,
                                      ctypes.POINTER(ctypes.c_size_t)]),
    "kdloss_fused_linear_jsd": (_ST, [ctypes.POINTER(FldJsdParams), _I64, _I64, _I64, _I64, CMat,
                                      CMat, _P, CMat, CMat, _P, Labels, ctypes.POINTER(FldJsdOut),
                                      _P, ctypes.c_size_t]),
    "kdloss_divergence_from_name": (_ST, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]),
    "kdloss_divergence_name": (ctypes.c_char_p, [ctypes.c_int]),
    "kdloss_distill_params_default": (None, [ctypes.POINTER(DistillParams)]),
    "kdloss_distill": (_ST, [ctypes.POINTER(DistillParams), _I64, _I64, CMat, CMat, Labels, _P, _P,
                             Mat]),
    "kdloss_distill_logits_params_default": (None, [ctypes.POINTER(DistillLogitsParams)]),
    "kdloss_distill_logits": (_ST, [ctypes.POINTER(DistillLogitsParams), _I64, _I64, CMat, CMat,
                                    Labels, _P, _P, Mat]),
    "kdloss_fused_linear_distill_params_default": (None, [ctypes.POINTER(FldParams)]),
    "kdloss_fused_linear_distill_workspace_size": (_ST, [ctypes.POINTER(FldParams), _I64, _I64,
                                                         _I64, _I64, ctypes.c_int, ctypes.c_int,
                                                         ctypes.POINTER(ctypes.c_size_t)]),
    "kdloss_fused_linear_distill": (_ST, [ctypes.POINTER(FldParams), _I64, _I64, _I64, _I64, CMat,
                                          CMat, _P, CMat, CMat, _P, Labels,
                                          ctypes.POINTER(FldOut), _P, ctypes.c_size_t]),
    "kdloss_fused_linear_distill_multi": (_ST, [ctypes.POINTER(FldParams), _I64, _I64, _I64, _I64,
                                                CMat, CMat, _P, CMat, ctypes.POINTER(TeacherHeads),
                                                Labels, ctypes.POINTER(FldOut), _P,
                                                ctypes.c_size_t]),
    "kdloss_fused_linear_distill_vp": (_ST, [ctypes.POINTER(FldParams), ctypes.POINTER(VocabShard),
                                             _I64, _I64, _I64, _I64, CMat, CMat, _P, CMat, CMat,
                                             _P, Labels, ctypes.POINTER(FldOut), _P,
                                             ctypes.c_size_t]),
    "kdloss_cuda_distill_workspace_size": (_ST, [_I64, _I64, ctypes.POINTER(ctypes.c_size_t)]),
    "kdloss_cuda_distill": (_ST, [_P, _P, ctypes.POINTER(DistillParams), _I64, _I64, CMat, CMat,
                                  Labels, _P, _P, Mat, _P, ctypes.c_size_t]),
    "kdloss_cuda_distill_logits_workspace_size": (_ST, [_I64, _I64,
                                                        ctypes.POINTER(ctypes.c_size_t)]),
    "kdloss_cuda_distill_logits": (_ST, [_P, _P, ctypes.POINTER(DistillLogitsParams), _I64, _I64,
                                         CMat, CMat, Labels, _P, _P, Mat, _P, ctypes.c_size_t]),
    "kdloss_cuda_fused_linear_distill_workspace_size": (_ST, [ctypes.POINTER(FldParams), _I64,
                                                              _I64, _I64, _I64, ctypes.c_int,
                                                              ctypes.c_int,
                                                              ctypes.POINTER(ctypes.c_size_t)]),
    "kdloss_cuda_fused_linear_distill": (_ST, [_P, _P, ctypes.POINTER(FldParams), _I64, _I64, _I64,
                                               _I64, CMat, CMat, _P, CMat, CMat, _P, Labels,
                                               ctypes.POINTER(FldOut), _P, ctypes.c_size_t]),
    "kdloss_cuda_fused_linear_distill_multi": (_ST, [_P, _P, ctypes.POINTER(FldParams), _I64,
                                                     _I64, _I64, _I64, CMat, CMat, _P, CMat,
                                                     ctypes.POINTER(TeacherHeads), Labels,
                                                     ctypes.POINTER(FldOut), _P,
                                                     ctypes.c_size_t]),
    "kdloss_topk_tail_name": (ctypes.c_char_p, [ctypes.c_int]),
    "kdloss_topk_tail_from_name": (_ST, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]),
    "kdloss_topk_distill_params_default": (None, [ctypes.POINTER(TopkDistillParams)]),
    "kdloss_topk_distill_logits": (_ST, [ctypes.POINTER(TopkDistillParams), _I64, _I64, CMat,
                                         TopkTeacher, Labels, _P, _P, Mat]),
    "kdloss_fused_linear_topk_distill_params_default": (None, [ctypes.POINTER(FltkParams)]),
    "kdloss_fused_linear_topk_distill_workspace_size": (_ST, [ctypes.POINTER(FltkParams), _I64,
                                                              _I64, _I64, _I64, ctypes.c_int,
                                                              ctypes.c_int,
                                                              ctypes.POINTER(ctypes.c_size_t)]),
    "kdloss_fused_linear_topk_distill": (_ST, [ctypes.POINTER(FltkParams), _I64, _I64, _I64, CMat,
                                               CMat, _P, TopkTeacher, Labels,
                                               ctypes.POINTER(FldOut), _P, ctypes.c_size_t]),
    "kdloss_fused_linear_topk_distill_vp": (_ST, [ctypes.POINTER(FltkParams),
                                                  ctypes.POINTER(VocabShard), _I64, _I64, _I64,
                                                  CMat, CMat, _P, TopkTeacher, Labels,
                                                  ctypes.POINTER(FldOut), _P, ctypes.c_size_t]),
    "kdloss_cuda_topk_distill_logits_workspace_size": (_ST, [_I64, _I64, _I64,
                                                             ctypes.POINTER(ctypes.c_size_t)]),
    "kdloss_cuda_topk_distill_logits": (_ST, [_P, _P, ctypes.POINTER(TopkDistillParams), _I64,
                                              _I64, CMat, TopkTeacher, Labels, _P, _P, Mat, _P,
                                              ctypes.c_size_t]),
    "kdloss_cuda_fused_linear_topk_distill_workspace_size": (
        _ST, [ctypes.POINTER(FltkParams), _I64, _I64, _I64, _I64, ctypes.c_int, ctypes.c_int,
              ctypes.POINTER(ctypes.c_size_t)]),
    "kdloss_cuda_fused_linear_topk_distill": (_ST, [_P, _P, ctypes.POINTER(FltkParams), _I64, _I64,
                                                    _I64, CMat, CMat, _P, TopkTeacher, Labels,
                                                    ctypes.POINTER(FldOut), _P, ctypes.c_size_t]),
    "kdloss_cuda_fused_linear_distill_vp_workspace_size": (
        _ST, [ctypes.POINTER(FldParams), _I64, _I64, _I64, _I64, ctypes.c_int, ctypes.c_int,
              ctypes.POINTER(ctypes.c_size_t)]),
    "kdloss_cuda_fused_linear_distill_vp": (_ST, [_P, _P, ctypes.POINTER(FldParams),
                                                  ctypes.POINTER(VocabShard), _I64, _I64, _I64,
                                                  _I64, CMat, CMat, _P, CMat, CMat, _P, Labels,
                                                  ctypes.POINTER(FldOut), _P, ctypes.c_size_t]),
    "kdloss_cuda_fused_linear_topk_distill_vp_workspace_size": (
        _ST, [ctypes.POINTER(FltkParams), _I64, _I64, _I64, _I64, ctypes.c_int, ctypes.c_int,
              ctypes.POINTER(ctypes.c_size_t)]),
    "kdloss_cuda_fused_linear_topk_distill_vp": (_ST, [_P, _P, ctypes.POINTER(FltkParams),
                                                       ctypes.POINTER(VocabShard), _I64, _I64,
                                                       _I64, CMat, CMat, _P, TopkTeacher, Labels,
                                                       ctypes.POINTER(FldOut), _P,
                                                       ctypes.c_size_t]),
    "kdloss_cuda_available": (ctypes.c_int, []),
    "kdloss_cuda_context_create": (_ST, [ctypes.c_int, ctypes.POINTER(_P)]),
    "kdloss_cuda_context_destroy": (None, [_P]),
    "kdloss_cuda_kl_div_workspace_size": (_ST, [_I64, _I64, ctypes.POINTER(ctypes.c_size_t)]),
    "kdloss_cuda_kl_div": (_ST, [_P, _P, ctypes.POINTER(KlParams), _I64, _I64, CMat, CMat, _P, _P,
                                 Mat, Mat, _P, ctypes.c_size_t]),
    "kdloss_cuda_jsd_workspace_size": (_ST, [_I64, _I64, ctypes.POINTER(ctypes.c_size_t)]),
    "kdloss_cuda_jsd": (_ST, [_P, _P, ctypes.POINTER(JsdParams), _I64, _I64, CMat, CMat, Labels,
                              _P, _P, Mat, _P, ctypes.c_size_t]),
    "kdloss_cuda_fljsd_workspace_size": (_ST, [ctypes.POINTER(FldJsdParams), _I64, _I64, _I64, _I64,
                                               ctypes.c_int, ctypes.c_int,
                                               ctypes.POINTER(ctypes.c_size_t)]),
    "kdloss_cuda_fused_linear_jsd": (_ST, [_P, _P, ctypes.POINTER(FldJsdParams), _I64, _I64, _I64,
                                           _I64, CMat, CMat, _P, CMat, CMat, _P, Labels,
                                           ctypes.POINTER(FldJsdOut), _P, ctypes.c_size_t]),
}

_lock = threading.Lock()
_lib = None
_lib_path = None


def _candidates():
    env = os.environ.get("KDLOSS_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(here, "libkdloss.so"),
            os.path.join(here, os.pardir, os.pardir, "build", "libkdloss.so")]


def lib():
    """The loaded library (loaded on first use; with torch already imported, the CUDA backend
    is attached at the same time where torch sees a device)."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    _load_cpu()
    if "torch" in sys.modules or os.environ.get("KDLOSS_CUDA_LIB"):
        _attach_cuda()
    return _lib


def _load_cpu():
    global _lib, _lib_path
    with _lock:
        if _lib is None:
            tried = []
            for path in _candidates():
                path = os.path.normpath(path)
                if not os.path.exists(path):
                    tried.append(f"{path} (missing)")
                    continue
                handle = ctypes.CDLL(path)
                for name, (restype, argtypes) in _PROTOTYPES.items():
                    fn = getattr(handle, name, None)
                    if fn is not None:
                        fn.restype = restype
                        fn.argtypes = argtypes
                _lib_path = path
                _lib = handle
                break
            else:
                raise OSError("kdloss: cannot find libkdloss.so; tried " + ", ".join(tried) +
                              ". Install the package (pip install .) or set KDLOSS_LIBRARY.")


def library_path():
    lib()
    return _lib_path


def has(name):
    """True if the loaded library exports `name` (e.g. "kdloss_fused_linear_jsd")."""
    if name.startswith("kdloss_cuda_"):
        lib()
        _attach_cuda()
    return getattr(lib(), name, None) is not None


def fn(name):
    """The C function `name`, or KdlossError(ERR_UNSUPPORTED) if this build lacks it."""
    if name.startswith("kdloss_cuda_"):
        lib()
        _attach_cuda()
    f = getattr(lib(), name, None)
    if f is None:
        raise KdlossError(ERR_UNSUPPORTED, f"{name} is not exported by {library_path()}")
    return f


def status_string(status):
    try:
        return lib().kdloss_status_string(int(status)).decode()
    except OSError:
        return f"kdloss status {int(status)}"


def error_detail(cuda=False):
    """kdloss_error_detail() of this thread's last failing call ("" if the library has none);
    cuda: of libkdloss_cuda.so's calls (each library keeps its own)."""
    try:
        f = getattr(_cuda["handle"], "kdloss_error_detail", None) if cuda else None
        d = (f or fn("kdloss_error_detail"))()
    except KdlossError:
        return ""
    return d.decode(errors="replace") if d else ""


def check(status, where):
    """Raise KdlossError unless status is KDLOSS_OK; the message ends with the C check's detail
    (which argument, row and value), read right after the call on the same thread (from the
    CUDA library when `where` names a kdloss_cuda_* function)."""
    if status != OK:
        raise KdlossError(status, where, error_detail(str(where).startswith("kdloss_cuda_")))


def version():
    return lib().kdloss_version().decode()


def kl_params(reduction, log_target, eps, grad_scale=1.0):
    p = KlParams()
    fn("kdloss_kl_params_default")(ctypes.byref(p))
    p.reduction, p.log_target, p.eps, p.grad_scale = reduction, int(bool(log_target)), eps, grad_scale
    return p


def jsd_params(beta, ignore_index, grad_scale=1.0):
    p = JsdParams()
    fn("kdloss_jsd_params_default")(ctypes.byref(p))
    p.beta, p.ignore_index, p.grad_scale = beta, ignore_index, grad_scale
    return p


def fld_jsd_params(beta, temperature, weight_hard_loss, weight_soft_loss, ignore_index,
                   chunk_size=0, memory_budget=0, grad_scale=1.0):
    p = FldJsdParams()
    fn("kdloss_fljsd_params_default")(ctypes.byref(p))
    p.beta, p.temperature = beta, temperature
    p.weight_hard_loss, p.weight_soft_loss = weight_hard_loss, weight_soft_loss
    p.ignore_index, p.chunk_size = ignore_index, chunk_size
    p.memory_budget, p.grad_scale = memory_budget, grad_scale
    return p


def _registry(name_fn, first):
    """The names a C registry's name function gives for the codes first, first + 1, ... up to
    the first "unknown" (kdloss_divergence_name, kdloss_cpu_isa_name): what C defines is known
    here without an edit."""
    names, name_of = [], fn(name_fn)
    while (n := name_of(first + len(names)).decode()) != "unknown":
        names.append(n)
    return tuple(names)


@functools.lru_cache(maxsize=None)
def divergences():
    """The divergence names, in kdloss_divergence order: the C library's registry (_registry).
    Cached."""
    return _registry("kdloss_divergence_name", 0)


def __getattr__(name):  # DIVERGENCES, as before, read from the library on first use
    if name == "DIVERGENCES":
        return divergences()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _enum_from_name(from_name, what, value, choices):
    """The C enum value a kdloss_*_from_name function gives for the string `value`;
    KdlossError(INVALID_PARAM) with the C message for an unknown name or a non-string."""
    code = ctypes.c_int()
    st = ERR_INVALID_PARAM if not isinstance(value, str) else \
        fn(from_name)(value.encode(), ctypes.byref(code))
    check(st, f"{what}={value!r} (one of {', '.join(choices)})")
    return code.value


def div_params(divergence, beta, alpha):
    """kdloss_div_params for a divergence name; KdlossError(INVALID_PARAM) for an unknown name.
    beta and alpha are range-checked by the C call that receives them."""
    code = _enum_from_name("kdloss_divergence_from_name", "divergence", divergence, divergences())
    return DivParams(code, float(beta), float(alpha))


TAILS = ("bucket", "renorm_both", "renorm_teacher")


def topk_tail(tail):
    """kdloss_topk_tail for a tail-mode name; KdlossError(INVALID_PARAM) for an unknown name."""
    return _enum_from_name("kdloss_topk_tail_from_name", "tail", tail, TAILS)


def _filled(struct, default_fn, **fields):
    """A params struct from its kdloss_*_default function, then `fields` set on it."""
    p = struct()
    fn(default_fn)(ctypes.byref(p))
    for name, value in fields.items():
        setattr(p, name, value)
    return p


def topk_distill_params(div, tail, temperature, ignore_index, grad_scale=1.0):
    """kdloss_topk_distill_params (div: DivParams, tail: a topk_tail() value)."""
    return _filled(TopkDistillParams, "kdloss_topk_distill_params_default", div=div, tail=tail,
                   temperature=temperature, ignore_index=ignore_index, grad_scale=grad_scale)


def fltk_params(div, tail, temperature, weight_hard_loss, weight_soft_loss, ignore_index,
                chunk_size=0, t2_scale=False, memory_budget=0, grad_scale=1.0,
                student_map=(1.0, None)):
    """kdloss_fused_linear_topk_distill_params; student_map: (scale, softcap)."""
    return _filled(FltkParams, "kdloss_fused_linear_topk_distill_params_default", div=div,
                   tail=tail, temperature=temperature, weight_hard_loss=weight_hard_loss,
                   weight_soft_loss=weight_soft_loss, t2_scale=int(bool(t2_scale)),
                   ignore_index=ignore_index, chunk_size=chunk_size,
                   memory_budget=memory_budget, grad_scale=grad_scale,
                   student_map=logit_map(*student_map))


def distill_params(div, ignore_index, grad_scale=1.0):
    p = DistillParams()
    fn("kdloss_distill_params_default")(ctypes.byref(p))
    p.div, p.ignore_index, p.grad_scale = div, ignore_index, grad_scale
    return p


def distill_logits_params(div, temperature, ignore_index, grad_scale=1.0):
    p = DistillLogitsParams()
    fn("kdloss_distill_logits_params_default")(ctypes.byref(p))
    p.div, p.temperature = div, temperature
    p.ignore_index, p.grad_scale = ignore_index, grad_scale
    return p


def logit_map(scale=1.0, softcap=None):
    """kdloss_logit_map from a model's logit_scale and final_logit_softcapping (None: no cap)."""
    return LogitMap(1.0 if scale is None else float(scale),
                    0.0 if softcap is None else float(softcap))


def fld_params(div, temperature, weight_hard_loss, weight_soft_loss, ignore_index, chunk_size=0,
               t2_scale=False, memory_budget=0, grad_scale=1.0, maps=(1.0, None, 1.0, None)):
    """maps: (student scale, student softcap, teacher scale, teacher softcap)."""
    p = FldParams()
    fn("kdloss_fused_linear_distill_params_default")(ctypes.byref(p))
    p.div, p.temperature, p.t2_scale = div, temperature, int(bool(t2_scale))
    p.weight_hard_loss, p.weight_soft_loss = weight_hard_loss, weight_soft_loss
    p.ignore_index, p.chunk_size = ignore_index, chunk_size
    p.memory_budget, p.grad_scale = memory_budget, grad_scale
    p.student_map, p.teacher_map = logit_map(*maps[:2]), logit_map(*maps[2:])
    return p


# ---- the CUDA backend (libkdloss_cuda.so; see the top of this file) ------------------------------

_cuda_lock = threading.Lock()
_cuda = {"tried": False, "handle": None, "path": None, "build": None, "reason": "not tried yet"}
# Loaded in this order (libcublas needs libcublasLt); major = the CUDA major of the build.
_CUDA_SONAMES = ("libcudart.so.{major}", "libcublasLt.so.{major}", "libcublas.so.{major}")


def _cuda_candidates():
    env = os.environ.get("KDLOSS_CUDA_LIB")
    if env:
        return [env]
    dirs = [os.path.dirname(os.path.abspath(__file__))]
    if _lib_path and os.path.dirname(_lib_path) not in dirs:
        dirs.append(os.path.dirname(_lib_path))
    return [os.path.join(d, "libkdloss_cuda.so") for d in dirs]


def _torch_cuda():
    """(torch module or None, why not usable): torch with a visible CUDA device, else None."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed (the CUDA backend is used through torch)"
    if not torch.version.cuda:
        return None, f"torch {torch.__version__} is a build without CUDA"
    if not torch.cuda.is_available():
        return None, (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA "
                      "device (torch.cuda.is_available() is False)")
    return torch, ""


def _build_info(path):
    """kdloss_cuda_build.json beside the library: {"cuda_version", "archs", "simulator"}."""
    try:
        with open(os.path.join(os.path.dirname(path), "kdloss_cuda_build.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _mapped(soname):
    try:
        with open("/proc/self/maps") as f:
            return any(line.rstrip().endswith("/" + soname) for line in f)
    except OSError:
        return False


def _preload_cuda_libs(major):
    """Loads, globally, each CUDA library the backend needs that the process has not mapped yet
    (torch usually has): from the loader's path, else from torch's nvidia/*/lib wheels."""
    for pattern in _CUDA_SONAMES:
        soname = pattern.format(major=major)
        if _mapped(soname):
            continue
        places = [soname]
        for d in sys.path:
            places += sorted(glob.glob(os.path.join(d, "nvidia", "*", "lib", soname)))
        for place in places:
            try:
                ctypes.CDLL(place, mode=ctypes.RTLD_GLOBAL)
                break
            except OSError:
                continue


def _load_cuda():
    """Finds, checks and loads libkdloss_cuda.so; returns (handle or None, reason)."""
    override = os.environ.get("KDLOSS_CUDA_LIB")
    torch = None
    if not override:
        torch, why = _torch_cuda()
        if torch is None:
            return None, why
    paths = [os.path.normpath(p) for p in _cuda_candidates()]
    path = next((p for p in paths if os.path.exists(p)), None)
    if path is None:
        return None, ("no CUDA backend library: " + ", ".join(paths) + " missing (this kdloss "
                      "was built without nvcc)")
    build = _build_info(path)
    _cuda["path"], _cuda["build"] = path, build
    lib_cuda = build.get("cuda_version")
    if torch is None and "torch" in sys.modules:
        torch = sys.modules["torch"]
    torch_cuda = getattr(getattr(torch, "version", None), "cuda", None)
    if lib_cuda and torch_cuda and lib_cuda.split(".")[0] != torch_cuda.split(".")[0]:
        return None, (f"CUDA major version mismatch: {path} was built with CUDA {lib_cuda}, "
                      f"torch {torch.__version__} uses CUDA {torch_cuda}; refused (rebuild kdloss "
                      f"with a CUDA {torch_cuda.split('.')[0]} nvcc, or install the torch of "
                      f"CUDA {lib_cuda.split('.')[0]})")
    if lib_cuda:
        _preload_cuda_libs(lib_cuda.split(".")[0])
    try:
        handle = ctypes.CDLL(path)
    except OSError as e:
        return None, f"{path} did not load: {e}"
    if getattr(handle, "kdloss_cuda_available", None) is None:
        return None, f"{path} exports no kdloss_cuda_available"
    for name, (restype, argtypes) in _PROTOTYPES.items():
        f = getattr(handle, name, None)
        if f is not None:
            f.restype, f.argtypes = restype, argtypes
    return handle, ""


def _attach_cuda():
    """Loads the CUDA backend once (where allowed) and puts its kdloss_cuda_* functions on lib()."""
    if _cuda["tried"]:
        return
    with _cuda_lock:
        if _cuda["tried"]:
            return
        handle, reason = _load_cuda()
        if handle is not None:
            for name in _PROTOTYPES:
                f = getattr(handle, name, None) if name.startswith("kdloss_cuda_") else None
                if f is not None:
                    setattr(_lib, name, f)
            _cuda["handle"] = handle
        _cuda["reason"] = reason
        _cuda["tried"] = True


def cuda_info():
    """Whether the CUDA backend is in use, as a dict: available (bool), reason (str: why not, or
    which library and device), library (path or None), cuda_version (of the build), archs,
    simulator (bool), torch_cuda (torch.version.cuda or None). Loads it where allowed."""
    lib()
    _attach_cuda()
    build = _cuda["build"] or {}
    torch = sys.modules.get("torch")
    info = {"available": False, "reason": _cuda["reason"], "library": _cuda["path"],
            "cuda_version": build.get("cuda_version"), "archs": build.get("archs"),
            "simulator": bool(build.get("simulator")),
            "torch_cuda": getattr(getattr(torch, "version", None), "cuda", None)}
    if _cuda["handle"] is None:
        return info
    if not _cuda["handle"].kdloss_cuda_available():
        info["reason"] = f"{_cuda['path']} loaded, but it sees no CUDA device"
        return info
    device = "the CUDA simulator (cudasim)" if info["simulator"] else "device 0"
    if torch is not None and not info["simulator"] and torch.cuda.is_available():
        device = f"cuda:0 ({torch.cuda.get_device_name(0)})"
    info["available"] = True
    info["reason"] = (f"{_cuda['path']} (CUDA {info['cuda_version'] or '-'}, archs "
                      f"{info['archs'] or '-'}) on {device}")
    return info


# ---- CPU path selection (kdloss_cpu_*) -------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def cpu_isas():
    """The CPU code paths' names, in kdloss_cpu_isa order from KDLOSS_ISA_SCALAR: the C library's
    ISA registry (_registry), so a path added there is known here without an edit. Cached."""
    return _registry("kdloss_cpu_isa_name", ISA_SCALAR)


def _isa_code(name):
    """The kdloss_cpu_isa value of a path name ("auto" or one of cpu_isas())."""
    if name == "auto":
        return ISA_AUTO
    if name not in cpu_isas():
        raise KdlossError(ERR_INVALID_PARAM, f"unknown ISA {name!r} (auto or one of "
                          f"{', '.join(cpu_isas())})")
    return ISA_SCALAR + cpu_isas().index(name)


def cpu_isa():
    """Name of the CPU code path the next call uses (one of cpu_isas())."""
    return lib().kdloss_cpu_isa_name(lib().kdloss_cpu_get_isa()).decode()


def set_cpu_isa(name):
    """Force a CPU code path for the whole process ("auto" or one of cpu_isas())."""
    code = _isa_code(name)
    check(lib().kdloss_cpu_set_isa(code), f"kdloss_cpu_set_isa({name!r})")


def cpu_isa_supported(name):
    return bool(lib().kdloss_cpu_isa_supported(_isa_code(name)))


# ---- bf16 GEMMs (kdloss_gemm_set_bf16, kdloss_gemm_set_bf16_grad, kdloss_gemm_bf16_query) --------

_BF16_GEMM_MODES = ("auto", "widen", "native")
_BF16_GRAD_MODES = ("auto", "exact")


def set_bf16_gemm(mode):
    """How bf16 x bf16 products run, for the whole process: "auto" (the default: native bf16 where
    this process measured it at least 1.15x faster than widen + fp32 sgemm, else widened),
    "widen" or "native" (KdlossError ERR_UNSUPPORTED where oneDNN has no bf16 matmul)."""
    if mode not in _BF16_GEMM_MODES:
        raise KdlossError(ERR_INVALID_PARAM, f"unknown bf16 GEMM mode {mode!r}")
    check(fn("kdloss_gemm_set_bf16")(_BF16_GEMM_MODES.index(mode)),
          f"kdloss_gemm_set_bf16({mode!r})")


def set_bf16_grad(mode):
    """The fused-linear losses' backward GEMMs with a bf16 student where the logits run natively:
    "auto" (the default: dZ rounded to bf16, relative error <= 2^-8 an element, and native GEMMs,
    as torch's bf16 autograd does) or "exact" (fp32 dZ, fp32 GEMMs on widened operands). Where
    the logits are widened both give the same bits. Process-wide; CPU only."""
    if mode not in _BF16_GRAD_MODES:
        raise KdlossError(ERR_INVALID_PARAM, f"unknown bf16 gradient mode {mode!r}")
    check(fn("kdloss_gemm_set_bf16_grad")(_BF16_GRAD_MODES.index(mode)),
          f"kdloss_gemm_set_bf16_grad({mode!r})")


def bf16_gemm_info():
    """The bf16 GEMM choice as a dict: mode, grad, native, grad_native, auto_native, available,
    native_gflops, widen_gflops (one thread, measured once per process), margin, kernel."""
    info = Bf16GemmInfo()
    check(fn("kdloss_gemm_bf16_query")(ctypes.byref(info)), "kdloss_gemm_bf16_query")
    return {"mode": _BF16_GEMM_MODES[info.mode], "grad": _BF16_GRAD_MODES[info.grad],
            "native": bool(info.native), "grad_native": bool(info.grad_native),
            "auto_native": bool(info.auto_native), "available": bool(info.available),
            "reference": bool(info.reference), "measurements": info.measurements,
            "native_gflops": info.native_gflops, "widen_gflops": info.widen_gflops,
            "margin": info.margin, "shape": (info.m, info.n, info.k),
            "kernel": info.kernel.decode()}
