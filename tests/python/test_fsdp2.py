"""The fused-linear losses under FSDP2 (torch.distributed.fsdp.fully_shard) with 2 data-parallel
processes on the CPU (gloo). One spawn runs every scenario; each test reads its own.

The student is a tiny LM laid out as a Hugging Face causal LM: `model` (embedding, a linear
layer, tanh) and `lm_head` (Linear with bias); fully_shard(student.model), then
fully_shard(student), so lm_head sits in the root's group. The teacher has the same layout, is
frozen and is sharded the same way. Every rank trains on its own batch (different ignored
labels, so the ranks' per-token means have different counts). Two ways of calling the loss:

- "dtensor_head": README's TRL recipe, hidden = student.model(ids) and the loss outside any
  FSDP forward, on student.lm_head.weight / .bias as they are there: DTensors (Shard(0)), which
  kdloss gathers with full_tensor() (the teacher's head too);
- "inside_forward": the loss computed inside the root module's forward (kdloss's docstring's
  advice), where FSDP2 has unsharded lm_head into plain tensors.

Each rank checks, for FusedLinearDistillLoss, FusedLinearJSDLoss, the functional
fused_linear_distill_loss and FusedLinearTopKDistillLoss:
(a) its loss equals the same loss on a plain (unsharded) copy of the model on its batch;
(b) after backward, the gradients FSDP2 leaves on the sharded parameters (DTensor .grad, gathered
    with full_tensor()) of lm_head (weight, bias), the trunk's linear layer and the embedding
    equal the AVERAGE over the ranks of the plain copy's gradients, each rank's from its own
    batch: FSDP2 reduce-scatters with gradient_divide_factor = world size by default (a mean,
    as DDP), checked here rather than assumed: the trunk's gradients (reduced by FSDP2 itself)
    must match the same average;
(c) one SGD step on the sharded parameters runs and gives the plain copy's parameters minus
    lr x that average gradient.

Tolerances. The sharded and the plain runs make the same kdloss call on the same values (the
all-gathers copy bits; the trunk's torch ops are the same), so they may differ only by fp32
summation order: in a length-V sum of same-sign fp32 terms that is at most (V - 1) u relative
(u = 2^-24), plus a few u from the row pass's exp / log, so losses within 4 V u = 3.1e-5
relative (V = 128). Gradients: the same budget for each rank's gradient (its dW sums run over
the rank's 16 rows < V), plus one fp32 rounding in the 2-rank average (the division by 2 is
exact), relative to the largest entry as conftest.assert_close scales it (entries near 0
cancel). A gradient missing the other rank's batch is off by O(1) of the largest entry, 4
orders of magnitude above this bound. (Observed: bitwise equal wherever the semantics match.)
"""

import copy
import datetime

import pytest
import torch
import torch.distributed as dist

from conftest import UNIT, assert_close
from test_vocab_parallel import WORLD, check_scenario, spawn_scenarios

try:  # torch >= 2.6; torch 2.4 / 2.5 have it under _composable
    from torch.distributed.fsdp import fully_shard
except ImportError:  # pragma: no cover - depends on the torch version
    try:
        from torch.distributed._composable.fsdp import fully_shard
    except ImportError:
        fully_shard = None

pytestmark = [
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                       reason="torch.distributed with gloo is not available"),
    pytest.mark.skipif(fully_shard is None, reason="this torch has no FSDP2 fully_shard"),
]

V, H, HT, B, L, K = 128, 32, 24, 2, 8, 8  # vocabulary, hidden sizes, batch per rank, top-k slots
LR = 0.5
TOL = 4 * V * UNIT[torch.float32]  # 3.1e-5: the module docstring's derivation
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=30)
DEADLINE_S = 120  # the parent kills the processes after this long (a run takes ~10 s)


# ---- the model and the data ----------------------------------------------------------------------

class _Trunk(torch.nn.Module):
    def __init__(self, h):
        super().__init__()
        self.embed = torch.nn.Embedding(V, h)
        self.proj = torch.nn.Linear(h, h)

    def forward(self, ids):
        return torch.tanh(self.proj(self.embed(ids)))


class TinyLM(torch.nn.Module):
    """model (the trunk) and lm_head, as a Hugging Face causal LM. forward(ids) returns the hidden
    states; forward(ids, head_loss) returns head_loss(hidden, lm_head.weight, lm_head.bias),
    computed inside this module's forward (where FSDP2 has lm_head unsharded)."""

    def __init__(self, h):
        super().__init__()
        self.model = _Trunk(h)
        self.lm_head = torch.nn.Linear(h, V)

    def forward(self, ids, head_loss=None):
        hidden = self.model(ids)
        if head_loss is None:
            return hidden
        return head_loss(hidden, self.lm_head.weight, self.lm_head.bias)


def _sharded(model):
    """FSDP2 over `model`, as accelerate / TRL lay it out: the trunk its own unit, lm_head in the
    root's group."""
    fully_shard(model.model)
    fully_shard(model)
    return model


def _batch(rank):
    """Rank `rank`'s batch: token ids and labels (the ids shifted by one) with -100 at 3 places on
    rank 0 and 1 on rank 1, so the ranks keep 13 and 15 of their 16 rows."""
    g = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(0, V, (B, L), generator=g)
    labels = ids.roll(-1, dims=1)
    labels[0, -1] = -100
    if rank == 0:
        labels[1, :2] = -100
    return ids, labels


def _topk_teacher(hidden, w, b, temperature):
    """The teacher's top-K (ids, log-probs) at `temperature`, as a stored offline teacher."""
    with torch.no_grad():
        lp = torch.log_softmax((hidden @ w.T + b) / temperature, dim=-1)
        top, ids = torch.topk(lp, K, dim=-1)
    return ids.to(torch.int32), top


def _losses():
    """(name, loss(hidden, w, b, teacher) with teacher = dict(xt, wt, bt, ids, lps, labels))."""
    from kdloss.torch import (FusedLinearDistillLoss, FusedLinearJSDLoss,
                              FusedLinearTopKDistillLoss, fused_linear_distill_loss)
    distill = FusedLinearDistillLoss(divergence="forward_kl", weight_hard_loss=0.3,
                                     weight_soft_loss=0.7, temperature=2.0, t2_scale=True)
    jsd = FusedLinearJSDLoss(weight_hard_loss=0.5, weight_soft_loss=0.5, beta=0.3,
                             temperature=1.5)
    topk = FusedLinearTopKDistillLoss(divergence="forward_kl", tail="bucket",
                                      weight_hard_loss=0.2, weight_soft_loss=0.8, temperature=2.0)
    return [
        ("FusedLinearDistillLoss", lambda h, w, b, t: distill(h, w, t["xt"], t["wt"], t["labels"],
                                                              b, t["bt"])),
        ("FusedLinearJSDLoss", lambda h, w, b, t: jsd(h, w, t["xt"], t["wt"], t["labels"], b,
                                                      t["bt"])),
        ("fused_linear_distill_loss", lambda h, w, b, t: fused_linear_distill_loss(
            h, w, t["xt"], t["wt"], t["labels"], b, t["bt"], divergence="jsd", beta=0.5,
            weight_hard_loss=0.0, weight_soft_loss=1.0)),
        ("FusedLinearTopKDistillLoss", lambda h, w, b, t: topk(h, w, t["ids"], t["lps"],
                                                               t["labels"], b)),
    ]


def _teacher_inputs(teacher, rank, temperature=2.0):
    """What a loss gets from the teacher for rank `rank`'s batch: its hidden states, head weight
    and bias (DTensors when `teacher` is sharded), the top-k of its log-probs, the labels."""
    ids, labels = _batch(rank)
    with torch.no_grad():
        xt = teacher.model(ids)
    wt, bt = teacher.lm_head.weight, teacher.lm_head.bias
    full = [x.full_tensor() if hasattr(x, "full_tensor") else x for x in (wt, bt)]
    top_ids, lps = _topk_teacher(xt, *full, temperature)
    return ids, dict(xt=xt, wt=wt, bt=bt, ids=top_ids, lps=lps, labels=labels)


def _full(t):
    from torch.distributed.tensor import DTensor
    return t.full_tensor() if isinstance(t, DTensor) else t


# ---- one rank's checks ---------------------------------------------------------------------------

def _scenario(rank, inside):
    """Runs every loss of _losses() with a fresh sharded student, called outside any FSDP forward
    on the DTensor head (inside=False) or inside the root's forward (inside=True); collects what
    disagrees and raises one AssertionError at the end (the collectives of every loss run on both
    ranks whatever the checks find, so the ranks stay in step)."""
    from torch.distributed.tensor import DTensor
    torch.manual_seed(0)
    base, teacher_plain = TinyLM(H), TinyLM(HT)
    teacher_plain.requires_grad_(False)
    teacher = _sharded(copy.deepcopy(teacher_plain))
    ids, mine = _teacher_inputs(teacher, rank)
    assert isinstance(mine["wt"], DTensor), type(mine["wt"])
    problems = []
    for name, loss_fn in _losses():
        what = f"rank {rank} {'inside_forward' if inside else 'dtensor_head'} {name}"
        # the plain copy: each rank's loss and gradients, on each rank's batch
        want_loss, want_grads, own = None, {}, []
        for r in range(WORLD):
            plain = copy.deepcopy(base)
            r_ids, r_teacher = _teacher_inputs(teacher_plain, r)
            loss = plain(r_ids, lambda h, w, b: loss_fn(h, w, b, r_teacher))
            loss.backward()
            if r == rank:
                want_loss = loss.detach()
            own.append({pname: p.grad for pname, p in plain.named_parameters()})
            for pname, p in plain.named_parameters():
                want_grads[pname] = want_grads.get(pname, 0) + p.grad / WORLD
        # the sharded student
        student = _sharded(copy.deepcopy(base))
        seen = {}

        def head_loss(h, w, b):
            seen["weight"] = type(w).__name__
            return loss_fn(h, w, b, mine)
        if inside:
            loss = student(ids, head_loss)
        else:
            loss = head_loss(student.model(ids), student.lm_head.weight, student.lm_head.bias)
        want_type = "Parameter" if inside else "DTensor"
        if seen["weight"] != want_type:
            problems.append(f"{what}: lm_head.weight was a {seen['weight']}, expected "
                            f"{want_type}")
        loss.backward()
        grads = {pname: _full(p.grad) for pname, p in student.named_parameters()}
        optimizer = torch.optim.SGD(student.parameters(), lr=LR)
        optimizer.step()
        stepped = {pname: _full(p.detach()) for pname, p in student.named_parameters()}
        # (a) the loss, (b) the averaged gradients, (c) the step
        checks = [(f"{what}: loss", loss.detach(), want_loss, TOL, 0.0)]
        for pname, p in base.named_parameters():
            checks.append((f"{what}: d{pname}", grads[pname], want_grads[pname], TOL, TOL))
            checks.append((f"{what}: {pname} after one SGD step", stepped[pname],
                           p.detach() - LR * want_grads[pname], TOL, TOL))
        failed = []
        for text, got, want, rtol, atol in checks:
            try:
                assert_close(got, want, rtol, atol, text)
            except AssertionError as e:
                failed.append(str(e))
        problems += failed + (_unreduced(what, grads, want_grads, own) if failed else [])
        del student, optimizer
    if problems:
        raise AssertionError("\n".join(problems))


def _unreduced(what, grads, want_grads, own):
    """A diagnosis for the gradients that do not match: those that equal, block by block of
    FSDP2's Shard(0), the gradient of the block's owner rank from its own batch alone (what a
    gradient that skipped the reduction across the ranks would be)."""
    def close(a, b):
        return torch.allclose(a, b, rtol=TOL, atol=TOL * float(b.abs().max()))
    notes = []
    for pname, g in grads.items():
        alone = torch.cat([o[pname].chunk(WORLD, dim=0)[r] for r, o in enumerate(own)])
        if not close(g, want_grads[pname]) and close(g, alone):
            notes.append(f"{what}: d{pname} is, in each rank's Shard(0) block, that rank's own "
                         "batch's gradient: not reduced across the ranks")
    return notes


def _dtensor_head(rank):
    _scenario(rank, inside=False)


def _inside_forward(rank):
    _scenario(rank, inside=True)


SCENARIOS = {"inside_forward": _inside_forward, "dtensor_head": _dtensor_head}


# ---- the harness: test_vocab_parallel's (one spawn runs every scenario) -------------------------

KEEP_GOING_ON_ASSERT = True  # a scenario's collectives have all run before it checks anything


def rank_setup(rank):
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    return spawn_scenarios(tmp_path_factory, __name__, DEADLINE_S)


def test_loss_inside_the_wrapped_forward(outcomes):
    """lm_head unsharded by FSDP2 (plain tensors): kdloss sees no DTensor."""
    check_scenario(outcomes, "inside_forward")


def test_dtensor_lm_head_outside_the_forward(outcomes):
    """README's TRL recipe: the loss on student.lm_head.weight / .bias as DTensors."""
    check_scenario(outcomes, "dtensor_head")
