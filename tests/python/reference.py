"""float64 reference losses written from docs/MATH.md (sections 2-4), never from a
peer's code. Gradients come from torch.autograd on these float64 formulas, which is exactly the
"log-probs as free variables" gradient docs/MATH.md states (checked in test_reference_formulas)."""

import math

import torch


def kl_elem(y, t, log_target, eps=1e-10):
    """Elementwise KL(t || exp y) (section 2). t == 0 (or t == -inf when log_target) adds 0."""
    if log_target:
        live = t > -math.inf
        tt = torch.where(live, t, torch.zeros_like(t))
        return torch.where(live, tt.exp() * (tt - y), torch.zeros_like(y))
    live = t != 0
    return torch.where(live, t * (torch.log(torch.clamp(t, min=eps)) - y), torch.zeros_like(y))


def kl(y, t, reduction, log_target, eps=1e-10):
    """y, t: (..., V) float64. 'batchmean' divides by the number of rows (prod of leading dims)."""
    e = kl_elem(y, t, log_target, eps)
    if reduction == "none":
        return e
    s = e.sum()
    if reduction == "sum":
        return s
    if reduction == "mean":
        return s / e.numel()
    return s / (e.numel() // e.shape[-1])


def jsd_rows(x, y, beta):
    """Per-row JSD(beta) of student log-probs x and teacher log-probs y (section 3)."""
    q, p = x.exp(), y.exp()
    if beta == 0:
        return (p * (y - x)).sum(-1)
    if beta == 1:
        return (q * (x - y)).sum(-1)
    log_m = torch.logaddexp(math.log(beta) + y, math.log(1 - beta) + x)
    return beta * (p * (y - log_m)).sum(-1) + (1 - beta) * (q * (x - log_m)).sum(-1)


def jsd(x, y, beta, labels=None, ignore_index=-100):
    v = x.shape[-1]
    rows = jsd_rows(x.reshape(-1, v), y.reshape(-1, v), beta)
    if labels is None:
        return rows.sum() / rows.numel()
    mask = labels.reshape(-1) != ignore_index
    n = int(mask.sum())
    if n == 0:
        return rows.sum() * 0.0
    return (rows * mask).sum() / n


def fused_linear_jsd_loss(xs, ws, xt, wt, labels, bs=None, bt=None, w_hard=0.5, w_soft=0.5,
                          beta=0.5, ignore_index=-100, temperature=1.0):
    """(loss, soft, hard) of section 4, with full float64 logits. labels None: every row valid."""
    hs, ht = ws.shape[1], wt.shape[1]
    zs = xs.reshape(-1, hs) @ ws.T
    zt = xt.reshape(-1, ht) @ wt.T
    if bs is not None:
        zs = zs + bs
    if bt is not None:
        zt = zt + bt
    if labels is None:
        labels = torch.zeros(zs.shape[0], dtype=torch.long)
    labels = labels.reshape(-1)
    mask = labels != ignore_index
    n = max(1, int(mask.sum()))
    safe = torch.where(mask, labels, torch.zeros_like(labels))
    ce = torch.logsumexp(zs, -1) - zs.gather(1, safe[:, None])[:, 0]
    hard = (ce * mask).sum() / n
    x = torch.log_softmax(zs / temperature, -1)
    y = torch.log_softmax(zt / temperature, -1)
    soft = (jsd_rows(x, y, beta) * mask).sum() / n
    return w_hard * hard + w_soft * soft, soft, hard
