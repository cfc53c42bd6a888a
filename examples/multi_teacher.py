"""Several teachers in one fused call (README.md, "Several teachers"): each sequence is distilled
from its own domain's teacher, one call for the whole batch. Tiny sizes, CPU, about a second."""

import torch

from kdloss.torch import FusedLinearDistillLoss

V, H_TEACHER, H_STUDENT, B, L = 256, 48, 32, 6, 16
torch.manual_seed(0)
tokens = torch.randint(0, V, (B, L + 1))
inputs, labels = tokens[:, :-1], tokens[:, 1:]
domain = torch.tensor([0, 1, 1, 0, 2, 2])  # each sequence's teacher

# Three frozen teachers over one vocabulary, with one hidden size. Each sequence's hidden states
# come from its own teacher's body; the heads (and biases) go to the loss as lists.
teachers = [torch.nn.Sequential(torch.nn.Embedding(V, H_TEACHER), torch.nn.Linear(H_TEACHER, V))
            for _ in range(3)]
with torch.no_grad():
    teacher_hidden = torch.stack([teachers[d][0](inputs[b])
                                  for b, d in enumerate(domain.tolist())])  # (B, L, H_TEACHER)
heads = [t[1].weight for t in teachers]
biases = [t[1].bias for t in teachers]
teacher_index = domain[:, None].expand(B, L)  # (B, L): the teacher of every token

embed, head = torch.nn.Embedding(V, H_STUDENT), torch.nn.Linear(H_STUDENT, V)
loss_fn = FusedLinearDistillLoss(divergence="forward_kl", temperature=2.0, t2_scale=True,
                                 weight_hard_loss=0.5, weight_soft_loss=0.5)
optimizer = torch.optim.AdamW([*embed.parameters(), *head.parameters()], lr=1e-2)
losses = []
for step in range(20):
    loss = loss_fn(embed(inputs), head.weight, teacher_hidden, heads, labels, head.bias, biases,
                   teacher_index=teacher_index)
    optimizer.zero_grad()
    loss.backward()  # the student's gradients only: the teachers' heads get none
    optimizer.step()
    losses.append(loss.item())
print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps")
