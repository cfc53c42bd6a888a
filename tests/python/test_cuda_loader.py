"""The loader of the CUDA backend library, libkdloss_cuda.so (python/kdloss/_lib.py):
  - where torch sees no CUDA device, kdloss.cuda_info() says so (available False, the reason
    naming torch and its CUDA) and libkdloss_cuda.so is never mapped into the process;
  - with $KDLOSS_CUDA_LIB naming the simulator-built backend (CMake -DKDLOSS_CUDA_SIM=ON, cudasim/),
    the loader finds and loads it, puts its kdloss_cuda_* functions on the binding's handle
    (the CPU functions stay libkdloss.so's), and one real entry point, kdloss_cuda_kl_div, runs
    on memory from the simulator's cudaMalloc and matches the CPU backend's kdloss_kl_div;
  - a library built for another CUDA major than torch's is refused with a reason naming both,
    and not loaded.
The simulator cases need the library's path in $KDLOSS_TEST_CUDA_SIM_LIB (bench/gpu_check.sh
--dry-run builds it and sets it); without it they skip, unless $KDLOSS_TEST_REQUIRE_SIM=1 (the
dry run sets it too), where a missing library fails the test.
Each case runs in a fresh interpreter: the loader decides once per process."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest


def run_py(code, **env):
    """Runs `code` in a fresh python (this one) with env added; returns its stdout."""
    full = dict(os.environ)
    full.pop("KDLOSS_CUDA_LIB", None)
    full.update(env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


def sim_lib():
    path = os.environ.get("KDLOSS_TEST_CUDA_SIM_LIB")
    if path and os.path.exists(path):
        return path
    if os.environ.get("KDLOSS_TEST_REQUIRE_SIM") == "1":
        pytest.fail(f"KDLOSS_TEST_CUDA_SIM_LIB={path!r}: no simulator-built libkdloss_cuda.so")
    pytest.skip("KDLOSS_TEST_CUDA_SIM_LIB not set (bench/gpu_check.sh --dry-run sets it)")


def test_without_a_device_the_backend_is_not_loaded():
    out = run_py("""
        import json, torch, kdloss
        info = kdloss.cuda_info()
        maps = open("/proc/self/maps").read()
        print(json.dumps({"info": info, "gpu": torch.cuda.is_available(),
                          "torch_cuda": torch.version.cuda,
                          "mapped": "libkdloss_cuda" in maps}))
    """)
    r = json.loads(out.splitlines()[-1])
    info = r["info"]
    assert isinstance(info["available"], bool) and isinstance(info["reason"], str), info
    if r["gpu"]:
        pytest.skip("torch sees a CUDA device here: " + info["reason"])
    assert info["available"] is False and not r["mapped"], r
    assert "no CUDA device" in info["reason"] or "without CUDA" in info["reason"], info
    if r["torch_cuda"]:
        assert r["torch_cuda"] in info["reason"], info


def test_without_torch_nothing_is_tried():
    """A process that never imports torch: kdloss works, cuda_info() says torch is missing or
    has no device, and the CUDA library is not mapped."""
    out = run_py("""
        import sys, kdloss
        v = kdloss.version()
        mapped_before = "libkdloss_cuda" in open("/proc/self/maps").read()
        print(v, mapped_before, "torch" in sys.modules)
    """)
    version, mapped, torch_loaded = out.split()
    assert version and mapped == "False" and torch_loaded == "False", out


SIM_CASE = """
    import ctypes, json, math, os, random
    import kdloss
    from kdloss import _lib
    info = kdloss.cuda_info()
    assert info["available"] and info["simulator"], info
    assert info["library"] == os.path.normpath(os.environ["KDLOSS_CUDA_LIB"]), info
    cuda = _lib._cuda["handle"]
    addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value
    # the CUDA entries are the CUDA library's; a CPU entry stays libkdloss.so's
    assert addr(_lib.fn("kdloss_cuda_kl_div")) == addr(cuda.kdloss_cuda_kl_div)
    assert addr(_lib.fn("kdloss_kl_div")) != addr(cuda.kdloss_kl_div)
    assert _lib.library_path().endswith("libkdloss.so"), _lib.library_path()
    sim = ctypes.CDLL(os.path.join(os.path.dirname(info["library"]), "libkdsim.so"))
    sim.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    sim.cudaFree.argtypes = [ctypes.c_void_p]

    def dev(nbytes):
        p = ctypes.c_void_p()
        assert sim.cudaMalloc(ctypes.byref(p), nbytes) == 0
        return p

    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    bt, v = 5, 37
    def log_softmax(row):
        m = max(row); s = math.log(sum(math.exp(x - m) for x in row)); return [x - m - s for x in row]
    inp = [x for _ in range(bt) for x in log_softmax([rng.uniform(-4, 4) for _ in range(v)])]
    tgt = [math.exp(x) for _ in range(bt) for x in log_softmax([rng.uniform(-3, 5) for _ in range(v)])]
    F = ctypes.c_float * (bt * v)
    h_inp, h_tgt = F(*inp), F(*tgt)
    d_inp, d_tgt, d_grad, d_loss = dev(4 * bt * v), dev(4 * bt * v), dev(4 * bt * v), dev(4)
    ctypes.memmove(d_inp, h_inp, 4 * bt * v)
    ctypes.memmove(d_tgt, h_tgt, 4 * bt * v)
    params = _lib.KlParams()
    _lib.fn("kdloss_kl_params_default")(ctypes.byref(params))
    params.reduction = _lib.REDUCTIONS["batchmean"]
    ctx = ctypes.c_void_p()
    _lib.check(_lib.fn("kdloss_cuda_context_create")(0, ctypes.byref(ctx)), "kdloss_cuda_context_create")
    n = ctypes.c_size_t()
    _lib.check(_lib.fn("kdloss_cuda_kl_div_workspace_size")(bt, v, ctypes.byref(n)), "kdloss_cuda_kl_div_workspace_size")
    ws = dev(max(n.value, 4))
    st = _lib.fn("kdloss_cuda_kl_div")(ctx, None, ctypes.byref(params), bt, v,
                                       _lib.CMat(d_inp, _lib.F32, 0), _lib.CMat(d_tgt, _lib.F32, 0),
                                       d_loss, None, _lib.NULL_MAT, _lib.Mat(d_grad, _lib.F32, 0),
                                       ws, n.value)
    _lib.check(st, "kdloss_cuda_kl_div")
    assert sim.cudaDeviceSynchronize() == 0
    word = ctypes.c_int32.from_address(ws.value).value
    assert word == 0, word
    cpu_loss, cpu_grad = ctypes.c_float(), F()
    _lib.check(_lib.fn("kdloss_kl_div")(ctypes.byref(params), bt, v, _lib.CMat(ctypes.cast(h_inp, ctypes.c_void_p), _lib.F32, 0),
                                        _lib.CMat(ctypes.cast(h_tgt, ctypes.c_void_p), _lib.F32, 0), ctypes.byref(cpu_loss), None,
                                        _lib.NULL_MAT, _lib.Mat(ctypes.cast(cpu_grad, ctypes.c_void_p), _lib.F32, 0)), "kdloss_kl_div")
    g_loss = ctypes.c_float.from_address(d_loss.value).value
    g_grad = F.from_address(d_grad.value)
    ref = sum(t * (math.log(t) - x) for x, t in zip(inp, tgt)) / bt  # the double oracle
    assert abs(g_loss - ref) <= 1e-5 * max(1.0, abs(ref)), (g_loss, ref)
    assert abs(cpu_loss.value - ref) <= 1e-5 * max(1.0, abs(ref)), (cpu_loss.value, ref)
    worst = max(abs(a - b) for a, b in zip(g_grad, cpu_grad))
    assert worst <= 1e-6, worst
    # a bad argument is refused by the CUDA library with its own detail
    st = _lib.fn("kdloss_cuda_kl_div")(ctx, None, ctypes.byref(params), -1, v,
                                       _lib.CMat(d_inp, _lib.F32, 0), _lib.CMat(d_tgt, _lib.F32, 0),
                                       d_loss, None, _lib.NULL_MAT, _lib.NULL_MAT, ws, n.value)
    assert st == _lib.ERR_INVALID_SIZE, st
    _lib.fn("kdloss_cuda_context_destroy")(ctx)
    for p in (d_inp, d_tgt, d_grad, d_loss, ws):
        sim.cudaFree(p)
    print("sim backend ok: loss", g_loss, "ref", ref, "grad max diff", worst)
"""


def test_simulator_backend_is_found_loaded_and_runs():
    lib = sim_lib()
    out = run_py(SIM_CASE, KDLOSS_CUDA_LIB=lib)
    assert "sim backend ok" in out, out


def test_cuda_major_mismatch_is_refused(tmp_path):
    """A library whose build says CUDA 12.x while torch says 13.x (or the reverse)."""
    lib = sim_lib()
    torch = pytest.importorskip("torch")
    if not torch.version.cuda:
        pytest.skip("torch without CUDA: no major to compare")
    other = "12.8" if not torch.version.cuda.startswith("12") else "13.0"
    shutil.copy2(lib, tmp_path / "libkdloss_cuda.so")
    shutil.copy2(os.path.join(os.path.dirname(lib), "libkdsim.so"), tmp_path / "libkdsim.so")
    (tmp_path / "kdloss_cuda_build.json").write_text(json.dumps(
        {"cuda_version": other, "archs": "90-real", "simulator": True}))
    out = run_py("""
        import json, torch, kdloss
        info = kdloss.cuda_info()
        print(json.dumps({"info": info, "mapped": "libkdloss_cuda" in open("/proc/self/maps").read()}))
    """, KDLOSS_CUDA_LIB=str(tmp_path / "libkdloss_cuda.so"))
    r = json.loads(out.splitlines()[-1])
    reason = r["info"]["reason"]
    assert r["info"]["available"] is False and not r["mapped"], r
    assert "mismatch" in reason and other in reason and torch.version.cuda in reason, reason
