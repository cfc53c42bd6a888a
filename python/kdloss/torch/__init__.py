"""PyTorch autograd modules for kdloss (drop-in for Liger-Kernel's distillation losses).

    from kdloss.torch import KLDivLoss, JSD, FusedLinearJSD, FusedLinearJSDLoss
    from kdloss.torch import functional  # kl_div, jsd, fused_linear_jsd, fused_linear_jsd_loss
    from kdloss.torch import TopKDistillLoss, FusedLinearTopKDistillLoss  # sparse top-k teacher
    from kdloss.torch import JSDFunction, KLDivFunction, FusedLinearJSDFunction  # Liger's apply
    from kdloss.torch import liger  # Liger's own names: liger.LigerJSD, liger.liger_kl_div, ...

Every loss is returned in float32; dtypes, batchmean and the rest: functional's docstring.
"""

from . import adapters, functional, liger
from ._backend import register_backend, release_output_buffers, set_cuda_status_check
from .functional import (FusedLinearJSDFunction, FusedLinearJSDLossFunction, JSDFunction,
                         KLDivFunction, distill_loss, fused_linear_distill_loss, fused_linear_jsd,
                         fused_linear_jsd_loss, fused_linear_topk_distill_loss, jsd, kl_div,
                         topk_distill_loss)
from .modules import (JSD, DistillLoss, FusedLinearDistillLoss, FusedLinearJSD,
                      FusedLinearJSDLoss, FusedLinearTopKDistillLoss, KLDivLoss, TopKDistillLoss)

__all__ = ["KLDivLoss", "JSD", "FusedLinearJSD", "FusedLinearJSDLoss", "functional", "kl_div",
           "adapters", "set_cuda_status_check", "release_output_buffers",
           "jsd", "fused_linear_jsd", "fused_linear_jsd_loss", "register_backend", "DistillLoss",
           "FusedLinearDistillLoss", "distill_loss", "fused_linear_distill_loss",
           "TopKDistillLoss", "FusedLinearTopKDistillLoss", "topk_distill_loss",
           "fused_linear_topk_distill_loss", "KLDivFunction", "JSDFunction",
           "FusedLinearJSDFunction", "FusedLinearJSDLossFunction", "liger"]
