"""float64 reference losses written from docs/MATH.md (sections 2-4, 7, 8), never from a
peer's code or the library's. Gradients come from torch.autograd on these float64 formulas, which
is exactly the "log-probs as free variables" gradient docs/MATH.md states (checked in
test_reference_formulas; the top-k one in test_topk.py)."""

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
    """y, t: (..., V) float64. 'batchmean' divides by y.shape[0], as torch (B for (B, T, V))."""
    e = kl_elem(y, t, log_target, eps)
    if reduction == "none":
        return e
    s = e.sum()
    if reduction == "sum":
        return s
    if reduction == "mean":
        return s / e.numel()
    return s / e.shape[0]


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


# ---- the divergence family (section 7) -----------------------------------------------------------

def _kl(lp, lq):
    """sum p (log p - log q) over the last dim, 0 log 0 = 0 (float64)."""
    p = lp.exp()
    return torch.where(p > 0, p * (lp - lq), torch.zeros_like(p)).sum(-1)


def _mix(lp, lq, w):
    """log(w P + (1-w) Q)."""
    a = lp + math.log(w) if w > 0 else torch.full_like(lp, -math.inf)
    b = lq + math.log1p(-w) if w < 1 else torch.full_like(lq, -math.inf)
    return torch.logaddexp(a, b)


def div_rows(lp, lq, div, beta=0.5, alpha=0.1):
    """Per-row divergence of teacher log-probs lp (P) and student log-probs lq (Q) over the last
    dim: forward_kl KL(P||Q), reverse_kl KL(Q||P), jsd (beta; 0 and 1 are the two KLs),
    skew_forward_kl KL(P || alpha P + (1-alpha) Q), skew_reverse_kl KL(Q || alpha Q + (1-alpha) P),
    tvd 1/2 sum |P - Q|."""
    if div == "forward_kl" or (div == "jsd" and beta == 0.0):
        return _kl(lp, lq)
    if div == "reverse_kl" or (div == "jsd" and beta == 1.0):
        return _kl(lq, lp)
    if div == "jsd":
        lm = _mix(lp, lq, beta)
        return beta * _kl(lp, lm) + (1 - beta) * _kl(lq, lm)
    if div == "skew_forward_kl":
        return _kl(lp, _mix(lp, lq, alpha))
    if div == "skew_reverse_kl":
        return _kl(lq, _mix(lq, lp, alpha))
    assert div == "tvd", div
    return 0.5 * (lp.exp() - lq.exp()).abs().sum(-1)


# ---- sparse top-k teacher (section 8) ------------------------------------------------------------

TAIL_FLOOR = 2.0 ** -126  # the teacher tail's floor, the smallest normal fp32


def topk_rows(zs, ids, lps, div, tail, beta=0.5, alpha=0.1, t=1.0):
    """Per-row loss of a sparse teacher against softmax(zs / t), float64, differentiable in zs.
    zs (BT, V); ids (BT, K) with -1 = unused slot; lps (BT, K) the teacher's full-vocabulary
    log-probs at ids (unused slots are never read). tail: bucket (|S| + 1 bins: S and the rest,
    the student's rest summed over the columns outside S, the teacher's 1 - sum_S P floored at
    TAIL_FLOOR; no tail bin when S is the whole vocabulary), renorm_both (both renormalized over
    S), renorm_teacher (the teacher renormalized over S against the student's full log-probs;
    forward KL). A row with S empty gives 0."""
    u = zs.double() / t
    lse = torch.logsumexp(u, -1)
    v = u.shape[-1]
    out = []
    for r in range(u.shape[0]):
        used = ids[r] >= 0
        s = ids[r][used].long()
        if s.numel() == 0:
            out.append(u[r].sum() * 0.0)
            continue
        lp = lps[r][used].double()
        x = u[r, s] - lse[r]
        if tail == "renorm_both":
            out.append(div_rows(lp - torch.logsumexp(lp, 0), u[r, s] - torch.logsumexp(u[r, s], 0),
                                div, beta, alpha))
            continue
        if tail == "renorm_teacher":
            out.append(div_rows(lp - torch.logsumexp(lp, 0), x, "forward_kl"))
            continue
        assert tail == "bucket", tail
        rest = torch.ones(v, dtype=torch.bool)
        rest[s] = False
        if bool(rest.any()):
            x_tail = torch.logsumexp(u[r][rest], 0) - lse[r]
            y_tail = torch.clamp(-torch.expm1(torch.logsumexp(lp, 0)), min=TAIL_FLOOR).log()
            x, lp = torch.cat([x, x_tail[None]]), torch.cat([lp, y_tail[None]])
        out.append(div_rows(lp, x, div, beta, alpha))
    return torch.stack(out)
