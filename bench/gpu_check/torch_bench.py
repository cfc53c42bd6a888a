"""Peer timings for bench/gpu_check.sh: eager torch and Liger-Kernel on the same two workloads
(forward + backward, do_bench median/p20/p80 with L2 flushing, peak memory allocated with the
inputs included), following bench/README.md's reference workloads. Written for this repository; it only calls
the public APIs of torch and liger_kernel.

Usage: python3 torch_bench.py out.json
Each workload is optional: a failure (missing package, API mismatch, out of memory) is recorded
in the JSON and the others still run.
"""
import json
import math
import sys
import time
import traceback

import torch
import torch.nn.functional as F

DEV = "cuda"
results = []


def bench(fn, grad_to_none, rep_ms):
    """(median, p20, p80) in ms, and peak MB allocated during one call (inputs included)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 1e6
    try:
        from triton.testing import do_bench

        q = do_bench(fn, warmup=max(25, rep_ms // 10), rep=rep_ms, grad_to_none=grad_to_none,
                     quantiles=[0.5, 0.2, 0.8])
        return q[0], q[1], q[2], peak
    except ImportError:
        pass
    cache = torch.empty(256 << 20, dtype=torch.int8, device=DEV)
    ts = []
    for _ in range(3):
        fn()
    for _ in range(10):
        for g in grad_to_none or []:
            g.grad = None
        cache.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    pick = lambda q: ts[min(len(ts) - 1, int(round(q * (len(ts) - 1))))]
    return pick(0.5), pick(0.2), pick(0.8), peak


def record(name, fn, grad_to_none, rep_ms):
    t0 = time.time()
    try:
        med, p20, p80, peak = bench(fn, grad_to_none, rep_ms)
        results.append({"name": name, "ms": med, "p20": p20, "p80": p80, "mem_mb": peak})
        print(f"{name:44s} {med:9.3f} ms  [p20 {p20:.3f}, p80 {p80:.3f}]  mem {peak:7.0f} MB"
              f"  ({time.time() - t0:.0f} s)", flush=True)
    except Exception as e:  # noqa: BLE001 - a peer failing must not stop the others
        results.append({"name": name, "error": f"{type(e).__name__}: {e}"[:300]})
        print(f"{name:44s} FAILED: {type(e).__name__}: {str(e)[:200]}", flush=True)
        traceback.print_exc(limit=2)
    torch.cuda.empty_cache()


def kl_workloads():
    bt, v = 16384, 4096
    x0 = torch.randn(bt, v, device=DEV, requires_grad=True)
    target = torch.randn(bt, v, device=DEV).softmax(-1)

    def torch_kl():
        F.kl_div(torch.log_softmax(x0, -1), target, reduction="batchmean").backward()

    record("torch kl_div full 16384x4096 fp32", torch_kl, [x0], 200)
    try:
        from liger_kernel.transformers.kl_div import LigerKLDIVLoss

        lk = LigerKLDIVLoss(reduction="batchmean")

        def liger_kl():
            lk(torch.log_softmax(x0, -1), target).backward()

        record("liger kl_div full 16384x4096 fp32", liger_kl, [x0], 200)
    except ImportError as e:
        results.append({"name": "liger kl_div", "error": f"not installed: {e}"})
        print("liger kl_div: not installed")
    del x0, target


def distill_workloads():
    bt, hs, ht, v = 8192, 2048, 4096, 128256
    beta, temp, wh, wsft, ignore = 0.5, 1.0, 0.5, 0.5, -100
    bf = torch.bfloat16
    xs = torch.rand(bt, hs, device=DEV, dtype=bf, requires_grad=True)
    ws = torch.nn.Linear(hs, v, bias=False, device=DEV, dtype=bf).weight
    xt = torch.rand(bt, ht, device=DEV, dtype=bf)
    wt = torch.nn.Linear(ht, v, bias=False, device=DEV, dtype=bf).weight.detach()
    labels = torch.randint(0, v, (bt,), device=DEV)
    lb, l1b = math.log(beta), math.log1p(-beta)

    def torch_distill():
        zs = (xs @ ws.t()).float()
        zt = (xt @ wt.t()).float()
        lq = torch.log_softmax(zs / temp, -1)
        lp = torch.log_softmax(zt / temp, -1)
        lm = torch.logaddexp(lp + lb, lq + l1b)
        jsd = beta * (lp.exp() * (lp - lm)).sum() + (1 - beta) * (lq.exp() * (lq - lm)).sum()
        ce = F.cross_entropy(zs, labels, ignore_index=ignore, reduction="sum")
        n = (labels != ignore).sum().clamp(min=1)
        ((wh * ce + wsft * jsd) / n).backward()

    record("torch distill_jsd full seed bf16", torch_distill, [xs, ws], 1500)
    try:
        from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss

        mod = LigerFusedLinearJSDLoss(weight_hard_loss=wh, weight_soft_loss=wsft, beta=beta,
                                      ignore_index=ignore, temperature=temp)

        def liger_distill():
            try:
                out = mod(xs, ws, xt, wt, labels, None, None)
            except TypeError:
                out = mod(xs, ws, xt, wt, labels)
            out.backward()

        record("liger distill_jsd full seed bf16", liger_distill, [xs, ws], 1500)
    except ImportError as e:
        results.append({"name": "liger distill_jsd", "error": f"not installed: {e}"})
        print("liger distill_jsd: not installed")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "torch_bench.json"
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}", flush=True)
    try:
        import liger_kernel  # noqa: F401

        print("liger_kernel present", flush=True)
    except ImportError:
        print("liger_kernel absent (carry wheels in .whl/ to compare)", flush=True)
    for part in (kl_workloads, distill_workloads):
        try:
            part()
        except Exception as e:  # noqa: BLE001
            results.append({"name": part.__name__, "error": f"{type(e).__name__}: {e}"[:300]})
            traceback.print_exc(limit=3)
        torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump({"results": results}, f, indent=1)


if __name__ == "__main__":
    main()
