"""topk_distill_loss / TopKDistillLoss / FusedLinearTopKDistillLoss (the sparse top-k
teacher) against float64 torch references written from docs/MATH.md section 8
(reference.topk_rows; never from the library's code), plus K = V against the dense
distill_loss, the error paths and finite differences.

Tolerances (the same budget as test_distill.py, tests/README.md): the library computes in fp32
with double accumulation and the reference reads the very values the library reads (bf16 / fp16
log-probs rounded first), so only fp32 rounding separates them:
  - losses rtol 1e-4 / atol 1e-6: fp32 row sums of <= 40 terms, each a product of an exp and a
    log-difference of size <= ~20 (|log-probs| at T = 2), ~1e-6 relative at worst;
  - logit gradients rtol 1e-3 / atol 1e-6: fp32 differences g - Q G that cancel, relative to
    their terms (~1e-7 each), and the tail bin's exp(u_j - R) factor formed in fp32;
  - fused dX / dW / db rtol 1e-3 / atol 1e-5: the gradient above through fp32 GEMMs of length V
    and BT (test_distill.py's fused budget); bf16 operands: test_fused_linear_jsd.py's bf16 budget.
"""

import math

import pytest
import torch

import kdloss
from kdloss import _lib
from kdloss.torch import FusedLinearTopKDistillLoss, TopKDistillLoss, distill_loss
from kdloss.torch.functional import fused_linear_topk_distill_loss, topk_distill_loss

import reference as ref
from conftest import UNIT, assert_close, covers_registry, require

pytestmark = require("kdloss_topk_distill_logits")
fused_only = require("kdloss_fused_linear_topk_distill")

LOSS_TOL = dict(rtol=1e-4, atol=1e-6)
GRAD_TOL = dict(rtol=1e-3, atol=1e-6)
FUSED_GRAD_TOL = dict(rtol=1e-3, atol=1e-5)

# (divergence, beta, alpha): every divergence, parameters off their defaults so that a swapped
# or dropped argument shows, and the JSD / skew end points that map to other operations.
DIVS = [("forward_kl", 0.5, 0.1), ("reverse_kl", 0.5, 0.1), ("jsd", 0.3, 0.1),
        ("jsd", 1.0, 0.1), ("skew_forward_kl", 0.5, 0.25), ("skew_reverse_kl", 0.5, 0.25),
        ("skew_reverse_kl", 0.5, 0.0), ("tvd", 0.5, 0.1)]
CASES = [(d, b, a, tail) for d, b, a in DIVS for tail in ("bucket", "renorm_both")] + \
    [("forward_kl", 0.5, 0.1, "renorm_teacher")]


def teacher(gen, bt, v, k, t, lp_dtype=torch.float32, id_dtype=torch.int64, unused=True):
    """A stored top-k teacher as an offline pipeline makes it: log_softmax(zt / t) over the full
    vocabulary, torch.topk, slots shuffled (slot order must not matter). With `unused`, row 1
    loses its first slot, row 2 its last two and row 3 every slot (-1 ids), and the log-probs
    of unused slots are NaN (the library must never read them)."""
    zt = torch.randn(bt, v, generator=gen, dtype=torch.float64) * 2
    lps, ids = torch.topk(torch.log_softmax(zt / t, -1), k, -1)
    perm = torch.argsort(torch.rand(bt, k, generator=gen), -1)
    ids, lps = ids.gather(1, perm), lps.gather(1, perm)
    if unused:
        ids[1, 0] = -1
        ids[2, -2:] = -1
        ids[3] = -1
        lps[ids < 0] = math.nan
    return ids.to(id_dtype), lps.to(lp_dtype)


def student(gen, bt, v, scale=3.0):
    return (torch.randn(bt, v, generator=gen) * scale).requires_grad_()


def reference(zs, ids, lps, labels, div, tail, beta, alpha, t, reduction, ii=-100):
    """(loss, zd): the reduced float64 reference loss and the float64 leaf it depends on."""
    zd = zs.detach().double().requires_grad_()
    keep = torch.ones(zs.shape[0], dtype=torch.bool) if labels is None else labels != ii
    rows = ref.topk_rows(zd, ids, lps, div, tail, beta, alpha, t) * keep
    n = max(1, int(keep.sum()))
    return {"batchmean": rows.sum() / n, "sum": rows.sum(), "none": rows}[reduction], zd


def check_against_reference(zs, ids, lps, labels, div, tail, beta, alpha, t, reduction, out):
    want, zd = reference(zs, ids, lps, labels, div, tail, beta, alpha, t, reduction)
    torch.testing.assert_close(out.double(), want.detach(), **LOSS_TOL)
    w = torch.randn(zs.shape[0]) if reduction == "none" else torch.tensor(1.7)
    (out * w).sum().backward()
    (want * w.double()).sum().backward()
    torch.testing.assert_close(zs.grad.double(), zd.grad, **GRAD_TOL)


@pytest.mark.parametrize("div,beta,alpha,tail", CASES)
@pytest.mark.parametrize("reduction", ["batchmean", "sum", "none"])
def test_topk_matches_reference(div, beta, alpha, tail, reduction, gen):
    """Every divergence x tail x reduction, ignored rows (one of them with a used slot), unused
    slots (first, last two, all), T = 2."""
    bt, v, k, t = 10, 37, 6, 2.0
    ids, lps = teacher(gen, bt, v, k, t)
    zs = student(gen, bt, v)
    labels = torch.randint(0, v, (bt,), generator=gen)
    labels[[0, 5]] = -100
    out = topk_distill_loss(zs, ids, lps, labels, divergence=div, tail=tail, beta=beta,
                            alpha=alpha, temperature=t, reduction=reduction)
    assert out.dtype == zs.dtype and out.shape == ((bt,) if reduction == "none" else ())
    check_against_reference(zs, ids, lps, labels, div, tail, beta, alpha, t, reduction, out)
    if reduction == "none":
        assert out[0].item() == 0.0 and out[3].item() == 0.0  # ignored; no used slot
        assert torch.count_nonzero(zs.grad[[0, 3, 5]]) == 0


@pytest.mark.parametrize("lp_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("tail", ["bucket", "renorm_both"])
def test_half_logprobs_and_id_dtypes(lp_dtype, id_dtype, tail, gen):
    """The reference reads the rounded bf16 / fp16 log-probs, so the fp32 budget holds; the
    rounded top-k mass may exceed 1 (the bucket's floor then applies in both)."""
    bt, v, k, t = 8, 29, 5, 1.0
    ids, lps = teacher(gen, bt, v, k, t, lp_dtype, id_dtype)
    zs = student(gen, bt, v)
    out = TopKDistillLoss(divergence="jsd", tail=tail, temperature=t)(zs, ids, lps)
    check_against_reference(zs, ids, lps, None, "jsd", tail, 0.5, 0.1, t, "batchmean", out)


def test_leading_dims_and_padded_views(spy, gen):
    """(B, T, V) logits with (B, T, K) ids / log-probs sliced out of wider tensors: the teacher
    goes in as views with their own row stride (no copy), the per-row loss comes back (B, T)."""
    b, s, v, k, t = 2, 5, 23, 4, 1.5
    ids, lps = teacher(gen, b * s, v, k, t)
    wide_ids = torch.full((b * s, k + 3), -7, dtype=ids.dtype)
    wide_lps = torch.full((b * s, k + 3), 99.0)
    wide_ids[:, :k], wide_lps[:, :k] = ids, lps
    ids3, lps3 = wide_ids[:, :k].view(b, s, k), wide_lps[:, :k].view(b, s, k)
    zs = student(gen, b * s, v)
    labels = torch.randint(0, v, (b, s), generator=gen)
    labels[1, 2] = -100
    zs3 = zs.detach().view(b, s, v).requires_grad_()
    out = topk_distill_loss(zs3, ids3, lps3, labels, divergence="reverse_kl", temperature=t,
                            reduction="none")
    assert out.shape == (b, s)
    teacher_view = spy.calls[-1][1][5]
    assert teacher_view.k == k
    assert teacher_view.ids.ld == k + 3 and teacher_view.logprobs.ld == k + 3
    assert teacher_view.ids.data == wide_ids.data_ptr()
    want, zd = reference(zs, ids, lps, labels.reshape(-1), "reverse_kl", "bucket", 0.5, 0.1, t,
                         "none")
    torch.testing.assert_close(out.reshape(-1).double(), want.detach(), **LOSS_TOL)
    out.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(zs3.grad.reshape(b * s, v).double(), zd.grad, **GRAD_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("grad", [False, True])
def test_student_logits_are_left_untouched(dtype, grad, gen):
    """The student's logits are an input: no call may write them (a forward-only fp32 call
    once masked the teacher's ids to -inf in them, so a second call on the same tensor was
    infinite)."""
    ids, lps = teacher(gen, 6, 17, 3, 1.0)
    zs = student(gen, 6, 17).detach().to(dtype).requires_grad_(grad)
    before = zs.detach().clone()
    first = topk_distill_loss(zs, ids, lps)
    assert torch.equal(zs.detach(), before)
    assert torch.equal(topk_distill_loss(zs, ids, lps).detach(), first.detach())


def test_forward_only_passes_no_gradient_output(spy, gen):
    ids, lps = teacher(gen, 6, 17, 3, 1.0)
    zs = student(gen, 6, 17)
    with torch.no_grad():
        a = topk_distill_loss(zs, ids, lps)
    assert spy.calls[-1][1][-1].data is None  # grad: the NULL view
    b = topk_distill_loss(zs, ids, lps)
    assert spy.calls[-1][1][-1].data is not None
    assert torch.equal(a, b.detach())


@pytest.mark.parametrize("div,tail", [(d, t) for d in ("forward_kl", "reverse_kl", "jsd",
                                                       "skew_forward_kl", "tvd")
                                      for t in ("bucket", "renorm_both")] +
                         [("forward_kl", "renorm_teacher")])
def test_full_vocabulary_teacher_is_the_dense_loss(div, tail, gen):
    """K = V (ids a permutation of the vocabulary): no tail bin, no renormalization left, so every
    tail mode is distill_loss with the dense teacher (renorm_teacher: forward KL only). Both are
    the library in fp32; they differ by the teacher log-probs' rounding (formed by torch here,
    by the C library from the logits there: ~1 ulp of |y| <= 10) and summation order, hence
    loss rtol 1e-5 and gradient rtol 1e-4 (atol 1e-6, the fp32 terms' size)."""
    bt, v, t = 6, 19, 2.0
    zt = torch.randn(bt, v, generator=gen) * 2
    ids = torch.stack([torch.randperm(v, generator=gen) for _ in range(bt)])
    lps = torch.log_softmax(zt / t, -1).gather(1, ids)
    zs = student(gen, bt, v)
    zd = zs.detach().clone().requires_grad_()
    labels = torch.randint(0, v, (bt,), generator=gen)
    labels[2] = -100
    kw = dict(divergence=div, beta=0.3, alpha=0.25, temperature=t)
    a = topk_distill_loss(zs, ids.to(torch.int32), lps, labels, tail=tail, **kw)
    b = distill_loss(zd, zt, labels, **kw)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    a.backward()
    b.backward()
    torch.testing.assert_close(zs.grad, zd.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("div", ["reverse_kl", "skew_reverse_kl", "forward_kl", "tvd"])
def test_teacher_mass_one_and_minus_inf_logprobs(div, gen):
    """The stored top-k mass is exactly 1 (two slots of log 1/2): the bucket's teacher tail is
    the 2^-126 floor, so reverse-type divergences stay finite. A -inf log-prob in a used slot
    is a zero-probability bin: 0 log 0 = 0 for the forward-type ones, while reverse KL is
    rightly infinite there (student mass where the teacher has none, MATH.md section 5)."""
    bt, v, t = 3, 11, 1.0
    ids = torch.tensor([[2, 7], [0, 10], [4, 5]])
    half = math.log(0.5)
    lps = torch.tensor([[half, half], [half, half], [0.0, -math.inf]])
    zs = student(gen, bt, v)
    out = topk_distill_loss(zs, ids, lps, divergence=div, alpha=0.25, temperature=t,
                            reduction="none")
    assert torch.isfinite(out[:2]).all()
    assert bool(torch.isinf(out[2])) == (div == "reverse_kl")
    zs.grad = None
    finite = slice(0, 2) if div == "reverse_kl" else slice(0, 3)
    zs2 = zs.detach()[finite].clone().requires_grad_()
    out = topk_distill_loss(zs2, ids[finite], lps[finite], divergence=div, alpha=0.25,
                            temperature=t)
    check_against_reference(zs2, ids[finite], lps[finite], None, div, "bucket", 0.5, 0.25, t,
                            "batchmean", out)
    assert torch.isfinite(zs2.grad).all()


def test_all_rows_ignored_or_empty():
    zs = torch.randn(4, 9, requires_grad=True)
    ids = torch.tensor([[1, 2], [3, -1], [-1, -1], [0, 8]])
    lps = torch.log(torch.tensor([[0.2, 0.1]] * 4))
    loss = TopKDistillLoss(divergence="tvd")(zs, ids, lps, torch.full((4,), -100))
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(zs.grad) == 0
    zs.grad = None
    empty = torch.full((4, 2), -1)
    loss = topk_distill_loss(zs, empty, lps, reduction="sum")
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(zs.grad) == 0


# ---- the reference against MATH.md's closed forms and finite differences -------------------------

def test_reference_forward_kl_bucket_gradient_closed_form(gen):
    """docs/MATH.md section 8: forward KL with the bucket has dD/du = Q_k - P_k on S and
    Q_j (1 - P_tail / Q_tail) outside (u = z / T); checks the reference's autograd against it."""
    bt, v, k, t = 5, 13, 4, 2.0
    ids, lps = teacher(gen, bt, v, k, t, unused=False)
    zd = (torch.randn(bt, v, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    ref.topk_rows(zd, ids, lps, "forward_kl", "bucket", t=t).sum().backward()
    q = torch.softmax(zd.detach() / t, -1)
    p = torch.zeros(bt, v, dtype=torch.float64).scatter(1, ids, lps.double().exp())
    inside = torch.zeros(bt, v, dtype=torch.bool).scatter(1, ids, True)
    p_tail = 1 - p.sum(-1, keepdim=True)
    q_tail = (q * ~inside).sum(-1, keepdim=True)
    want = torch.where(inside, q - p, q * (1 - p_tail / q_tail)) / t
    torch.testing.assert_close(zd.grad, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("tail,div", [("bucket", "jsd"), ("bucket", "skew_reverse_kl"),
                                      ("renorm_both", "reverse_kl"),
                                      ("renorm_teacher", "forward_kl")])
def test_reference_and_library_against_finite_differences(tail, div, gen):
    """gradcheck of the float64 reference (central differences, h 1e-6, rtol 1e-6: truncation
    O(h^2) and cancellation O(2^-53 / h) both far below it), then the library's gradient against
    central differences of its own fp32 loss (h 1e-2: rounding / h and truncation give ~1e-3,
    checked to 2e-2 of the largest entry, tests/README.md's library-vs-FD bound)."""
    bt, v, k, t = 3, 7, 3, 1.5
    ids, lps = teacher(gen, bt, v, k, t, unused=False)
    ids[1, 2] = -1
    z0 = torch.randn(bt, v, generator=gen, dtype=torch.float64) * 2
    f = lambda z: ref.topk_rows(z, ids, lps, div, tail, 0.3, 0.25, t).sum()  # noqa: E731
    assert torch.autograd.gradcheck(f, (z0.clone().requires_grad_(),), eps=1e-6, atol=1e-9,
                                    rtol=1e-6)
    kw = dict(divergence=div, tail=tail, beta=0.3, alpha=0.25, temperature=t, reduction="sum")
    zs = z0.float().requires_grad_()
    topk_distill_loss(zs, ids, lps.float(), **kw).backward()
    h = 1e-2
    fd = torch.zeros(bt, v, dtype=torch.float64)
    with torch.no_grad():
        for i in range(bt):
            for j in range(v):
                zp, zm = z0.float().clone(), z0.float().clone()
                zp[i, j] += h
                zm[i, j] -= h
                fd[i, j] = (float(topk_distill_loss(zp, ids, lps.float(), **kw)) -
                            float(topk_distill_loss(zm, ids, lps.float(), **kw))) / (2 * h)
    assert_close(zs.grad, fd, rtol=2e-2, what="library vs finite differences")


# ---- errors: raised before anything is written, no gradient --------------------------------------

def _status(name):
    return getattr(_lib, name)


BAD_TEACHERS = [
    ("id == V", lambda ids, lps: (ids.index_fill(1, torch.tensor([0]), 17), lps), "ERR_INVALID_ID"),
    ("id -2", lambda ids, lps: (torch.where(ids == ids[0, 1], -2, ids), lps), "ERR_INVALID_ID"),
    ("repeated id", lambda ids, lps: (ids.index_copy(1, torch.tensor([1]), ids[:, :1]), lps),
     "ERR_INVALID_ID"),
    ("ids / logprobs shapes", lambda ids, lps: (ids, lps[:, :2]), "ERR_SHAPE_MISMATCH"),
    ("rows", lambda ids, lps: (ids[:3], lps[:3]), "ERR_SHAPE_MISMATCH"),
    ("K = 0", lambda ids, lps: (ids[:, :0], lps[:, :0]), "ERR_INVALID_SIZE"),
    ("bool ids", lambda ids, lps: (ids > 3, lps), "ERR_INVALID_DTYPE"),
    ("float ids", lambda ids, lps: (ids.float(), lps), "ERR_INVALID_DTYPE"),
    ("float64 logprobs", lambda ids, lps: (ids, lps.double()), "ERR_INVALID_DTYPE"),
    ("integer logprobs", lambda ids, lps: (ids, lps.long()), "ERR_INVALID_DTYPE"),
]


def _good_teacher():
    ids = torch.tensor([[1, 4, -1], [0, 2, 3], [5, -1, -1], [6, 16, 9]])
    return ids, torch.log(torch.full((4, 3), 0.1))


@pytest.mark.parametrize("what,make,status", BAD_TEACHERS, ids=[b[0] for b in BAD_TEACHERS])
def test_bad_teacher_raises_and_leaves_grad(what, make, status):
    ids, lps = make(*_good_teacher())
    zs = torch.randn(4, 17, requires_grad=True)
    zs.grad = torch.full_like(zs, 3.0)
    with pytest.raises(kdloss.KdlossError) as e:
        topk_distill_loss(zs, ids, lps).backward()
    assert e.value.status == _status(status), str(e.value)
    assert kdloss.status_string(e.value.status) in str(e.value)
    assert torch.equal(zs.grad, torch.full_like(zs, 3.0))


def test_invalid_id_in_an_ignored_row_still_raises():
    ids, lps = _good_teacher()
    ids[2, 1] = 5  # repeats the row's first id
    zs = torch.randn(4, 17, requires_grad=True)
    with pytest.raises(kdloss.KdlossError) as e:
        topk_distill_loss(zs, ids, lps, torch.tensor([1, 2, -100, 3]))
    assert e.value.status_name == "KDLOSS_ERR_INVALID_ID"
    assert zs.grad is None


BAD_PARAMS = [dict(divergence="kl"), dict(tail="top"), dict(tail=None), dict(beta=1.5),
              dict(alpha=float("nan")), dict(alpha=-0.1), dict(temperature=0.0),
              dict(temperature=-2.0), dict(temperature=float("nan")),
              dict(divergence="jsd", tail="renorm_teacher"),
              dict(divergence="tvd", tail="renorm_teacher")]


@pytest.mark.parametrize("kw", BAD_PARAMS, ids=[str(k) for k in BAD_PARAMS])
def test_bad_params_raise_with_the_c_message(kw):
    ids, lps = _good_teacher()
    zs = torch.randn(4, 17, requires_grad=True)
    with pytest.raises(kdloss.KdlossError) as e:
        topk_distill_loss(zs, ids, lps, **kw)
    assert e.value.status == -5 and "invalid parameter" in str(e.value)
    assert zs.grad is None


def test_bad_labels_and_reduction_raise():
    ids, lps = _good_teacher()
    zs = torch.randn(4, 17, requires_grad=True)
    for labels, status in ((torch.tensor([True, False, True, True]), "KDLOSS_ERR_INVALID_DTYPE"),
                           (torch.tensor([1.0, 2.0, 3.0, 4.0]), "KDLOSS_ERR_INVALID_DTYPE"),
                           (torch.tensor([1, 2, 17, 3]), "KDLOSS_ERR_LABEL_OUT_OF_RANGE"),
                           (torch.tensor([1, 2, 3]), "KDLOSS_ERR_SHAPE_MISMATCH")):
        with pytest.raises(kdloss.KdlossError) as e:
            topk_distill_loss(zs, ids, lps, labels)
        assert e.value.status_name == status
    with pytest.raises(kdloss.KdlossError) as e:
        TopKDistillLoss(reduction="avg")(zs, ids, lps)
    assert e.value.status_name == "KDLOSS_ERR_INVALID_REDUCTION"
    with pytest.raises(kdloss.KdlossError):
        TopKDistillLoss(tail="nope")
    assert zs.grad is None
    topk_distill_loss(zs, ids, lps).backward()  # a good call right after still works
    assert torch.isfinite(zs.grad).all()


@pytest.mark.parametrize("fused", [False, True])
def test_double_backward_raises(fused, gen):
    ids, lps = teacher(gen, 4, 7, 3, 1.0)
    if fused:
        if not _lib.has("kdloss_fused_linear_topk_distill"):
            pytest.skip("no kdloss_fused_linear_topk_distill yet")
        ws = torch.randn(7, 5, generator=gen)
        x = torch.randn(4, 5, generator=gen, requires_grad=True)
        loss = FusedLinearTopKDistillLoss()(x, ws, ids, lps)
    else:
        x = student(gen, 4, 7)
        loss = topk_distill_loss(x, ids, lps)
    (g,) = torch.autograd.grad(loss, x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiable once only"):
        (g ** 2).sum().backward()


# ---- the fused-linear module ---------------------------------------------------------------------

def fused_reference(xs, ws, bs, ids, lps, labels, div, tail, t, wh, wsft, t2, beta=0.5,
                    alpha=0.1, ii=-100):
    """(loss, soft, hard) of the fused top-k loss with float64 logits (docs/MATH.md 4 and 8)."""
    zs = xs.reshape(-1, xs.shape[-1]) @ ws.T + (0 if bs is None else bs)
    keep = torch.ones(zs.shape[0], dtype=torch.bool) if labels is None else labels != ii
    n = max(1, int(keep.sum()))
    hard = (torch.nn.functional.cross_entropy(zs[keep], labels[keep], reduction="sum")
            if labels is not None and keep.any() else zs.sum() * 0) / n
    soft = (ref.topk_rows(zs, ids, lps, div, tail, beta, alpha, t) * keep).sum() / n
    soft = soft * (t * t if t2 else 1.0)
    return wh * hard + wsft * soft, soft, hard


def fused_case(gen, bt=12, h=16, v=41, k=5, t=1.5, dtype=torch.float32, bias=True):
    xs = torch.randn(bt, h, generator=gen).to(dtype).requires_grad_()
    ws = (torch.randn(v, h, generator=gen) * 0.3).to(dtype).requires_grad_()
    bs = (torch.randn(v, generator=gen) * 0.5).to(dtype).requires_grad_() if bias else None
    ids, lps = teacher(gen, bt, v, k, t)
    labels = torch.randint(0, v, (bt,), generator=gen)
    labels[[3, -1]] = -100
    return xs, ws, bs, ids, lps, labels


def check_fused(loss, leaves, loss_ref, copies):
    """loss: the library's (already backwarded), leaves its (xs, ws, bs); loss_ref: the
    reference over `copies`, their float64 twins."""
    torch.testing.assert_close(loss.double(), loss_ref.detach(), **LOSS_TOL)
    loss_ref.backward()
    for name, a, b in zip(("dX", "dW", "db"), leaves, copies):
        if a is not None:
            assert a.grad.dtype == a.dtype, name
            torch.testing.assert_close(a.grad.double(), b.grad, **FUSED_GRAD_TOL, msg=name)


def float64_copies(*tensors):
    return [None if x is None else x.detach().double().requires_grad_() for x in tensors]


FUSED_CASES = [("bucket", "forward_kl"), ("bucket", "skew_reverse_kl"), ("renorm_both", "jsd"),
               ("renorm_both", "forward_kl"), ("renorm_teacher", "forward_kl")]
# with labels and CE; with labels and no CE (renorm_both then runs the sparse path); no labels
MODES = [("ce", 0.3, 0.7), ("soft", 0.0, 1.0), ("nolabels", 0.0, 0.8)]


@fused_only
@pytest.mark.parametrize("tail,div", FUSED_CASES)
@pytest.mark.parametrize("mode,wh,wsft", MODES)
@pytest.mark.parametrize("t2", [False, True])
def test_fused_matches_reference(tail, div, mode, wh, wsft, t2, gen):
    xs, ws, bs, ids, lps, labels = fused_case(gen)
    if mode == "nolabels":
        labels = None
    t = 1.5
    m = FusedLinearTopKDistillLoss(divergence=div, tail=tail, beta=0.3, alpha=0.25,
                                   weight_hard_loss=wh, weight_soft_loss=wsft, temperature=t,
                                   t2_scale=t2)
    loss = m(xs, ws, ids, lps, labels, bs)
    loss.backward()
    copies = float64_copies(xs, ws, bs)
    want = fused_reference(*copies, ids, lps, labels, div, tail, t, wh, wsft, t2, 0.3, 0.25)[0]
    check_fused(loss, (xs, ws, bs), want, copies)


@fused_only
@pytest.mark.parametrize("tail,wh", [("bucket", 0.4), ("renorm_both", 0.4), ("renorm_both", 0.0)])
def test_fused_chunked_soft_and_hard_parts(tail, wh, gen):
    """chunk_size 5 over 12 rows (three chunks, the last partial); soft and hard parts (the hard
    part asked for; renorm_both without CE weight: the sparse path, whose hard part is 0)."""
    xs, ws, bs, ids, lps, labels = fused_case(gen)
    loss, soft, hard = fused_linear_topk_distill_loss(
        xs, ws, ids, lps, labels, bs, tail=tail, divergence="reverse_kl", weight_hard_loss=wh,
        weight_soft_loss=0.6, temperature=2.0, t2_scale=True, chunk_size=5,
        return_soft_hard_loss=True)
    loss.backward()
    copies = float64_copies(xs, ws, bs)
    want = fused_reference(*copies, ids, lps, labels, "reverse_kl", tail, 2.0, wh, 0.6, True)
    torch.testing.assert_close(soft.double(), want[1].detach(), **LOSS_TOL)
    torch.testing.assert_close(hard.double(), want[2].detach(), **LOSS_TOL)
    check_fused(loss, (xs, ws, bs), want[0], copies)


@fused_only
@pytest.mark.parametrize("div", ["forward_kl", "jsd"])
def test_fused_full_vocabulary_teacher_is_the_dense_fused_loss(div, gen):
    """K = V (a permutation per row, stored in fp32): FusedLinearTopKDistillLoss with the bucket
    is FusedLinearDistillLoss with the teacher's LM head, cross-entropy included. Both are the
    library in fp32, differing by where the teacher's log-probs are rounded: rtol 1e-5 loss,
    1e-4 gradients (as the logits-level K = V test)."""
    from kdloss.torch import FusedLinearDistillLoss
    bt, h, v, t = 10, 12, 23, 2.0
    xs = torch.randn(bt, h, generator=gen, requires_grad=True)
    ws = (torch.randn(v, h, generator=gen) * 0.3).requires_grad_()
    xt, wt = torch.randn(bt, h, generator=gen), torch.randn(v, h, generator=gen) * 0.3
    labels = torch.randint(0, v, (bt,), generator=gen)
    labels[2] = -100
    ids = torch.stack([torch.randperm(v, generator=gen) for _ in range(bt)])
    lps = torch.log_softmax(xt @ wt.T / t, -1).gather(1, ids)
    kw = dict(divergence=div, beta=0.3, weight_hard_loss=0.3, weight_soft_loss=0.7,
              temperature=t, t2_scale=True)
    a = FusedLinearTopKDistillLoss(**kw)(xs, ws, ids, lps, labels)
    a.backward()
    xd, wd = xs.detach().clone().requires_grad_(), ws.detach().clone().requires_grad_()
    b = FusedLinearDistillLoss(**kw)(xd, wd, xt, wt, labels)
    b.backward()
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(xs.grad, xd.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(ws.grad, wd.grad, rtol=1e-4, atol=1e-6)


@fused_only
@pytest.mark.parametrize("tail", ["bucket", "renorm_both"])
def test_fused_bf16(tail, gen):
    """bf16 student operands (exact in float64): test_fused_linear_jsd.py's bf16 budget, one
    rounding of each gradient and of the loss to bf16 (2 u(bf16) relative, 4e-3 of the largest
    entry absolute)."""
    xs, ws, bs, ids, lps, labels = fused_case(gen, dtype=torch.bfloat16)
    loss = FusedLinearTopKDistillLoss(tail=tail, divergence="jsd")(xs, ws, ids, lps, labels, bs)
    loss.backward()
    copies = float64_copies(xs, ws, bs)
    want = fused_reference(*copies, ids, lps, labels, "jsd", tail, 1.0, 0.0, 1.0, False)[0]
    rtol = 2 * UNIT[torch.bfloat16]
    assert_close(loss, want.detach(), rtol, 4e-3, "loss")
    want.backward()
    for name, a, b in zip(("dX", "dW", "db"), (xs, ws, bs), copies):
        assert a.grad.dtype == torch.bfloat16
        assert_close(a.grad, b.grad, rtol, 4e-3, name)


@fused_only
def test_fused_errors_leave_gradients_untouched(gen):
    xs, ws, bs, ids, lps, labels = fused_case(gen, bt=4, v=17, k=3)
    for t in (xs, ws, bs):
        t.grad = torch.full_like(t, 2.0)
    repeat_in_ignored_row = ids.clone()
    repeat_in_ignored_row[3, :2] = 5
    assert labels[3] == -100
    bad = [
        (dict(), (ids.masked_fill(ids == ids[0, 0], 17), lps, labels), "KDLOSS_ERR_INVALID_ID"),
        (dict(), (repeat_in_ignored_row, lps, labels), "KDLOSS_ERR_INVALID_ID"),
        (dict(), (ids[:, :2], lps, labels), "KDLOSS_ERR_SHAPE_MISMATCH"),
        (dict(), (ids[:3], lps[:3], labels), "KDLOSS_ERR_SHAPE_MISMATCH"),
        (dict(), (ids > 0, lps, labels), "KDLOSS_ERR_INVALID_DTYPE"),
        (dict(), (ids, lps, labels.bool()), "KDLOSS_ERR_INVALID_DTYPE"),
        (dict(weight_hard_loss=0.5), (ids, lps, None), "KDLOSS_ERR_INVALID_PARAM"),
        (dict(tail="renorm_teacher", divergence="reverse_kl"), (ids, lps, labels),
         "KDLOSS_ERR_INVALID_PARAM"),
        (dict(temperature=0.0), (ids, lps, labels), "KDLOSS_ERR_INVALID_PARAM"),
        (dict(beta=-1.0), (ids, lps, labels), "KDLOSS_ERR_INVALID_PARAM"),
    ]
    for kw, (i, lp, lab), status in bad:
        with pytest.raises(kdloss.KdlossError) as e:
            FusedLinearTopKDistillLoss(**kw)(xs, ws, i, lp, lab, bs).backward()
        assert e.value.status_name == status, (kw, str(e.value))
        assert kdloss.status_string(e.value.status) in str(e.value)
    with pytest.raises(kdloss.KdlossError) as e:
        FusedLinearTopKDistillLoss()(xs, ws[:, :3], ids, lps, labels, bs)
    assert e.value.status_name == "KDLOSS_ERR_SHAPE_MISMATCH"
    for t in (xs, ws, bs):
        assert torch.equal(t.grad, torch.full_like(t, 2.0))
    for kw in (dict(divergence="kl"), dict(tail="bucket2")):
        with pytest.raises(kdloss.KdlossError) as e:
            FusedLinearTopKDistillLoss(**kw)
        assert e.value.status == -5


def test_module_repr_and_attributes():
    m = FusedLinearTopKDistillLoss(tail="renorm_both", t2_scale=True)
    assert "tail='renorm_both'" in repr(m) and "t2_scale=True" in repr(m)
    assert m.weight_hard_loss == 0.0 and m.weight_soft_loss == 1.0
    m2 = TopKDistillLoss(divergence="jsd", beta=0.2)
    assert m2.beta == 0.2 and m2.reduction == "batchmean" and m2.tail == "bucket"


def test_cases_cover_the_divergence_registry():
    assert covers_registry({d for d, _, _ in DIVS}) == []
