"""Liger-Kernel's names for kdloss's drop-ins, so a swap is an import line:

    from kdloss.torch.liger import LigerJSD, LigerKLDIVLoss, LigerFusedLinearJSD  # transformers
    from kdloss.torch.liger import liger_jsd, liger_kl_div, liger_fused_linear_jsd
    from kdloss.torch.liger import LigerJSDFunction, LigerKLDivLossFunction
    from kdloss.torch.liger import chunked_loss  # chunked_loss.LigerFusedLinearJSDLoss, ...

Signatures (keyword names, positional orders, defaults, autograd Functions' `apply`) are Liger's;
the semantics are kdloss's (functional.py's module docstring): every loss is float32, kl_div's
batchmean divides by input.size(0) as torch's, accum_dtype is accepted and not needed, the fused
losses' default chunk is the library's budgeted one, and kernel-choice arguments (jsd_impl,
jsd_mode, compiled) are ignored. One exception, so that code (and Liger's own tests) comparing
dtypes keeps working: LigerJSD, liger_jsd and LigerJSDFunction return the loss in the input's
dtype, as Liger's JSD does (computed in fp32 and double, then cast: a bf16 loss keeps 3
significant digits there); kdloss.torch's own JSD / jsd return float32. Liger has two functions named liger_fused_linear_jsd and two
Functions named LigerFusedLinearJSDFunction: the liger_kernel.transformers / liger_kernel.ops
ones are here, the liger_kernel.chunked_loss ones in `chunked_loss`.
"""

import types

from .functional import (FusedLinearJSDFunction, FusedLinearJSDLossFunction, JSDFunction,
                         KLDivFunction, fused_linear_jsd, fused_linear_jsd_loss, jsd, kl_div)
from .modules import JSD, FusedLinearJSD, FusedLinearJSDLoss, KLDivLoss



class LigerJSD(JSD):
    """JSD with Liger's return dtype (the input's)."""

    def forward(self, log_q, log_p, shift_labels=None):
        return super().forward(log_q, log_p, shift_labels).to(log_q.dtype)


class LigerJSDFunction:
    """JSDFunction.apply with Liger's return dtype (the input's); the cast is differentiable."""

    @staticmethod
    def apply(input, target, shift_labels=None, beta=0.5, ignore_index=-100, *args):
        out = JSDFunction.apply(input, target, shift_labels, beta, ignore_index, *args)
        return out.to(input.dtype)


def liger_jsd(*args, **kwargs):
    """jsd with Liger's return dtype (the input's)."""
    x = args[0] if args else kwargs.get("input", kwargs.get("log_q"))
    out = jsd(*args, **kwargs)
    return out.to(x.dtype) if x is not None and x.is_floating_point() else out


LigerKLDIVLoss = KLDivLoss
LigerFusedLinearJSD = FusedLinearJSD
LigerKLDivLossFunction = KLDivFunction
LigerFusedLinearJSDFunction = FusedLinearJSDFunction
liger_kl_div = kl_div
liger_fused_linear_jsd = fused_linear_jsd

# liger_kernel.chunked_loss (and its .functional / .jsd_loss) names
chunked_loss = types.SimpleNamespace(
    LigerFusedLinearJSDLoss=FusedLinearJSDLoss,
    LigerFusedLinearJSDFunction=FusedLinearJSDLossFunction,
    liger_fused_linear_jsd=fused_linear_jsd_loss)
LigerFusedLinearJSDLoss = FusedLinearJSDLoss

__all__ = ["LigerKLDIVLoss", "LigerJSD", "LigerFusedLinearJSD", "LigerFusedLinearJSDLoss",
           "LigerKLDivLossFunction", "LigerJSDFunction", "LigerFusedLinearJSDFunction",
           "liger_kl_div", "liger_jsd", "liger_fused_linear_jsd", "chunked_loss"]
