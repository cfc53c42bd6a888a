"""kdloss.torch.KLDivLoss / kl_div against the float64 reference of docs/MATH.md section 2."""

import pytest
import torch

import kdloss
from kdloss.torch import KLDivLoss, kl_div

import reference as ref
from conftest import UNIT, assert_close, require

pytestmark = require("kdloss_kl_div")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
REDUCTIONS = ["none", "sum", "mean", "batchmean"]
# fp32: a <= 2-ulp log (vmath.h; libm on the scalar path) plus fp32 tiles summed in double -> a few 1e-7 relative; 2e-5 is slack
# for terms that cancel (t log t against t y). Half dtypes: the inputs are exact in float64, so the
# error is one rounding of the output (loss or gradient) to the dtype; fp16 gradients of "mean"
# reach fp16's subnormals (spacing 6e-8), hence the absolute part.
TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2 * UNIT[torch.bfloat16], 1e-3),
       torch.float16: (2 * UNIT[torch.float16], 4e-3)}


def make(bt, v, dtype, log_target, gen, shape=None):
    y = torch.log_softmax(2 * torch.randn(bt, v, generator=gen, dtype=torch.float64), -1)
    if log_target:
        t = torch.log_softmax(torch.randn(bt, v, generator=gen, dtype=torch.float64), -1)
        t[0, :3] = -float("inf")  # zero-probability targets contribute 0 (and gradient 0)
    else:
        t = torch.softmax(torch.randn(bt, v, generator=gen, dtype=torch.float64), -1)
        t[1, 5:9] = 0.0
    if shape is not None:
        y, t = y.reshape(shape), t.reshape(shape)
    return y.to(dtype), t.to(dtype)


def reference(y, t, reduction, log_target, upstream=None):
    yd = y.detach().double().requires_grad_()
    out = ref.kl(yd, t.double(), reduction, log_target)
    (out if upstream is None else out * upstream.double()).sum().backward()
    return out.detach(), yd.grad


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_grid(reduction, log_target, dtype, gen):
    y, t = make(37, 129, dtype, log_target, gen)
    y.requires_grad_()
    out = KLDivLoss(reduction=reduction, log_target=log_target)(y, t)
    assert out.dtype == (dtype if reduction == "none" else torch.float32)  # losses are fp32
    upstream = torch.randn(y.shape, generator=gen).to(dtype) if reduction == "none" else None
    (out if upstream is None else out * upstream).sum().backward()
    want, want_grad = reference(y, t, reduction, log_target, upstream)
    rtol, atol = TOL[dtype]
    assert_close(out, want, rtol, atol, "loss")
    assert y.grad.dtype == dtype
    if reduction == "none":  # y.grad = upstream * dl/dy: the reference product, rounded twice
        rtol, atol = 2 * rtol, 2 * atol
    assert_close(y.grad, want_grad, rtol, atol, "grad")


@pytest.mark.parametrize("reduction", ["sum", "batchmean"])
def test_upstream_gradient_and_non_leaf(reduction, gen):
    """The loss input is log_softmax of a leaf (as in the reference benchmark); an upstream
    gradient of 2.5 must scale the leaf's gradient through the log_softmax backward."""
    logits = torch.randn(16, 50, generator=gen, requires_grad=True)
    t = torch.softmax(torch.randn(16, 50, generator=gen), -1)
    (2.5 * kl_div(logits.log_softmax(-1), t, reduction=reduction)).backward()
    ld = logits.detach().double().requires_grad_()
    (2.5 * ref.kl(ld.log_softmax(-1), t.double(), reduction, False)).backward()
    assert_close(logits.grad, ld.grad, 1e-5, 1e-5, "leaf grad")


def test_retain_graph_twice(gen):
    y = torch.randn(8, 20, generator=gen).log_softmax(-1).requires_grad_()
    t = torch.softmax(torch.randn(8, 20, generator=gen), -1)
    loss = kl_div(y, t, reduction="batchmean")
    loss.backward(retain_graph=True)
    g1 = y.grad.clone()
    loss.backward()
    assert_close(y.grad, 2 * g1, 1e-6, 0, "accumulated twice")


def test_3d_input_batchmean_divides_by_size0(gen):
    y, t = make(2 * 5, 33, torch.float32, False, gen, shape=(2, 5, 33))
    y.requires_grad_()
    out = KLDivLoss(reduction="batchmean")(y, t)
    out.backward()
    want, want_grad = reference(y, t, "batchmean", False)
    assert_close(out, want, 1e-5, what="loss")  # divided by B = 2, as torch, not by B*T
    assert_close(y.grad, want_grad, 1e-5, what="grad")
    assert y.grad.shape == (2, 5, 33)
    none = kl_div(y.detach(), t, reduction="none")
    assert none.shape == (2, 5, 33)


def test_matches_torch_module_on_2d(gen):
    y, t = make(12, 40, torch.float32, False, gen)
    for reduction in REDUCTIONS:
        ours = KLDivLoss(reduction=reduction)(y, t)
        theirs = torch.nn.KLDivLoss(reduction=reduction)(y, t)
        assert_close(ours, theirs, 1e-5, what=reduction)
    # deprecated spellings resolve as in torch: size_average=False -> "sum", reduce=False -> "none"
    with pytest.warns(UserWarning):
        assert KLDivLoss(size_average=False).reduction == "sum"
    with pytest.warns(UserWarning):
        assert KLDivLoss(reduce=False).reduction == "none"
    assert KLDivLoss(1e-6).eps == 1e-6  # eps first, as in Liger's LigerKLDIVLoss


def test_no_grad_calls_forward_only(spy, gen):
    y, t = make(9, 31, torch.float32, False, gen)
    y.requires_grad_()
    with torch.no_grad():
        a = kl_div(y, t, reduction="sum")
    b = kl_div(y.detach(), t, reduction="sum")  # requires_grad False: forward-only too
    c = kl_div(y, t, reduction="sum")
    grads = [args[-1] for name, args in spy.calls]  # the `grad` view
    assert [g.data is None for g in grads] == [True, True, False]
    assert a.grad_fn is None and b.grad_fn is None and c.grad_fn is not None
    assert a.item() == b.item() == c.detach().item()


def test_row_strided_input_is_not_copied(spy, gen):
    big = torch.log_softmax(torch.randn(20, 64, generator=gen), -1)
    y = big[:, 3:3 + 50]  # ld = 64, last dim contiguous
    t = torch.softmax(torch.randn(20, 50, generator=gen), -1)
    y = y.detach().requires_grad_()
    y_view = big[:, 3:53]  # same layout, not a leaf: check the pointer handed to C
    kl_div(y_view, t, reduction="batchmean")
    args = spy.calls[-1][1]
    assert args[4].data == y_view.data_ptr() and args[4].ld == 64
    assert args[5].data == t.data_ptr()
    out = kl_div(y, t, reduction="batchmean")
    out.backward()
    want, want_grad = reference(y, t, "batchmean", False)
    assert_close(out, want, 1e-5, what="loss")
    assert_close(y.grad, want_grad, 1e-5, what="grad")


def test_non_contiguous_last_dim_and_broadcast_target(gen):
    y = torch.log_softmax(torch.randn(30, 17, generator=gen), -1).T.contiguous().T  # column-major
    assert y.stride(-1) != 1
    t = torch.softmax(torch.randn(1, 30 * 0 + 17, generator=gen), -1).expand(30, 17)  # stride 0
    y.requires_grad_()
    out = kl_div(y, t, reduction="sum", log_target=False)
    out.backward()
    want, want_grad = reference(y, t, "sum", False)
    assert_close(out, want, 1e-5, what="loss")
    assert_close(y.grad, want_grad, 1e-5, what="grad")


def test_gradcheck_fp32(gen):
    """Finite differences in fp32: eps 1e-3 on O(1) losses leaves ~1e-4 relative noise."""
    y = torch.randn(3, 5, generator=gen).requires_grad_()
    t = torch.softmax(torch.randn(3, 5, generator=gen), -1)
    for reduction in REDUCTIONS:
        assert torch.autograd.gradcheck(lambda a: kl_div(a, t, reduction=reduction), (y,),
                                        eps=1e-3, atol=1e-3, rtol=1e-2, nondet_tol=0,
                                        fast_mode=False)


def test_errors(gen):
    y = torch.randn(4, 6)
    with pytest.raises(kdloss.KdlossError, match="shape mismatch") as e:
        kl_div(y, torch.rand(4, 7))
    assert e.value.status_name == "KDLOSS_ERR_SHAPE_MISMATCH"
    assert isinstance(e.value, ValueError) and isinstance(e.value, RuntimeError)
    with pytest.raises(kdloss.KdlossError, match="invalid reduction"):
        KLDivLoss(reduction="avg")
    with pytest.raises(kdloss.KdlossError, match="invalid reduction"):
        kl_div(y, torch.rand(4, 6), reduction="avg")
    with pytest.raises(kdloss.KdlossError, match="invalid parameter"):  # C checks eps >= 0
        kl_div(y, torch.rand(4, 6), eps=-1.0)
    with pytest.raises(kdloss.KdlossError, match="invalid dtype"):
        kl_div(y.double(), torch.rand(4, 6, dtype=torch.float64))
    with pytest.raises(kdloss.KdlossError, match="invalid size"):  # C rejects an empty matrix
        kl_div(torch.randn(0, 6), torch.rand(0, 6))
    with pytest.raises(kdloss.KdlossError, match="unsupported"):
        kl_div(y.to("meta"), torch.rand(4, 6, device="meta"))
