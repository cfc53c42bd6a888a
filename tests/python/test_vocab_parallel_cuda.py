"""Vocabulary-parallel fused losses on CUDA tensors (process_group=..., through VocabParallel to
kdloss_cuda_fused_linear_distill_vp / kdloss_cuda_fused_linear_topk_distill_vp): 2 gloo processes
sharing one GPU (cuda:0 for both ranks; gloo reduces CUDA tensors through the host), each rank
against the single-process CUDA run on the concatenated heads, with test_vocab_parallel.py's
tolerances (losses 1e-6 relative, dX and the rank's dW / db block 1e-5 relative + 1e-5 x the
largest entry). Skipped without a GPU and a CUDA build of the library: written on a machine
without a GPU, so it has never run.
"""

import pytest
import torch
import torch.distributed as dist

from kdloss import _lib
from kdloss.torch import FusedLinearDistillLoss, FusedLinearTopKDistillLoss

from test_fused_linear_jsd import make, run
from test_topk import fused_case
from test_vocab_parallel import (BLOCKS, block_of, check_rank, check_scenario, detached,
                                 spawn_scenarios)


def _cuda_ready():
    try:
        return (torch.cuda.is_available() and _lib.has("kdloss_cuda_fused_linear_distill_vp")
                and bool(_lib.lib().kdloss_cuda_available()))
    except OSError:
        return False


pytestmark = pytest.mark.skipif(
    not _cuda_ready() or not dist.is_available() or not dist.is_gloo_available(),
    reason="needs a GPU, a CUDA build of libkdloss and torch.distributed with gloo")

DEV = "cuda:0"
DEADLINE_S = 180


def _on_gpu(t):
    return {k: (x.detach().to(DEV) if isinstance(x, torch.Tensor) else x) for k, x in t.items()}


def _dense(rank):
    group = dist.group.WORLD
    for layout, sizes in BLOCKS.items():
        t = _on_gpu(make(torch.Generator().manual_seed(7), bias=True, ignore=True, bt=24, hs=8,
                         ht=12, v=sum(sizes)))
        lo, hi = block_of(rank, sizes)
        for kw in (dict(divergence="forward_kl", weight_hard_loss=0.3, weight_soft_loss=0.7,
                        temperature=2.0, t2_scale=True),
                   dict(divergence="jsd", chunk_size=5)):
            want = run(detached(t), FusedLinearDistillLoss(return_soft_hard_loss=True, **kw))
            mine = dict(detached(t), **{k: t[k][lo:hi].clone() for k in ("ws", "bs", "wt", "bt")})
            got = run(mine, FusedLinearDistillLoss(return_soft_hard_loss=True, process_group=group,
                                                   **kw))
            check_rank(f"rank {rank} {layout} {kw}", got[:3], got[3], want[:3], want[3], lo, hi)


def _topk(rank):
    group = dist.group.WORLD
    cases = [("bucket", "jsd", 0.3, True), ("renorm_both", "reverse_kl", 0.0, False),
             ("renorm_teacher", "forward_kl", 0.0, True)]
    for layout, sizes in BLOCKS.items():
        xs, ws, bs, ids, lps, labels = (
            x.detach().to(DEV) for x in fused_case(torch.Generator().manual_seed(11), bt=12, h=16,
                                                   v=sum(sizes), k=5, t=1.5))
        lo, hi = block_of(rank, sizes)
        for tail, div, wh, with_labels in cases:
            kw = dict(divergence=div, tail=tail, weight_hard_loss=wh, weight_soft_loss=1.0 - wh,
                      temperature=1.5)
            runs = []
            for w, b, pg in ((ws, bs, None), (ws[lo:hi], bs[lo:hi], group)):
                x, w, b = (y.clone().requires_grad_() for y in (xs, w, b))
                loss = FusedLinearTopKDistillLoss(process_group=pg, **kw)(
                    x, w, ids, lps, labels if with_labels else None, b)
                loss.backward()
                runs.append(([loss], {"xs": x.grad, "ws": w.grad, "bs": b.grad}))
            check_rank(f"rank {rank} {layout} {tail} {div}", *runs[1], *runs[0], lo, hi)


SCENARIOS = {"dense": _dense, "topk": _topk}


def rank_setup(rank):
    """Both ranks on the one GPU (test_vocab_parallel's harness calls it in each process)."""
    torch.cuda.set_device(0)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    return spawn_scenarios(tmp_path_factory, __name__, DEADLINE_S)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_cuda_vocab_parallel_matches_single_process(outcomes, name):
    check_scenario(outcomes, name)
