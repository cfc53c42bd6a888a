"""A teacher whose vocabulary is padded past the student's
(Qwen2.5: 152064 rows against 151936) is used through its first V rows / columns, as TRL slices
logits (TRL #3028), without a copy; and num_items_in_batch= normalizes for gradient accumulation
(TRL #6006): micro-batches divided by the step's total of kept tokens add up to the full batch.

Tolerances: the same C calls on the same rows give the same loss up to the order of the row
sums (fp32 values, double accumulation): 1e-6 relative. Micro-batch gradients are each rescaled
by one fp32 multiply and summed in fp32 against one call's accumulation: 1e-6 relative (of the
largest entry for entries that cancel).
"""

import pytest
import torch

from kdloss import KdlossError
from kdloss.torch import (DistillLoss, FusedLinearDistillLoss, FusedLinearJSDFunction,
                          FusedLinearJSDLoss, FusedLinearJSDLossFunction,
                          FusedLinearTopKDistillLoss, TopKDistillLoss, distill_loss,
                          fused_linear_distill_loss, fused_linear_jsd, fused_linear_jsd_loss,
                          fused_linear_topk_distill_loss, topk_distill_loss)

from conftest import assert_close, require
import reference as ref

BT, V, PAD, HS, HT, K = 8, 13, 5, 6, 7, 4
FUSED = "kdloss_fused_linear_distill"
TOPK = "kdloss_topk_distill_logits"
FUSED_TOPK = "kdloss_fused_linear_topk_distill"


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    labels = torch.randint(0, V, (BT,), generator=g)
    labels[[1, 6]] = -100
    ids = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(BT)])
    ids[2, -1] = -1
    lps = torch.log_softmax(r(BT, V), -1).gather(1, ids.clamp(min=0))
    return {"xs": r(BT, HS), "ws": r(V, HS), "bs": r(V), "xt": r(BT, HT),
            "wt": r(V + PAD, HT), "bt": r(V + PAD), "zs": r(BT, V), "zt": r(BT, V + PAD),
            "labels": labels, "ids": ids, "lps": lps}


def _grads(fn, d, keys):
    d = {k: (v.clone().requires_grad_() if k in keys else v) for k, v in d.items()}
    loss = fn(d)
    loss.backward()
    return loss.detach(), [d[k].grad for k in keys]


# ---- a teacher with more rows / columns -----------------------------------------------------------

# (name, student keys, fn(d, wt, bt)) with the teacher head given explicitly
FUSED_CASES = [
    ("fused_linear_distill_loss", ("xs", "ws", "bs"), lambda d, wt, bt: fused_linear_distill_loss(
        d["xs"], d["ws"], d["xt"], wt, d["labels"], d["bs"], bt, divergence="forward_kl",
        temperature=2.0)),
    ("FusedLinearDistillLoss", ("xs", "ws"), lambda d, wt, bt: FusedLinearDistillLoss(
        divergence="reverse_kl")(d["xs"], d["ws"], d["xt"], wt, d["labels"], None, bt)),
    ("fused_linear_jsd_loss", ("xs", "ws"), lambda d, wt, bt: fused_linear_jsd_loss(
        d["xs"], d["ws"], d["xt"], wt, d["labels"], None, bt)),
    ("FusedLinearJSDLoss", ("xs", "ws", "bs"), lambda d, wt, bt: FusedLinearJSDLoss(beta=0.3)(
        d["xs"], d["ws"], d["xt"], wt, d["labels"], d["bs"], bt)),
    ("fused_linear_jsd", ("xs", "ws"), lambda d, wt, bt: fused_linear_jsd(
        d["xs"], d["ws"], d["xt"], wt, d["labels"])),
    ("FusedLinearJSDFunction", ("xs", "ws"), lambda d, wt, bt: FusedLinearJSDFunction.apply(
        d["xs"], d["ws"], d["xt"], wt, d["labels"])),
    ("FusedLinearJSDLossFunction", ("xs", "ws"), lambda d, wt, bt:
        FusedLinearJSDLossFunction.apply(d["xs"], d["ws"], d["xt"], wt, d["labels"], None, bt)),
]


@require(FUSED)
@pytest.mark.parametrize("name,keys,fn", FUSED_CASES, ids=[c[0] for c in FUSED_CASES])
def test_fused_padded_teacher_uses_first_rows(name, keys, fn):
    d = _data()
    got, got_g = _grads(lambda e: fn(e, e["wt"], e["bt"]), d, keys)
    want, want_g = _grads(lambda e: fn(e, e["wt"][:V].clone(), e["bt"][:V].clone()), d, keys)
    assert_close(got, want, 1e-6, what=f"{name} loss")
    for k, a, b in zip(keys, got_g, want_g):
        assert_close(a, b, 1e-6, what=f"{name} d{k}")


@require(FUSED)
def test_fused_padded_teacher_is_not_copied(spy):
    d = _data()
    fused_linear_distill_loss(d["xs"], d["ws"], d["xt"], d["wt"], d["labels"], None, d["bt"])
    (name, args), = [c for c in spy.calls if c[0] == "fused_linear_distill"]
    v, wt_view, bt_ptr = args[5], args[10], args[11]
    assert v == V
    assert wt_view.data == d["wt"].data_ptr()  # the first V rows of the head itself
    assert wt_view.ld in (0, HT)
    assert bt_ptr == d["bt"].data_ptr()


@require(FUSED)
def test_fused_teacher_with_fewer_rows_names_both_shapes():
    d = _data()
    with pytest.raises(KdlossError, match=r"teacher_weight \(10, 7\).*student_weight \(13, 6\)"):
        fused_linear_distill_loss(d["xs"], d["ws"], d["xt"], d["wt"][:10], d["labels"])
    with pytest.raises(KdlossError, match=r"teacher_bias has 13 elements"):
        fused_linear_distill_loss(d["xs"], d["ws"], d["xt"], d["wt"], d["labels"], None,
                                  d["bt"][:V])


@require(FUSED)
def test_fused_padded_teacher_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        d = _data()
        xs = d["xs"].requires_grad_()
        loss = fused_linear_jsd_loss(xs, d["ws"], d["xt"], d["wt"], d["labels"], None, d["bt"])
        assert loss.shape == () and loss.dtype == torch.float32
        with pytest.raises(KdlossError, match="fewer rows"):
            fused_linear_jsd_loss(xs, d["ws"], d["xt"], d["wt"][:V - 1], d["labels"])


@require(FUSED)
def test_fused_padded_teacher_compiles():
    torch._dynamo.reset()
    d = _data()
    fn = lambda e: fused_linear_jsd_loss(  # noqa: E731
        e["xs"], e["ws"], e["xt"], e["wt"], e["labels"], None, e["bt"])
    want, want_g = _grads(fn, d, ("xs", "ws"))
    got, got_g = _grads(torch.compile(fn, backend="aot_eager", fullgraph=True), d, ("xs", "ws"))
    assert_close(got, want, 1e-6, what="loss")
    for a, b in zip(got_g, want_g):
        assert_close(a, b, 1e-6, what="grad")


@pytest.mark.parametrize("shape", [(BT,), (2, BT // 2)])
@pytest.mark.parametrize("divergence", ["jsd", "forward_kl"])
def test_distill_padded_teacher_logits(shape, divergence):
    d = _data()
    zs = d["zs"].view(*shape, V) if len(shape) == 2 else d["zs"]
    zt = d["zt"].view(*shape, V + PAD) if len(shape) == 2 else d["zt"]
    labels = d["labels"].view(shape)
    run = lambda t: _grads(lambda e: distill_loss(  # noqa: E731
        e["zs"], t, labels, divergence=divergence, temperature=1.5), {"zs": zs}, ("zs",))
    got, (g,) = run(zt)
    want, (w,) = run(zt[..., :V].contiguous())
    assert_close(got, want, 1e-6, what="loss")
    assert_close(g, w, 1e-6, what="grad")
    # the float64 truth on the first V columns
    lp = torch.log_softmax(zt[..., :V].double().reshape(-1, V) / 1.5, -1)
    lq = torch.log_softmax(zs.double().reshape(-1, V) / 1.5, -1)
    rows = ref.div_rows(lp, lq, divergence)
    keep = labels.reshape(-1) != -100
    assert_close(got, rows[keep].sum() / keep.sum(), 1e-5, what="loss vs float64")


def test_distill_padded_teacher_logits_are_not_copied(spy):
    d = _data()
    zt = d["zt"].view(2, BT // 2, V + PAD)
    DistillLoss(divergence="jsd")(d["zs"].view(2, BT // 2, V), zt)
    (name, args), = [c for c in spy.calls if c[0] == "distill_logits"]
    teacher = args[5]
    assert teacher.data == zt.data_ptr() and teacher.ld == V + PAD  # a strided view, no copy


def test_distill_teacher_logits_with_fewer_columns_name_both_shapes():
    d = _data()
    with pytest.raises(KdlossError, match=r"\(8, 13\) vs teacher_logits \(8, 12\)"):
        distill_loss(d["zs"], d["zt"][:, :V - 1])
    with pytest.raises(KdlossError, match=r"\(8, 13\) vs teacher_logits \(7, 18\)"):
        distill_loss(d["zs"], d["zt"][:7])


# ---- num_items_in_batch: gradient accumulation ----------------------------------------------------

def _accumulated(fn, d, keys, labels_key="labels", n_items=None, tensor_n=False):
    """(full-batch loss, grads) against (sum of the two half batches' losses, summed grads), the
    halves called with num_items_in_batch = the full batch's kept rows."""
    full, full_g = _grads(lambda e: fn(e, None), d, keys)
    if n_items is None:
        n_items = int((d[labels_key] != -100).sum())
    n = torch.tensor(n_items) if tensor_n else n_items
    total, acc = 0.0, [torch.zeros_like(d[k]) for k in keys]
    for half in (slice(0, BT // 2), slice(BT // 2, BT)):
        e = {k: (v[half] if v.shape[:1] == (BT,) else v) for k, v in d.items()}
        loss, g = _grads(lambda e: fn(e, n), e, keys)
        total = total + loss
        for a, k, gk in zip(acc, keys, g):
            if k in ("xs", "zs"):  # one row per token: each half fills its rows
                a[half] += gk
            else:  # LM head weight, bias: the halves' gradients add up
                a += gk
    return (full, full_g), (total, acc)


def _check_accumulated(full, acc, keys, what):
    (fl, fg), (al, ag) = full, acc
    assert_close(al, fl, 1e-6, what=f"{what} loss sum")
    for k, a, b in zip(keys, ag, fg):
        assert_close(a, b, 1e-6, what=f"{what} d{k}")


ACC_CASES = [
    ("fused_linear_distill_loss", FUSED, ("xs", "ws", "bs"), lambda e, n:
        fused_linear_distill_loss(e["xs"], e["ws"], e["xt"], e["wt"], e["labels"], e["bs"],
                                  e["bt"], divergence="jsd", temperature=2.0, t2_scale=True,
                                  num_items_in_batch=n)),
    ("FusedLinearJSDLoss", FUSED, ("xs", "ws"), lambda e, n: FusedLinearJSDLoss()(
        e["xs"], e["ws"], e["xt"], e["wt"], e["labels"], num_items_in_batch=n)),
    ("fused_linear_jsd_loss", FUSED, ("xs", "ws"), lambda e, n: fused_linear_jsd_loss(
        e["xs"], e["ws"], e["xt"], e["wt"], e["labels"], num_items_in_batch=n)),
    ("fused_linear_jsd", FUSED, ("xs", "ws"), lambda e, n: fused_linear_jsd(
        e["xs"], e["ws"], e["xt"], e["wt"], e["labels"], num_items_in_batch=n)),
    ("FusedLinearDistillLoss", FUSED, ("xs", "ws"), lambda e, n: FusedLinearDistillLoss(
        divergence="forward_kl", weight_hard_loss=0.3)(
        e["xs"], e["ws"], e["xt"], e["wt"], e["labels"], num_items_in_batch=n)),
    ("fused_linear_topk_distill_loss", FUSED_TOPK, ("xs", "ws", "bs"), lambda e, n:
        fused_linear_topk_distill_loss(e["xs"], e["ws"], e["ids"], e["lps"], e["labels"],
                                       e["bs"], weight_hard_loss=0.5, num_items_in_batch=n)),
    ("FusedLinearTopKDistillLoss", FUSED_TOPK, ("xs", "ws"), lambda e, n:
        FusedLinearTopKDistillLoss(tail="renorm_both")(
            e["xs"], e["ws"], e["ids"], e["lps"], e["labels"], num_items_in_batch=n)),
    ("distill_loss", None, ("zs",), lambda e, n: distill_loss(
        e["zs"], e["zt"], e["labels"], divergence="jsd", num_items_in_batch=n)),
    ("distill_loss_sum", None, ("zs",), lambda e, n: distill_loss(
        e["zs"], e["zt"], e["labels"], reduction="sum" if n is None else "batchmean",
        num_items_in_batch=None if n is None else 1)),
    ("distill_loss_mean", None, ("zs",), lambda e, n: distill_loss(
        e["zs"], e["zt"], e["labels"], reduction="mean", divergence="reverse_kl",
        num_items_in_batch=n)),
    ("DistillLoss", None, ("zs",), lambda e, n: DistillLoss(divergence="tvd")(
        e["zs"], e["zt"], e["labels"], num_items_in_batch=n)),
    ("topk_distill_loss", TOPK, ("zs",), lambda e, n: topk_distill_loss(
        e["zs"], e["ids"], e["lps"], e["labels"], num_items_in_batch=n)),
    ("TopKDistillLoss", TOPK, ("zs",), lambda e, n: TopKDistillLoss(temperature=2.0)(
        e["zs"], e["ids"], e["lps"], e["labels"], num_items_in_batch=n)),
]


def _acc_params():
    return [pytest.param(name, keys, fn, id=name, marks=[require(sym)] if sym else [])
            for name, sym, keys, fn in ACC_CASES]


@pytest.mark.parametrize("tensor_n", [False, True], ids=["int", "tensor"])
@pytest.mark.parametrize("name,keys,fn", _acc_params())
def test_two_half_batches_equal_one_full_batch(name, keys, fn, tensor_n):
    d = _data(1)
    full, acc = _accumulated(fn, d, keys, tensor_n=tensor_n)
    _check_accumulated(full, acc, keys, name)


@require(FUSED)
def test_num_items_without_labels_counts_every_row():
    d = _data(2)
    fn = lambda e, n: fused_linear_distill_loss(  # noqa: E731
        e["xs"], e["ws"], e["xt"], e["wt"], None, weight_hard_loss=0.0, num_items_in_batch=n)
    full, acc = _accumulated(fn, d, ("xs", "ws"), n_items=BT)
    _check_accumulated(full, acc, ("xs", "ws"), "no labels")


@require(FUSED)
def test_num_items_scales_soft_and_hard():
    d = _data(3)
    n = 20
    args = (d["xs"], d["ws"], d["xt"], d["wt"], d["labels"])
    base = fused_linear_jsd_loss(*args, return_soft_hard_loss=True)
    got = fused_linear_jsd_loss(*args, return_soft_hard_loss=True, num_items_in_batch=n)
    kept = int((d["labels"] != -100).sum())
    for a, b in zip(got, base):
        assert_close(a, b.double() * kept / n, 1e-6)


def test_distill_num_items_matches_trl_normalization():
    """TRL's generalized_jsd_loss(num_items_in_batch=N): the kept tokens' JSD sum / N."""
    d = _data(4)
    labels = d["labels"]
    got = distill_loss(d["zs"], d["zt"][:, :V], labels, divergence="jsd", beta=0.3,
                       num_items_in_batch=17)
    lp = torch.log_softmax(d["zt"][:, :V].double(), -1)
    lq = torch.log_softmax(d["zs"].double(), -1)
    rows = ref.div_rows(lp, lq, "jsd", beta=0.3)
    assert_close(got, rows[labels != -100].sum() / 17, 1e-5)


def test_num_items_refusals():
    d = _data()
    with pytest.raises(KdlossError, match="reduction='none'"):
        distill_loss(d["zs"], d["zt"], reduction="none", num_items_in_batch=4)
    for bad in (0, -3, 0.0, True, "8"):
        with pytest.raises(KdlossError, match="num_items_in_batch"):
            distill_loss(d["zs"], d["zt"], num_items_in_batch=bad)


@require(FUSED)
def test_num_items_compiles_without_graph_breaks():
    d = _data(5)
    n = torch.tensor(9)

    def fn(e):
        return (fused_linear_jsd_loss(e["xs"], e["ws"], e["xt"], e["wt"], e["labels"],
                                      num_items_in_batch=n)
                + distill_loss(e["zs"], e["zt"], e["labels"], num_items_in_batch=7))

    torch._dynamo.reset()
    explain = torch._dynamo.explain(fn)(d)
    assert explain.graph_break_count == 0, explain.break_reasons
    torch._dynamo.reset()
    want, want_g = _grads(fn, d, ("xs", "ws", "zs"))
    got, got_g = _grads(torch.compile(fn, backend="aot_eager", fullgraph=True), d,
                        ("xs", "ws", "zs"))
    assert_close(got, want, 1e-6, what="loss")
    for a, b in zip(got_g, want_g):
        assert_close(a, b, 1e-6, what="grad")
