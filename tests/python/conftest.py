"""Shared helpers for the kdloss binding tests. Tolerances are stated where they are used, with
where they come from: the library computes in fp32 (double accumulation for the losses) and
writes gradients in the input's dtype, so the error budget is fp32 rounding for fp32 tensors and
one rounding to 8 (bf16) or 11 (fp16) significant bits for half tensors."""

import contextlib
import os

import pytest
import torch

import kdloss
from kdloss import _lib
from kdloss.torch import _backend

torch.set_num_threads(1)  # 2 shared cores: keep the reference math from fighting the library

# Relative error of one rounding to the dtype (half an ulp), used to size tolerances.
UNIT = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def assert_close(actual, expected, rtol, atol_rel=None, what=""):
    """|a - e| <= rtol * |e| + atol_rel * max|e| elementwise (atol_rel defaults to rtol), in
    float64. Scaling the absolute part by the largest reference value keeps near-zero entries
    (gradients that cancel) from demanding more than the dtype can give."""
    a = torch.as_tensor(actual).detach().double()
    e = torch.as_tensor(expected).detach().double()
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} vs {tuple(e.shape)}"
    atol = (rtol if atol_rel is None else atol_rel) * float(e.abs().max()) if e.numel() else 0.0
    err = (a - e).abs()
    bound = rtol * e.abs() + atol
    bad = ~(err <= bound)
    if bool(bad.any()):
        i = int(torch.argmax((err - bound).reshape(-1)))
        raise AssertionError(
            f"{what}: {int(bad.sum())}/{a.numel()} elements off; worst at flat index {i}: "
            f"got {a.reshape(-1)[i].item():.9g}, want {e.reshape(-1)[i].item():.9g} "
            f"(rtol {rtol:g}, atol {atol:g})")


def require(symbol):
    """Skip when the loaded libkdloss.so does not export `symbol` yet (a kernel not merged)."""
    return pytest.mark.skipif(not _lib.has(symbol),
                              reason=f"{_lib.library_path()} has no {symbol} yet")


class SpyBackend:
    """Wraps the CPU backend and records each call's arguments (to check pointers, strides and
    that forward-only calls pass NULL gradient outputs)."""

    def __init__(self):
        self.inner = _backend.CpuBackend()
        self.calls = []

    def __getattr__(self, name):
        real = getattr(self.inner, name)

        def spy(*args):
            self.calls.append((name, args))
            return real(*args)
        return spy


def covers_registry(names):
    """The divergences of the C library's registry (`kdloss divergences`, _lib.divergences())
    missing from `names`: a test file's hand-made case list must name every one, so a divergence
    added in C fails the Python tests until its cases (and reference.py's formula) exist."""
    return sorted(set(_lib.divergences()) - set(names))


def spread(shape, g, scale=1.0, dtype=torch.float32):
    """Non-uniform values from generator g: normal draws times a per-row spread in [0.25, 2.25),
    times scale, in dtype."""
    x = torch.randn(shape, generator=g)
    rows = torch.rand(shape[:-1] + (1,), generator=g) * 2 + 0.25
    return (x * rows * scale).to(dtype)


@contextlib.contextmanager
def cpu_backend(backend):
    """CPU tensors routed to `backend` (_backend.register_backend) inside the block, the built-in
    CPU backend again after it."""
    _backend.register_backend("cpu", backend)
    try:
        yield backend
    finally:
        _backend._BACKENDS.pop("cpu", None)


@pytest.fixture
def spy():
    with cpu_backend(SpyBackend()) as s:
        yield s


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


def pytest_report_header(config):
    return (f"kdloss {kdloss.version()} from {kdloss.library_path()}, CPU path {kdloss.cpu_isa()}, "
            f"torch {torch.__version__}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")


def _entropy_written(path):
    """Whether the loaded library writes the student's entropy on `path` (the per-row weights
    and entropy members of the C API, merged per backend path): a call on zero logits must give
    log V exactly as the definition does (an unwritten output holds whatever the allocator left)."""
    import math
    from kdloss.torch import functional as F
    z, x, head = torch.zeros(2, 8), torch.zeros(2, 4), torch.zeros(8, 4)  # logits 0: H = log 8
    ids, lps = torch.tensor([[0, 1], [2, 3]]), torch.full((2, 2), -math.log(8.0))
    w = torch.tensor([1.0, 0.0])
    calls = {
        "logits": lambda: F.distill_loss(z, z, token_weights=w, return_entropy=True),
        "topk_logits": lambda: F.topk_distill_loss(z, ids, lps, token_weights=w,
                                                   return_entropy=True),
        "fused": lambda: F.fused_linear_distill_loss(
            x, head, x, head, None, weight_hard_loss=0.0, token_weights=w, return_entropy=True),
        "fused_topk": lambda: F.fused_linear_topk_distill_loss(
            x, head, ids, lps, token_weights=w, return_entropy=True),
    }
    try:
        entropy = calls[path]()[-1]
    except kdloss.KdlossError:
        return False
    return abs(float(entropy[0]) - math.log(8.0)) < 1e-6 and float(entropy[1]) == 0.0


def require_row_extras(path):
    """Skip until the loaded library honours row_weights / row_entropy on `path` (one of
    _entropy_written's): the Python surface is tested against the documented C semantics, and
    each backend path's C side lands on its own."""
    return pytest.mark.skipif(not _entropy_written(path), reason=f"{_lib.library_path()} does "
                              f"not write row_entropy on the {path} path yet")
