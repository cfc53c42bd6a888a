"""Argument checks and operand preparation of the functional forms (functional.py): the
values the C calls cannot check themselves or that Python must settle first (ignore_index's
range, temperature 0, num_items_in_batch, names), DTensor gathering, torch.autocast's operand
dtypes, the num_items_in_batch divisor and the entropy output. One floor below functional
(tests/python/test_structure.py): it imports _ops, _calls, _backend and _lib only."""

import torch

from .. import _lib
from .._lib import KdlossError
from . import _backend, _ops
from ._backend import as_rows, is_dtensor, label_matches


def free_bytes(device):
    """Free memory of `device` in bytes (None when unknown): MemAvailable for the CPU,
    cudaMemGetInfo for CUDA."""
    try:
        if device.type == "cuda":
            return torch.cuda.mem_get_info(device)[0]
        if device.type == "cpu":
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
    except (OSError, RuntimeError, ValueError):
        pass
    return None


def gathered(t, what):
    """`t`, or for a DTensor its full tensor (full_tensor(): differentiable) when that takes at
    most half the free memory of its device; KdlossError(UNSUPPORTED) naming DTensor and
    process_group= otherwise."""
    if t is None or not is_dtensor(t):
        return t
    nbytes = t.numel() * t.element_size()
    local = t.to_local()
    free = free_bytes(local.device)
    if free is not None and nbytes > free // 2:
        raise KdlossError(
            _lib.ERR_UNSUPPORTED,
            f"{what} is a DTensor {tuple(t.shape)} {t.dtype} with placements "
            f"{tuple(t.placements)} on {t.device_mesh}: gathering it with full_tensor() takes "
            f"{nbytes / 2**20:.0f} MiB, more than half of the {free / 2**20:.0f} MiB free on "
            f"{local.device}. For an LM head sharded by vocabulary rows (Shard(0)) pass each "
            f"rank's block ({what}.to_local()) with process_group=<the mesh's group> and the "
            "hidden states replicated over it; with FSDP2, call the loss inside the wrapped "
            "module's forward, where the weight is already unsharded")
    # The gradient back to the shards is the AVERAGE over the mesh of the ranks' gradients:
    # under FSDP2 / HSDP each rank's loss is its own batch's, and FSDP2 averages (its default
    # gradient divide factor; a custom factor set with set_gradient_divide_factor is not seen
    # here); under tensor parallelism every rank's gradient is the same, so the average changes
    # nothing. full_tensor()'s default (Replicate) would keep each rank's own, never reduced:
    # FSDP2 did not unshard this weight, so it reduces nothing either (tests/python/test_fsdp2.py).
    try:
        from torch.distributed.tensor import Partial
    except ImportError:  # torch 2.4
        from torch.distributed._tensor import Partial
    return t.full_tensor(grad_placements=[Partial("avg")] * t.device_mesh.ndim)


def refuse_dtensors(*named):
    """KdlossError naming the DTensor among (name, tensor) pairs (as_rows's message), before an
    op would see it: the autograd Functions do not gather (the functional forms do)."""
    for name, t in named:
        if t is not None and is_dtensor(t):
            as_rows(t, name)


def index(ignore_index):
    """ignore_index as the int64 the C API takes; KdlossError (not torch's schema error) for a
    value outside int64."""
    i = int(ignore_index)
    if not -2**63 <= i < 2**63:
        raise KdlossError(_lib.ERR_INVALID_PARAM, f"ignore_index={ignore_index!r}: outside "
                          "int64 (labels are int32 or int64 token ids)")
    return i


def check_temperature(temperature):
    """temperature 0 refused here, before any tensor work (other bad values by the C call)."""
    if temperature == 0:
        raise KdlossError(_lib.ERR_INVALID_PARAM, "temperature=0")


def needs_grad(*tensors):
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def detached(t):
    """A tensor that receives no gradient (teachers, targets) as the ops get it: detached, so
    that one requiring grad neither records a graph nor gets a gradient (None stays None)."""
    return None if t is None else t.detach()


NO_TAIL = object()


def check_names(divergence, beta, alpha, tail=NO_TAIL):
    """An unknown divergence (or tail) name raises KdlossError here, through the C lookup, as
    before the ops were there. Skipped while torch.compile / torch.export trace (no ctypes call
    in a graph): the op's implementation makes the same lookup and raises at run time."""
    if torch.compiler.is_compiling():
        return
    _lib.div_params(divergence, beta, alpha)
    if tail is not NO_TAIL:
        _lib.topk_tail(tail)


def check_items(num_items_in_batch):
    """KdlossError unless num_items_in_batch is None or a number > 0: a Python int or float, or
    a one-element real tensor holding one. A tensor's value is read once (_backend.host_read:
    free in host memory, one stream synchronization for a device tensor, which only this check
    costs; traced tensors are not read)."""
    n = num_items_in_batch
    if n is None:
        return
    if isinstance(n, torch.Tensor):
        value = f"a {n.dtype} tensor of shape {tuple(n.shape)}"
        ok = n.numel() == 1 and not (n.is_complex() or n.dtype == torch.bool)
        if ok and not _ops.traced(n):
            read = _backend.host_read(n.detach())
            ok, value = read > 0, f"tensor({read!r})"
    else:
        ok = not isinstance(n, bool) and isinstance(n, (int, float)) and n > 0
        value = repr(n)
    if not ok:
        raise KdlossError(_lib.ERR_INVALID_PARAM, f"num_items_in_batch={value}: a number > 0 "
                          "(or a one-element tensor holding one), the non-ignored tokens of "
                          "every accumulation micro-batch together")


def over_items(loss, num_items_in_batch, times=1.0):
    """loss / (num_items_in_batch * times), computed in double and returned in float32;
    differentiable (backward scales the saved gradient once)."""
    n = num_items_in_batch
    if isinstance(n, torch.Tensor):
        d = n.detach().reshape(()).to(device=loss.device, dtype=torch.float64) * times
    else:
        d = float(n) * times
    return (loss.double() / d).float()


def kept_rows(labels, ignore_index, rows, weights=None):
    """max(1, rows whose label != ignore_index and whose weight is > 0) (all rows without labels
    and weights): the divisor the fused losses' per-call mean used; a tensor (no sync) when
    labels or weights are given."""
    if labels is None and weights is None:
        return float(max(1, rows))
    kept = torch.ones(rows, dtype=torch.bool, device=(labels if labels is not None
                                                      else weights).device)
    if labels is not None:
        kept = kept & ~label_matches(labels.detach(), ignore_index).reshape(-1)
    if weights is not None:
        kept = kept & (weights.detach().reshape(-1) > 0)
    return kept.sum().clamp(min=1).double()


def fused_over_items(results, labels, ignore_index, xs, num_items_in_batch, weights=None):
    """The fused losses' (loss, soft, hard), each a per-call mean over the kept rows, turned
    into sums / num_items_in_batch (gradient accumulation, TRL #6006)."""
    if num_items_in_batch is None:
        return results
    kept = kept_rows(labels, ignore_index, xs.numel() // max(1, xs.shape[-1]), weights)
    return tuple(over_items(r.double() * kept, num_items_in_batch) for r in results)


def with_entropy(result, entropy, lead, return_entropy):
    """What a loss returns: `result`, or with return_entropy (result, entropy) flattened, the
    entropy ([rows] from the op) viewed as the student's leading dims `lead` and detached."""
    if not return_entropy:
        return result
    entropy = entropy.detach().view(lead)
    return (*result, entropy) if isinstance(result, tuple) else (result, entropy)


def autocast_dtype(t):
    """The dtype torch.autocast computes matmuls in on `t`'s device, None when autocast is off
    there (or `t` is None)."""
    if not isinstance(t, torch.Tensor):
        return None
    try:
        if not torch.is_autocast_enabled(t.device.type):
            return None
        return torch.get_autocast_dtype(t.device.type)
    except RuntimeError:  # a device type autocast does not know (meta, a registered one)
        return None


def as_autocast(t, dtype):
    """`t` as an autocast matmul sees it (module docstring): in `dtype` (bfloat16), or float16
    rounded and widened to float32 (no float16 GEMM); differentiable (the gradient returns to
    `t` in its dtype). None and dtype None leave it as it is."""
    if t is None or dtype is None or t.dtype == dtype:
        return t
    if dtype == torch.float16:
        return t.to(torch.float16).to(torch.float32)
    return t.to(dtype)


def autocast_heads(named):
    """(name, tensor) pairs with the hidden states and LM heads (not biases nor teacher data
    that are not matmul operands) cast as autocast would (as_autocast)."""
    dtype = autocast_dtype(named[0][1])
    if dtype is None:
        return named
    heads = ("student_input", "student_weight", "teacher_input", "teacher_weight")
    return [(n, each(lambda x: as_autocast(x, dtype), t) if n in heads else t)
            for n, t in named]


def each(fn, t):
    """fn(t), or [fn(x) for each x] when t is a list (several teachers' heads or biases)."""
    return [fn(x) for x in t] if isinstance(t, list) else fn(t)
