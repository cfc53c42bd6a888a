"""Binding defects, kept fixed: first-order-only autograd functions refuse double
backward with a clear error (instead of a misleading one, or silently wrong second-order
gradients), and labels must have an integer dtype (bool is not a token id). Also the
parameter checks of the C library as the binding reports them."""

import pytest
import torch

import kdloss
from kdloss import _lib
from kdloss.torch import jsd, kl_div, fused_linear_jsd_loss

from conftest import require

DOUBLE_BACKWARD = "differentiable once only"


def _logprobs(gen, bt=4, v=7):
    return torch.log_softmax(torch.randn(bt, v, generator=gen), dim=-1)


def _losses(gen):
    """(name, fn(student) -> scalar loss) for each autograd function of the binding."""
    y = _logprobs(gen).exp()
    t = _logprobs(gen)
    xt, wt = torch.randn(4, 5, generator=gen), torch.randn(7, 5, generator=gen)
    ws = torch.randn(7, 3, generator=gen)
    labels = torch.tensor([1, 2, -100, 6])
    return [
        ("kl_div", lambda x: kl_div(x, y, reduction="sum")),
        ("jsd", lambda x: jsd(x, t)),
        ("fused_linear_jsd_loss",
         lambda x: fused_linear_jsd_loss(x[:, :3], ws, xt, wt, labels, chunk_size=0)),
    ]


@require("kdloss_fused_linear_jsd")
@pytest.mark.parametrize("which", [0, 1, 2])
def test_gradient_penalty_raises_a_clear_error(which, gen):
    name, fn = _losses(gen)[which]
    x = _logprobs(gen).requires_grad_()
    (g,) = torch.autograd.grad(fn(x), x, create_graph=True)
    penalty = (g ** 2).sum()
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD):
        penalty.backward()


@require("kdloss_fused_linear_jsd")
@pytest.mark.parametrize("which", [0, 1, 2])
def test_input_dependent_upstream_gradient_cannot_give_wrong_second_order(which, gen):
    """loss * x.sum(): the upstream gradient depends on x, so d2/dx2 needs the loss's own
    second derivative, which the functions do not have. It must raise, not return a number."""
    name, fn = _losses(gen)[which]
    x = _logprobs(gen).requires_grad_()
    out = fn(x) * x.sum()
    (g,) = torch.autograd.grad(out, x, create_graph=True)
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD):
        torch.autograd.grad(g.sum(), x)


def test_first_order_gradients_still_flow(gen):
    x = _logprobs(gen).requires_grad_()
    jsd(x, _logprobs(gen)).backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.float16, torch.complex64])
def test_non_integer_labels_raise(dtype, gen):
    x, t = _logprobs(gen), _logprobs(gen)
    labels = torch.tensor([1, 0, 1, 1]).to(dtype)
    with pytest.raises(kdloss.KdlossError, match="integer") as e:
        jsd(x, t, labels)
    assert e.value.status_name == "KDLOSS_ERR_INVALID_DTYPE"
    xs, ws = torch.randn(4, 3, generator=gen), torch.randn(7, 3, generator=gen)
    with pytest.raises(kdloss.KdlossError, match="integer"):
        fused_linear_jsd_loss(xs, ws, xs, ws, labels)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
def test_integer_labels_are_accepted(dtype, gen):
    x, t = _logprobs(gen), _logprobs(gen)
    labels = torch.tensor([1, 0, 5, 6]).to(dtype)
    want = jsd(x, t, labels.to(torch.int64))
    assert torch.equal(jsd(x, t, labels), want)


def test_scale_factors_that_overflow_fp32_are_rejected(gen):
    x, t = _logprobs(gen), _logprobs(gen)
    with pytest.raises(kdloss.KdlossError) as e:
        kl_div(x, t.exp(), eps=1e39)
    assert e.value.status_name == "KDLOSS_ERR_INVALID_PARAM"
    xs, ws = torch.randn(4, 3, generator=gen), torch.randn(7, 3, generator=gen)
    labels = torch.tensor([1, 2, 3, 4])
    for temperature, w_soft in ((3e-39, 0.5), (1e-30, 1e10)):  # subnormal T; w_soft/T > FLT_MAX
        with pytest.raises(kdloss.KdlossError) as e:
            fused_linear_jsd_loss(xs, ws, xs, ws, labels, temperature=temperature,
                                  weight_soft_loss=w_soft)
        assert e.value.status_name == "KDLOSS_ERR_INVALID_PARAM"


def test_new_status_codes_have_messages():
    assert "kdloss_fljsd_min_budget" in kdloss.status_string(_lib.ERR_BUDGET_TOO_SMALL)
    assert "align" in kdloss.status_string(_lib.ERR_MISALIGNED)
