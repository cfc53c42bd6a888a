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
    assert kdloss.cpu_isa() in kdloss.cpu_isas()
    assert kdloss.cpu_isas()[:3] == ("scalar", "avx2", "avx512")  # the registry's first rows


def test_every_isa_path_can_be_forced():
    """Each path of the C registry (cpu_isas) can be set where the CPU has it and names itself;
    an unknown name is refused with KdlossError."""
    before = kdloss.cpu_isa()
    try:
        for name in kdloss.cpu_isas():
            if kdloss.cpu_isa_supported(name):
                kdloss.set_cpu_isa(name)
                assert kdloss.cpu_isa() == name
    finally:
        kdloss.set_cpu_isa("auto")
    assert kdloss.cpu_isa() == before
    with pytest.raises(kdloss.KdlossError, match="unknown ISA"):
        kdloss.set_cpu_isa("avx9000")


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


def test_bf16_gemm_modes_round_trip():
    """The bf16 GEMM choice: measured once and cached, forced modes on top of it, the
    exact backward as an option; bf16 fused-linear gradients agree across the modes."""
    info = kdloss.bf16_gemm_info()
    assert info["mode"] == "auto" and info["grad"] == "auto" and info["measurements"] == 1
    assert info["widen_gflops"] > 0 and info["native"] == info["auto_native"]
    assert kdloss.bf16_gemm_info() == info  # cached: the same rates
    kdloss.set_bf16_gemm("widen")
    kdloss.set_bf16_grad("exact")
    try:
        now = kdloss.bf16_gemm_info()
        assert now["mode"] == "widen" and now["grad"] == "exact"
        assert not now["native"] and not now["grad_native"]
        assert now["widen_gflops"] == info["widen_gflops"]
        with pytest.raises(kdloss.KdlossError):
            kdloss.set_bf16_gemm("fast")
        with pytest.raises(kdloss.KdlossError):
            kdloss.set_bf16_grad("rounded")
        if not info["available"]:
            with pytest.raises(kdloss.KdlossError) as e:
                kdloss.set_bf16_gemm("native")
            assert e.value.status == _lib.ERR_UNSUPPORTED
    finally:
        kdloss.set_bf16_gemm("auto")
        kdloss.set_bf16_grad("auto")
    assert kdloss.bf16_gemm_info() == info


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


def _fake_cuda_layer(monkeypatch, calls, seen=None):
    """A fake C layer (every call checked against the prototype declared for it: argument count
    and ctypes conversion; its name appended to `calls`, and for a _vp entry its args to `seen`)
    and a CudaBackend whose stream is NULL and whose workspaces are host tensors."""
    import ctypes

    def fake_fn(name):
        restype, argtypes = _lib._PROTOTYPES[name]

        def call(*args):
            assert len(args) == len(argtypes), (name, len(args), len(argtypes))
            for a, t in zip(args, argtypes):
                t.from_param(a)  # raises TypeError on a mismatch
            calls.append(name)
            if name == "kdloss_cuda_context_create":
                args[1]._obj.value = 0x1234
            elif name.endswith("_workspace_size"):
                args[-1]._obj.value = 4096
            elif seen is not None and name.endswith("_vp"):
                seen.append(args)
            return 0
        call.argtypes = argtypes
        return call

    monkeypatch.setattr(_lib, "fn", fake_fn)
    be = _backend.CudaBackend()
    monkeypatch.setattr(be, "_stream", staticmethod(lambda index: ctypes.c_void_p(None)))
    # host workspaces whose status word (first 4 bytes) the fake C calls leave at OK, as the real
    # ones write it; status_word[0], when set, is written there instead
    def workspace(n, device):
        ws = torch.zeros(n, dtype=torch.uint8)
        if _FAKE_STATUS[0]:
            ws[:4].view(torch.int32)[0] = _FAKE_STATUS[0]
        return ws, n
    monkeypatch.setattr(be, "_workspace", staticmethod(workspace))
    return be


_FAKE_STATUS = [0]


def test_cuda_backend_argument_plumbing(monkeypatch):
    """Without a GPU: drive CudaBackend with a fake C layer that checks every call against the
    prototype declared for it (argument count and ctypes conversion), so the CUDA path's calls
    are at least well-formed until a CUDA machine runs tests/python for real."""
    calls = []
    be = _fake_cuda_layer(monkeypatch, calls)
    dev = torch.device("cuda", 0)
    x = torch.zeros(4, 6)
    m = _lib.CMat(x.data_ptr(), _lib.F32, 6)
    out = _lib.Mat(x.data_ptr(), _lib.F32, 6)
    loss = torch.zeros(1)
    be.kl_div(dev, _lib.KlParams(), 4, 6, m, m, loss.data_ptr(), None, _lib.Mat(None, 0, 0), out)
    be.jsd(dev, _lib.JsdParams(), 4, 6, m, m, _lib.Labels(None, _lib.I64), loss.data_ptr(), None,
           out)
    be.distill(dev, _lib.DistillParams(), 4, 6, m, m, _lib.Labels(None, _lib.I64),
               loss.data_ptr(), None, out)
    be.distill_logits(dev, _lib.DistillLogitsParams(), 4, 6, m, m, _lib.Labels(None, _lib.I64),
                      loss.data_ptr(), None, out)
    fo = _lib.FldOut(loss.data_ptr(), None, None, out, _lib.Mat(None, 0, 0), None, None, None,
                     None)
    be.fused_linear_distill(dev, _lib.FldParams(), 4, 6, 6, 6, m, m, None, m, m, None,
                            _lib.Labels(x.data_ptr(), _lib.I64), fo, _lib.F32, True)
    teacher = _lib.TopkTeacher(3, _lib.CMat(x.data_ptr(), _lib.I64, 6), m)
    be.topk_distill_logits(dev, _lib.TopkDistillParams(), 4, 6, m, teacher,
                           _lib.Labels(None, _lib.I64), loss.data_ptr(), None, out)
    be.fused_linear_topk_distill(dev, _lib.FltkParams(), 4, 6, 6, m, m, None, teacher,
                                 _lib.Labels(None, _lib.I64), fo, _lib.F32, True)
    assert calls == ["kdloss_cuda_context_create", "kdloss_cuda_kl_div_workspace_size",
                     "kdloss_cuda_kl_div", "kdloss_cuda_jsd_workspace_size", "kdloss_cuda_jsd",
                     "kdloss_cuda_distill_workspace_size", "kdloss_cuda_distill",
                     "kdloss_cuda_distill_logits_workspace_size", "kdloss_cuda_distill_logits",
                     "kdloss_cuda_fused_linear_distill_workspace_size",
                     "kdloss_cuda_fused_linear_distill",
                     "kdloss_cuda_topk_distill_logits_workspace_size",
                     "kdloss_cuda_topk_distill_logits",
                     "kdloss_cuda_fused_linear_topk_distill_workspace_size",
                     "kdloss_cuda_fused_linear_topk_distill"]


def test_cuda_vocab_parallel_plumbing(monkeypatch):
    """Without a GPU: a vocabulary-parallel call on CUDA tensors goes through VocabParallel to
    kdloss_cuda_*_vp with the context, the stream, the shard after the params (from the
    all-gathered row counts) and a workspace of the _vp size query, every argument checked
    against its prototype by a fake C layer; a rank that failed after the all-gather joins the
    agreement with a context (meet_peers); the all-reduce callback views a device buffer through
    __cuda_array_interface__ on the call's device and reduces it in place."""
    import torch.distributed as dist

    calls, seen = [], []
    be = _fake_cuda_layer(monkeypatch, calls, seen)
    monkeypatch.setattr(_backend, "_cuda_backend", lambda device: be)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)

    def all_gather(out, t, group=None):  # rank 0 holds 5 rows
        out[0].fill_(5)
        out[1].copy_(t)
    monkeypatch.setattr(dist, "all_gather", all_gather)
    dev = torch.device("cuda", 0)
    x = torch.zeros(4, 6)
    m = _lib.CMat(x.data_ptr(), _lib.F32, 6)
    out = _lib.FldOut(x.data_ptr(), None, None, _lib.Mat(x.data_ptr(), _lib.F32, 6),
                      _lib.Mat(None, 0, 0), None, None, None, None)
    teacher = _lib.TopkTeacher(3, _lib.CMat(x.data_ptr(), _lib.I64, 6), m)
    for c_name in ("kdloss_fused_linear_distill_vp", "kdloss_fused_linear_topk_distill_vp"):
        vp = _backend.VocabParallel(object(), c_name)
        monkeypatch.setattr(vp, "_collective_device", lambda: torch.device("cpu"))
        assert _backend.backend_for(dev, vp) is vp
        if "topk" in c_name:
            vp.fused_linear_topk_distill(dev, _lib.FltkParams(), 4, 6, 6, m, m, None, teacher,
                                         _lib.Labels(None, _lib.I64), out, _lib.F32, True)
        else:
            vp.fused_linear_distill(dev, _lib.FldParams(), 4, 6, 6, 6, m, m, None, m, m, None,
                                    _lib.Labels(x.data_ptr(), _lib.I64), out, _lib.F32, True)
        vp.called = False
        vp.meet_peers()  # after the all-gather: the C call's agreement, with a context
    cuda = "kdloss_cuda_fused_linear_"
    assert calls == ["kdloss_cuda_context_create", cuda + "distill_vp_workspace_size",
                     cuda + "distill_vp", cuda + "distill_vp", cuda + "topk_distill_vp_workspace_size",
                     cuda + "topk_distill_vp", cuda + "topk_distill_vp"], calls
    assert [getattr(a[0], "value", a[0]) for a in seen] == [0x1234] * 4  # the context first
    shards = [(a[3]._obj.v_total, a[3]._obj.v_begin, a[3]._obj.comm.contents.rank) for a in seen]
    assert shards == [(11, 5, 1)] * 4, shards

    # the callback: a device buffer viewed on the call's device, reduced in place
    seen = []
    host = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)

    def as_tensor(obj, device=None):
        face = obj.__cuda_array_interface__
        seen.append((face["data"][0], face["typestr"], face["shape"], device))
        return host
    monkeypatch.setattr(torch, "as_tensor", as_tensor)
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None, group=None: t.mul_(2))
    assert vp.comm.allreduce(None, 0xABC0, 3, _lib.F64, _lib.COMM_SUM) == 0
    assert seen == [(0xABC0, "<f8", (3,), dev)] and host.tolist() == [2.0, 4.0, 6.0]
    with pytest.raises(NotImplementedError, match="CPU or CUDA tensors"):
        _backend.VocabParallel(object(), "kdloss_fused_linear_distill_vp").bind(
            torch.device("meta"))


def test_cuda_status_word_is_raised():
    # CudaBackend reads the device status word after each call (kdloss.h, CUDA section) and
    # raises it; the decision is tested here without a GPU
    from kdloss.torch import _backend, set_cuda_status_check
    _backend.raise_status_word(0, "kdloss_cuda_distill")  # OK: nothing raised
    with pytest.raises(kdloss.KdlossError, match="reported by the device") as e:
        _backend.raise_status_word(kdloss._lib.ERR_LABEL_OUT_OF_RANGE, "kdloss_cuda_distill")
    assert e.value.status == kdloss._lib.ERR_LABEL_OUT_OF_RANGE
    set_cuda_status_check(False)
    assert _backend._CUDA_STATUS_CHECK[0] is False
    set_cuda_status_check(True)


def test_cuda_status_word_read_after_the_call(monkeypatch):
    # the fake C layer's workspace holding a bad-label word: the call raises; switched off, not
    from kdloss.torch import set_cuda_status_check
    calls = []
    be = _fake_cuda_layer(monkeypatch, calls)
    dev = torch.device("cuda", 0)
    x = torch.zeros(4, 6)
    m = _lib.CMat(x.data_ptr(), _lib.F32, 6)
    g = _lib.Mat(x.data_ptr(), _lib.F32, 6)
    lab = _lib.Labels(None, _lib.I64)
    _FAKE_STATUS[0] = _lib.ERR_LABEL_OUT_OF_RANGE
    try:
        with pytest.raises(kdloss.KdlossError, match="reported by the device"):
            be._run(dev, "jsd", (4, 6), (None, 4, 6, m, m, lab, None, None, g))
        set_cuda_status_check(False)
        be._run(dev, "jsd", (4, 6), (None, 4, 6, m, m, lab, None, None, g))
    finally:
        _FAKE_STATUS[0] = 0
        set_cuda_status_check(True)
