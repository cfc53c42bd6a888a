"""bench/gpu_check.sh's Python check: every kdloss loss through kdloss.torch on tensors of
--device (cuda on the GPU machine) against the CPU backend on the same inputs: forward and
backward, fp32 and bf16, labels with ignored rows, the top-k teacher, a logit map, per-token
weights, several teachers, and torch.compile of one loss. Fresh random inputs each run (the seed is printed).

Usage: python3 cuda_vs_cpu.py [--device cuda|cpu] [--no-compile]
--device cpu (the dry run, no GPU): the same calls, both sides on the CPU, which checks that
every case runs as written (names, arguments, shapes) before a GPU is at hand.
Exit code 0 only when every case ran and agreed; one line per case, then "N of M cases agree".
"""
import argparse
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

import kdloss
from kdloss.torch import functional as KF

BT, V, HS, HT, K = 64, 1000, 64, 96, 8
IGNORE = -100


def labels(gen, bt, v, device):
    lab = torch.randint(0, v, (bt,), generator=gen)
    lab[torch.randperm(bt, generator=gen)[: bt // 4]] = IGNORE  # a quarter of the rows ignored
    return lab.to(device)


def inputs(case, dtype, gen):
    """The case's tensors on the CPU (leaves that need grad are marked by the case)."""
    randn = lambda *s, scale=1.0: (torch.randn(*s, generator=gen) * scale).to(dtype)
    if case in ("kl_div", "jsd"):
        lq = torch.log_softmax(randn(BT, V, scale=3.0).float(), -1).to(dtype)
        lp = torch.log_softmax(randn(BT, V, scale=2.0).float(), -1).to(dtype)
        return {"s": lq, "t": lp, "lab": labels(gen, BT, V, "cpu")}
    if case in ("distill_fkl", "distill_jsd", "topk"):
        zs, zt = randn(BT, V, scale=3.0), randn(BT, V, scale=2.0)
        lp = torch.log_softmax(zt.float(), -1)
        vals, ids = lp.topk(K, -1)
        return {"s": zs, "t": zt, "lab": labels(gen, BT, V, "cpu"), "ids": ids,
                "tlp": vals}
    xs, xt = randn(BT, HS), randn(BT, HT)
    ws, wt = randn(V, HS, scale=HS ** -0.5), randn(V, HT, scale=HT ** -0.5)
    tlp, ids = torch.log_softmax((xt.float() @ wt.float().T), -1).topk(K, -1)
    tw = torch.rand(BT, generator=gen) * 2.0
    tw[::7] = 0.0  # rows of weight 0 are ignored
    tidx = (torch.arange(BT) // 8) % 2  # two teachers, a run of 8 rows each
    return {"xs": xs, "ws": ws, "xt": xt, "wt": wt, "lab": labels(gen, BT, V, "cpu"),
            "ids": ids, "tlp": tlp, "wt2": randn(V, HT, scale=2.0 * HT ** -0.5), "tw": tw,
            "tidx": tidx}


def loss_of(case, t):
    """The loss of `case` on tensors t (any device); the inputs it differentiates are t's
    "s" (or "xs" and "ws")."""
    if case == "kl_div":
        return KF.kl_div(t["s"], t["t"], reduction="batchmean", log_target=True)
    if case == "jsd":
        return KF.jsd(t["s"], t["t"], t["lab"], beta=0.3)
    if case == "distill_fkl":
        return KF.distill_loss(t["s"], t["t"], t["lab"], divergence="forward_kl", temperature=2.0)
    if case == "distill_jsd":
        return KF.distill_loss(t["s"], t["t"], t["lab"], divergence="jsd", beta=0.5)
    if case == "topk":
        return KF.topk_distill_loss(t["s"], t["ids"], t["tlp"], t["lab"], tail="renorm_both")
    if case == "fused_jsd":
        return KF.fused_linear_jsd_loss(t["xs"], t["ws"], t["xt"], t["wt"], t["lab"])
    if case == "fused_softcap":
        return KF.fused_linear_distill_loss(t["xs"], t["ws"], t["xt"], t["wt"], t["lab"],
                                            divergence="forward_kl", student_softcap=30.0,
                                            teacher_softcap=30.0, student_logit_scale=0.9)
    if case == "fused_topk":
        return KF.fused_linear_topk_distill_loss(t["xs"], t["ws"], t["ids"], t["tlp"], t["lab"],
                                                 weight_hard_loss=0.5, weight_soft_loss=0.5)
    if case == "fused_weights":  # per-token weights and the entropy (docs/MATH.md section 12)
        loss, ent = KF.fused_linear_distill_loss(t["xs"], t["ws"], t["xt"], t["wt"], t["lab"],
                                                 divergence="reverse_kl", token_weights=t["tw"],
                                                 return_entropy=True)
        return loss + ent.mean()  # the entropy (no gradient) compared through the loss's value
    if case == "fused_multi":  # several teachers (docs/MATH.md section 13)
        return KF.fused_linear_distill_loss(t["xs"], t["ws"], t["xt"], [t["wt"], t["wt2"]],
                                            t["lab"], teacher_index=t["tidx"])
    raise ValueError(case)


GRADS = {"kl_div": ("s",), "jsd": ("s",), "distill_fkl": ("s",), "distill_jsd": ("s",),
         "topk": ("s",), "fused_jsd": ("xs", "ws"), "fused_softcap": ("xs", "ws"),
         "fused_topk": ("xs", "ws"), "fused_weights": ("xs", "ws"), "fused_multi": ("xs", "ws")}


def run_on(case, base, device, compiled=False):
    t = {k: v.detach().clone().to(device) for k, v in base.items()}
    for k in GRADS[case]:
        t[k].requires_grad_(True)
    f = torch.compile(lambda tt: loss_of(case, tt), dynamic=False) if compiled else \
        (lambda tt: loss_of(case, tt))
    loss = f(t)
    loss.backward()
    return loss.detach().float().cpu(), {k: t[k].grad.detach().float().cpu() for k in GRADS[case]}


def close(a, b, dtype):
    """max |a - b| relative to max |b|, and whether it is within the dtype's tolerance: fp32
    sums in another order (1e-4); bf16 outputs are rounded to 8 bits (2^-7 of the largest)."""
    scale = max(float(b.abs().max()), 1e-30)
    err = float((a - b).abs().max()) / scale
    return err, err <= (1e-4 if dtype == torch.float32 else 1.6e-2)


def check(case, dtype, device, gen, compiled=False):
    base = inputs(case, dtype, gen)
    l_dev, g_dev = run_on(case, base, device, compiled)
    l_cpu, g_cpu = run_on(case, base, "cpu")
    errs = [close(l_dev, l_cpu, torch.float32)]
    errs += [close(g_dev[k], g_cpu[k], dtype) for k in GRADS[case]]
    ok = all(e[1] for e in errs) and bool(torch.isfinite(l_dev).all())
    worst = max(e[0] for e in errs)
    return ok, f"loss {float(l_dev):.6g} (cpu {float(l_cpu):.6g}), worst rel diff {worst:.2e}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    info = kdloss.cuda_info()
    print(f"kdloss {kdloss.version()} from {kdloss.library_path()}; cuda_info: {info}")
    print(f"torch {torch.__version__}, device {a.device}, seed {seed}", flush=True)
    if a.device.startswith("cuda") and not info["available"]:
        print("FAIL: the CUDA backend is not available: " + info["reason"])
        return 1
    cases = [(c, d, False) for c in GRADS for d in (torch.float32, torch.bfloat16)]
    if not a.no_compile:
        cases.append(("distill_fkl", torch.float32, True))
    passed = 0
    for case, dtype, compiled in cases:
        name = f"{case} {str(dtype).replace('torch.', '')}{' torch.compile' if compiled else ''}"
        t0 = time.time()
        try:
            ok, msg = check(case, dtype, a.device, gen, compiled)
        except Exception as e:  # noqa: BLE001 - report every case
            ok, msg = False, f"{type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc(limit=3)
        passed += ok
        print(f"{'ok  ' if ok else 'FAIL'} {name:36s} {msg} ({time.time() - t0:.1f} s)",
              flush=True)
    print(f"{passed} of {len(cases)} cases agree")
    return 0 if passed == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
