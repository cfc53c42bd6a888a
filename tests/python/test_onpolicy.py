"""examples/onpolicy_distill.py's step (reverse KL from teacher hidden states, both LM heads split
by vocabulary over a gloo group, per-token weights, the student's entropy) on 2 and 3 ranks
against one process on the whole heads: losses and entropies 1e-6 relative (the blocks change
only the order in which fp32 tile sums and the ranks' doubles add up; the entropies + 1e-6 of the
largest, see below), the hidden states'
gradient (summed over the ranks inside the call) and each rank's head-block gradient 1e-5
relative + 1e-5 of the largest entry (test_vocab_parallel.py's tolerances). The heads' blocks are
even for 2 ranks (V 300: 150 + 150) and uneven for 3 (V 301: 101 + 100 + 100). A fresh
seed each run (printed; KDLOSS_TEST_SEED reruns it)."""

import os
import random
import sys

import pytest
import torch
import torch.distributed as dist

from conftest import assert_close, require, require_row_extras

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                                os.pardir, "examples"))
import onpolicy_distill as ex  # noqa: E402  (spawned ranks import it by this name)

pytestmark = [require("kdloss_fused_linear_distill_vp"), require_row_extras("fused"),
              pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                 reason="torch.distributed with gloo is not available")]

SEED = int(os.environ.get("KDLOSS_TEST_SEED") or random.SystemRandom().randrange(2**31))
print(f"test_onpolicy: KDLOSS_TEST_SEED={SEED}")


@pytest.mark.parametrize("world,v", [(2, 300), (3, 301)])
def test_vocab_parallel_onpolicy_matches_one_process(world, v, tmp_path, monkeypatch):
    monkeypatch.setattr(ex, "V", v)
    monkeypatch.setenv("KDLOSS_ONPOLICY_V", str(v))  # the spawned ranks read V from here
    ranks = ex.run_ranks(world, str(tmp_path), seed=SEED, steps=1)
    (loss, entropy, dh, dw), _ = ex.train(seed=SEED, steps=1, log=lambda *_: None)
    assert bool((entropy[ex.problem(SEED)[5] == 0] == 0).all())  # 0 on rows of weight 0
    for rank, r in enumerate(ranks):
        rl, re_, rdh, rdw = r["first"]
        lo, hi = ex.vocab_block(rank, world, v)
        assert_close(rl, loss, 1e-6, 0.0, what=f"rank {rank}/{world} loss")
        # + 1e-6 of the largest entropy: a row's entropy is log Z - E_Q[z / T], a difference of
        # terms the size of its logits, rounded in another order on each rank count
        assert_close(re_, entropy, 1e-6, 1e-6, what=f"rank {rank}/{world} entropy")
        assert_close(rdh, dh, 1e-5, what=f"rank {rank}/{world} d hidden")
        assert_close(rdw, dw[lo:hi], 1e-5, what=f"rank {rank}/{world} d head block")
