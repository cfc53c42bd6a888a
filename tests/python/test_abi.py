"""The ctypes mirrors of kdloss.h's structs (python/kdloss/_lib.py) against the layout the loaded
library was compiled with (kdloss_abi_layout): same size, same fields in the same order at the
same offsets with the same sizes. A field added to, moved in or retyped in kdloss.h without the
same change in _lib.py fails here instead of corrupting a call."""
import ctypes

import pytest

from kdloss import _lib

# public structs Python does not mirror (it never passes them)
NOT_MIRRORED = {"kdloss_gemm_info"}


@pytest.mark.parametrize("cls", list(_lib.C_STRUCTS), ids=lambda c: c.__name__)
def test_ctypes_layout_matches_the_library(cls):
    c_name = _lib.C_STRUCTS[cls]
    layout = _lib.abi_layout(c_name)
    assert layout, f"the library does not know {c_name}"
    (_, _, size), fields = layout[0], layout[1:]
    assert ctypes.sizeof(cls) == size, f"{cls.__name__}: ctypes {ctypes.sizeof(cls)} bytes, C {size}"
    py = [(n, getattr(cls, n).offset, getattr(cls, n).size) for n, *_ in cls._fields_]
    assert py == fields, f"{cls.__name__} vs {c_name}:\n ctypes {py}\n C      {fields}"


def test_every_public_struct_is_mirrored_or_listed():
    mirrored = set(_lib.C_STRUCTS.values())
    # the C table's struct names: every kdloss.h struct the library describes
    known = [n for n in ("kdloss_cmat", "kdloss_mat", "kdloss_labels", "kdloss_gemm_info",
                         "kdloss_bf16_gemm_info", "kdloss_kl_params", "kdloss_div_params",
                         "kdloss_distill_params", "kdloss_distill_logits_params",
                         "kdloss_jsd_params", "kdloss_fljsd_params", "kdloss_fljsd_out",
                         "kdloss_fused_linear_distill_params", "kdloss_fused_linear_distill_out",
                         "kdloss_topk_teacher", "kdloss_topk_distill_params",
                         "kdloss_fused_linear_topk_distill_params", "kdloss_comm",
                         "kdloss_vocab_shard", "kdloss_logit_map", "kdloss_teacher_heads")
             if _lib.abi_layout(n)]
    assert len(known) == 21
    assert set(known) == mirrored | NOT_MIRRORED
    assert _lib.abi_layout("kdloss_nonexistent") == []
