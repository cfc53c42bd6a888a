"""The package itself: loading, status messages, error type, device dispatch."""

import pytest
import torch

import kdloss
from kdloss import _lib
from kdloss.torch import _backend

from conftest import require


def test_version_and_library():
    assert kdloss.version() == kdloss.__version__ == "0.1.0"
    assert kdloss.library_path().endswith("libkdloss.so")
    assert kdloss.cpu_isa() in ("scalar", "avx2", "avx512")


def test_error_carries_the_c_message():
    e = kdloss.KdlossError(_lib.ERR_LABEL_OUT_OF_RANGE, "kdloss_jsd")
    assert str(e) == "kdloss_jsd: " + kdloss.status_string(_lib.ERR_LABEL_OUT_OF_RANGE)
    assert e.status == -8 and e.status_name == "KDLOSS_ERR_LABEL_OUT_OF_RANGE"
    assert isinstance(e, ValueError) and isinstance(e, RuntimeError)
    for code in _lib.STATUS_NAMES:  # every code has a message from the library
        assert kdloss.status_string(code) not in ("", "unknown status code")


def test_cpu_isa_switch_round_trip():
    before = kdloss.cpu_isa()
    kdloss.set_cpu_isa("scalar")
    assert kdloss.cpu_isa() == "scalar"
    kdloss.set_cpu_isa("auto")
    assert kdloss.cpu_isa() == before
    with pytest.raises(kdloss.KdlossError):
        kdloss.set_cpu_isa("sse9")


def test_cuda_tensors_raise_a_clear_error_without_a_cuda_build():
    if _lib.lib().kdloss_cuda_available():
        pytest.skip("this libkdloss.so has a CUDA backend")
    with pytest.raises(kdloss.KdlossError, match="no CUDA backend") as e:
        _backend.backend_for(torch.device("cuda", 0))
    assert e.value.status_name == "KDLOSS_ERR_UNSUPPORTED"


@require("kdloss_kl_div")
def test_register_backend_hook():
    calls = []

    class Fake:
        def kl_div(self, device, *args):
            calls.append(device)
            raise kdloss.KdlossError(_lib.ERR_UNSUPPORTED, "fake backend")

    _backend.register_backend("meta", Fake())
    try:
        with pytest.raises(kdloss.KdlossError, match="fake backend"):
            kdloss.torch.kl_div(torch.empty(2, 3, device="meta"), torch.empty(2, 3, device="meta"))
    finally:
        _backend._BACKENDS.pop("meta")
    assert calls == [torch.device("meta")]
