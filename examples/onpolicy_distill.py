"""On-policy distillation from a teacher's hidden states, with both LM heads split by vocabulary.

    python examples/onpolicy_distill.py        # 2 gloo processes on the CPU, seconds

The shape of on-policy distillation in RL trainers: the student samples completions, a teacher
server returns its last hidden states for them (a (B, T, Ht) tensor: far smaller than its logits),
and each of the student's ranks holds its block of vocabulary rows of the student head AND of the
teacher head. One kdloss call per step computes the full-vocabulary reverse KL(student ||
teacher) over those blocks (process_group=: the ranks exchange per-row statistics, never logits),
with per-token weights (the completion mask times a per-token weight, as a trainer's loss mask or
advantage weighting gives them) and the student's entropy per token for logging.

Every rank passes the same hidden states, weights and teacher states and gets the same loss and
entropy, the full gradient of the hidden states (already summed over the ranks: no all-reduce
needed) and the gradient of its own head block. The result equals one process's on the whole
heads (tests/python/test_onpolicy.py checks 2 and 3 ranks against it). The models here are a tiny
embedding + MLP student and a random teacher (the wiring, not a useful distillation).
"""
import os
import tempfile

import torch
import torch.distributed as dist

from kdloss.torch import FusedLinearDistillLoss

V, HS, HT, B, T, STEPS, WORLD = int(os.environ.get("KDLOSS_ONPOLICY_V", 300)), 32, 48, 4, 10, 3, 2


def vocab_block(rank, world, v=None):
    """[lo, hi) of this rank's vocabulary rows of v (V by default; uneven when world does not
    divide v)."""
    v = V if v is None else v
    sizes = [v // world + (r < v % world) for r in range(world)]
    lo = sum(sizes[:rank])
    return lo, lo + sizes[rank]


def problem(seed):
    """What every rank holds alike: the student (embedding + MLP backbone), the full heads (each
    rank keeps its block of them), sampled completions, the teacher server's hidden states and the
    per-token weights."""
    g = torch.Generator().manual_seed(seed)
    student = torch.nn.Sequential(torch.nn.Embedding(V, HS), torch.nn.Linear(HS, HS),
                                  torch.nn.GELU(), torch.nn.Linear(HS, HS))
    with torch.no_grad():
        for p in student.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    student_head = torch.randn(V, HS, generator=g) * 0.3
    teacher_head = torch.randn(V, HT, generator=g) * 0.3
    tokens = torch.randint(0, V, (B, T), generator=g)          # the student's sampled completions
    teacher_hidden = torch.randn(B, T, HT, generator=g)         # from the teacher server
    mask = torch.ones(B, T)
    mask[0, 7:] = 0                                              # finished early (padding)
    mask[2, 4:] = 0
    weights = mask * (torch.rand(B, T, generator=g) + 0.5)      # per-token weights, 0 = ignored
    return student, student_head, teacher_head, tokens, teacher_hidden, weights


def train(rank=0, world=1, group=None, seed=0, steps=STEPS, log=print):
    """`steps` optimizer steps of on-policy reverse-KL distillation on this rank; returns the
    first step's (loss, entropy (B, T), d hidden states, d student-head block) and the losses.
    world 1 / group None: one process on the whole heads."""
    student, s_head, t_head, tokens, teacher_hidden, weights = problem(seed)
    lo, hi = vocab_block(rank, world)
    head = torch.nn.Parameter(s_head[lo:hi].clone())   # this rank's block of the student head
    teacher_block = t_head[lo:hi]                       # and of the teacher head (frozen)
    loss_fn = FusedLinearDistillLoss(divergence="reverse_kl", weight_hard_loss=0.0,
                                     weight_soft_loss=1.0, process_group=group,
                                     return_entropy=True)
    opt = torch.optim.SGD(list(student.parameters()) + [head], lr=0.5)
    first, losses = None, []
    for step in range(steps):
        hidden = student(tokens)
        hidden.retain_grad()
        loss, entropy = loss_fn(hidden, head, teacher_hidden, teacher_block, None,
                                token_weights=weights)
        loss.backward()  # hidden.grad: the full gradient on every rank; head.grad: the block's
        if first is None:
            first = (loss.detach(), entropy, hidden.grad.clone(), head.grad.clone())
        opt.step()
        opt.zero_grad()
        kept = weights > 0
        losses.append(float(loss.detach()))
        log(f"rank {rank}/{world} step {step}: reverse KL {float(loss):.6f}, "
            f"mean entropy {float(entropy[kept].mean()):.4f} nats")
    return first, losses


def _rank_main(rank, world, store, out, seed, steps):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        first, losses = train(rank, world, dist.group.WORLD, seed, steps,
                              log=print if rank == 0 else (lambda *_: None))
        torch.save({"first": first, "losses": losses}, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_ranks(world, out, seed=0, steps=STEPS):
    """Runs train() on `world` gloo processes; returns each rank's saved results."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.multiprocessing.start_processes(_rank_main, args=(world, os.path.join(out, "store"),
                                                            out, seed, steps),
                                          nprocs=world, join=True, start_method="spawn")
    return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(world)]


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as out:
        ranks = run_ranks(WORLD, out)
    _, alone = train(log=lambda *_: None)
    losses = ranks[0]["losses"]
    print(f"{WORLD} ranks: losses " + " ".join(f"{x:.6f}" for x in losses))
    print("1 process: losses " + " ".join(f"{x:.6f}" for x in alone))
