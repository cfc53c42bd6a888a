"""torch.compile, torch.export and FakeTensor over kdloss's losses.

Every loss of one process is a torch.library custom op (kdloss/torch/_ops.py): the ctypes call
runs inside the op, so Dynamo traces the public functions and modules without a graph break,
FakeTensorMode gives the outputs' shapes and dtypes from the ops' fake implementations, and
torch.export keeps each loss as one torch.ops.kdloss node. Compiled runs must match eager ones
(losses and gradients within 1e-6; they make the same C calls). The compiled cases use the
aot_eager backend (Dynamo + AOTAutograd, the parts that see the ops; no C++ compile on these two
shared cores) and one case inductor, when a compiler is there. The vocabulary-parallel calls
(process_group=) stay eager and are not tested here.
"""

import shutil

import pytest
import torch

torch_dynamo = pytest.importorskip("torch._dynamo")
pytest.importorskip("torch.library")
if not hasattr(torch.library, "custom_op") or not hasattr(torch.library, "register_fake"):
    pytest.skip("torch.library.custom_op / register_fake missing", allow_module_level=True)

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import kdloss  # noqa: E402
from kdloss.torch import (JSD, DistillLoss, FusedLinearDistillLoss, FusedLinearJSD,  # noqa: E402
                          FusedLinearJSDFunction, FusedLinearJSDLoss, FusedLinearJSDLossFunction,
                          FusedLinearTopKDistillLoss, JSDFunction, KLDivFunction, KLDivLoss,
                          TopKDistillLoss, distill_loss, fused_linear_distill_loss,
                          fused_linear_jsd, fused_linear_jsd_loss, fused_linear_topk_distill_loss,
                          jsd, kl_div, liger, topk_distill_loss)

from conftest import require  # noqa: E402

BT, V, HS, HT, K = 6, 11, 5, 7, 4


def _inputs(gen):
    """Small inputs shared by the cases; a fresh leaf per call for the student tensors."""
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    ids = torch.stack([torch.randperm(V, generator=gen)[:K] for _ in range(BT)])
    ids[1, -1] = -1
    lps = torch.log_softmax(r(BT, V), -1).gather(1, ids.clamp(min=0))
    labels = torch.randint(0, V, (BT,), generator=gen)
    labels[2] = -100
    return {"y": torch.log_softmax(r(BT, V), -1), "t": torch.softmax(r(BT, V), -1),
            "lt": torch.log_softmax(r(BT, V), -1), "zs": r(2, 3, V), "zt": r(2, 3, V),
            "xs": r(BT, HS), "ws": r(V, HS), "bs": r(V), "xt": r(BT, HT), "wt": r(V, HT),
            "bt": r(V), "labels": labels, "ids": ids, "lps": lps}


# (name, the student tensors' keys, fn(d) -> loss); d maps the keys of _inputs to tensors
CASES = [
    ("kl_div", ("y",), lambda d: kl_div(d["y"], d["t"], reduction="batchmean")),
    ("kl_div_none", ("y",), lambda d: kl_div(d["y"], d["lt"], reduction="none",
                                               log_target=True).sum()),
    ("KLDivLoss", ("y",), lambda d: KLDivLoss(reduction="sum")(d["y"], d["t"])),
    ("jsd", ("y",), lambda d: jsd(d["y"], d["lt"], d["labels"], beta=0.3)),
    ("JSD", ("y",), lambda d: JSD(beta=0.7)(d["y"], d["lt"])),
    ("liger_jsd", ("y",), lambda d: liger.liger_jsd(d["y"], d["lt"])),
    ("distill_loss", ("zs",), lambda d: distill_loss(
        d["zs"], d["zt"], d["labels"].view(2, 3), divergence="jsd", temperature=2.0)),
    ("DistillLoss_none", ("zs",), lambda d: (DistillLoss(
        divergence="reverse_kl", reduction="none")(d["zs"], d["zt"]) * 0.5).sum()),
    ("topk_distill_loss", ("zs",), lambda d: topk_distill_loss(
        d["zs"].view(BT, V), d["ids"], d["lps"], d["labels"], temperature=1.5)),
    ("TopKDistillLoss", ("zs",), lambda d: TopKDistillLoss(
        tail="renorm_both", reduction="sum")(d["zs"].view(BT, V), d["ids"], d["lps"])),
    ("fused_linear_jsd", ("xs", "ws"), lambda d: fused_linear_jsd(
        d["xs"], d["ws"], d["xt"], d["wt"], d["labels"], 0.4, temperature=2.0)),
    ("FusedLinearJSD", ("xs", "ws"), lambda d: FusedLinearJSD(jsd_beta=0.6)(
        d["xs"], d["ws"], d["xt"], d["wt"])),
    ("FusedLinearJSDLoss", ("xs", "ws", "bs"), lambda d: FusedLinearJSDLoss()(
        d["xs"], d["ws"], d["xt"], d["wt"], d["labels"], d["bs"], d["bt"])),
    ("fused_linear_jsd_loss_parts", ("xs", "ws"), lambda d: sum(fused_linear_jsd_loss(
        d["xs"], d["ws"], d["xt"], d["wt"], d["labels"], return_soft_hard_loss=True))),
    ("FusedLinearDistillLoss", ("xs", "ws", "bs"), lambda d: FusedLinearDistillLoss(
        divergence="forward_kl", t2_scale=True, temperature=2.0)(
        d["xs"], d["ws"], d["xt"], d["wt"], d["labels"], d["bs"], d["bt"])),
    ("fused_linear_distill_loss", ("ws",), lambda d: fused_linear_distill_loss(
        d["xs"], d["ws"], d["xt"], d["wt"], None, weight_hard_loss=0.0, divergence="tvd")),
    ("FusedLinearTopKDistillLoss", ("xs", "ws", "bs"), lambda d: FusedLinearTopKDistillLoss(
        weight_hard_loss=0.25)(d["xs"], d["ws"], d["ids"], d["lps"], d["labels"], d["bs"])),
    ("fused_linear_topk_distill_loss", ("xs",), lambda d: fused_linear_topk_distill_loss(
        d["xs"], d["ws"], d["ids"], d["lps"], tail="bucket", chunk_size=4)),
    # the autograd Functions with Liger's apply signatures (their forward calls the op)
    ("KLDivFunction", ("y",), lambda d: KLDivFunction.apply(d["y"], d["t"], "sum")),
    ("JSDFunction", ("y",), lambda d: JSDFunction.apply(d["y"], d["lt"], d["labels"], 0.3)),
    ("LigerJSDFunction", ("y",), lambda d: liger.LigerJSDFunction.apply(d["y"], d["lt"])),
    ("FusedLinearJSDFunction", ("xs", "ws"), lambda d: FusedLinearJSDFunction.apply(
        d["xs"], d["ws"], d["xt"], d["wt"], d["labels"], 0.3)),
    ("FusedLinearJSDLossFunction", ("xs", "ws", "bs"), lambda d: FusedLinearJSDLossFunction.apply(
        d["xs"], d["ws"], d["xt"], d["wt"], d["labels"], d["bs"], d["bt"])),
]
NEEDS = {"topk": "kdloss_topk_distill_logits", "TopK": "kdloss_topk_distill_logits",
         "fused": "kdloss_fused_linear_distill", "Fused": "kdloss_fused_linear_distill"}


def _case_params():
    out = []
    for name, keys, fn in CASES:
        marks = [require(sym) for key, sym in NEEDS.items() if key in name]
        out.append(pytest.param(name, keys, fn, id=name, marks=marks))
    return out


def _run(fn, gen_seed, keys, scale=1.5):
    """(loss, grads of `keys`) of fn * scale on fresh inputs from the seed."""
    d = _inputs(torch.Generator().manual_seed(gen_seed))
    for k in keys:
        d[k].requires_grad_()
    loss = fn(d) * scale
    loss.backward()
    return loss.detach(), [d[k].grad for k in keys]


def _same(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, what
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=what)


@pytest.mark.parametrize("name,keys,fn", _case_params())
def test_compile_fullgraph_matches_eager(name, keys, fn):
    torch_dynamo.reset()
    want, want_g = _run(fn, 7, keys)
    got, got_g = _run(torch.compile(fn, backend="aot_eager", fullgraph=True), 7, keys)
    _same(got, want, f"{name} loss")
    for k, a, b in zip(keys, got_g, want_g):
        _same(a, b, f"{name} d{k}")


@pytest.mark.parametrize("name,keys,fn", _case_params())
def test_no_graph_breaks(name, keys, fn):
    torch_dynamo.reset()
    d = _inputs(torch.Generator().manual_seed(3))
    for k in keys:
        d[k].requires_grad_()
    explain = torch_dynamo.explain(fn)(d)
    assert explain.graph_break_count == 0, explain.break_reasons
    assert explain.graph_count == 1


@pytest.mark.parametrize("name,keys,fn", _case_params())
def test_fake_tensor_mode_gives_shapes(name, keys, fn):
    d = _inputs(torch.Generator().manual_seed(5))
    for k in keys:
        d[k].requires_grad_()
    want = fn(d)
    with FakeTensorMode() as mode:
        fd = {k: mode.from_tensor(v) for k, v in d.items()}
        got = fn(fd)
        assert got.shape == want.shape and got.dtype == want.dtype
        got.backward()
        for k in keys:
            assert fd[k].grad.shape == d[k].shape and fd[k].grad.dtype == d[k].dtype


def test_fake_tensor_mode_row_losses_and_dtypes():
    with FakeTensorMode():
        zs = torch.empty(2, 3, V, dtype=torch.bfloat16)
        zt = torch.empty(2, 3, V, dtype=torch.float16)
        out = distill_loss(zs, zt, reduction="none")
        assert out.shape == (2, 3) and out.dtype == torch.float32
        y, t = torch.empty(4, V, dtype=torch.float16), torch.empty(4, V)
        assert kl_div(y, t, reduction="none").dtype == torch.float32  # torch's promotion
        assert kl_div(y, t).shape == () and kl_div(y, t).dtype == torch.float32
        assert liger.liger_jsd(y, y).dtype == torch.float16
        xs, ws = torch.empty(2, 3, HS, dtype=torch.bfloat16), torch.empty(V, HS)
        loss, soft, hard = fused_linear_jsd_loss(xs, ws, xs, ws, torch.zeros(2, 3, dtype=int),
                                                 return_soft_hard_loss=True)
        assert loss.shape == soft.shape == hard.shape == ()
        with pytest.raises(kdloss.KdlossError, match="shape mismatch"):
            jsd(y, torch.empty(4, V + 1))


def test_fake_ops_on_their_own():
    """torch.ops.kdloss.* under FakeTensorMode: the gradients formed in forward, (0,) when not
    asked for."""
    with FakeTensorMode():
        x = torch.empty(3, 4, 8, dtype=torch.bfloat16)
        out, g = torch.ops.kdloss.jsd(x, x, None, 0.5, -100, True)
        assert out.shape == () and g.shape == x.shape and g.dtype == x.dtype
        out, g = torch.ops.kdloss.kl_div(x, x, "sum", False, 1e-10, False)
        assert g.shape == (0,)


def test_compiled_dynamic_shapes_recompile_without_breaks():
    torch_dynamo.reset()
    fn = torch.compile(lambda x, t: jsd(x, t), backend="aot_eager", fullgraph=True)
    gen = torch.Generator().manual_seed(11)
    for bt in (3, 5, 9):
        x = torch.log_softmax(torch.randn(bt, V, generator=gen), -1).requires_grad_()
        t = torch.log_softmax(torch.randn(bt, V, generator=gen), -1)
        got = fn(x, t)
        got.backward()
        gx = x.grad
        x.grad = None
        want = jsd(x, t)
        want.backward()
        _same(got, want, f"bt={bt}")
        _same(gx, x.grad, f"bt={bt} grad")


def test_no_grad_under_compile_forms_no_gradient():
    torch_dynamo.reset()
    fn = torch.compile(lambda x, t: kl_div(x, t, reduction="sum"), backend="aot_eager",
                       fullgraph=True)
    x = torch.log_softmax(torch.randn(4, V), -1)
    t = torch.softmax(torch.randn(4, V), -1)
    with torch.no_grad():
        got = fn(x.requires_grad_(), t)
    assert not got.requires_grad
    _same(got, kl_div(x.detach(), t, reduction="sum"), "no_grad")


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                    reason="inductor needs a C++ compiler")
@require("kdloss_fused_linear_distill")
def test_inductor_fused_jsd_loss():
    torch_dynamo.reset()
    fn = dict((c[0], c[2]) for c in CASES)["FusedLinearJSDLoss"]
    keys = ("xs", "ws", "bs")
    want, want_g = _run(fn, 9, keys)
    got, got_g = _run(torch.compile(fn, fullgraph=True), 9, keys)
    _same(got, want, "inductor loss")
    for k, a, b in zip(keys, got_g, want_g):
        _same(a, b, f"inductor d{k}")


# ---- torch.export -------------------------------------------------------------------------------

class _FusedJSD(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(HS, V)
        self.loss = FusedLinearJSDLoss(weight_hard_loss=0.3, weight_soft_loss=0.7, temperature=2.0)

    def forward(self, x, xt, wt, labels):
        return self.loss(x, self.head.weight, xt, wt, labels, self.head.bias)


class _Distill(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.loss = DistillLoss(divergence="jsd", beta=0.4, temperature=1.5)

    def forward(self, zs, zt, labels):
        return self.loss(zs, zt, labels)


def _export_check(module, args):
    export = getattr(torch, "export", None)
    if export is None or not hasattr(export, "export"):
        pytest.skip("torch.export missing")
    ep = torch.export.export(module, args)
    ops = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any(o.startswith("kdloss.") for o in ops), ops
    with torch.no_grad():
        want = module(*args)
        got = ep.module()(*args)
    _same(got, want, type(module).__name__)


@require("kdloss_fused_linear_distill")
def test_export_fused_jsd_loss():
    d = _inputs(torch.Generator().manual_seed(13))
    torch.manual_seed(0)
    _export_check(_FusedJSD(), (d["xs"], d["xt"], d["wt"], d["labels"]))


def test_export_distill_loss():
    d = _inputs(torch.Generator().manual_seed(17))
    _export_check(_Distill(), (d["zs"], d["zt"], d["labels"].view(2, 3)))
