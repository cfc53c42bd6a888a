"""Vocabulary-parallel fused losses (process_group=...) and the fused loss under
DistributedDataParallel, in a gloo group of 2 processes on this machine (one spawn runs every
scenario; each test reads its scenario's outcome).

Every rank draws the same inputs, holds its block of rows of the LM heads (even or uneven), runs
the module with process_group, and checks its own results against the single-process run it also
makes on the concatenated heads (the C test tests/mpi/test_vp.c's tolerances): losses 1e-6
relative (the blocks only change the order in which fp32 tile sums and the ranks' doubles are
added), dX and its dW / db block 1e-5 relative + 1e-5 x the largest entry (dX's sum over ranks is
another fp32 summation order). A rank that fails raises, its process exits non-zero, and the
parent fails the test with its traceback; gloo's timeout (a collective no peer joins) and the
parent's deadline turn a hang into a failure.
"""

import datetime
import gc
import importlib
import os
import time
import traceback

import pytest
import torch
import torch.distributed as dist

import kdloss
from kdloss import _lib
from kdloss.torch import (FusedLinearDistillLoss, FusedLinearJSDLoss, FusedLinearTopKDistillLoss,
                          fused_linear_topk_distill_loss)

from conftest import assert_close, require
from test_fused_linear_jsd import make, run
from test_topk import fused_case

pytestmark = [require("kdloss_fused_linear_distill_vp"),
              pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                 reason="torch.distributed with gloo is not available")]

WORLD = 2
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=20)  # gloo: a collective no peer joins fails
DEADLINE_S = 120  # the parent kills the processes after this long (a run takes ~15 s)
LOSS_RTOL, GRAD_TOL = 1e-6, 1e-5
BLOCKS = {"even": (20, 20), "uneven": (29, 12)}  # rows per rank of a V = 40 / 41 head


# ---- the harness: one spawn runs every scenario, each test reads its scenario's outcome ---------

def _entry(rank, store, outdir, module):
    """A rank: joins the gloo group, runs the scenarios of test module `module` (its SCENARIOS,
    after its rank_setup(rank) if it has one) in order, writes each one's outcome to
    outdir/NAME.RANK (empty: passed; else the traceback). The first failure ends the process with
    that exception: the ranks are no longer in step, and the parent reports a non-zero exit. A
    module whose scenarios have run all their collectives before they check anything sets
    KEEP_GOING_ON_ASSERT: a failed check (AssertionError) then ends only its scenario. The
    module's COLLECTIVE_TIMEOUT, if it has one, replaces this one's."""
    mod = importlib.import_module(module)
    if hasattr(mod, "rank_setup"):
        mod.rank_setup(rank)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=getattr(mod, "COLLECTIVE_TIMEOUT", COLLECTIVE_TIMEOUT))
    keep_going = getattr(mod, "KEEP_GOING_ON_ASSERT", False)
    try:
        for name, worker in mod.SCENARIOS.items():
            outcome = os.path.join(outdir, f"{name}.{rank}")
            try:
                worker(rank)
            except BaseException as e:
                with open(outcome, "w") as f:
                    f.write(traceback.format_exc())
                if not (keep_going and isinstance(e, AssertionError)):
                    raise
                continue
            open(outcome, "w").close()
    finally:
        gc.collect()  # cycles that hold the group (DDP's, the caught errors' tracebacks) go first
        dist.destroy_process_group()


def spawn_scenarios(tmp_path_factory, module, deadline_s=DEADLINE_S):
    """Runs test module `module`'s scenarios in WORLD spawned processes (one start-up for all its
    tests) and returns (outcome folder, what ended the processes early: None, an exception's text
    or a deadline)."""
    outdir = tmp_path_factory.mktemp(module)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")  # 2 processes on 2 cores
        ctx = torch.multiprocessing.start_processes(
            _entry, args=(str(outdir / "store"), str(outdir), module), nprocs=WORLD, join=False,
            start_method="spawn")
    deadline, ended = time.monotonic() + deadline_s, None
    try:
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                ended = f"the processes were killed after {DEADLINE_S} s"
                break
    except Exception as e:  # a rank raised or died: ProcessRaisedException / ProcessExitedException
        ended = str(e)
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    return outdir, ended


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    return spawn_scenarios(tmp_path_factory, __name__)


def check_scenario(outcomes, name):
    """Fails unless every rank passed scenario `name`."""
    outdir, ended = outcomes
    for rank in range(WORLD):
        path = outdir / f"{name}.{rank}"
        if not path.exists():
            pytest.fail(f"rank {rank} did not finish {name}: {ended or 'no outcome written'}")
        text = path.read_text()
        if text:
            pytest.fail(f"rank {rank} failed {name}:\n{text}")


def block_of(rank, sizes):
    """[lo, hi) of rank's rows."""
    lo = sum(sizes[:rank])
    return lo, lo + sizes[rank]


def detached(t):
    """Fresh leaves with the same values (each run gets its own gradients)."""
    return {k: (x.detach().clone() if isinstance(x, torch.Tensor) else x) for k, x in t.items()}


def check_rank(what, losses, grads, want_losses, want_grads, lo, hi):
    """This rank's losses and gradients against the single-process ones: dX whole, dW and db
    (keys ws / bs) this rank's rows [lo, hi)."""
    for i, (a, e) in enumerate(zip(losses, want_losses)):
        assert_close(a, e, LOSS_RTOL, 0.0, f"{what}: loss output {i}")
    assert grads.keys() == want_grads.keys(), what
    for k, e in want_grads.items():
        assert_close(grads[k], e if k == "xs" else e[lo:hi], GRAD_TOL, what=f"{what}: d{k}")


# ---- dense teachers -------------------------------------------------------------------------------

def _dense_modules(rank):
    """(name, constructor keywords, module class): three cases of FusedLinearDistillLoss (with
    cross-entropy, T, t2_scale; several chunks; logit maps) and FusedLinearJSDLoss, whose chunk
    size differs between the ranks (they agree on the smaller)."""
    return [
        ("forward_kl", dict(divergence="forward_kl", weight_hard_loss=0.3, weight_soft_loss=0.7,
                            temperature=2.0, t2_scale=True), FusedLinearDistillLoss),
        ("skew_reverse_kl", dict(divergence="skew_reverse_kl", alpha=0.25, temperature=1.5,
                                 chunk_size=5), FusedLinearDistillLoss),
        ("jsd_loss", dict(beta=0.3, temperature=2.0, chunk_size=4 if rank == 0 else 0),
         FusedLinearJSDLoss),
        ("logit_maps", dict(divergence="reverse_kl", weight_hard_loss=0.4, temperature=1.5,
                            student_logit_scale=1.5, student_softcap=2.0, teacher_softcap=3.0),
         FusedLinearDistillLoss),
    ]


def _dense_worker(rank):
    group = dist.group.WORLD
    for layout, sizes in BLOCKS.items():
        t = make(torch.Generator().manual_seed(7), bias=True, ignore=True, bt=24, hs=8, ht=12,
                 v=sum(sizes))
        lo, hi = block_of(rank, sizes)
        for name, kw, cls in _dense_modules(rank):
            what = f"rank {rank} {layout} {name}"
            want = run(detached(t), cls(return_soft_hard_loss=True, **kw))
            mine = dict(detached(t), **{k: t[k][lo:hi].clone() for k in ("ws", "bs", "wt", "bt")})
            got = run(mine, cls(return_soft_hard_loss=True, process_group=group, **kw))
            check_rank(what, got[:3], got[3], want[:3], want[3], lo, hi)
        # without labels every row counts whatever ignore_index (0 included), on every rank
        base = dict(t, labels=None)
        kw = dict(divergence="forward_kl", weight_hard_loss=0.0, weight_soft_loss=1.0,
                  return_soft_hard_loss=True)
        want = run(detached(base), FusedLinearDistillLoss(**kw))
        mine = dict(detached(base), **{k: base[k][lo:hi].clone() for k in ("ws", "bs", "wt", "bt")})
        got = run(mine, FusedLinearDistillLoss(process_group=group, ignore_index=0, **kw))
        check_rank(f"rank {rank} {layout} no labels, ignore_index 0", got[:3], got[3],
                   want[:3], want[3], lo, hi)


def test_dense_matches_single_process(outcomes):
    check_scenario(outcomes, "dense")


# ---- sparse top-k teachers ------------------------------------------------------------------------

TOPK_CASES = [  # (tail, divergence, weight_hard_loss, with labels)
    ("bucket", "jsd", 0.3, True), ("renorm_both", "forward_kl", 0.4, True),
    ("renorm_both", "reverse_kl", 0.0, False), ("renorm_teacher", "forward_kl", 0.0, True)]


def _topk_worker(rank):
    group = dist.group.WORLD
    for layout, sizes in BLOCKS.items():
        xs, ws, bs, ids, lps, labels = fused_case(torch.Generator().manual_seed(11), bt=12, h=16,
                                                  v=sum(sizes), k=5, t=1.5)
        lo, hi = block_of(rank, sizes)
        for i, (tail, div, wh, with_labels) in enumerate(TOPK_CASES):
            what = f"rank {rank} {layout} {tail} {div}"
            kw = dict(divergence=div, tail=tail, weight_hard_loss=wh, weight_soft_loss=1.0 - wh,
                      temperature=1.5)
            if i == 1:  # one case with a student logit map (softcap 2 on logits of spread ~3)
                kw.update(student_logit_scale=1.2, student_softcap=2.0)
            lab = labels if with_labels else None
            runs = []
            for w, b, pg in ((ws, bs, None), (ws[lo:hi], bs[lo:hi], group)):
                x, w, b = (y.detach().clone().requires_grad_() for y in (xs, w, b))
                loss = FusedLinearTopKDistillLoss(process_group=pg, **kw)(x, w, ids, lps, lab, b)
                loss.backward()
                runs.append(([loss], {"xs": x.grad, "ws": w.grad, "bs": b.grad}))
            check_rank(what, *runs[1], *runs[0], lo, hi)


def test_topk_matches_single_process(outcomes):
    check_scenario(outcomes, "topk")


# ---- errors: every rank raises, none waits --------------------------------------------------------

def _error_worker(rank):
    group = dist.group.WORLD
    sizes = BLOCKS["uneven"]
    lo, hi = block_of(rank, sizes)
    t = make(torch.Generator().manual_seed(3), bias=True, bt=8, hs=4, ht=6, v=sum(sizes))
    t = dict(t, **{k: t[k][lo:hi] for k in ("ws", "bs", "wt", "bt")})

    def dense(labels=None, **kw):
        u = detached(t)
        u["labels"] = u["labels"] if labels is None else labels
        return run(u, FusedLinearDistillLoss(return_soft_hard_loss=True, process_group=group,
                                             **kw))

    def good_call():  # the group is still in step after each failure
        assert torch.isfinite(dense()[0])

    peer = kdloss.status_string(_lib.ERR_PEER)
    # a parameter the C library rejects on rank 1: rank 1 has the C message, rank 0 the peer's
    with pytest.raises(kdloss.KdlossError) as e:
        dense(temperature=-1.0 if rank == 1 else 1.0)
    if rank == 1:
        assert e.value.status == _lib.ERR_INVALID_PARAM, str(e.value)
        assert "kdloss_fused_linear_distill_vp" in str(e.value), str(e.value)
        assert kdloss.status_string(_lib.ERR_INVALID_PARAM) in str(e.value), str(e.value)
    else:
        assert e.value.status == _lib.ERR_PEER and peer in str(e.value), str(e.value)
    good_call()

    # labels are global ids: V_total itself is out of range (rank 0 holds it), rank 1 hears of it
    bad = t["labels"].clone()
    bad[2] = sum(sizes) if rank == 0 else bad[2]
    with pytest.raises(kdloss.KdlossError) as e:
        dense(bad)
    assert e.value.status == (_lib.ERR_LABEL_OUT_OF_RANGE if rank == 0 else _lib.ERR_PEER), \
        str(e.value)
    good_call()

    # an error the binding finds before the C call (rank 0's labels have the wrong length): the
    # rank still joins the others' collectives, so they get KDLOSS_ERR_PEER instead of waiting
    xs, ws, bs, ids, lps, labels = fused_case(torch.Generator().manual_seed(5), bt=8, h=4,
                                              v=sum(sizes), k=3, t=1.0)
    labels = labels[:5] if rank == 0 else labels
    with pytest.raises(kdloss.KdlossError) as e:
        fused_linear_topk_distill_loss(xs, ws[lo:hi], ids, lps, labels, bs[lo:hi],
                                       process_group=group)
    assert e.value.status == (_lib.ERR_SHAPE_MISMATCH if rank == 0 else _lib.ERR_PEER), \
        str(e.value)
    good_call()

    # an exception inside the all-reduce callback comes back as itself, after the C call
    real = dist.all_reduce

    def failing(*a, **k):
        raise RuntimeError(f"injected all-reduce failure on rank {rank}")
    dist.all_reduce = failing
    try:
        with pytest.raises(RuntimeError, match=f"injected all-reduce failure on rank {rank}"):
            dense()
    finally:
        dist.all_reduce = real
    good_call()

    # tensors on another device than the CPU or CUDA: NotImplementedError
    meta = {k: x.to("meta") for k, x in t.items()}
    with pytest.raises(NotImplementedError, match="CPU or CUDA tensors"):
        FusedLinearJSDLoss(process_group=group)(meta["xs"], meta["ws"], meta["xt"], meta["wt"],
                                                meta["labels"])
    good_call()


def test_errors_reach_every_rank(outcomes):
    check_scenario(outcomes, "errors")


# ---- data parallelism: the (non-vocab-parallel) fused loss inside DDP -----------------------------

class _Student(torch.nn.Module):
    """A hidden layer and an LM head trained through the fused loss against a fixed teacher."""

    def __init__(self, h, v):
        super().__init__()
        self.proj = torch.nn.Linear(h, h)
        self.head = torch.nn.Linear(h, v)
        self.loss = FusedLinearDistillLoss(divergence="forward_kl", weight_hard_loss=0.4,
                                           weight_soft_loss=0.6, temperature=2.0)

    def forward(self, x, xt, wt, labels):
        return self.loss(torch.tanh(self.proj(x)), self.head.weight, xt, wt, labels,
                         self.head.bias)


def _ddp_worker(rank):
    torch.manual_seed(0)
    model = _Student(8, 40)
    t = make(torch.Generator().manual_seed(9), bt=16, hs=8, ht=6, v=40)
    t["labels"][[0, 1, 2, 12]] = -100  # rank 0's half keeps 5 rows, rank 1's half 7

    single = _Student(8, 40)
    single.load_state_dict(model.state_dict())
    single(t["xs"], t["xt"], t["wt"], t["labels"]).backward()

    # The fused loss is a batchmean over the rows each process keeps, loss_r = S_r / n_r, and
    # DDP averages the processes' gradients: (1 / W) sum_r grad(S_r) / n_r. One process on the
    # whole batch gets grad(sum_r S_r) / N with N = sum_r n_r, the same only when every half
    # keeps N / W rows. Scaling each process's loss by W n_r / N makes the two equal for any
    # split (the halves here keep 5 and 7 rows): (1 / W) sum_r (W n_r / N) grad(S_r) / n_r.
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    half = slice(8 * rank, 8 * rank + 8)
    n_kept = (t["labels"][half] != -100).sum()
    n_total = n_kept.clone()
    dist.all_reduce(n_total)
    loss = ddp(t["xs"][half], t["xt"][half], t["wt"], t["labels"][half])
    (loss * (WORLD * n_kept / n_total)).backward()
    for name, p in model.named_parameters():
        want = dict(single.named_parameters())[name].grad
        assert_close(p.grad, want, GRAD_TOL, what=f"rank {rank} DDP d{name}")


def test_data_parallel_ddp_matches_one_process(outcomes):
    check_scenario(outcomes, "ddp")


SCENARIOS = {"dense": _dense_worker, "topk": _topk_worker, "errors": _error_worker,
             "ddp": _ddp_worker}
