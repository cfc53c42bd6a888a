"""kdloss.torch.FusedLinearJSDLoss / FusedLinearJSD against the float64 full-logits reference of
docs/MATH.md section 4, at the C tests' small shape (BT 141, Hs 15, Ht 31, V 123)."""

import itertools
import math

import pytest
import torch

import kdloss
from kdloss.torch import FusedLinearJSD, FusedLinearJSDLoss, fused_linear_jsd_loss

import reference as ref
from conftest import UNIT, assert_close, require

pytestmark = require("kdloss_fused_linear_jsd")

BT, HS, HT, V = 141, 15, 31, 123
# fp32: logits come from fp32 GEMMs of length Hs/Ht (relative error ~1e-7 * sqrt(H)), softmaxes in
# fp32, dXs/dWs from fp32 GEMMs over V and BT: 1e-4 of the largest entry is ~100x that budget.
# bf16: inputs exact in float64, fp32 math, one rounding of each gradient (and the loss) to bf16.
TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2 * UNIT[torch.bfloat16], 4e-3)}


def make(gen, dtype=torch.float32, bias=False, ignore=False, bt=BT, hs=HS, ht=HT, v=V,
         teacher_dtype=None):
    def r(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen, dtype=torch.float64))
    t = dict(xs=r(bt, hs), ws=r(v, hs, scale=2 / math.sqrt(hs)), xt=r(bt, ht),
             wt=r(v, ht, scale=2 / math.sqrt(ht)))
    t = {k: x.to(dtype if k[1] == "s" else (teacher_dtype or dtype)) for k, x in t.items()}
    t["bs"] = r(v, scale=0.5).to(dtype) if bias else None
    t["bt"] = r(v, scale=0.5).to(teacher_dtype or dtype) if bias else None
    labels = torch.randint(0, v, (bt,), generator=gen)
    if ignore:
        labels[::4] = -100
    t["labels"] = labels
    return t


def reference(t, **kw):
    d = {k: (None if x is None else x.detach().double()) for k, x in t.items() if k != "labels"}
    for k in ("xs", "ws", "bs"):
        if d[k] is not None:
            d[k].requires_grad_()
    loss, soft, hard = ref.fused_linear_jsd_loss(d["xs"], d["ws"], d["xt"], d["wt"], t["labels"],
                                                 d["bs"], d["bt"], **kw)
    loss.backward()
    grads = {k: d[k].grad for k in ("xs", "ws", "bs") if d[k] is not None}
    return loss.detach(), soft.detach(), hard.detach(), grads


def run(t, module):
    for k in ("xs", "ws", "bs"):
        if t[k] is not None:
            t[k].requires_grad_()
    loss, soft, hard = module(t["xs"], t["ws"], t["xt"], t["wt"], t["labels"], t["bs"], t["bt"])
    loss.backward()
    return loss, soft, hard, {k: t[k].grad for k in ("xs", "ws", "bs") if t[k] is not None}


def check(got, want, dtype):
    rtol, atol = TOL[dtype]
    for name, a, b in zip(("loss", "soft", "hard"), got[:3], want[:3]):
        assert_close(a, b, rtol, atol, name)
    assert got[3].keys() == want[3].keys()
    for k in want[3]:
        assert got[3][k].dtype == dtype, k
        assert_close(got[3][k], want[3][k], rtol, atol, f"d{k}")


GRID = list(itertools.product([0.0, 0.5, 1.0], [1.0, 2.5], [(0.5, 0.5), (0.0, 1.0), (1.0, 0.0)],
                              [False, True], [False, True]))


@pytest.mark.parametrize("beta,temperature,weights,bias,ignore", GRID,
                         ids=[f"b{b}-T{t}-w{w[0]}_{w[1]}-{'bias' if bi else 'nobias'}-"
                              f"{'ign' if ig else 'all'}" for b, t, w, bi, ig in GRID])
def test_grid_fp32(beta, temperature, weights, bias, ignore, gen):
    t = make(gen, bias=bias, ignore=ignore)
    kw = dict(w_hard=weights[0], w_soft=weights[1], beta=beta, temperature=temperature)
    module = FusedLinearJSDLoss(weight_hard_loss=weights[0], weight_soft_loss=weights[1],
                                beta=beta, temperature=temperature, return_soft_hard_loss=True)
    check(run(t, module), reference(t, **kw), torch.float32)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_bf16(beta, gen):
    t = make(gen, dtype=torch.bfloat16, bias=True, ignore=True)
    module = FusedLinearJSDLoss(beta=beta, temperature=2.0, return_soft_hard_loss=True)
    check(run(t, module), reference(t, beta=beta, temperature=2.0), torch.bfloat16)


def test_bf16_student_fp32_teacher(gen):
    t = make(gen, dtype=torch.bfloat16, teacher_dtype=torch.float32, bias=True)
    module = FusedLinearJSDLoss(return_soft_hard_loss=True)
    check(run(t, module), reference(t), torch.bfloat16)


@pytest.mark.parametrize("ignore", [False, True])
def test_fused_linear_jsd_pure_soft(ignore, gen):
    t = make(gen, ignore=ignore)
    xs, ws = t["xs"].requires_grad_(), t["ws"].requires_grad_()
    labels = t["labels"] if ignore else None
    loss = FusedLinearJSD(jsd_beta=0.3, temperature=1.5)(xs, ws, t["xt"], t["wt"], labels)
    loss.backward()
    d = {k: t[k].detach().double() for k in ("xs", "ws", "xt", "wt")}
    d["xs"].requires_grad_(), d["ws"].requires_grad_()
    want = ref.fused_linear_jsd_loss(d["xs"], d["ws"], d["xt"], d["wt"], labels, w_hard=0.0,
                                     w_soft=1.0, beta=0.3, temperature=1.5)[0]
    want.backward()
    assert_close(loss, want, 1e-4, what="loss")
    assert_close(xs.grad, d["xs"].grad, 1e-4, what="dxs")
    assert_close(ws.grad, d["ws"].grad, 1e-4, what="dws")


def test_3d_inputs_and_2d_labels(gen):
    t = make(gen, bt=2 * 9, bias=True, ignore=True)
    want = reference(t)
    t3 = dict(t, xs=t["xs"].reshape(2, 9, HS), xt=t["xt"].reshape(2, 9, HT),
              labels=t["labels"].reshape(2, 9))
    got = run(t3, FusedLinearJSDLoss(return_soft_hard_loss=True))
    assert got[3]["xs"].shape == (2, 9, HS)
    got[3]["xs"] = got[3]["xs"].reshape(18, HS)
    check(got, want, torch.float32)


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 1024, 0, None])
def test_chunk_size_does_not_change_results(chunk_size, gen):
    t = make(gen, bias=True, ignore=True)
    check(run(t, FusedLinearJSDLoss(chunk_size=chunk_size, return_soft_hard_loss=True)),
          reference(t), torch.float32)


def test_upstream_gradient_non_leaf_and_teacher_gets_none(gen):
    t = make(gen, bias=True)
    h = torch.randn(BT, 6, generator=gen, dtype=torch.float64).float().requires_grad_()
    proj = torch.randn(6, HS, generator=gen).requires_grad_()
    xs = h @ proj  # non-leaf student input
    ws, bs = t["ws"].requires_grad_(), t["bs"].requires_grad_()
    xt = t["xt"].requires_grad_()  # a teacher that requires grad still gets none
    loss = fused_linear_jsd_loss(xs, ws, xt, t["wt"], t["labels"], bs, t["bt"], temperature=2.0)
    (3.0 * loss).backward()
    assert xt.grad is None
    hd, pd = h.detach().double().requires_grad_(), proj.detach().double().requires_grad_()
    wd, bd = ws.detach().double().requires_grad_(), bs.detach().double().requires_grad_()
    want = ref.fused_linear_jsd_loss(hd @ pd, wd, t["xt"].detach().double(), t["wt"].double(),
                                     t["labels"], bd, t["bt"].double(), temperature=2.0)[0]
    (3.0 * want).backward()
    for name, a, b in (("h", h, hd), ("proj", proj, pd), ("ws", ws, wd), ("bs", bs, bd)):
        assert_close(a.grad, b.grad, 1e-4, what=name)


def test_only_requested_gradients_are_computed(spy, gen):
    t = make(gen, bias=True)
    xs = t["xs"].requires_grad_()
    loss = fused_linear_jsd_loss(xs, t["ws"], t["xt"], t["wt"], t["labels"], t["bs"], t["bt"])
    out = spy.calls[-1][1][13]
    assert out.dxs.data is not None and out.dws.data is None and out.dbs is None
    loss.backward()
    assert t["ws"].grad is None and xs.grad is not None
    with torch.no_grad():
        fused_linear_jsd_loss(xs, t["ws"].requires_grad_(), t["xt"], t["wt"], t["labels"])
    out = spy.calls[-1][1][13]
    assert out.dxs.data is None and out.dws.data is None and out.dbs is None


def test_soft_and_hard_are_not_differentiable(gen):
    t = make(gen)
    t["xs"].requires_grad_()
    loss, soft, hard = fused_linear_jsd_loss(t["xs"], t["ws"], t["xt"], t["wt"], t["labels"],
                                             return_soft_hard_loss=True)
    assert loss.requires_grad and not soft.requires_grad and not hard.requires_grad


def test_all_rows_ignored(gen):
    t = make(gen, bias=True)
    t["labels"][:] = -100
    loss, soft, hard, grads = run(t, FusedLinearJSDLoss(return_soft_hard_loss=True))
    assert loss.item() == soft.item() == hard.item() == 0.0
    assert all(bool((g == 0).all()) for g in grads.values())


def test_row_strided_inputs_and_weights_are_not_copied(spy, gen):
    t = make(gen)
    big = torch.randn(BT, HS + 9, generator=gen)
    xs = big[:, 4:4 + HS]  # ld HS + 9
    wbig = torch.zeros(V, HT + 5)
    wbig[:, 5:] = t["wt"]
    wt = wbig[:, 5:]  # teacher weight with ld HT + 5
    fused_linear_jsd_loss(xs, t["ws"], t["xt"], wt, t["labels"])
    args = spy.calls[-1][1]
    assert args[6].data == xs.data_ptr() and args[6].ld == HS + 9
    assert args[10].data == wt.data_ptr() and args[10].ld == HT + 5
    t["xs"] = xs.clone()
    want = reference(t)
    xs = xs.detach().requires_grad_()
    ws = t["ws"].detach().requires_grad_()
    loss = fused_linear_jsd_loss(xs, ws, t["xt"], wt, t["labels"])
    loss.backward()
    assert_close(loss, want[0], 1e-4, what="loss")
    assert_close(xs.grad, want[3]["xs"], 1e-4, what="dxs")
    assert_close(ws.grad, want[3]["ws"], 1e-4, what="dws")


def test_gradcheck_fp32(gen):
    t = make(gen, bias=True, ignore=True, bt=5, hs=3, ht=4, v=7)
    xs, ws, bs = (t[k].requires_grad_() for k in ("xs", "ws", "bs"))
    f = lambda a, b, c: fused_linear_jsd_loss(a, b, t["xt"], t["wt"], t["labels"], c, t["bt"],
                                              temperature=1.7, beta=0.4)
    assert torch.autograd.gradcheck(f, (xs, ws, bs), eps=1e-3, atol=2e-3, rtol=1e-2)


def test_errors(gen):
    t = make(gen, bt=6, hs=4, ht=5, v=8)
    xs, ws, xt, wt, labels = t["xs"], t["ws"], t["xt"], t["wt"], t["labels"]
    f = fused_linear_jsd_loss
    with pytest.raises(kdloss.KdlossError, match="shape mismatch"):
        f(xs, ws, xt, wt[:7], labels)  # V differs
    with pytest.raises(kdloss.KdlossError, match="shape mismatch"):
        f(xs, ws, xt[:, :4], wt, labels)  # teacher hidden size differs from its weight
    with pytest.raises(kdloss.KdlossError, match="shape mismatch"):
        f(xs[:5], ws, xt, wt, labels)  # token counts differ
    with pytest.raises(kdloss.KdlossError, match="shape mismatch"):
        f(xs, ws, xt, wt, labels, torch.zeros(7))  # bias of the wrong length
    with pytest.raises(kdloss.KdlossError, match="label out of range") as e:
        f(xs, ws, xt, wt, torch.tensor([0, 1, 2, 3, 8, -100]))
    assert e.value.status_name == "KDLOSS_ERR_LABEL_OUT_OF_RANGE"
    with pytest.raises(kdloss.KdlossError, match="invalid dtype"):  # fp16 is widened, not fp64
        f(xs.double(), ws.double(), xt, wt, labels)
    with pytest.raises(kdloss.KdlossError, match="null pointer"):
        f(xs, ws, xt, wt, None)  # the hard loss needs labels
    with pytest.raises(kdloss.KdlossError, match="invalid parameter"):
        FusedLinearJSDLoss(temperature=0)
    with pytest.raises(kdloss.KdlossError, match="invalid parameter"):  # C checks T > 0
        f(xs, ws, xt, wt, labels, temperature=-1.0)
    with pytest.raises(kdloss.KdlossError, match="invalid parameter"):
        f(xs, ws, xt, wt, labels, beta=-0.1)
