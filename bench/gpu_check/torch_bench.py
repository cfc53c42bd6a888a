"""Python timings for bench/gpu_check.sh: kdloss through kdloss.torch with its default arguments
(what users get), eager torch and Liger-Kernel, on the same inputs and the same timed work
(forward + backward; do_bench median/p20/p80 with L2 flushing; peak memory allocated during one
call, the inputs included), on the two seed workloads of bench/README.md:
  - KL 16384 x 4096 fp32, batchmean, twice: from log-probs on every side (the student's ready
    log-probs are the leaf; F.kl_div, LigerKLDIVLoss, kdloss.torch.KLDivLoss) and from logits on
    every side (the student's logits are the leaf, the teacher's logits given; log_softmax inside
    the timed work of torch and Liger, kdloss.torch.DistillLoss(divergence="forward_kl") alone);
  - fused-linear JSD at the seed shape, bf16 (eager torch, LigerFusedLinearJSDLoss,
    kdloss.torch.FusedLinearJSDLoss), loss + dxs + dws.
The C bench (gpu_bench.cu) times the same KL workloads and the fused loss through the C API.
Written for this repository; it only calls the public APIs of torch, liger_kernel and kdloss.

Usage: python3 torch_bench.py out.json [--dry-run]
--dry-run (no GPU): every workload at a tiny shape on the CPU, each timed once, Liger only
imported (its kernels are Triton, GPU only): checks that the script runs as written.
A failure (missing package, API mismatch, out of memory) is recorded in the JSON and the others
still run; the exit code is 1 when a kdloss row failed (in the dry run: any row but Liger's).
"""
import json
import math
import sys
import time
import traceback

import torch
import torch.nn.functional as F

DRY = "--dry-run" in sys.argv
DEV = "cpu" if DRY else "cuda"
results = []


def bench(fn, grad_to_none, rep_ms):
    """(median, p20, p80) in ms, and peak MB allocated during one call (inputs included)."""
    if DRY:  # one timed call on the CPU: the script runs as written
        t0 = time.perf_counter()
        fn()
        ms = (time.perf_counter() - t0) * 1e3
        return ms, ms, ms, 0.0
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
        print(f"{name:56s} {med:9.3f} ms  [p20 {p20:.3f}, p80 {p80:.3f}]  mem {peak:7.0f} MB"
              f"  ({time.time() - t0:.0f} s)", flush=True)
    except Exception as e:  # noqa: BLE001 - a peer failing must not stop the others
        results.append({"name": name, "error": f"{type(e).__name__}: {e}"[:300]})
        print(f"{name:56s} FAILED: {type(e).__name__}: {str(e)[:200]}", flush=True)
        traceback.print_exc(limit=2)
    if not DRY:
        torch.cuda.empty_cache()


def liger(name):
    """liger_kernel's `name` (a dotted path), or None with an error row when it is absent; in
    the dry run only imported."""
    mod, _, attr = name.rpartition(".")
    try:
        obj = getattr(__import__(mod, fromlist=[attr]), attr)
    except (ImportError, AttributeError) as e:
        results.append({"name": "liger " + attr, "error": f"not installed: {e}"})
        print(f"liger {attr}: not available ({e})")
        return None
    if DRY:
        print(f"liger {attr}: imported (not run on the CPU)")
        return None
    return obj


def kl_workloads():
    import kdloss.torch as kt

    bt, v = (64, 128) if DRY else (16384, 4096)
    shape = f"{bt}x{v} fp32"
    # from log-probs: the leaf is the student's log-probs; the target is probabilities
    lp = torch.log_softmax(torch.randn(bt, v, device=DEV), -1).requires_grad_(True)
    target = torch.randn(bt, v, device=DEV).softmax(-1)
    record(f"torch kl_div from log-probs {shape}",
           lambda: F.kl_div(lp, target, reduction="batchmean").backward(), [lp], 200)
    kd = kt.KLDivLoss(reduction="batchmean")  # the seed workload's reduction, else defaults
    record(f"kdloss.torch KLDivLoss from log-probs {shape}",
           lambda: kd(lp, target).backward(), [lp], 200)
    lk_cls = liger("liger_kernel.transformers.kl_div.LigerKLDIVLoss")
    if lk_cls is not None:
        lk = lk_cls(reduction="batchmean")
        record(f"liger kl_div from log-probs {shape}", lambda: lk(lp, target).backward(), [lp], 200)
    del lp, target
    # from logits: the leaf is the student's logits, the teacher's logits are given; T = 1
    zs = torch.randn(bt, v, device=DEV).requires_grad_(True)
    zt = torch.randn(bt, v, device=DEV)
    record(f"torch kl_div from logits {shape}",
           lambda: F.kl_div(torch.log_softmax(zs, -1), torch.log_softmax(zt, -1),
                            reduction="batchmean", log_target=True).backward(), [zs], 200)
    dl = kt.DistillLoss(divergence="forward_kl")  # defaults: batchmean, T 1
    record(f"kdloss.torch DistillLoss forward_kl from logits {shape}",
           lambda: dl(zs, zt).backward(), [zs], 200)
    if lk_cls is not None:
        lk2 = lk_cls(reduction="batchmean", log_target=True)
        record(f"liger kl_div from logits {shape}",
               lambda: lk2(torch.log_softmax(zs, -1), torch.log_softmax(zt, -1)).backward(),
               [zs], 200)
    del zs, zt


def distill_workloads():
    import kdloss.torch as kt

    bt, hs, ht, v = (32, 16, 24, 256) if DRY else (8192, 2048, 4096, 128256)
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

    record("torch distill_jsd seed bf16", torch_distill, [xs, ws], 1500)
    kd = kt.FusedLinearJSDLoss()  # defaults: weights 0.5 / 0.5, beta 0.5, T 1, ignore -100
    record("kdloss.torch FusedLinearJSDLoss seed bf16",
           lambda: kd(xs, ws, xt, wt, labels).backward(), [xs, ws], 1500)
    cls = liger("liger_kernel.chunked_loss.LigerFusedLinearJSDLoss")
    if cls is not None:
        mod = cls(weight_hard_loss=wh, weight_soft_loss=wsft, beta=beta, ignore_index=ignore,
                  temperature=temp)

        def liger_distill():
            try:
                out = mod(xs, ws, xt, wt, labels, None, None)
            except TypeError:
                out = mod(xs, ws, xt, wt, labels)
            out.backward()

        record("liger distill_jsd seed bf16", liger_distill, [xs, ws], 1500)


def main():
    args = [a for a in sys.argv[1:] if a != "--dry-run"]
    out = args[0] if args else "torch_bench.json"
    where = "the CPU (dry run)" if DRY else torch.cuda.get_device_name(0)
    print(f"torch {torch.__version__} on {where}", flush=True)
    try:
        import liger_kernel  # noqa: F401

        print("liger_kernel present", flush=True)
    except ImportError:
        print("liger_kernel absent (carry its wheel in .whl/: bench/gpu_check/NOTES.md)",
              flush=True)
    for part in (kl_workloads, distill_workloads):
        try:
            part()
        except Exception as e:  # noqa: BLE001
            results.append({"name": part.__name__, "error": f"{type(e).__name__}: {e}"[:300]})
            traceback.print_exc(limit=3)
        if not DRY:
            torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump({"results": results}, f, indent=1)
    # exit 1 when a kdloss row failed, or in the dry run any row but Liger's (only imported)
    bad = [r["name"] for r in results if "error" in r and
           (not r["name"].startswith("liger") or not r["error"].startswith("not installed"))
           and (DRY or not r["name"].startswith(("liger", "torch")))]
    if bad:
        print("failed: " + ", ".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
