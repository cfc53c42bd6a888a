"""kdloss.torch.JSD / jsd against the float64 reference of docs/MATH.md section 3."""

import pytest
import torch

import kdloss
from kdloss.torch import JSD, jsd

import reference as ref
from conftest import UNIT, assert_close, require

pytestmark = require("kdloss_jsd")

BETAS = [0.0, 0.1, 0.5, 0.9, 1.0]
# fp32: vector exp/log (1 ulp) and log-space mixture in fp32, rows summed in double: 2e-5 covers
# the cancellation inside a row (the JSD is small against its terms). Half inputs are exact in
# float64; the gradient is rounded once to the dtype, the loss once more.
TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2 * UNIT[torch.bfloat16], 1e-3),
       torch.float16: (2 * UNIT[torch.float16], 1e-3)}


def make(bt, v, dtype, gen, scale=1.0):
    x = torch.log_softmax(scale * torch.randn(bt, v, generator=gen, dtype=torch.float64), -1)
    y = torch.log_softmax(scale * torch.randn(bt, v, generator=gen, dtype=torch.float64), -1)
    return x.to(dtype), y.to(dtype)


def reference(x, y, beta, labels=None, ignore_index=-100):
    xd = x.detach().double().requires_grad_()
    out = ref.jsd(xd, y.double(), beta, labels, ignore_index)
    out.backward()
    return out.detach(), xd.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_labels", [False, True], ids=["nolabels", "ignore"])
@pytest.mark.parametrize("beta", BETAS)
def test_grid(beta, with_labels, dtype, gen):
    bt, v = 41, 257
    x, y = make(bt, v, dtype, gen)
    labels = None
    if with_labels:
        labels = torch.randint(0, v, (bt,), generator=gen)
        labels[::3] = -100
    x.requires_grad_()
    out = JSD(beta=beta)(x, y, labels)
    assert out.dtype == torch.float32 and out.dim() == 0  # losses are fp32 for every dtype
    out.backward()
    want, want_grad = reference(x, y, beta, labels)
    rtol, atol = TOL[dtype]
    assert_close(out, want, rtol, atol, "loss")
    assert_close(x.grad, want_grad, rtol, atol, "grad")
    if with_labels:
        assert bool((x.grad[::3] == 0).all()), "ignored rows must get zero gradient"


def test_float16(gen):
    x, y = make(10, 100, torch.float16, gen)
    x.requires_grad_()
    out = jsd(x, y, beta=0.3)
    out.backward()
    want, want_grad = reference(x, y, 0.3)
    assert_close(out, want, *TOL[torch.float16], "loss")
    assert_close(x.grad, want_grad, *TOL[torch.float16], "grad")


def test_custom_ignore_index_int32_labels_and_2d_labels(gen):
    x, y = make(12, 40, torch.float32, gen)
    x3, y3 = x.reshape(3, 4, 40).requires_grad_(), y.reshape(3, 4, 40)
    labels = torch.randint(0, 40, (3, 4), generator=gen, dtype=torch.int32)
    labels[labels == 7] = 8  # only the rows set below are ignored
    labels[0, 1] = labels[2, 3] = 7
    out = JSD(beta=0.5, ignore_index=7)(x3, y3, labels)
    out.backward()
    want, want_grad = reference(x, y, 0.5, labels.long(), ignore_index=7)
    assert_close(out, want, 2e-5, what="loss")
    assert_close(x3.grad.reshape(12, 40), want_grad, 2e-5, what="grad")
    assert x3.grad.shape == (3, 4, 40)


def test_all_rows_ignored_gives_zero_not_nan(gen):
    x, y = make(6, 30, torch.float32, gen)
    x.requires_grad_()
    out = jsd(x, y, torch.full((6,), -100))
    out.backward()
    assert out.item() == 0.0 and bool((x.grad == 0).all())


def test_symmetric_at_half(gen):
    x, y = make(20, 64, torch.float32, gen)
    assert_close(jsd(x, y, beta=0.5), jsd(y, x, beta=0.5), 1e-6, what="JSD(0.5) symmetry")


def test_far_below_exp_range_stays_finite(gen):
    """Log-probs near -1e4: exp underflows, the log-space mixture must not give NaN."""
    x, y = make(8, 50, torch.float32, gen, scale=3000.0)
    assert float(x.min()) < -1000
    x.requires_grad_()
    for beta in BETAS:
        out = jsd(x, y, beta=beta)
        out.backward()
        assert torch.isfinite(out) and bool(torch.isfinite(x.grad).all()), beta
        want, want_grad = reference(x, y, beta)
        assert_close(out, want, 1e-4, what=f"loss beta={beta}")
        x.grad = None


def test_upstream_gradient_non_leaf_and_no_grad(spy, gen):
    logits = torch.randn(16, 33, generator=gen, requires_grad=True)
    y = torch.log_softmax(torch.randn(16, 33, generator=gen), -1)
    (-0.75 * jsd(logits.log_softmax(-1), y, beta=0.2)).backward()
    ld = logits.detach().double().requires_grad_()
    (-0.75 * ref.jsd(ld.log_softmax(-1), y.double(), 0.2)).backward()
    assert_close(logits.grad, ld.grad, 2e-5, what="leaf grad")
    with torch.no_grad():
        jsd(logits.log_softmax(-1), y)
    assert spy.calls[-1][1][-1].data is None  # forward-only: NULL gradient view
    assert spy.calls[0][1][-1].data is not None


def test_row_strided_inputs(spy, gen):
    big_x, big_y = make(10, 80, torch.float32, gen)
    x, y = big_x[:, :64].log_softmax(-1), big_y[:, 8:72]  # y: ld 80, offset 8
    jsd(x, y, beta=0.9)
    args = spy.calls[-1][1]
    assert args[5].data == y.data_ptr() and args[5].ld == 80
    x.requires_grad_()
    out = jsd(x, y, beta=0.9)
    out.backward()
    want, want_grad = reference(x, y, 0.9)
    assert_close(out, want, 2e-5, what="loss")
    assert_close(x.grad, want_grad, 2e-5, what="grad")


def test_gradcheck_fp32(gen):
    x = torch.randn(3, 6, generator=gen).log_softmax(-1).requires_grad_()
    y = torch.randn(3, 6, generator=gen).log_softmax(-1)
    labels = torch.tensor([1, -100, 4])
    for beta in BETAS:
        assert torch.autograd.gradcheck(lambda a: jsd(a, y, labels, beta=beta), (x,), eps=1e-3,
                                        atol=1e-3, rtol=1e-2)


def test_errors(gen):
    x, y = make(5, 9, torch.float32, gen)
    with pytest.raises(kdloss.KdlossError, match="shape mismatch"):
        jsd(x, y[:, :8])
    with pytest.raises(kdloss.KdlossError, match="label out of range") as e:
        jsd(x, y, torch.tensor([0, 1, 9, 2, 3]))  # 9 is neither -100 nor in [0, 9)
    assert e.value.status_name == "KDLOSS_ERR_LABEL_OUT_OF_RANGE"
    with pytest.raises(kdloss.KdlossError, match="shape mismatch"):
        jsd(x, y, torch.zeros(4, dtype=torch.long))
    with pytest.raises(kdloss.KdlossError, match="invalid parameter"):
        JSD(beta=1.5)(x, y)
    with pytest.raises(kdloss.KdlossError, match="invalid dtype"):
        jsd(x, y, torch.zeros(5))
