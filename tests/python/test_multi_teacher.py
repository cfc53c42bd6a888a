"""Several teachers in one fused call (docs/MATH.md section 13; functional.fused_linear_distill_loss,
"Several teachers in one call"): teacher_weight a list of heads, teacher_bias a list of one entry
(or None) per head, teacher_index one head per row.

Checked against:
  - the single-teacher calls, one per head on its own rows (the other rows' labels set to
    ignore_index), each loss and gradient weighted by its teacher's share n_j / N of the kept rows
    and summed: the definition of the combined call. fp32, 1e-6 relative (losses) and 1e-6 of
    the largest entry (gradients): the same fp32 products, only the summation orders differ
    (tests/test_fld_multi.c has the same budget for the C call);
  - a float64 torch reference (each row's teacher logits from its own head in float64, the
    divergence from reference.py): 1e-4 in fp32 (fp32 logits over V <= 100 with double sums, the
    budget of test_weights_entropy.py), bf16 operands against the reference on the same
    bf16-rounded values 2e-3 (losses) and 2e-2 (gradients: dz rounded to bf16);
  - a one-head list against the single-teacher call: bitwise (the same GEMMs);
  - central finite differences of the loss along random unit directions (the gradients formed
    by the several-teacher path are new), 2e-4 of the gradient's norm (fp32 losses, eps 1e-2).
Index layouts: grouped (runs, one teacher per sequence), interleaved (row by row) and random.
Inputs are fresh random draws (the seed printed; KDLOSS_TEST_SEED reruns one).
"""

import ctypes
import os
import random

import pytest
import torch

from kdloss import KdlossError, _lib
from kdloss.torch import FusedLinearDistillLoss, _backend, _calls
from kdloss.torch import functional as F

import reference as ref
from conftest import assert_close, cpu_backend, require, spread

pytestmark = require("kdloss_fused_linear_distill_multi")

SEED = int(os.environ.get("KDLOSS_TEST_SEED") or random.SystemRandom().randrange(2**31))
print(f"test_multi_teacher: KDLOSS_TEST_SEED={SEED}")

BT, HS, HT, V = 23, 16, 20, 97


def _gen(salt):
    return torch.Generator().manual_seed(SEED * 1000 + salt)


def _index(pattern, bt, n, g):
    """One head per row: "grouped" (runs of 5 rows, cycling through the heads), "interleaved"
    (row r: r mod n) or "random"; every head used at least once when bt >= n."""
    if pattern == "grouped":
        return (torch.arange(bt) // 5) % n
    if pattern == "interleaved":
        return torch.arange(bt) % n
    idx = torch.randint(0, n, (bt,), generator=g)
    idx[:n] = torch.arange(n)
    return idx[torch.randperm(bt, generator=g)]


def _problem(g, n, dtype=torch.float32, biases=(True, False, True), bt=BT, v=V):
    """A batch with n teachers: student (xs, ws, bs), teacher_input xt, heads, biases (a None
    where `biases` says so), labels with two ignored rows."""
    d = {"xs": spread((bt, HS), g).to(dtype), "ws": (spread((v, HS), g) * 0.3).to(dtype),
         "bs": (torch.randn(v, generator=g) * 0.2).to(dtype), "xt": spread((bt, HT), g).to(dtype)}
    d["wts"] = [(spread((v, HT), g) * (0.2 + 0.15 * j)).to(dtype) for j in range(n)]
    d["bts"] = [(torch.randn(v, generator=g) * 0.3).to(dtype) if biases[j % len(biases)]
                else None for j in range(n)]
    labels = torch.randint(0, v, (bt,), generator=g)
    labels[[2, bt - 3]] = -100
    d["labels"] = labels
    return d


def _leaves(d, keys=("xs", "ws", "bs")):
    return [d[k].clone().requires_grad_() for k in keys]


def _kept(labels, w):
    kept = labels != -100
    return kept if w is None else kept & (w > 0)


# ---- against the single-teacher calls on each teacher's rows ------------------------------------

def _split(d, index, kw, w=None):
    """The combined call built from single-teacher calls: (loss, soft, hard, entropy, dxs, dws,
    dbs), float64, each call's results weighted by n_j / N."""
    n, kept = len(d["wts"]), _kept(d["labels"], w)
    total = max(1, int(kept.sum()))
    acc = [0.0] * 3 + [torch.zeros(BT, dtype=torch.float64)] + [0.0] * 3
    for j in range(n):
        mine = index == j
        labels = torch.where(mine, d["labels"], torch.full_like(d["labels"], -100))
        xs, ws, bs = _leaves(d)
        loss, soft, hard, ent = F.fused_linear_distill_loss(
            xs, ws, d["xt"], d["wts"][j], labels, bs, d["bts"][j], return_soft_hard_loss=True,
            return_entropy=True, token_weights=w, **kw)
        loss.backward()
        share = int((kept & mine).sum()) / total
        parts = (loss, soft, hard, None, xs.grad, ws.grad, bs.grad)
        for i, p in enumerate(parts):
            if p is not None:
                acc[i] = acc[i] + p.double() * share
        acc[3] = acc[3] + ent.double() * mine  # a row's entropy is its own call's
    return acc


def _multi(d, index, kw, w=None, module=False):
    xs, ws, bs = _leaves(d)
    if module:
        kw = dict(kw)
        items = kw.pop("num_items_in_batch", None)
        fn = FusedLinearDistillLoss(return_soft_hard_loss=True, return_entropy=True, **kw)
        out = fn(xs, ws, d["xt"], d["wts"], d["labels"], bs, d["bts"], token_weights=w,
                 teacher_index=index, num_items_in_batch=items)
    else:
        out = F.fused_linear_distill_loss(
            xs, ws, d["xt"], d["wts"], d["labels"], bs, d["bts"], return_soft_hard_loss=True,
            return_entropy=True, token_weights=w, teacher_index=index, **kw)
    out[0].backward()
    return list(out) + [xs.grad, ws.grad, bs.grad]


_NAMES = ("loss", "soft", "hard", "entropy", "dxs", "dws", "dbs")

_SPLIT_CASES = [  # (divergence, keywords beyond it)
    ("jsd", dict(beta=0.3, temperature=1.5)),
    ("forward_kl", dict(t2_scale=True, temperature=2.0, weight_hard_loss=0.25)),
    ("reverse_kl", dict(student_logit_scale=0.8, teacher_softcap=7.0)),
    ("skew_forward_kl", dict(alpha=0.2, student_softcap=9.0, teacher_logit_scale=1.3)),
    ("skew_reverse_kl", dict(alpha=0.3, weight_soft_loss=0.9)),
    ("tvd", dict(weight_hard_loss=0.0)),
]


def test_split_cases_cover_every_divergence():
    assert sorted(c[0] for c in _SPLIT_CASES) == sorted(_lib.divergences())


@pytest.mark.parametrize("div,kw", _SPLIT_CASES, ids=[c[0] for c in _SPLIT_CASES])
@pytest.mark.parametrize("pattern", ["grouped", "interleaved", "random"])
def test_equals_split_single_teacher_calls(div, kw, pattern):
    g = _gen(1)
    d = _problem(g, 3)
    index = _index(pattern, BT, 3, g)
    kw = dict(kw, divergence=div)
    got, want = _multi(d, index, kw), _split(d, index, kw)
    for a, b, name in zip(got, want, _NAMES):
        assert_close(a, b, 1e-6, what=f"{div} {pattern} {name}")


@pytest.mark.parametrize("items", [None, 31])
def test_split_with_weights_items_and_module(items):
    """Per-row weights (some 0: those rows leave N) and num_items_in_batch, through the module:
    still the weighted sum of the single-teacher calls."""
    g = _gen(2)
    d = _problem(g, 2, biases=(False,))
    index = _index("random", BT, 2, g)
    w = torch.rand(BT, generator=g) * 2
    w[[0, 7]] = 0.0
    kw = dict(divergence="jsd", temperature=1.2, num_items_in_batch=items)
    got = _multi(d, index, kw, w, module=True)
    want = _split(d, index, dict(kw, num_items_in_batch=None), w)
    if items is not None:  # the split calls' means, turned into sums / items
        scale = max(1, int(_kept(d["labels"], w).sum())) / items
        want = [x * scale if i != 3 else x for i, x in enumerate(want)]
    for a, b, name in zip(got, want, _NAMES):
        assert_close(a, b, 1e-6, what=f"weights items={items} {name}")


# ---- against the float64 reference --------------------------------------------------------------

def _softcap(u, scale, cap):
    u = u * scale
    return cap * torch.tanh(u / cap) if cap else u


def _reference(d, index, w, div, beta, alpha, t, w_hard, w_soft, maps, t2=False):
    """(loss, soft, hard, entropy), float64, differentiable in the returned leaves (xs, ws, bs):
    row r's teacher logits from head index[r] (docs/MATH.md section 13)."""
    xs, ws, bs = (d[k].double().requires_grad_() for k in ("xs", "ws", "bs"))
    xt = d["xt"].double()
    zs = _softcap(xs @ ws.T + bs, maps[0], maps[1])
    heads = torch.stack([xt @ wt.double().T + (0 if b is None else b.double())
                         for wt, b in zip(d["wts"], d["bts"])])
    zt = _softcap(heads[index, torch.arange(xt.shape[0])], maps[2], maps[3])
    kept = _kept(d["labels"], w)
    wk = kept.double() * (1.0 if w is None else w.double())
    lq, lp = torch.log_softmax(zs / t, -1), torch.log_softmax(zt / t, -1)
    soft = (ref.div_rows(lp, lq, div, beta, alpha) * wk).sum() * (t * t if t2 else 1.0)
    ce = -torch.log_softmax(zs, -1).gather(1, d["labels"].clamp(min=0)[:, None])[:, 0]
    hard = (ce * wk).sum()
    n = max(1, int(kept.sum()))
    ent = -(lq.exp() * lq).sum(-1) * kept
    return ((w_hard * hard + w_soft * soft) / n, soft / n, hard / n, ent.detach()), (xs, ws, bs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("div,beta,alpha,t2", [("jsd", 0.5, 0.1, False),
                                               ("forward_kl", 0.5, 0.1, True),
                                               ("skew_reverse_kl", 0.5, 0.25, False)])
@pytest.mark.parametrize("pattern", ["grouped", "interleaved"])
def test_against_float64_reference(dtype, div, beta, alpha, t2, pattern):
    g = _gen(3)
    d = _problem(g, 3, dtype)
    index = _index(pattern, BT, 3, g).view(1, BT)  # (B, T) index with 2-D inputs: flattened
    w = torch.rand(BT, generator=g) + 0.5
    w[5] = 0.0
    maps, t = (0.9, 8.0, 1.1, 0.0), 1.7
    xs, ws, bs = _leaves(d)
    out = F.fused_linear_distill_loss(
        xs, ws, d["xt"], d["wts"], d["labels"], bs, d["bts"], divergence=div, beta=beta,
        alpha=alpha, weight_hard_loss=0.4, weight_soft_loss=0.6, temperature=t, t2_scale=t2,
        return_soft_hard_loss=True, return_entropy=True, token_weights=w, teacher_index=index,
        student_logit_scale=maps[0], student_softcap=maps[1], teacher_logit_scale=maps[2])
    want, leaves = _reference(d, index.view(-1), w, div, beta, alpha, t, 0.4, 0.6, maps, t2)
    tol = 1e-4 if dtype == torch.float32 else 2e-3
    for a, b, name in zip(out, want, _NAMES):
        assert_close(a, b, tol, what=f"{div} {dtype} {pattern} {name}")
    out[0].backward()
    want[0].backward()
    for a, b, name in zip((xs.grad, ws.grad, bs.grad), leaves, _NAMES[4:]):
        assert a.dtype == dtype
        assert_close(a, b.grad, tol if dtype == torch.float32 else 2e-2,
                     what=f"{div} {dtype} {pattern} {name}")


def test_finite_differences():
    """The loss along random unit directions of (xs, ws, bs) together: its central difference
    against the gradient the call returned, within 2e-4 of the gradient's norm (fp32 losses of
    ~2 round at ~2e-7, over a step of 2e-2: ~1e-5 of a unit slope; seen at most 1.6e-5 of the
    norm over 20 seeds x 4 directions). The gradient of head 0 for every row (every teacher but
    one ignored) is off by 4e-4 or more of the norm in some direction on each of those seeds."""
    g = _gen(4)
    d = _problem(g, 3, bt=12, v=29)
    index = _index("random", 12, 3, g)
    kw = dict(divergence="jsd", beta=0.4, temperature=1.3, teacher_index=index)
    xs, ws, bs = _leaves(d)
    loss = F.fused_linear_distill_loss(xs, ws, d["xt"], d["wts"], d["labels"], bs, d["bts"],
                                       **kw)
    loss.backward()
    grads = [t.grad.double() for t in (xs, ws, bs)]
    norm = sum(float((u * u).sum()) for u in grads) ** 0.5
    eps = 1e-2
    for trial in range(4):
        dirs = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (xs, ws, bs)]
        scale = sum(float((u * u).sum()) for u in dirs) ** 0.5
        dirs = [u / scale for u in dirs]
        slope = sum(float((gr * u).sum()) for gr, u in zip(grads, dirs))

        def at(sign):
            a = [(t.detach().double() + sign * eps * u).float()
                 for t, u in zip((xs, ws, bs), dirs)]
            return float(F.fused_linear_distill_loss(a[0], a[1], d["xt"], d["wts"], d["labels"],
                                                     a[2], d["bts"], **kw))
        fd = (at(1) - at(-1)) / (2 * eps)
        assert abs(fd - slope) <= 2e-4 * norm, (trial, fd, slope, norm)


# ---- one head, layouts, dtypes ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_one_head_list_is_bitwise_the_single_call(dtype, bias):
    g = _gen(5)
    d = _problem(g, 1, dtype, biases=(bias,), bt=37, v=301)
    kw = dict(divergence="reverse_kl", temperature=1.4, weight_hard_loss=0.3,
              return_soft_hard_loss=True, return_entropy=True, chunk_size=8)
    outs = []
    for heads, bts, index in ((d["wts"][0], d["bts"][0], None),
                              ([d["wts"][0]], [d["bts"][0]], torch.zeros(37, dtype=torch.int64)),
                              ((d["wts"][0],), None if not bias else (d["bts"][0],),
                               torch.zeros(37, dtype=torch.int32))):
        xs, ws, bs = (t.clone().requires_grad_() for t in (d["xs"], d["ws"], d["bs"]))
        out = F.fused_linear_distill_loss(xs, ws, d["xt"], heads, d["labels"], bs, bts,
                                          teacher_index=index, **kw)
        out[0].backward()
        outs.append(list(out) + [xs.grad, ws.grad, bs.grad])
    for other in outs[1:]:
        for a, b, name in zip(other, outs[0], _NAMES):
            assert a.dtype == b.dtype and torch.equal(a, b), f"{dtype} {name}: not bitwise"


def test_index_shapes_and_dtypes_agree():
    """(B, T, H) inputs with a (B, T) index, the flat (B*T,) one, int32 / int64 / uint8, and
    one held by a view with a stride: one result, bitwise."""
    g = _gen(6)
    d = _problem(g, 2, bt=24)
    index = _index("grouped", 24, 2, g)
    xs, xt, labels = d["xs"].view(4, 6, HS), d["xt"].view(4, 6, HT), d["labels"].view(4, 6)
    wide = torch.stack([index, index], 1)[:, 1]  # a strided view
    results = []
    for idx in (index.view(4, 6), index, index.to(torch.int32), index.to(torch.uint8), wide):
        results.append(F.fused_linear_distill_loss(xs, d["ws"], xt, d["wts"], labels,
                                                   teacher_index=idx, return_entropy=True))
    for loss, ent in results[1:]:
        assert torch.equal(loss, results[0][0]) and torch.equal(ent, results[0][1])
    assert results[0][1].shape == (4, 6)


def test_heads_of_mixed_dtypes_are_cast_once():
    """bf16 teacher_input with one bf16 and one fp32 head: every teacher operand in fp32, as
    one head mixed with its input is (the cast is exact: the fp32 call's bits)."""
    g = _gen(7)
    d = _problem(g, 2)
    index = _index("random", BT, 2, g)
    xt16, w16 = d["xt"].bfloat16(), d["wts"][0].bfloat16()
    mixed = F.fused_linear_distill_loss(d["xs"], d["ws"], xt16, [w16, d["wts"][1]], d["labels"],
                                        teacher_index=index)
    wide = F.fused_linear_distill_loss(d["xs"], d["ws"], xt16.float(), [w16.float(), d["wts"][1]],
                                       d["labels"], teacher_index=index)
    assert torch.equal(mixed, wide)


def test_autocast_casts_every_head():
    """Under CPU autocast (bf16) the heads and hidden states are taken in bf16, as one head's
    are: the call on the bf16-cast operands, bitwise (the biases as given)."""
    g = _gen(15)
    d = _problem(g, 2)
    index = _index("random", BT, 2, g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = F.fused_linear_distill_loss(d["xs"], d["ws"], d["xt"], d["wts"], d["labels"],
                                          d["bs"], d["bts"], teacher_index=index)
    b16 = {k: d[k].bfloat16() for k in ("xs", "ws", "xt")}
    want = F.fused_linear_distill_loss(b16["xs"], b16["ws"], b16["xt"],
                                       [w.bfloat16() for w in d["wts"]], d["labels"], d["bs"],
                                       d["bts"], teacher_index=index)
    assert torch.equal(got, want)


def test_without_labels_every_row_counts():
    """No labels (weight_hard_loss 0): every row kept, the soft part as with labels that ignore
    nothing (1e-6: the same rows, with or without the cross-entropy pass)."""
    g = _gen(16)
    d = _problem(g, 3)
    index = _index("grouped", BT, 3, g)
    kw = dict(weight_hard_loss=0.0, divergence="reverse_kl", teacher_index=index,
              return_soft_hard_loss=True)
    loss, soft, hard = F.fused_linear_distill_loss(d["xs"], d["ws"], d["xt"], d["wts"], None,
                                                   d["bs"], d["bts"], **kw)
    every = d["labels"].clamp(min=0)
    want = F.fused_linear_distill_loss(d["xs"], d["ws"], d["xt"], d["wts"], every, d["bs"],
                                       d["bts"], **kw)
    assert_close(loss, want[0], 1e-6, what="loss")
    assert_close(soft, want[1], 1e-6, what="soft")
    assert float(hard) == 0.0 and float(want[2]) > 0


def test_padded_heads_and_no_teacher_gradient():
    """Heads with more rows than the student's V (a padded vocabulary) are used through their
    first V, as one head is; the teachers' tensors get no gradient even when they require it."""
    g = _gen(8)
    d = _problem(g, 2)
    index = _index("interleaved", BT, 2, g)
    pad = [torch.cat([w, torch.randn(5, HT, generator=g)]).requires_grad_() for w in d["wts"]]
    pbias = [None if b is None else torch.cat([b, torch.randn(5, generator=g)]) for b in d["bts"]]
    xt = d["xt"].clone().requires_grad_()
    xs = d["xs"].clone().requires_grad_()
    got = F.fused_linear_distill_loss(xs, d["ws"], xt, pad, d["labels"], None, pbias,
                                      teacher_index=index)
    want = F.fused_linear_distill_loss(d["xs"], d["ws"], d["xt"], d["wts"], d["labels"], None,
                                       d["bts"], teacher_index=index)
    assert torch.equal(got, want)
    got.backward()
    assert xs.grad is not None and xt.grad is None and all(w.grad is None for w in pad)


# ---- errors ----------------------------------------------------------------------------------------

class _SentinelBackend:
    """The CPU backend, but the several-teacher call first fills every output with a sentinel
    byte and, when the call raises, checks that the sentinel is still there (nothing written)."""

    def __init__(self):
        self.inner = _backend.CpuBackend()
        self.checked = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def fused_linear_distill_multi(self, device, params, bt, hs, ht, v, xs, ws, bs, xt, heads,
                                   labels, out, dtype, want_grad):
        size = {_lib.F32: 4, _lib.BF16: 2, _lib.F16: 2}
        sx, sw = size[out.dxs.dtype], size[out.dws.dtype]
        spans = [(out.loss, 4), (out.soft_loss, 4), (out.hard_loss, 4),
                 (out.dxs.data, bt * hs * sx), (out.dws.data, v * hs * sw), (out.dbs, v * sw),
                 (out.row_entropy, bt * 4)]
        spans = [(p, n) for p, n in spans if p]
        for p, n in spans:
            ctypes.memset(p, 0x5A, n)
        try:
            self.inner.fused_linear_distill_multi(device, params, bt, hs, ht, v, xs, ws, bs, xt,
                                                  heads, labels, out, dtype, want_grad)
        except KdlossError:
            for p, n in spans:
                assert ctypes.string_at(p, n) == b"\x5a" * n, "an output was written"
            self.checked += 1
            raise


@pytest.fixture
def sentinel():
    with cpu_backend(_SentinelBackend()) as be:
        yield be


@pytest.mark.parametrize("row,value", [(3, 2), (0, -1), (2, 7)])  # row 2's label is ignored
def test_index_out_of_range_refused_nothing_written(sentinel, row, value):
    g = _gen(9)
    d = _problem(g, 2)
    index = _index("grouped", BT, 2, g)
    index[row] = value
    xs, ws, bs = _leaves(d)
    with pytest.raises(KdlossError, match=rf"teachers->index\[{row}\] = {value} is not in "
                       r"\[0, 2\)") as e:
        F.fused_linear_distill_loss(xs, ws, d["xt"], d["wts"], d["labels"], bs, d["bts"],
                                    teacher_index=index, return_entropy=True)
    assert e.value.status == _lib.ERR_INVALID_ID
    assert sentinel.checked == 1
    assert xs.grad is None and ws.grad is None


def test_index_outside_int32_refused_before_the_cast():
    """2^32 would wrap to 0 in an int32 cast: refused in Python with the same status."""
    g = _gen(10)
    d = _problem(g, 2)
    index = _index("grouped", BT, 2, g)
    index[4] = 2**32
    with pytest.raises(KdlossError, match=r"teacher_index\[4\] = 4294967296 is not in") as e:
        F.fused_linear_distill_loss(d["xs"], d["ws"], d["xt"], d["wts"], d["labels"],
                                    teacher_index=index)
    assert e.value.status == _lib.ERR_INVALID_ID


def _call(d, heads, bts=None, index=None, **kw):
    return F.fused_linear_distill_loss(d["xs"], d["ws"], d["xt"], heads, d["labels"], None, bts,
                                       teacher_index=index, **kw)


def test_argument_errors():
    g = _gen(11)
    d = _problem(g, 2)
    index = _index("grouped", BT, 2, g)
    cases = [  # (what, call, status, message)
        ("list without index", lambda: _call(d, d["wts"]), _lib.ERR_INVALID_PARAM,
         "teacher_index is not given"),
        ("index with one head", lambda: _call(d, d["wts"][0], index=index),
         _lib.ERR_INVALID_PARAM, "teacher_weight is one head"),
        ("bias list too short", lambda: _call(d, d["wts"], [d["bts"][0]], index),
         _lib.ERR_INVALID_PARAM, "one bias"),
        ("one bias tensor", lambda: _call(d, d["wts"], d["bts"][0], index),
         _lib.ERR_INVALID_PARAM, "one bias"),
        ("no heads", lambda: _call(d, [], None, index), _lib.ERR_INVALID_PARAM,
         "at least one head"),
        ("float index", lambda: _call(d, d["wts"], None, index.float()), _lib.ERR_INVALID_DTYPE,
         "integer tensor"),
        ("bool index", lambda: _call(d, d["wts"], None, index > 0), _lib.ERR_INVALID_DTYPE,
         "integer tensor"),
        ("index too short", lambda: _call(d, d["wts"], None, index[1:]),
         _lib.ERR_SHAPE_MISMATCH, "one per row"),
        ("head of another Ht", lambda: _call(d, [d["wts"][0], d["wts"][1][:, 1:]], None, index),
         _lib.ERR_SHAPE_MISMATCH, r"teacher_weight\[1\]"),
        ("head of fewer rows", lambda: _call(d, [d["wts"][0][1:], d["wts"][1]], None, index),
         _lib.ERR_SHAPE_MISMATCH, r"teacher_weight\[0\]"),
        ("bias of another V", lambda: _call(d, d["wts"], [None, d["bts"][0][1:]], index),
         _lib.ERR_SHAPE_MISMATCH, r"teacher_bias\[1\]"),
        ("float64 head", lambda: _call(d, [d["wts"][0], d["wts"][1].double()], None, index),
         _lib.ERR_INVALID_DTYPE, r"teacher_weight\[1\]"),
        ("index as a list", lambda: _call(d, d["wts"], None, index.tolist()),
         _lib.ERR_INVALID_DTYPE, "integer tensor"),
        ("a head that is None", lambda: _call(d, [d["wts"][0], None], None, index),
         _lib.ERR_NULL_POINTER, r"teacher_weight\[1\] is NoneType"),
        ("unknown divergence", lambda: _call(d, d["wts"], None, index, divergence="nope"),
         None, None),
    ]
    for what, fn, status, msg in cases:
        with pytest.raises(KdlossError, match=msg) as e:
            fn()
        assert status is None or e.value.status == status, (what, e.value)


def test_backends_with_and_without_multi():
    """The CPU and the CUDA backend both have the several-teacher call (the CUDA one calls
    kdloss_cuda_fused_linear_distill_multi, tests/cuda/test_cuda_multi.c on the simulator); a
    registered backend without it is refused with KdlossError(UNSUPPORTED) naming the call."""
    assert hasattr(_backend.CudaBackend, "fused_linear_distill_multi")
    assert _calls.multi_backend(torch.device("cpu")) is not None

    class NoMulti:
        name = "privateuseone"

    _backend.register_backend("privateuseone", NoMulti())
    try:
        with pytest.raises(KdlossError, match="has no fused_linear_distill_multi") as e:
            _calls.multi_backend(torch.device("privateuseone"))
        assert e.value.status == _lib.ERR_UNSUPPORTED
    finally:
        _backend._BACKENDS.pop("privateuseone", None)


def test_process_group_refused(tmp_path):
    """process_group with several heads: KdlossError(UNSUPPORTED) naming the one-head
    vocabulary-parallel entry (a one-rank gloo group)."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    if dist.is_initialized():
        pytest.skip("a default process group already exists in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        g = _gen(12)
        d = _problem(g, 2)
        with pytest.raises(KdlossError, match="kdloss_fused_linear_distill_vp") as e:
            _call(d, d["wts"], None, _index("grouped", BT, 2, g),
                  process_group=dist.group.WORLD)
        assert e.value.status == _lib.ERR_UNSUPPORTED
    finally:
        dist.destroy_process_group()


# ---- torch.compile, FakeTensor --------------------------------------------------------------------

def _compiled_case(d, index):
    def fn(xs, ws, bs):
        loss, ent = F.fused_linear_distill_loss(
            xs, ws, d["xt"], d["wts"], d["labels"], bs, d["bts"], divergence="forward_kl",
            temperature=1.5, teacher_index=index, return_entropy=True,
            token_weights=torch.ones(BT))
        return loss * 1.5, ent
    return fn


def test_compile_fullgraph_matches_eager():
    torch_dynamo = pytest.importorskip("torch._dynamo")
    torch_dynamo.reset()
    g = _gen(13)
    d = _problem(g, 3)
    fn = _compiled_case(d, _index("random", BT, 3, g))
    results = []
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        leaves = _leaves(d)
        loss, ent = f(*leaves)
        loss.backward()
        results.append([loss, ent] + [t.grad for t in leaves])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    explain = torch_dynamo.explain(fn)(*_leaves(d))
    assert explain.graph_break_count == 0 and explain.graph_count == 1, explain.break_reasons


def test_fake_tensor_mode_gives_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    g = _gen(14)
    d = _problem(g, 2, torch.bfloat16)
    index = _index("grouped", BT, 2, g)
    short = index[1:]
    with FakeTensorMode() as mode:
        fd = {k: (mode.from_tensor(v) if isinstance(v, torch.Tensor) else
                  [None if t is None else mode.from_tensor(t) for t in v]) for k, v in d.items()}
        xs, ws = fd["xs"].requires_grad_(), fd["ws"].requires_grad_()
        loss, ent = F.fused_linear_distill_loss(xs, ws, fd["xt"], fd["wts"], fd["labels"],
                                                None, fd["bts"], return_entropy=True,
                                                teacher_index=mode.from_tensor(index))
        assert loss.shape == () and loss.dtype == torch.float32 and ent.shape == (BT,)
        loss.backward()
        assert xs.grad.shape == xs.shape and xs.grad.dtype == torch.bfloat16
        assert ws.grad.shape == ws.shape
        with pytest.raises(KdlossError, match="one per row"):
            F.fused_linear_distill_loss(xs, ws, fd["xt"], fd["wts"], fd["labels"],
                                        teacher_index=mode.from_tensor(short))



# ---- the README's example -------------------------------------------------------------------------

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)


def test_readme_shows_the_example_and_it_runs():
    """README.md's "Several teachers" block is examples/multi_teacher.py's code, and the script
    runs: finite losses that go down, no gradient on the teachers' heads."""
    import re
    import runpy
    path = os.path.join(_ROOT, "examples", "multi_teacher.py")
    with open(path) as f:
        code = f.read().split('"""', 2)[2].strip() + "\n"
    with open(os.path.join(_ROOT, "README.md")) as f:
        section = f.read().split("\n## Several teachers\n", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"```python\n(.*?)```", section, re.S).group(1) == code
    env = runpy.run_path(path, run_name="__main__")
    losses = env["losses"]
    assert len(losses) == 20 and all(x == x and abs(x) < 1e3 for x in losses)
    assert losses[-1] < losses[0]
    assert all(w.grad is None for w in env["heads"]) and env["head"].weight.grad is not None
