"""kdloss: fused knowledge-distillation loss kernels (C library, loaded with ctypes).

`import kdloss` needs only the standard library; the PyTorch modules live in `kdloss.torch`.
kdloss.cuda_info() says whether the CUDA backend (libkdloss_cuda.so) is in use, and why not.
"""

from ._lib import (KdlossError, bf16_gemm_info, cpu_isa, cpu_isa_supported, cpu_isas, cuda_info,
                   library_path, set_bf16_gemm, set_bf16_grad, set_cpu_isa, status_string, version)

__version__ = "0.1.0"

__all__ = ["KdlossError", "version", "library_path", "status_string", "cpu_isa", "cpu_isas",
           "set_cpu_isa", "cpu_isa_supported", "set_bf16_gemm", "set_bf16_grad", "bf16_gemm_info", "cuda_info",
           "__version__"]
