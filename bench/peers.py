#!/usr/bin/env python3
"""Peer comparison on the CPU: eager PyTorch, Liger-Kernel and kdloss on the seed workloads.

Protocol (bench/README.md's reference workloads, adapted to a CPU):
  * timing: all providers side by side in ONE process (this one), on the same input tensors.
    modes: forward (the loss call alone), backward (loss.backward(retain_graph=True) on one
    forward's graph, repeated), full (forward + backward, what the seed records time). Each
    provider first gets warm-up full passes (Liger's torch.compile runs there), then the timed
    runs are interleaved round-robin across providers (torch, liger, kdloss, torch, ...) with a
    short untimed pause before each, so a change in machine load or a thread pool still spinning
    from the previous provider's call is shared out instead of landing on one provider. Timer
    time.perf_counter_ns; reported: median with p20/p80 (linear interpolation, as the quantiles
    of triton.testing.do_bench); gradients are reset to None between runs, outside the timed
    region, so every run pays the same;
  * peak memory: a fresh child process per (provider, point), so peaks never mix. The child runs
    the provider once on a tiny problem (thread pools, BLAS buffers, libraries), reads its RSS,
    creates the inputs, runs one full pass (warm-up; compilation), resets the RSS high-water mark
    (/proc/self/clear_refs 5) and runs a second full pass. "peak MiB" = the high-water mark after
    it (VmHWM; getrusage's ru_maxrss is not reset by clear_refs, so it is only the fallback) - the
    RSS before the inputs existed: inputs, outputs,
    gradients and working space of a steady-state full pass, without the Python/torch runtime;
  * torch_gemms (not a peer: the floor): the fused-linear loss's bare GEMMs through torch's
    matmul in this process (distillation: four; top-k: three, no teacher GEMM);
  * every provider gets the same inputs from the same seed, and the same input pipeline: for KL the
    input is randn(BT,V).log_softmax(-1) of a leaf that requires grad (so "full" includes the
    log_softmax backward for everyone); for distillation torch.rand hidden states, nn.Linear
    default-initialized LM heads (teacher frozen), labels randint(0, V), beta 0.5, T 1, 0.5/0.5.

Providers:
  kl_div:           torch = nn.KLDivLoss(reduction="batchmean"), liger = LigerKLDIVLoss (Triton:
                    expected to fail on a CPU; the error is recorded), kdloss = kdloss.torch.KLDivLoss
  distill_logits:   forward KL(P||Q) on logits (P = softmax(teacher), Q = softmax(student), T 1,
                    batchmean; randn(BT,V) logits, the student's a leaf requiring grad): torch =
                    log_softmax both + F.kl_div(log_target=True), liger = the same log_softmaxes +
                    LigerKLDIVLoss (Triton: expected to fail on a CPU), kdloss =
                    kdloss.torch.DistillLoss (one kdloss_distill_logits call)
  distill_jsd_loss: torch = full fp32 logits + CE + JSD written from docs/MATH.md section 4,
                    liger = chunked LigerFusedLinearJSDLoss (plain torch, compiled=True by default),
                    kdloss = kdloss.torch.FusedLinearJSDLoss (module defaults)
  topk_distill:     the LM head against a sparse top-k teacher (docs/MATH.md section 8),
                    forward KL, bucket tail, T 1, no labels: torch = eager (fp32 logits,
                    log_softmax, gather at the ids, tails via logsumexp/expm1, autograd),
                    kdloss = kdloss.torch.FusedLinearTopKDistillLoss when this build has it
                    (otherwise recorded as unavailable, not as a failure: `kdloss bench
                    topk_distill` times the C call), no Liger equivalent. Teacher: per row the K
                    most likely ids of log_softmax(5 randn(V)) and their log-probs (int32 ids for
                    kdloss, int64 for torch's gather). --topk-rss-bt: a fresh child doing one
                    kdloss call at that BT reports its whole peak RSS (target < 1.5 GiB)

Output: one KernelIndex-style JSON record per (workload, mode, provider, point) in --out, PNG plots
of time and memory against size per provider, and a markdown table on stdout.
Run it through bench/peers.sh (which unsets OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE).
"""

import argparse
import datetime as dt
import gc
import hashlib
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time

API = "kernelindex.dev/v1alpha1"
HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------------------------------------------
# inputs and providers
# ---------------------------------------------------------------------------------------------------


def rss_now_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def rss_peak_mb():
    """The RSS high-water mark: VmHWM (which /proc/self/clear_refs resets), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def reset_rss_peak():
    """Reset the RSS high-water mark to the current RSS (Linux >= 4.0). False if unavailable."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def torch_distill_loss(xs, ws, xt, wt, labels, beta=0.5, temperature=1.0, w_hard=0.5,
                       w_soft=0.5, ignore_index=-100):
    """Eager reference of docs/MATH.md section 4: full fp32 logits, CE + JSD(beta)."""
    import torch
    import torch.nn.functional as F
    zs = (xs @ ws.T).float()
    zt = (xt @ wt.T).float()
    valid = labels != ignore_index
    n = valid.sum().clamp(min=1)
    hard = F.cross_entropy(zs, labels, ignore_index=ignore_index, reduction="sum") / n
    x = F.log_softmax(zs / temperature, -1)
    y = F.log_softmax(zt / temperature, -1)
    if beta == 0:
        rows = (y.exp() * (y - x)).sum(-1)
    elif beta == 1:
        rows = (x.exp() * (x - y)).sum(-1)
    else:
        log_m = torch.logaddexp(y + math.log(beta), x + math.log(1 - beta))
        rows = (beta * y.exp() * (y - log_m) + (1 - beta) * x.exp() * (x - log_m)).sum(-1)
    soft = (rows * valid).sum() / n
    return w_hard * hard + w_soft * soft


def torch_topk_loss(xs, ws, ids, lp, temperature=1.0, tail="bucket"):
    """Eager reference of docs/MATH.md section 8, forward KL: full fp32 logits, log_softmax,
    gather at the teacher's ids; bucket tails from the K values (logsumexp, expm1, floored at
    2^-126 like kdloss's teacher tail), mean over rows; autograd does the backward."""
    import torch
    import torch.nn.functional as F
    zs = (xs @ ws.T).float()
    bt = zs.shape[0]
    if tail == "renorm_both":  # both renormalized over S: only the gathered logits matter
        x = F.log_softmax(zs.gather(1, ids) / temperature, -1)
        y = lp - torch.logsumexp(lp, -1, keepdim=True)
        return (y.exp() * (y - x)).sum() / bt
    x = F.log_softmax(zs / temperature, -1).gather(1, ids)  # student log-probs at S
    if tail == "renorm_teacher":
        y = lp - torch.logsumexp(lp, -1, keepdim=True)
        return (y.exp() * (y - x)).sum() / bt
    floor = 2.0 ** -126
    x_tail = torch.log((-torch.expm1(torch.logsumexp(x, -1))).clamp_min(floor))
    y_tail = torch.log((-torch.expm1(torch.logsumexp(lp.double(), -1))).clamp_min(floor)).float()
    rows = (lp.exp() * (lp - x)).sum(-1) + y_tail.exp() * (y_tail - x_tail)
    return rows.sum() / bt


def topk_teacher(bt, v, k, scale=5.0, chunk=256):
    """(ids int64, log-probs fp32): per row the k most likely ids of log_softmax(scale randn(v)),
    most likely first, drawn chunk by chunk so no BT x V tensor exists at once."""
    import torch
    ids, lps = [], []
    for r in range(0, bt, chunk):
        z = torch.randn(min(chunk, bt - r), v).mul_(scale).log_softmax(-1)
        lp, i = z.topk(k, -1)
        ids.append(i)
        lps.append(lp)
        del z
    return torch.cat(ids), torch.cat(lps)


class ProviderUnavailable(Exception):
    """This provider does not exist in this build (recorded, not counted as a failure)."""


def gemm_floor_fn():
    """The distillation loss's four bare GEMMs in torch (its own matmul, MKL on x86): the student
    and teacher logits in forward, dXs = zs ws and dWs = zs^T xs in backward. Nothing else, so
    forward mode times the two logits GEMMs and full mode all four: the floor every fused
    implementation is measured against, taken in the same process as the peers."""
    import torch

    class GemmFloor(torch.autograd.Function):
        @staticmethod
        def forward(ctx, xs, ws, xt, wt):
            zs = xs @ ws.T
            xt @ wt.T
            ctx.save_for_backward(xs, ws, zs)
            return zs.new_zeros(())

        @staticmethod
        def backward(ctx, g):
            xs, ws, zs = ctx.saved_tensors
            return zs @ ws, zs.T @ xs, None, None

    return GemmFloor.apply


def gemm_floor3_fn():
    """The top-k loss's three bare GEMMs in torch: the student logits zs = xs ws^T in forward,
    dXs = zs ws and dWs = zs^T xs in backward (no teacher GEMM: the teacher is sparse)."""
    import torch

    class GemmFloor3(torch.autograd.Function):
        @staticmethod
        def forward(ctx, xs, ws):
            zs = xs @ ws.T
            ctx.save_for_backward(xs, ws, zs)
            return zs.new_zeros(())

        @staticmethod
        def backward(ctx, g):
            xs, ws, zs = ctx.saved_tensors
            return zs @ ws, zs.T @ xs

    return GemmFloor3.apply


def make_inputs(wl, p, seed=0):
    """The tensors every provider of a point shares. `leaves` get their .grad reset."""
    import torch
    torch.manual_seed(seed)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[p["dtype"]]
    if wl == "kl_div":
        bt, v = p["tokens"], p["vocab"]
        leaf = torch.randn(bt, v, dtype=dtype, requires_grad=True)
        return {"leaf": leaf, "x": leaf.log_softmax(-1),
                "t": torch.randn(bt, v, dtype=dtype).softmax(-1), "leaves": [leaf], "retain": True}
    if wl == "distill_logits":
        bt, v = p["tokens"], p["vocab"]
        zs = torch.randn(bt, v, dtype=dtype, requires_grad=True)
        return {"zs": zs, "zt": torch.randn(bt, v, dtype=dtype), "leaves": [zs], "retain": False}
    if wl == "topk_distill":
        bt, hs, v, k = p["tokens"], p["hidden"], p["vocab"], p["topk"]
        xs = torch.rand(bt, hs, dtype=dtype, requires_grad=True)
        ws = torch.nn.Linear(hs, v, bias=False, dtype=dtype).weight
        ids, lp = topk_teacher(bt, v, k)
        return {"xs": xs, "ws": ws, "ids": ids, "ids32": ids.to(torch.int32), "lp": lp,
                "leaves": [xs, ws], "retain": False}
    bt, hs, ht, v = p["tokens"], p["hidden_student"], p["hidden_teacher"], p["vocab"]
    xs = torch.rand(bt, hs, dtype=dtype, requires_grad=True)
    xt = torch.rand(bt, ht, dtype=dtype)
    ws = torch.nn.Linear(hs, v, bias=False, dtype=dtype).weight  # a Parameter: requires grad
    wt = torch.nn.Linear(ht, v, bias=False, dtype=dtype).weight.detach()  # frozen teacher
    labels = torch.randint(0, v, (bt,))
    return {"xs": xs, "ws": ws, "xt": xt, "wt": wt, "labels": labels, "leaves": [xs, ws],
            "retain": False}


def make_provider(wl, prov, inp, liger_compiled=True):
    """(fwd, implementation-dict): fwd() returns the scalar loss on the shared inputs."""
    import torch
    if wl == "kl_div":
        x, t = inp["x"], inp["t"]
        if prov == "torch":
            fn, impl = torch.nn.KLDivLoss(reduction="batchmean"), "torch.nn.KLDivLoss"
        elif prov == "liger":
            from liger_kernel.transformers import LigerKLDIVLoss
            fn, impl = LigerKLDIVLoss(reduction="batchmean"), "liger_kernel.transformers.LigerKLDIVLoss"
        else:
            import kdloss.torch
            fn, impl = kdloss.torch.KLDivLoss(reduction="batchmean"), "kdloss.torch.KLDivLoss"
        return (lambda: fn(x, t)), {"module": impl, "options": {"reduction": "batchmean"}}
    if wl == "topk_distill":
        return make_topk_provider(prov, inp)
    if wl == "distill_logits":
        return make_logits_provider(prov, inp)
    xs, ws, xt, wt, labels = (inp[k] for k in ("xs", "ws", "xt", "wt", "labels"))
    opts = {"weight_hard_loss": 0.5, "weight_soft_loss": 0.5, "beta": 0.5, "temperature": 1.0}
    if prov == "torch":
        impl = "eager torch: fp32 logits + F.cross_entropy + JSD (bench/peers.py)"
        return (lambda: torch_distill_loss(xs, ws, xt, wt, labels)), {"module": impl,
                                                                       "options": opts}
    if prov == "torch_gemms":
        floor = gemm_floor_fn()
        return (lambda: floor(xs, ws, xt, wt)), {
            "module": "torch matmul: the four bare GEMMs (the floor; bench/peers.py)", "options": {}}
    if prov == "liger":
        from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss
        opts["compiled"] = liger_compiled
        m = LigerFusedLinearJSDLoss(**opts)
        impl = "liger_kernel.chunked_loss.LigerFusedLinearJSDLoss"
    else:
        import kdloss.torch
        m = kdloss.torch.FusedLinearJSDLoss(**opts)
        opts["chunk_size"] = m.chunk_size
        impl = "kdloss.torch.FusedLinearJSDLoss"
    return (lambda: m(xs, ws, xt, wt, labels)), {"module": impl, "options": opts}


def make_logits_provider(prov, inp):
    """Forward KL(P||Q) on logits, batchmean: P = softmax(teacher), Q = softmax(student)."""
    import torch
    zs, zt = inp["zs"], inp["zt"]
    opts = {"divergence": "forward_kl", "temperature": 1.0, "reduction": "batchmean"}
    if prov == "torch":
        def fwd():
            return torch.nn.functional.kl_div(zs.log_softmax(-1), zt.log_softmax(-1),
                                              reduction="batchmean", log_target=True)
        return fwd, {"module": "eager torch: log_softmax both, F.kl_div(log_target=True)",
                     "options": opts}
    if prov == "liger":
        from liger_kernel.transformers import LigerKLDIVLoss
        m = LigerKLDIVLoss(reduction="batchmean", log_target=True)
        return (lambda: m(zs.log_softmax(-1), zt.log_softmax(-1))), {
            "module": "torch log_softmax both + liger_kernel.transformers.LigerKLDIVLoss",
            "options": opts}
    import kdloss.torch
    m = kdloss.torch.DistillLoss(divergence="forward_kl")
    return (lambda: m(zs, zt)), {"module": "kdloss.torch.DistillLoss", "options": opts}


def make_topk_provider(prov, inp):
    import torch
    xs, ws, ids, ids32, lp = (inp[k] for k in ("xs", "ws", "ids", "ids32", "lp"))
    opts = {"divergence": "forward_kl", "tail": "bucket", "temperature": 1.0}
    if prov == "torch":
        impl = "eager torch: fp32 logits, log_softmax, gather, bucket tails (bench/peers.py)"
        return (lambda: torch_topk_loss(xs, ws, ids, lp)), {"module": impl, "options": opts}
    if prov == "torch_gemms":
        floor = gemm_floor3_fn()
        return (lambda: floor(xs, ws)), {
            "module": "torch matmul: the three bare GEMMs (the floor; bench/peers.py)",
            "options": {}}
    if prov == "kdloss":
        import kdloss.torch
        cls = getattr(kdloss.torch, "FusedLinearTopKDistillLoss", None)
        if cls is None:
            raise ProviderUnavailable("kdloss.torch.FusedLinearTopKDistillLoss is not in this "
                                      "build (kdloss bench topk_distill times the C call)")
        m = cls(**opts)
        return (lambda: m(xs, ws, ids32, lp)), {
            "module": "kdloss.torch.FusedLinearTopKDistillLoss", "options": opts}
    raise ProviderUnavailable(f"no {prov} implementation of a sparse top-k teacher loss")


TINY = {"tokens": 8, "vocab": 64, "hidden_student": 16, "hidden_teacher": 32, "hidden": 16,
        "topk": 4}


def quantiles(ns):
    import numpy as np
    ms = np.asarray(ns, dtype=np.float64) / 1e6
    p20, p50, p80 = np.percentile(ms, [20, 50, 80])
    return {"ms_20": float(p20), "ms_50": float(p50), "ms_80": float(p80), "runs": len(ns)}


def error_text(exc):
    msg = f"{type(exc).__name__}: {exc}".strip()
    return msg.splitlines()[0][:400] if msg else type(exc).__name__


# ---------------------------------------------------------------------------------------------------
# timing: every provider of a point in this process, runs interleaved
# ---------------------------------------------------------------------------------------------------


def time_point(wl, point, providers, modes, args, min_reps):
    """{provider: result} with modes timed; a provider that raises gets status failed."""
    import torch
    inp = make_inputs(wl, point)
    retain, leaves = inp["retain"], inp["leaves"]
    res, live, est = {}, {}, {}

    def zero():
        for t in leaves:
            t.grad = None

    def pause():  # let the previous provider's spinning BLAS/OpenMP threads go to sleep
        if args.pause_s > 0:
            time.sleep(args.pause_s)

    for prov in providers:
        r = res[prov] = {"status": "passed", "modes": {}}
        try:
            fwd, impl = make_provider(wl, prov, inp, not args.no_liger_compile)
            r["implementation"] = impl
            t0, n_warm = time.perf_counter(), 0
            while True:  # warm-up full passes: >= warmup_s, 1..3 of them
                pause()
                s = time.perf_counter_ns()
                y = fwd()
                y.backward(retain_graph=retain)
                e = time.perf_counter_ns() - s
                if n_warm == 0:
                    r["loss"] = float(y.detach().float())
                    r["warmup_first_ms"] = e / 1e6
                del y
                zero()
                n_warm += 1
                if time.perf_counter() - t0 >= args.warmup_s or n_warm >= 3:
                    break
            r["warmup_runs"] = n_warm
            live[prov], est[prov] = fwd, e / 1e9
        except Exception as exc:  # a provider that does not run here: record why
            r.update(status="failed", error=error_text(exc))
            zero()
    if not live:
        return res

    def reps(fraction):
        n = int(args.target_s / max(max(est.values()) * fraction, 1e-6))
        if args.deadline:  # a round runs every provider once; keep 30 s for the memory children
            n = min(n, int((args.deadline - time.time() - 30) / max(sum(est.values()) * fraction, 1e-6)))
        return max(min_reps, min(args.max_reps, n))

    for mode in modes:
        times = {prov: [] for prov in live}
        try:
            if mode == "backward":
                ys = {prov: fwd() for prov, fwd in live.items()}
            for _ in range(reps(0.5 if mode != "full" else 1.0)):
                for prov, fwd in live.items():
                    zero()
                    pause()
                    if mode == "forward":
                        s = time.perf_counter_ns()
                        y = fwd()
                        times[prov].append(time.perf_counter_ns() - s)
                        del y
                    elif mode == "backward":
                        s = time.perf_counter_ns()
                        ys[prov].backward(retain_graph=True)
                        times[prov].append(time.perf_counter_ns() - s)
                    else:
                        s = time.perf_counter_ns()
                        y = fwd()
                        y.backward(retain_graph=retain)
                        times[prov].append(time.perf_counter_ns() - s)
                        del y
            if mode == "backward":
                del ys
        except Exception as exc:
            for prov in live:
                res[prov].setdefault("error", f"mode {mode}: {error_text(exc)}")
        zero()
        for prov, ts in times.items():
            if ts:
                res[prov]["modes"][mode] = quantiles(ts)
                res[prov].setdefault("samples_ns", {})[mode] = ts  # round by round (not recorded)
    del inp, live
    gc.collect()
    return res


# ---------------------------------------------------------------------------------------------------
# memory: one fresh child per (provider, point)
# ---------------------------------------------------------------------------------------------------


def mem_child(spec):
    import torch  # noqa: F401
    wl, prov = spec["workload"], spec["provider"]
    if prov == "kdloss":
        import kdloss
        kdloss.version()  # load libkdloss.so (and its OpenBLAS/OpenMP) before the baseline
    out = {}
    try:  # start this provider's runtimes on a tiny problem so the baseline includes them
        tiny = make_inputs(wl, dict(spec["point"], **TINY))
        fwd, _ = make_provider(wl, prov, tiny, spec["liger_compiled"])
        fwd().backward(retain_graph=tiny["retain"])
        del fwd, tiny
    except Exception:
        pass
    gc.collect()
    base = rss_now_mb()
    try:
        inp = make_inputs(wl, spec["point"])
        fwd, _ = make_provider(wl, prov, inp, spec["liger_compiled"])
        for i in range(2):  # pass 0 warms up (and compiles); pass 1 is measured
            if i == 1:
                gc.collect()
                out["hwm_reset"] = reset_rss_peak()
            y = fwd()
            y.backward(retain_graph=inp["retain"])
            del y
            for t in inp["leaves"]:
                t.grad = None
        out["status"] = "passed"
    except Exception as exc:
        out["status"], out["error"] = "failed", error_text(exc)
    out["peak_rss_mb"] = rss_peak_mb()
    out["baseline_rss_mb"] = base
    out["peak_mb"] = out["peak_rss_mb"] - base
    return out


def topk_rss_child(spec):
    """One full kdloss top-k call at spec's point in this fresh process: its whole peak RSS
    (VmHWM: the Python/torch runtime, the inputs, the outputs, the library's workspace)."""
    import torch  # noqa: F401
    import kdloss
    kdloss.version()
    out = {"baseline_rss_mb": rss_now_mb()}
    try:
        inp = make_inputs("topk_distill", spec["point"])
        fwd, _ = make_provider("topk_distill", "kdloss", inp)
        del inp["ids"]  # kdloss reads the int32 copy; torch's int64 one is not part of its call
        out["inputs_rss_mb"] = rss_now_mb()
        y = fwd()
        y.backward()
        out["loss"] = float(y.detach())
        out["status"] = "passed"
    except ProviderUnavailable as exc:
        out["status"], out["error"] = "unavailable", error_text(exc)
    except Exception as exc:
        out["status"], out["error"] = "failed", error_text(exc)
    out["peak_rss_mb"] = rss_peak_mb()
    return out


def run_topk_rss(args, notes):
    """The top-k peak-RSS child at BT args.topk_rss_bt: a result dict (status passed,
    unavailable or failed), or None with a SKIP line in notes when the deadline is too near."""
    if args.deadline and args.deadline - time.time() < FIRST_POINT_S:
        notes.append(f"SKIP peers topk_distill peak-RSS child at BT {args.topk_rss_bt}: "
                     f"{args.deadline - time.time():.0f} s left before this run's deadline "
                     f"(--deadline), it needs ~{FIRST_POINT_S} s")
        print(notes[-1], flush=True)
        return None
    point = {"tokens": args.topk_rss_bt, "hidden": args.topk_hs, "vocab": args.vocab,
             "topk": args.topk_k, "dtype": args.dtype}
    try:
        limit = child_timeout(args)
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-topk-rss",
                              json.dumps({"point": point})], capture_output=True, text=True,
                             timeout=limit, env=child_env())
    except subprocess.TimeoutExpired:
        return {"status": "failed", "error": f"timed out after {limit}s", "point": point}
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        err = (out.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return {"status": "failed", "error": f"child exited {out.returncode}: {err}",
                "point": point}
    return dict(json.loads(lines[-1]), point=point)


TOPK_RSS_TARGET_MIB = 1536  # the top-k memory target: one BT 8192 call, the whole process below 1.5 GiB


# ---------------------------------------------------------------------------------------------------
# time guards: peers that cannot run fast on this machine, and the run's deadline
# ---------------------------------------------------------------------------------------------------

# KDLOSS_BENCH_BF16_SLOW=1 forces the probe's "slow" verdict (to test the smaller point on a CPU
# with bf16 arithmetic); any other value, or none, lets the probe decide.
BF16_SLOW_ENV = "KDLOSS_BENCH_BF16_SLOW"
BF16_SLOW_RATIO = 0.5  # bf16 matmul below half the fp32 rate: no bf16 arithmetic worth the name
BF16_MIN_BT = 64       # below this a bf16 point is skipped rather than measured smaller


def bf16_probe(budget_s=2.0):
    """torch's bf16 and fp32 matmul rates on this machine, timed (not guessed from CPU flags):
    {gflops_bf16, gflops_fp32, ratio, slow, forced}. A 256 x 1024 x 1024 product, each dtype
    repeated for about budget_s / 2 (at least twice, after one untimed call); the best run
    counts. Where bf16 has no arithmetic of its own (torch's fallback kernel), it runs tens of
    times below fp32; with bf16 instructions it runs at or above it."""
    import torch
    m, k, n = 256, 1024, 1024
    rates = {}
    for dt in (torch.float32, torch.bfloat16):
        a, b = torch.rand(m, k, dtype=dt), torch.rand(k, n, dtype=dt)
        torch.matmul(a, b)
        best, t0, runs = float("inf"), time.perf_counter(), 0
        while runs < 2 or (time.perf_counter() - t0 < budget_s / 2 and runs < 50):
            s = time.perf_counter()
            torch.matmul(a, b)
            best = min(best, time.perf_counter() - s)
            runs += 1
        rates[dt] = 2.0 * m * k * n / best * 1e-9
    g16, g32 = rates[torch.bfloat16], rates[torch.float32]
    forced = os.environ.get(BF16_SLOW_ENV) == "1"
    return {"gflops_bf16": g16, "gflops_fp32": g32, "ratio": g16 / g32,
            "slow": forced or g16 < BF16_SLOW_RATIO * g32, "forced": forced}


def bf16_gemm_flop(wl, p):
    """The GEMM flops of one full pass at point p (the four GEMMs of the dense loss, the three
    of the top-k one): what a bf16 pass costs where bf16 is slow."""
    if wl == "distill_jsd_loss":
        return 2.0 * p["tokens"] * p["vocab"] * (3 * p["hidden_student"] + p["hidden_teacher"])
    return 2.0 * p["tokens"] * p["vocab"] * 3 * p["hidden"]


def apply_bf16_probe(args, notes, probe=None):
    """With --dtype bf16 and a slow verdict: the distillation and top-k BTs shrink to the largest
    power of two whose full pass (its GEMMs at the probed bf16 rate) takes at most
    --bf16-slow-pass-s, or are skipped below BF16_MIN_BT. Appends SMALLER / SKIP lines."""
    if args.dtype != "bf16" or not any(w in args.workloads for w in ("distill_jsd_loss", "topk_distill")):
        return None
    pr = (probe or bf16_probe)()
    how = (f"torch's bf16 matmul ran at {pr['gflops_bf16']:.1f} GFLOP/s, fp32 at "
           f"{pr['gflops_fp32']:.1f} ({pr['ratio']:.2f}x; slow below {BF16_SLOW_RATIO}x)")
    if pr["forced"] and pr["ratio"] >= BF16_SLOW_RATIO:
        how += f", slow by {BF16_SLOW_ENV}=1"
    print(f"bf16 probe: bf16 {pr['gflops_bf16']:.1f} GFLOP/s, fp32 {pr['gflops_fp32']:.1f} GFLOP/s "
          f"(256x1024x1024 matmul): {'slow' if pr['slow'] else 'fast'}"
          f"{' (forced)' if pr['forced'] else ''}", flush=True)
    if not pr["slow"]:
        return pr
    for wl, attr, base in (("distill_jsd_loss", "distill_bt",
                            {"hidden_student": args.hs, "hidden_teacher": args.ht}),
                           ("topk_distill", "topk_bt", {"hidden": args.topk_hs})):
        if wl not in args.workloads:
            continue
        per_bt = bf16_gemm_flop(wl, dict(base, tokens=1, vocab=args.vocab))
        bt_ok = int(args.bf16_slow_pass_s * pr["gflops_bf16"] * 1e9 / per_bt)
        cap = 1 << (bt_ok.bit_length() - 1) if bt_ok >= 1 else 0
        kept = []
        for bt in getattr(args, attr):
            if bt <= bt_ok:
                kept.append(bt)
            elif cap >= BF16_MIN_BT:
                notes.append(f"SMALLER peers {wl} bf16 BT {bt} -> {cap}: {how}; a BT {bt} full "
                             f"pass would take ~{bt * per_bt / (pr['gflops_bf16'] * 1e9):.0f} s a "
                             f"provider (limit {args.bf16_slow_pass_s:g} s)")
                kept.append(cap)
            else:
                notes.append(f"SKIP peers {wl} bf16 BT {bt}: {how}; even BT {BF16_MIN_BT} would "
                             f"take ~{BF16_MIN_BT * per_bt / (pr['gflops_bf16'] * 1e9):.0f} s a "
                             f"full pass (limit {args.bf16_slow_pass_s:g} s)")
        setattr(args, attr, sorted(set(kept)))
    return pr


def triton_skip_reason():
    """Why Liger's Triton kernels cannot run here, or None: they need a GPU driver."""
    try:
        import torch
        if torch.cuda.is_available():
            return None
    except Exception:
        pass
    return "Liger's KL module is a Triton kernel and this machine has no GPU (torch.cuda.is_available() is False)"


def point_cost(wl, p):
    """A point's size, for scaling one point's measured time to the next of its workload."""
    if wl in ("kl_div", "distill_logits"):
        return p["tokens"] * p["vocab"]
    return bf16_gemm_flop(wl, p)


def deadline_skip(args, wl, p, last):
    """Why point p is not started before args.deadline (epoch s; 0: no deadline), or None. last:
    (cost, seconds) of this workload's previous point, scaled by cost; without one a point
    starts while FIRST_POINT_S remain."""
    if not args.deadline:
        return None
    left = args.deadline - time.time()
    est = last[1] * point_cost(wl, p) / last[0] if last else FIRST_POINT_S
    if est <= left:
        return None
    return (f"{left:.0f} s left before this run's deadline (--deadline), the point needs "
            f"~{est:.0f} s" + (" (its workload's previous point, scaled)" if last else ""))


FIRST_POINT_S = 60


def self_test():
    """The time guards' arithmetic without torch (`peers.py --self-test`, ctest's
    test_bench_guard): deadline skips, the bf16 probe's smaller points and skips, child limits.
    Returns the number of failed checks (printed)."""
    bad = []

    def check(cond, what):
        if not cond:
            bad.append(what)
            print(f"peers.py --self-test: FAIL: {what}")

    a = parse(["--dtype", "bf16", "--workloads", "distill_jsd_loss", "--distill-bt", "256,2048"])
    a.deadline = 0  # not $KDLOSS_BENCH_DEADLINE
    p = {"tokens": 1024, "vocab": 32768, "hidden_student": 1024, "hidden_teacher": 2048}
    check(deadline_skip(a, "distill_jsd_loss", p, None) is None, "no deadline: nothing skipped")
    a.deadline = time.time() + 100
    check(deadline_skip(a, "distill_jsd_loss", p, None) is None, "a first point with 100 s left")
    c256 = point_cost("distill_jsd_loss", dict(p, tokens=256))
    check(deadline_skip(a, "distill_jsd_loss", p, (c256, 20.0)) is None, "4 x 20 s fits 100 s")
    why = deadline_skip(a, "distill_jsd_loss", p, (c256, 30.0))
    check(why is not None and "~120 s" in why, f"4 x 30 s does not fit 100 s: {why}")
    a.deadline = time.time() + 30
    check(deadline_skip(a, "distill_jsd_loss", p, None) is not None, "a first point with 30 s left")
    check(30 <= child_timeout(a) <= 30, "a child's limit is at least 30 s and ends at the deadline")
    a.deadline = time.time() + 500
    check(480 <= child_timeout(a) <= 500, "a child's limit ends at the deadline")
    a.deadline = 0
    check(child_timeout(a) == a.timeout, "without a deadline a child gets --timeout")

    def rates(g16, g32):
        return lambda: {"gflops_bf16": g16, "gflops_fp32": g32, "ratio": g16 / g32,
                        "slow": g16 < BF16_SLOW_RATIO * g32, "forced": False}

    # 2 x 32768 x (3 x 1024 + 2048) flop a token: 3 s at 30 GFLOP/s is BT 268 -> 256
    notes = []
    apply_bf16_probe(a, notes, rates(30.0, 100.0))
    check(a.distill_bt == [256], f"slow bf16 at 30 GFLOP/s: BT 256 kept, 2048 -> 256: {a.distill_bt}")
    check(len(notes) == 1 and notes[0].startswith("SMALLER peers distill_jsd_loss bf16 BT 2048 -> 256:"),
          f"the smaller point is named: {notes}")
    a.distill_bt, notes = [256, 2048], []
    apply_bf16_probe(a, notes, rates(2.0, 100.0))  # BT 17: below BF16_MIN_BT
    check(a.distill_bt == [] and len(notes) == 2 and all(n.startswith("SKIP peers distill_jsd_loss bf16 BT ")
                                                        for n in notes), f"2 GFLOP/s: both skipped: {notes}")
    a.distill_bt, notes = [256, 2048], []
    apply_bf16_probe(a, notes, rates(200.0, 100.0))
    check(a.distill_bt == [256, 2048] and not notes, "fast bf16: nothing changes")
    a.dtype, notes = "fp32", []
    apply_bf16_probe(a, notes, rates(2.0, 100.0))
    check(a.distill_bt == [256, 2048] and not notes, "fp32: no probe, nothing changes")
    full = parse([])
    full.deadline = 0
    plain = plan(full)
    full.deadline = time.time() + 100
    turns = plan(full)
    check(sorted(map(repr, plain)) == sorted(map(repr, turns)) and turns[0][0] == DEADLINE_ORDER[0]
          and [j for j in turns if j[0] == "kl_div"] == [j for j in plain if j[0] == "kl_div"],
          "under a deadline the workloads take turns, the fused loss first, each in its order")
    print(f"peers.py --self-test: {'passed' if not bad else f'{len(bad)} failed'}")
    return len(bad)


def guard_setup(args, failed_at):
    """Before the sweep: the bf16 probe's smaller points, Liger's Triton modules marked skipped
    where there is no GPU (in failed_at, so no point tries them). Returns the SKIP / SMALLER
    lines, printed."""
    notes = []
    apply_bf16_probe(args, notes)
    no_triton = triton_skip_reason()
    if no_triton and "liger" in args.providers:
        triton_wls = [w for w in ("kl_div", "distill_logits") if w in args.workloads]
        for w in triton_wls:
            failed_at[(w, "liger")] = ("every point", f"skipped: {no_triton}")
        if triton_wls:
            notes.append(f"SKIP peers liger {', '.join(triton_wls)}: {no_triton}")
    for line in notes:
        print(line, flush=True)
    return notes


def skip_point(args, wl, point, modes, why, results, notes):
    """A point the deadline leaves out: its SKIP line, and a skipped result per provider."""
    ps = point_slug(wl, point)
    notes.append(f"SKIP peers {wl} {ps}: {why}")
    print(notes[-1], flush=True)
    for prov in providers_for(wl, args):
        res = {"status": "skipped", "modes": {}, "skipped": True, "point": point,
               "error": why[:400],
               "observedAt": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        for mode in modes:
            results[(wl, mode, prov, ps)] = res


def child_timeout(args):
    """A child's time limit: --timeout, and never past the deadline (at least 30 s)."""
    if not args.deadline:
        return args.timeout
    return int(max(30, min(args.timeout, args.deadline - time.time())))


# ---------------------------------------------------------------------------------------------------
# parent side: sweeps, records, plots, table
# ---------------------------------------------------------------------------------------------------


def canon(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(obj):
    return "sha256:" + hashlib.sha256(canon(obj).encode()).hexdigest()


def slug(s):
    out = "".join(c.lower() if c.isalnum() else "-" for c in s)
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-")


def cpu_info():
    model, flags = platform.processor() or "unknown cpu", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model in ("unknown cpu", "x86_64", ""):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = line.split(":", 1)[1]
    except OSError:
        pass
    isa = "avx512" if " avx512f" in flags else "avx2" if " avx2" in flags else "sse"
    cores = os.cpu_count() or 1
    mem = 0.0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    except (ValueError, OSError):
        pass
    return {"model": model, "isa": isa, "cores": cores, "memoryGiB": round(mem, 1),
            "slug": f"{slug(model)}-{cores}c"}


def software_versions():
    code = ("import json, platform, torch, numpy\n"
            "v = {'python': platform.python_version(), 'torch': torch.__version__,"
            " 'numpy': numpy.__version__, 'torch_threads': torch.get_num_threads()}\n"
            "try:\n import importlib.metadata as m; v['liger_kernel'] = m.version('liger-kernel')\n"
            "except Exception: v['liger_kernel'] = None\n"
            "try:\n import kdloss; v['kdloss'] = kdloss.version(); v['kdloss_cpu_isa'] = kdloss.cpu_isa()\n"
            "except Exception as e: v['kdloss'] = 'unavailable: ' + str(e)[:100]\n"
            "print(json.dumps(v))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=child_env())
    try:
        v = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        v = {"error": out.stderr[-300:]}
    v["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS")
    v["THP_MEM_ALLOC_ENABLE"] = "1" if THP else None
    return v


def child_env():
    env = dict(os.environ)
    # A fixed glibc mmap threshold: every block >= 4 MiB is its own mapping, returned to the OS
    # when freed, so RSS follows live memory. (By default the threshold drifts up to 32 MiB after
    # frees and mid-size tensors linger in the heap, which made small points read 100+ MB high.
    # Blocks >= 32 MiB, i.e. every big tensor, are mmapped either way, so timings barely move.)
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(4 << 20))
    if THP:
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    return env


THP = False  # --thp: torch's CPU allocator asks for transparent huge pages (every provider)


def point_slug(wl, p):
    if wl in ("kl_div", "distill_logits"):
        return f"tokens{p['tokens']}-vocab{p['vocab']}-{p['dtype']}"
    if wl == "topk_distill":  # kdloss bench's id order: in-id keys sorted, then the dtype
        return f"hidden{p['hidden']}-tokens{p['tokens']}-topk{p['topk']}-vocab{p['vocab']}-{p['dtype']}"
    # seed convention: "hidden" is the teacher's hidden size, the student's is half of it
    return f"hidden{p['hidden_teacher']}-tokens{p['tokens']}-vocab{p['vocab']}-{p['dtype']}"


def workload_obj(wl, p):
    spec = {"benchmark": wl, **{k: v for k, v in p.items()}}
    if wl == "kl_div":
        spec.update(reduction="batchmean",
                    input="randn(BT,V).log_softmax(-1) of a leaf requiring grad",
                    target="randn(BT,V).softmax(-1)")
        title = "KL-divergence loss"
    elif wl == "distill_logits":
        spec.update(divergence="forward_kl", temperature=1.0, reduction="batchmean",
                    student_logits="randn(BT,V), a leaf requiring grad", teacher_logits="randn(BT,V)")
        title = "Distillation loss on logits (forward KL)"
    elif wl == "topk_distill":
        spec.update(student_input="rand(BT,H)", weights="nn.Linear default init, no bias",
                    teacher="per row the top-k ids of log_softmax(5 randn(V)) and their log-probs"
                            " (int32 ids for kdloss, int64 for torch), fp32",
                    labels="none", divergence="forward_kl", tail="bucket", temperature=1.0,
                    weight_soft_loss=1.0, weight_hard_loss=0.0)
        title = "Fused-linear distillation loss, sparse top-k teacher"
    else:
        spec.update(student_input="rand(BT,Hs)", teacher_input="rand(BT,Ht)",
                    weights="nn.Linear default init, no bias; teacher frozen",
                    target="randint(0,V) int64, no ignored rows", beta=0.5, temperature=1.0,
                    weight_hard_loss=0.5, weight_soft_loss=0.5)
        title = "Chunked distillation JSD loss"
    return {"kind": "Workload", "spec": spec,
            "metadata": {"name": f"{wl}-{point_slug(wl, p)}", "title": title},
            "apiVersion": API}


def protocol_obj(mode, args):
    what = {"forward": "the forward pass alone",
            "backward": "loss.backward(retain_graph=True) repeated on one forward's graph",
            "full": "the forward pass plus the backward pass"}[mode]
    return {"kind": "BenchmarkProtocol",
            "spec": {"harness": {"name": "kdloss bench/peers.py", "repository": "kdloss"},
                     "measurement": {"timer": "time.perf_counter_ns", "primaryStatistic": "median",
                                     "warmup": f"full passes for >= {args.warmup_s}s (1-3 runs)"
                                               " per provider",
                                     "interleaving": "timed runs round-robin across providers in"
                                                     f" one process, {args.pause_s}s untimed "
                                                     "pause before each",
                                     "repeats": f"{args.min_reps} (distillation "
                                                f"{min(args.min_reps, args.distill_min_reps)})"
                                                f"..{args.max_reps} timed runs, about "
                                                f"{args.target_s}s per mode",
                                     "memory": "fresh child per (provider, point): VmHWM "
                                               "over a second full pass (high-water mark reset "
                                               "after the first) minus the RSS before any "
                                               "input existed"},
                     "comparability": {
                         "notes": f"Timed: {what}, on the CPU, all providers in one process "
                                  "on the same input tensors, runs interleaved. Median with "
                                  "p20/p80 of the timed runs; gradients reset between runs "
                                  "outside the timed region; no cache flush (every operand "
                                  "exceeds the last-level cache). Comparable only within one "
                                  "workload, timed pass and machine.",
                         "family": "kdloss_cpu_peers"}},
            "metadata": {"name": f"kdloss-peers-cpu-{mode}", "title": f"kdloss CPU peers · {mode}"},
            "apiVersion": API}


def environment_obj(cpu, sw):
    return {"kind": "ExecutionEnvironment",
            "spec": {"hardware": {"vendor": cpu["model"].split()[0].lower(), "product": cpu["model"],
                                  "architecture": platform.machine(), "isa": cpu["isa"],
                                  "cores": cpu["cores"], "memoryGiB": cpu["memoryGiB"]},
                     "software": sw},
            "metadata": {"name": f"kdloss-peers-{cpu['slug']}", "title": f"CPU host · {cpu['model']}"},
            "apiVersion": API}


def record(wl, mode, prov, p, res, cpu, env_obj, args, stamp):
    ps = point_slug(wl, p)
    wobj, pobj = workload_obj(wl, p), protocol_obj(mode, args)
    impl = {"kind": "Implementation",
            "spec": {"provider": prov, **res.get("implementation", {}),
                     "version": env_obj["spec"]["software"].get(
                         {"torch": "torch", "liger": "liger_kernel", "kdloss": "kdloss",
                          "torch_gemms": "torch"}[prov])},
            "apiVersion": API}
    ext = f"{wl}/{mode}/{prov}/{cpu['slug']}/{ps}/{stamp}"
    q = res.get("modes", {}).get(mode)
    # workload and implementation ride inside run.spec (as in `kdloss bench` records) so their
    # digests can be checked; the seed records carry only the digests.
    status = "passed" if q else "skipped" if res.get("status") == "skipped" else "failed"
    spec = {"status": status, "observedAt": res["observedAt"],
            "workload": wobj, "implementation": impl,
            "protocolDigest": digest(pobj), "workloadDigest": digest(wobj),
            "environmentDigest": digest(env_obj), "implementationDigest": digest(impl)}
    native = {"source": "kdloss-bench-peers", "benchmark": f"{wl}/{mode}", "externalId": ext,
              "metrics": {}}
    if q:
        spec["timing"] = {"latencyNs": {"median": round(q["ms_50"] * 1e6)},
                          "primaryStatistic": "median"}
        spec["measurements"] = [
            {"unit": "ns", "value": round(q["ms_20"] * 1e6), "metric": "latency", "statistic": "p20"},
            {"unit": "ns", "value": round(q["ms_80"] * 1e6), "metric": "latency", "statistic": "p80"}]
        if has_peak(res):
            spec["measurements"].append({"unit": "bytes", "value": round(res["peak_mb"] * 2 ** 20),
                                         "metric": "peak_memory", "statistic": "max"})
        native["metrics"] = {**q, "loss": res.get("loss"), "warmup_runs": res.get("warmup_runs"),
                             "warmup_first_ms": res.get("warmup_first_ms")}
        for k in ("peak_mb", "peak_rss_mb", "baseline_rss_mb", "hwm_reset", "memory_error"):
            if k in res and (k != "peak_mb" or has_peak(res)):
                native["metrics"][k] = res[k]
    else:
        spec["error"] = res.get("error", f"mode {mode} not run")
    spec["sourceNative"] = native
    titles = {"kl_div": "KL-divergence loss", "distill_jsd_loss": "Chunked distillation JSD loss",
              "distill_logits": "Distillation loss on logits (forward KL)",
              "topk_distill": "Fused-linear distillation loss, sparse top-k teacher"}
    run = {"kind": "BenchmarkRun", "spec": spec,
           "metadata": {"name": slug(f"kdloss-peers-{wl}-{mode}-{prov}-{cpu['slug']}-{ps}-{stamp}")[:100],
                        "title": f"{titles[wl]} · {prov} · {mode}",
                        "labels": {k: str(v) for k, v in env_obj["spec"]["software"].items()
                                   if k in ("torch", "liger_kernel", "kdloss")}},
           "apiVersion": API}
    return {"run": run, "protocol": pobj, "environment": env_obj}


def run_mem_child(spec, timeout):
    """The memory child's result; status failed (and NaN peaks) if it could not report."""
    nan = float("nan")
    try:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-mem",
                              json.dumps(spec)], capture_output=True, text=True, timeout=timeout,
                             env=child_env())
    except subprocess.TimeoutExpired:
        return {"status": "failed", "error": f"timed out after {timeout}s", "peak_mb": nan}
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        err = (out.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return {"status": "failed", "error": f"child exited {out.returncode}: {err}", "peak_mb": nan}
    return json.loads(lines[-1])


def has_peak(res):
    v = res.get("peak_mb")
    return v is not None and v == v  # not NaN


ALL_MODES = ["forward", "backward", "full"]
# Under a deadline: the fused loss against Liger first, then the KL seed record, top-k, logits.
DEADLINE_ORDER = ("distill_jsd_loss", "kl_div", "topk_distill", "distill_logits")


def plan(args):
    """[(workload, point, modes, min_reps)] for this run. forward/backward run at the points
    named by --kl-all-modes and at BT <= --distill-all-modes-max-bt; full runs everywhere. With
    a --deadline the workloads take turns (the first point of each, then the second, ...), each
    workload's points still in increasing size (deadline_skip scales from the previous one),
    the headline comparison first (DEADLINE_ORDER)."""
    jobs = []
    if "kl_div" in args.workloads:
        for bt, v in args.kl_points:
            modes = ALL_MODES if (bt, v) in args.kl_all_modes else ["full"]
            if args.quick:
                modes = ["full"]
            jobs.append(("kl_div", {"tokens": bt, "vocab": v, "dtype": "fp32"}, modes,
                         args.min_reps))
    if "distill_jsd_loss" in args.workloads:
        for bt in args.distill_bt:
            modes = ALL_MODES if bt <= args.distill_all_modes_max_bt and not args.quick else ["full"]
            jobs.append(("distill_jsd_loss", {"tokens": bt, "hidden_student": args.hs,
                                              "hidden_teacher": args.ht, "vocab": args.vocab,
                                              "dtype": args.dtype}, modes,
                         min(args.min_reps, args.distill_min_reps)))
        for bt in args.large_vocab_bt:  # 256k vocabularies: the same loss, V = --large-vocab
            jobs.append(("distill_jsd_loss", {"tokens": bt, "hidden_student": args.hs,
                                              "hidden_teacher": args.ht, "vocab": args.large_vocab,
                                              "dtype": args.dtype}, ["full"],
                         min(args.min_reps, args.distill_min_reps)))
    if "distill_logits" in args.workloads:
        for bt, v in args.logits_points:
            jobs.append(("distill_logits", {"tokens": bt, "vocab": v, "dtype": "fp32"}, ["full"],
                         args.min_reps))
    if "topk_distill" in args.workloads:
        for bt in args.topk_bt:
            jobs.append(("topk_distill", {"tokens": bt, "hidden": args.topk_hs, "vocab": args.vocab,
                                          "topk": args.topk_k, "dtype": args.dtype}, ["full"],
                         min(args.min_reps, args.distill_min_reps)))
    if args.deadline:  # each workload's first point first: a short budget still covers them all
        by_wl = {w: [] for w in DEADLINE_ORDER}
        for j in jobs:
            by_wl.setdefault(j[0], []).append(j)
        jobs = [q[i] for i in range(max(map(len, by_wl.values()), default=0))
                for q in by_wl.values() if i < len(q)]
    return jobs


def fmt_ms(q):
    if not q:
        return "—"
    return f"{q['ms_50']:.1f} [{q['ms_20']:.1f}–{q['ms_80']:.1f}]" if q["ms_50"] < 100 else \
        f"{q['ms_50']:.0f} [{q['ms_20']:.0f}–{q['ms_80']:.0f}]"


def table(results, all_providers):
    """Markdown tables: one per (workload, mode)."""
    lines = []
    keys = sorted({(wl, mode) for (wl, mode, _, _) in results},
                  key=lambda k: (k[0], ["forward", "backward", "full"].index(k[1])))
    for wl, mode in keys:
        providers = [p for p in all_providers if p in workload_providers(wl)]
        pts = [p for (w, m, _, p) in results if (w, m) == (wl, mode)]
        pts = list(dict.fromkeys(pts))
        head = ["point"] + [f"{p} ms [p20–p80]" for p in providers] + \
               [f"{p} peak MiB" for p in providers] + \
               ["kdloss speed-up vs torch", "vs fastest peer", "torch/kdloss memory", "max loss rel. diff vs torch"]
        lines += [f"\n### {wl} · {mode}\n", "| " + " | ".join(head) + " |",
                  "|" + "---|" * len(head)]
        for p in pts:
            row = [p]
            res = {pr: results.get((wl, mode, pr, p)) for pr in providers}
            qs = {pr: (r or {}).get("modes", {}).get(mode) for pr, r in res.items()}
            row += [fmt_ms(qs[pr]) if qs[pr] else f"{failed_word(res[pr])}: "
                    f"{(res[pr] or {}).get('error', 'not run')[:60]}" for pr in providers]
            row += [f"{res[pr]['peak_mb']:.0f}" if qs[pr] and has_peak(res[pr]) else "—"
                    for pr in providers]
            k = qs.get("kdloss")
            peers = [qs[pr]["ms_50"] for pr in providers if pr not in FLOORS + ("kdloss",) and qs[pr]]
            t = qs.get("torch")
            row.append(f"{t['ms_50'] / k['ms_50']:.2f}x" if k and t else "—")
            row.append(f"{min(peers) / k['ms_50']:.2f}x" if k and peers else "—")
            row.append(f"{res['torch']['peak_mb'] / res['kdloss']['peak_mb']:.1f}x"
                       if k and t and has_peak(res["torch"]) and has_peak(res["kdloss"])
                       and res["kdloss"]["peak_mb"] > 0 else "—")
            ref_loss = (res.get("torch") or {}).get("loss")
            diffs = [abs(res[pr]["loss"] - ref_loss) / max(abs(ref_loss), 1e-30)
                     for pr in providers if pr not in FLOORS + ("torch",) and res[pr]
                     and res[pr].get("loss") is not None
                     and ref_loss is not None]
            row.append(f"{max(diffs):.1e}" if diffs else "—")
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def plots(results, providers, out_dir, kl_bt):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    files = []
    for wl, xkey, xlabel, keep in (
            ("kl_div", "vocab", f"vocabulary V (BT = {kl_bt})", lambda p: p["tokens"] == kl_bt),
            ("distill_jsd_loss", "tokens", "tokens BT", lambda p: True)):
        series, failed = {}, {}
        for (w, mode, prov, ps), res in results.items():
            if w == wl and mode == "full" and not res.get("modes", {}).get("full") \
                    and not res.get("skipped"):
                failed.setdefault(prov, f"{prov}: {res.get('error', 'failed')[:90]}")
            if w != wl or mode != "full" or not res.get("modes", {}).get("full") or not keep(res["point"]):
                continue
            q = res["modes"]["full"]
            series.setdefault(prov, []).append((res["point"][xkey], q,
                                                res["peak_mb"] if has_peak(res) else float("nan")))
        if not series:
            continue
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for prov in providers:
            pts = sorted(series.get(prov, []), key=lambda t: t[0])
            if not pts:
                continue
            xs = [x for x, _, _ in pts]
            med = [q["ms_50"] for _, q, _ in pts]
            lo = [q["ms_50"] - q["ms_20"] for _, q, _ in pts]
            hi = [q["ms_80"] - q["ms_50"] for _, q, _ in pts]
            a1.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=prov)
            a2.plot(xs, [m for _, _, m in pts], marker="o", label=prov)
        for ax, yl in ((a1, "full (fwd+bwd) median ms, p20–p80"), (a2, "peak memory above baseline, MiB")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(yl)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        p = results_point(results, wl)
        shape = (f"fp32, batchmean" if wl == "kl_div" else
                 f"Hs {p['hidden_student']}, Ht {p['hidden_teacher']}, V {p['vocab']}, {p['dtype']}")
        fig.suptitle(f"{wl} · {shape} · {cpu_info()['model']}, {os.cpu_count()} cores")
        if failed:
            fig.text(0.01, 0.01, "did not run: " + "; ".join(failed.values()), fontsize=8,
                     color="dimgray")
        fig.tight_layout(rect=(0, 0.04 if failed else 0, 1, 1))
        path = os.path.join(out_dir, f"peers-{wl}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        files.append(path)
    return files


def results_point(results, wl):
    for (w, _, _, _), res in results.items():
        if w == wl:
            return res["point"]
    return {}


def _full_ms(results, wl, prov, ps):
    r = results.get((wl, "full", prov, ps))
    q = r.get("modes", {}).get("full") if r else None
    return q["ms_50"] if q else None


def targets(results, topk_rss=None):
    """TARGET lines (bench/run_main.sh collects them): MET or NOT MET, never a bare "passed"."""
    lines = ["\n### Targets\n"]
    lines += topk_targets(results, topk_rss)
    k, t = (_full_ms(results, "kl_div", p, "tokens16384-vocab4096-fp32") for p in ("kdloss", "torch"))
    if k and t:
        lines.append(f"TARGET peers kl_div full at the seed shape (BT 16384, V 4096, fp32): kdloss "
                     f"{t / k:.2f}x faster than eager torch (target >= 3x): "
                     f"{'MET' if t / k >= 3 else 'NOT MET'}")
    pts = sorted({ps for (wl, _, _, ps) in results if wl == "distill_jsd_loss"},
                 key=lambda ps: results_point_slug(results, ps)["tokens"])
    for ps in pts:
        k = _full_ms(results, "distill_jsd_loss", "kdloss", ps)
        if not k:
            continue
        lig = _full_ms(results, "distill_jsd_loss", "liger", ps)
        flo = _full_ms(results, "distill_jsd_loss", "torch_gemms", ps)
        # Judged on the median of the per-round ratios (the providers run back to back in each
        # round, so a shared machine's load swings the pairs far less than the medians); the
        # ratio of the medians is printed beside it. bf16: the target is 1.15x of torch's bf16 GEMMs.
        bf16 = results_point_slug(results, ps).get("dtype") == "bf16"
        if lig:
            pr = paired_ratio(results, "distill_jsd_loss", "liger", "kdloss", ps) or lig / k
            lines.append(f"TARGET peers distill full {ps}: kdloss {pr:.2f}x faster than "
                         f"Liger's chunked loss (median of the rounds' ratios; medians "
                         f"{lig / k:.2f}x; target >= 1.25x): {'MET' if pr >= 1.25 else 'NOT MET'}")
        if flo:
            lim = 1.15 if bf16 else 1.10
            pr = paired_ratio(results, "distill_jsd_loss", "kdloss", "torch_gemms", ps) or k / flo
            lines.append(f"TARGET peers distill full {ps}: kdloss {pr:.3f}x the four bare GEMMs "
                         f"in torch (median of the rounds' ratios; medians {k / flo:.3f}x; "
                         f"target <= {lim:.2f}x): {'MET' if pr <= lim else 'NOT MET'}")
        res, tor = (results.get(("distill_jsd_loss", "full", p, ps)) for p in ("kdloss", "torch"))
        # The memory target is for BT >= 2048, where the logits dominate (at small BT the
        # inputs and the runtimes do, for every provider).
        big = results_point_slug(results, ps)["tokens"] >= 2048
        if big and res and tor and has_peak(res) and has_peak(tor) and res["peak_mb"] > 0:
            mem = tor["peak_mb"] / res["peak_mb"]
            lines.append(f"TARGET peers distill full {ps}: {mem:.1f}x less peak memory than eager "
                         f"torch at BT >= 2048 (target >= 4x): {'MET' if mem >= 4 else 'NOT MET'}")
    return "\n".join(lines)


def paired_ratio(results, wl, a, b, ps, mode="full"):
    """Median over the rounds of a's time / b's time in the same round (the runs are interleaved
    round-robin, so each pair saw the same machine load); None when not both timed."""
    ra, rb = (results.get((wl, mode, p, ps)) or {} for p in (a, b))
    ta, tb = (r.get("samples_ns", {}).get(mode) for r in (ra, rb))
    if not ta or not tb or len(ta) != len(tb):
        return None
    import statistics
    return statistics.median(x / y for x, y in zip(ta, tb))


def topk_targets(results, topk_rss):
    """The top-k targets, in this process: the fused top-k loss (forward KL, bucket) within
    1.10x of torch's three bare GEMMs and faster than eager torch; one kdloss call at BT 8192 in
    a fresh process below 1.5 GiB peak RSS. Without kdloss's module only what ran is said."""
    lines = []
    pts = sorted({ps for (wl, _, _, ps) in results if wl == "topk_distill"},
                 key=lambda ps: results_point_slug(results, ps)["tokens"])
    for ps in pts:
        k, t, flo = (_full_ms(results, "topk_distill", p, ps) for p in ("kdloss", "torch", "torch_gemms"))
        if not k:
            err = (results.get(("topk_distill", "full", "kdloss", ps)) or {}).get("error", "not run")
            lines.append(f"(topk_distill {ps}: kdloss not timed in this process: {err[:160]}; "
                         f"eager torch {t and f'{t:.0f} ms'}, torch's three GEMMs "
                         f"{flo and f'{flo:.0f} ms'}; compare with `kdloss bench topk_distill`)")
            continue
        pf = paired_ratio(results, "topk_distill", "kdloss", "torch_gemms", ps)
        pt = paired_ratio(results, "topk_distill", "torch", "kdloss", ps)
        if flo:
            lines.append(f"TARGET peers topk_distill full {ps}: kdloss {k / flo:.3f}x the three "
                         f"bare GEMMs in torch (medians; paired per round {f'{pf:.3f}x' if pf else 'n/a'}) (target <= "
                         f"1.10x): {'MET' if k / flo <= 1.10 else 'NOT MET'}")
        if t:
            lines.append(f"TARGET peers topk_distill full {ps}: kdloss {t / k:.2f}x faster than "
                         f"eager torch (medians; paired per round {f'{pt:.2f}x' if pt else 'n/a'}) (target > 1x): "
                         f"{'MET' if t / k > 1 else 'NOT MET'}")
    if topk_rss and topk_rss["status"] == "passed":
        mib = topk_rss["peak_rss_mb"]
        lines.append(f"TARGET peers topk_distill peak RSS of a PyTorch process doing one kdloss call "
                     f"at {point_slug('topk_distill', topk_rss['point'])}: {mib:.0f} MiB (target < "
                     f"{TOPK_RSS_TARGET_MIB} MiB): {'MET' if mib < TOPK_RSS_TARGET_MIB else 'NOT MET'}")
    elif topk_rss:
        lines.append(f"(topk_distill peak-RSS child: {topk_rss['status']}: "
                     f"{topk_rss.get('error', '')[:160]})")
    return lines


def results_point_slug(results, ps):
    for (w, _, _, p), res in results.items():
        if p == ps:
            return res["point"]
    return {"tokens": 0}


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="seed KL point and distillation BT 256 only, full mode, 3 timed runs")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--workloads", default="kl_div,distill_logits,distill_jsd_loss,topk_distill")
    ap.add_argument("--logits-points", default="4096x32768",
                    help="BTxV list of the divergence family on logits (forward KL)")
    ap.add_argument("--providers", default="torch,liger,kdloss,torch_gemms",
                    help="torch_gemms: the distillation loss's four bare GEMMs in torch (its floor)")
    ap.add_argument("--kl-points", default="16384x4096,4096x4096,4096x8192,4096x16384,4096x32768",
                    help="BTxV list; the V sweep at BT 4096 is plotted, 16384x4096 is the seed shape")
    ap.add_argument("--distill-bt", default="256,512,1024,2048")
    ap.add_argument("--hs", type=int, default=1024)
    ap.add_argument("--ht", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--large-vocab", type=int, default=262144,
                    help="V of the large-vocabulary rows of distill_jsd_loss (Gemma's 262144; "
                         "0: none), measured after its --vocab points, deadline-guarded as they")
    ap.add_argument("--large-vocab-bt", default="2048", help="their BT list")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--topk-bt", default="2048", help="BT list of the sparse top-k teacher loss")
    ap.add_argument("--topk-hs", type=int, default=1024, help="its hidden size (V: --vocab)")
    ap.add_argument("--topk-k", type=int, default=64, help="its teacher slots per row")
    ap.add_argument("--topk-rss-bt", type=int, default=8192,
                    help="BT of the top-k peak-RSS child (one kdloss call in a fresh process; "
                         "0: none)")
    ap.add_argument("--kl-all-modes", default="16384x4096",
                    help="KL points (BTxV) that also get forward and backward modes")
    ap.add_argument("--distill-all-modes-max-bt", type=int, default=256,
                    help="forward and backward modes only up to this BT (full everywhere)")
    ap.add_argument("--thp", action="store_true",
                    help="THP_MEM_ALLOC_ENABLE=1 for every provider: torch's CPU allocator "
                         "madvises huge pages, so fresh big tensors fault 512x fewer pages")
    ap.add_argument("--no-liger-compile", action="store_true",
                    help="run Liger's chunked loss with compiled=False (its default is True)")
    ap.add_argument("--warmup-s", type=float, default=1.0)
    ap.add_argument("--target-s", type=float, default=3.0, help="timed seconds per mode, about")
    ap.add_argument("--min-reps", type=int, default=5)
    ap.add_argument("--distill-min-reps", type=int, default=3,
                    help="fewer timed runs for the GEMM-bound distillation points")
    ap.add_argument("--max-reps", type=int, default=30)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per memory child process")
    ap.add_argument("--deadline", type=float,
                    default=float(os.environ.get("KDLOSS_BENCH_DEADLINE") or 0.0),
                    help="epoch seconds: no point starts that would end after it (estimated from "
                         "the workload's previous point), each skip printed as a SKIP line; "
                         "children never run past it; 0: none. Default $KDLOSS_BENCH_DEADLINE "
                         "(bench/run_main.sh sets it per step, and --deadline for the peers)")
    ap.add_argument("--bf16-slow-pass-s", type=float, default=3.0,
                    help="with --dtype bf16 on a machine where torch's bf16 matmul is slow "
                         "(a timed probe; " + BF16_SLOW_ENV + "=1 forces it): the largest full "
                         "pass a point may need; bigger BTs are measured smaller or skipped")
    ap.add_argument("--pause-s", type=float, default=0.15,
                    help="untimed sleep before each run, so thread pools still spinning from the "
                         "previous provider's call (OpenBLAS: ~0.1 s) are parked")
    ap.add_argument("--self-test", action="store_true",
                    help="check the time guards' arithmetic (no torch needed) and exit")
    ap.add_argument("--child-mem", help=argparse.SUPPRESS)
    ap.add_argument("--child-topk-rss", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child_mem or a.child_topk_rss:
        return a
    a.workloads = a.workloads.split(",")
    a.providers = a.providers.split(",")
    a.kl_points = [tuple(int(x) for x in s.split("x")) for s in a.kl_points.split(",") if s]
    a.logits_points = [tuple(int(x) for x in s.split("x")) for s in a.logits_points.split(",") if s]
    a.distill_bt = [int(x) for x in a.distill_bt.split(",") if x]
    a.topk_bt = [int(x) for x in a.topk_bt.split(",") if x]
    a.large_vocab_bt = [int(x) for x in a.large_vocab_bt.split(",") if x] if a.large_vocab else []
    a.kl_all_modes = [tuple(int(x) for x in s.split("x")) for s in a.kl_all_modes.split(",") if s]
    if a.quick:
        a.kl_points = [(16384, 4096)]
        a.logits_points = [(1024, 32768)]
        a.distill_bt = [256]
        a.topk_bt = [256]
        a.large_vocab_bt = []
        a.topk_rss_bt = 0
        a.min_reps, a.max_reps, a.target_s, a.warmup_s = 3, 5, 1.0, 0.0
    return a


def main(argv):
    global THP
    args = parse(argv)
    if args.self_test:
        return 1 if self_test() else 0
    if args.child_mem:
        print(json.dumps(mem_child(json.loads(args.child_mem))))
        return 0
    if args.child_topk_rss:
        print(json.dumps(topk_rss_child(json.loads(args.child_topk_rss))))
        return 0
    THP = args.thp
    # This process times every provider: same environment as the memory children, set before
    # torch is loaded (it reads it once). OPENBLAS_* are left as the user has them.
    if THP:
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
    os.makedirs(args.out, exist_ok=True)
    cpu, sw = cpu_info(), software_versions()
    env_obj = environment_obj(cpu, sw)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d-%H-%M-%S")
    print(f"# kdloss peers on {cpu['model']} ({cpu['cores']} cores, {cpu['isa']}), "
          f"torch {sw.get('torch')}, liger-kernel {sw.get('liger_kernel')}, kdloss {sw.get('kdloss')} "
          f"({sw.get('kdloss_cpu_isa')})", flush=True)
    results, t_start, failed_at = {}, time.time(), {}
    notes = guard_setup(args, failed_at)  # SKIP / SMALLER lines: what is left out, and why
    last_point = {}  # workload: (cost, seconds) of its last completed point
    for wl, point, modes, min_reps in plan(args):
        ps = point_slug(wl, point)
        why = deadline_skip(args, wl, point, last_point.get(wl))
        if why:
            skip_point(args, wl, point, modes, why, results, notes)
            continue
        t_point = time.time()
        todo = [prov for prov in providers_for(wl, args) if (wl, prov) not in failed_at]
        timing = time_point(wl, point, todo, modes, args, min_reps) if todo else {}
        for prov in providers_for(wl, args):
            if prov not in timing:  # failed at a smaller point (or skipped): not retried
                first, err = failed_at[(wl, prov)]
                res = {"status": "failed", "modes": {}, "skipped": True,
                       "error": f"not run (failed at {first}): {err}"[:400]}
                if err.startswith("skipped: "):  # not tried at all (no Triton here)
                    res.update(status="skipped", error=err[len("skipped: "):][:400])
            else:
                res = timing[prov]
                if res["status"] == "passed":
                    mem = run_mem_child({"workload": wl, "provider": prov, "point": point,
                                         "liger_compiled": not args.no_liger_compile},
                                        child_timeout(args))
                    for k in ("peak_mb", "peak_rss_mb", "baseline_rss_mb", "hwm_reset"):
                        if k in mem:
                            res[k] = mem[k]
                    if mem.get("status") != "passed":
                        res["memory_error"] = mem.get("error", "memory child failed")
                else:
                    failed_at[(wl, prov)] = (ps, res.get("error", ""))
            res["point"] = point
            res["observedAt"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
            summary = ", ".join(f"{m} {fmt_ms(q)} ms" for m, q in res.get("modes", {}).items()) \
                or res.get("error", "")
            mem_s = (f"; peak {res['peak_mb']:.0f} MiB" if has_peak(res) else
                     f"; memory: {res['memory_error']}" if res.get("memory_error") else "")
            print(f"[{time.time() - t_start:6.0f}s] {wl} {ps} {prov}: {summary}{mem_s}", flush=True)
            for mode in modes:
                results[(wl, mode, prov, ps)] = res
                rec = record(wl, mode, prov, point, res, cpu, env_obj, args, stamp)
                path = os.path.join(args.out, f"{wl}-{mode}-{prov}-{ps}.json")
                with open(path, "w") as f:
                    json.dump(rec, f, indent=2)
        last_point[wl] = (point_cost(wl, point), time.time() - t_point)
    topk_rss = None
    if "topk_distill" in args.workloads and args.topk_rss_bt > 0 and "kdloss" in args.providers:
        topk_rss = run_topk_rss(args, notes)
    if topk_rss:
        with open(os.path.join(args.out, f"topk_distill-peak-rss-kdloss-"
                               f"{point_slug('topk_distill', topk_rss['point'])}.json"), "w") as f:
            json.dump(dict(topk_rss, cpu=cpu, software=sw, observedAt=dt.datetime.now(
                dt.timezone.utc).isoformat(timespec="seconds")), f, indent=2)
        print(f"[{time.time() - t_start:6.0f}s] topk_distill peak RSS child at BT "
              f"{args.topk_rss_bt}: " + (f"{topk_rss['peak_rss_mb']:.0f} MiB (baseline "
              f"{topk_rss['baseline_rss_mb']:.0f}, with inputs {topk_rss['inputs_rss_mb']:.0f})"
              if topk_rss["status"] == "passed" else
              f"{topk_rss['status']}: {topk_rss.get('error', '')}"), flush=True)
    pngs = plots(results, args.providers, args.out, kl_bt=4096)
    print(f"\n## kdloss vs peers on {cpu['model']} ({cpu['cores']} cores), "
          f"{time.time() - t_start:.0f} s total; times in ms, median [p20–p80]")
    print(table(results, args.providers))
    print(targets(results, topk_rss))
    print("\nrecords: " + args.out + "/*.json" + ("; plots: " + ", ".join(pngs) if pngs else ""))
    print(f"\nskipped or measured smaller: {len(notes)}" +
          (" (the SKIP / SMALLER lines above)" if notes else ""))
    print()
    print(combined_rows(results))
    bad = sorted({f"{wl}/{prov}" for (wl, _, prov, _), r in results.items()
                  if r.get("status") != "passed" and not expected_failure(wl, prov, r)})
    if topk_rss and topk_rss["status"] == "failed":
        bad.append("topk_distill/kdloss peak-RSS child")
    if bad:
        print("FAILED: " + ", ".join(bad))
        return 1
    return 0


FLOORS = ("torch_gemms",)  # not peers: the GEMMs alone, the floor of a fused-linear loss


def workload_providers(wl):
    """Who can run a workload: the GEMM floor only for the fused-linear losses; no Liger
    equivalent of the sparse top-k teacher loss."""
    return {"kl_div": ("torch", "liger", "kdloss"),
            "distill_logits": ("torch", "liger", "kdloss"),
            "distill_jsd_loss": ("torch", "liger", "kdloss", "torch_gemms"),
            "topk_distill": ("torch", "kdloss", "torch_gemms")}[wl]


def providers_for(wl, args):
    """The providers a workload runs (those asked for that can run it)."""
    return [p for p in args.providers if p in workload_providers(wl)]


def expected_failure(wl, prov, res):
    """Liger's KL module is a Triton kernel: without a GPU it cannot run, and that is recorded,
    not counted as a failure. Its chunked distillation loss is plain torch and must run. A
    provider this build does not have (kdloss's top-k module before its binding exists) is
    recorded as unavailable, not as a failure."""
    return (prov == "liger" and wl in ("kl_div", "distill_logits")) or \
        "ProviderUnavailable" in res.get("error", "") or res.get("status") == "skipped"


def failed_word(res):
    if (res or {}).get("status") == "skipped":
        return "skipped"
    return "unavailable" if "ProviderUnavailable" in (res or {}).get("error", "") else "failed"


def combined_rows(results):
    """Rows for bench/run_main.sh's combined table, in `kdloss bench`'s column order. The
    implementation column names the provider (torch, liger, kdloss-py: the PyTorch module);
    RSS_MiB is the peak above the child's baseline (see the protocol), GB/s and stream are not
    measured here."""
    names = {"kl_div": "kl_div", "distill_jsd_loss": "distill_jsd", "topk_distill": "topk_distill",
             "distill_logits": "dist_logits"}
    impl = {"torch": "torch", "liger": "liger", "kdloss": "kdloss-py", "torch_gemms": "torch-gemm"}
    out = [f"{'kernel':<12} {'mode':<8} {'BT':>8} {'V':>7} {'dtype':<5} {'isa':<9} "
           f"{'median_ms':>10} {'p20_ms':>10} {'p80_ms':>10} {'GB/s':>8} {'stream':>6} "
           f"{'RSS_MiB':>8} {'loss':>13}  note"]
    for (wl, mode, prov, ps), r in sorted(results.items(), key=lambda kv: (
            kv[0][0], ALL_MODES.index(kv[0][1]), kv[1]["point"]["tokens"],
            kv[1]["point"]["vocab"], kv[0][2])):
        p, q = r["point"], r.get("modes", {}).get(mode)
        head = (f"{names[wl]:<12} {mode:<8} {p['tokens']:>8} {p['vocab']:>7} {p['dtype']:<5} "
                f"{impl[prov]:<9} ")
        note = "peers.py" + (f", Hs {p['hidden_student']} Ht {p['hidden_teacher']}"
                             if wl == "distill_jsd_loss" else
                             f", H {p['hidden']} K {p['topk']} bucket" if wl == "topk_distill"
                             else "") + ", RSS above baseline"
        if q:
            loss = r.get("loss")
            peak = f"{r['peak_mb']:.0f}" if has_peak(r) else "-"
            loss_s = f"{loss:.7g}" if loss is not None else "-"
            out.append(head + f"{q['ms_50']:>10.3f} {q['ms_20']:>10.3f} {q['ms_80']:>10.3f} "
                       f"{'-':>8} {'-':>6} {peak:>8} {loss_s:>13}  {note}")
        else:
            out.append(head + f"{'-':>10} {'-':>10} {'-':>10} {'-':>8} {'-':>6} {'-':>8} "
                       f"{'-':>13}  {failed_word(r)}: {r.get('error', '')[:80]}")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
