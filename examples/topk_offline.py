"""Offline distillation from a stored top-k teacher: the code of README.md's section of that name.

    python examples/topk_offline.py     # tiny sizes, CPU, a few seconds; writes teacher_topk.pt

tests/python/test_examples.py runs this file and checks that README.md shows exactly this code
(everything below this docstring), so the README example cannot rot.
"""
import torch

from kdloss.torch import FusedLinearTopKDistillLoss

V, K, T = 512, 16, 2.0                     # vocabulary, stored slots per token, temperature
B, L, H_TEACHER, H_STUDENT = 4, 32, 64, 32
torch.manual_seed(0)
tokens = torch.randint(0, V, (B, L + 1))
inputs, labels = tokens[:, :-1], tokens[:, 1:]

# 1. The teacher, once, offline: log-probs over the FULL vocabulary at temperature T, top K kept.
teacher = torch.nn.Sequential(torch.nn.Embedding(V, H_TEACHER), torch.nn.Linear(H_TEACHER, V))
with torch.no_grad():
    logprobs = torch.log_softmax(teacher(inputs) / T, dim=-1)      # (B, L, V)
    top_logprobs, top_ids = torch.topk(logprobs, K, dim=-1)       # (B, L, K) each
torch.save({"ids": top_ids.to(torch.int32), "logprobs": top_logprobs.to(torch.float16),
            "temperature": T}, "teacher_topk.pt")

# 2. The student's training steps read the stored teacher: no teacher forward pass, and the
#    student's (B, L, V) logits are never formed (the loss takes the LM head's weight).
stored = torch.load("teacher_topk.pt")
embed, head = torch.nn.Embedding(V, H_STUDENT), torch.nn.Linear(H_STUDENT, V)
loss_fn = FusedLinearTopKDistillLoss(divergence="forward_kl", tail="bucket",
                                     temperature=stored["temperature"], t2_scale=True,
                                     weight_hard_loss=0.5, weight_soft_loss=0.5)
optimizer = torch.optim.AdamW([*embed.parameters(), *head.parameters()], lr=1e-2)
losses = []
for step in range(20):
    hidden = embed(inputs)                                        # (B, L, H_STUDENT)
    loss = loss_fn(hidden, head.weight, stored["ids"], stored["logprobs"], labels, head.bias)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps")
