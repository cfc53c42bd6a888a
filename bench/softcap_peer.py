"""The fused loss with a softcap on both heads (kdloss.torch.FusedLinearJSDLoss with
student_softcap / teacher_softcap) against eager torch applying the same map to materialized
logits (TRL's chunked path does this per chunk), in one process, paired per round; BENCHMARKS.md,
"Logit maps". Run: KDLOSS_LIBRARY=build/libkdloss.so PYTHONPATH=python venv/bin/python
bench/softcap_peer.py"""
import time, statistics, torch
from kdloss.torch import FusedLinearJSDLoss
torch.manual_seed(0)
BT, HS, HT, V, CAP = 512, 2048, 2048, 32768, 30.0
xs = torch.randn(BT, HS); ws = torch.randn(V, HS) / HS**0.5
xt = torch.randn(BT, HT); wt = torch.randn(V, HT) / HT**0.5
y = torch.randint(0, V, (BT,))
def torch_loss(xs, ws):
    zs = CAP * torch.tanh(xs @ ws.T / CAP); zt = CAP * torch.tanh(xt @ wt.T / CAP)
    lq = torch.log_softmax(zs, -1); lp = torch.log_softmax(zt, -1)
    lm = torch.logsumexp(torch.stack([lq + torch.log(torch.tensor(0.5)), lp + torch.log(torch.tensor(0.5))]), 0)
    jsd = 0.5 * (lp.exp() * (lp - lm)).sum(-1) + 0.5 * (lq.exp() * (lq - lm)).sum(-1)
    ce = torch.nn.functional.cross_entropy(zs, y, reduction="none")
    return (0.5 * ce + 0.5 * jsd).mean()
kd = FusedLinearJSDLoss(student_softcap=CAP, teacher_softcap=CAP)
kd0 = FusedLinearJSDLoss()
def run(f):
    a, b = xs.clone().requires_grad_(), ws.clone().requires_grad_()
    t0 = time.perf_counter(); l = f(a, b); l.backward(); return time.perf_counter() - t0, float(l)
fk = lambda a, b: kd(a, b, xt, wt, y)
f0 = lambda a, b: kd0(a, b, xt, wt, y)
run(fk); run(torch_loss); run(f0)
tk, tt, r, t0s, r0 = [], [], [], [], []
for _ in range(7):
    a, lk = run(fk); b, lt = run(torch_loss); c, _ = run(f0)
    tk.append(a); tt.append(b); r.append(b / a); t0s.append(c); r0.append(a / c)
print(f"kdloss without maps median {statistics.median(t0s)*1e3:.0f} ms; with / without paired {statistics.median(r0):.3f}")
print(f"BT {BT} Hs {HS} Ht {HT} V {V} fp32 softcap {CAP} both heads: kdloss median {statistics.median(tk)*1e3:.0f} ms, eager torch {statistics.median(tt)*1e3:.0f} ms, paired torch/kdloss {statistics.median(r):.2f}x; losses {lk:.6f} vs {lt:.6f}")
