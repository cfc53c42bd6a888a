"""GKD-style distillation with kdloss as the loss, on tiny models built from config (no download).

    python examples/trl_gkd.py        # a few steps on the CPU, under a minute

With `trl` installed (pip install trl: it brings transformers, accelerate, datasets), this runs
TRL's GKDTrainer with kdloss in place of its loss, in two ways:

  * generalized_jsd_loss -> kdloss.torch.distill_loss(divergence="jsd"): the same loss on the
    (B, T, V) logits, one fused pass (loss and gradient), num_items_in_batch honoured; and
  * compute_loss -> kdloss.torch.FusedLinearJSDLoss on the hidden states and the LM heads: the
    (B, T, V) logits of student and teacher are never formed.

Without trl it runs the same loss in a plain PyTorch loop (and says where generalized_jsd_loss
would be replaced). tests/python/test_examples.py runs it when trl and transformers are there.
The models are 2-layer Llamas from LlamaConfig; the teacher is random too (this shows the wiring,
not a useful distillation). Gradient accumulation: 2 micro-batches per step; the loss is divided
by the step's total of non-ignored tokens (num_items_in_batch), as the HF Trainer passes it.
"""
import os
import tempfile

import torch

from kdloss.torch import FusedLinearJSDLoss
from kdloss.torch.adapters import generalized_jsd_loss

V, STEPS, ACCUM, BATCH, LENGTH, BETA = 64, 4, 2, 4, 12, 0.5
torch.manual_seed(0)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
num_items_seen = []  # what the Trainer passed to compute_loss (None: no accumulation normalizer)


def tiny_llama(hidden, layers):
    """A causal LM from config: no download."""
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=V, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, pad_token_id=0, eos_token_id=1,
                         bos_token_id=2, tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def batch(generator, n=BATCH):
    """Token ids 3..V-1 with a 4-token prompt (labels -100) and some right padding (id 0)."""
    ids = torch.randint(3, V, (n, LENGTH), generator=generator)
    mask = torch.ones_like(ids)
    for i in range(n):  # sequences of different lengths
        mask[i, LENGTH - i % 3:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :4] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels,
            "prompts": ids[:, :4], "prompt_attention_mask": mask[:, :4]}


# GKDTrainer.generalized_jsd_loss's signature and semantics (TRL's beta: 0 is KL(teacher ||
# student), 1 the reverse), computed by kdloss in one pass over the logits
kdloss_generalized_jsd_loss = generalized_jsd_loss


FUSED_LOSS = FusedLinearJSDLoss(weight_hard_loss=0.0, weight_soft_loss=1.0, beta=BETA)


def fused_gkd_loss(student, teacher, inputs, num_items_in_batch=None):
    """The GKD loss from hidden states and LM heads: logits never formed. Position i predicts
    token i + 1 (the labels shifted, as GKDTrainer.compute_loss does)."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    hidden = student.model(input_ids=ids, attention_mask=mask).last_hidden_state
    with torch.no_grad():
        teacher_hidden = teacher.model(input_ids=ids, attention_mask=mask).last_hidden_state
    return FUSED_LOSS(hidden[:, :-1], student.lm_head.weight, teacher_hidden[:, :-1],
                      teacher.lm_head.weight, inputs["labels"][:, 1:],
                      num_items_in_batch=num_items_in_batch)


def train_with_trl(student, teacher):
    """TRL's GKDTrainer, kdloss as its loss. Returns the logged training losses."""
    from datasets import Dataset
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    GKDConfig, GKDTrainer = gkd_classes()

    class KdlossGKDTrainer(GKDTrainer):
        # the drop-in: GKDTrainer.compute_loss calls this with num_items_in_batch
        generalized_jsd_loss = staticmethod(kdloss_generalized_jsd_loss)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            # the fused form; on one process `model` is the module itself (under DDP call
            # model.module's parts, or keep the generalized_jsd_loss override above)
            num_items_seen.append(num_items_in_batch)
            loss = fused_gkd_loss(model, self.teacher_model, inputs, num_items_in_batch)
            return (loss, None) if return_outputs else loss

    vocab = {f"t{i}": i for i in range(V)}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t3")),
        pad_token="t0", eos_token="t1", bos_token="t2", unk_token="t3")
    g = torch.Generator().manual_seed(1)
    rows = [{k: v[0].tolist() for k, v in batch(g, 1).items()}
            for _ in range(BATCH * ACCUM * STEPS)]

    def collate(examples):
        return {k: torch.tensor([e[k] for e in examples]) for k in examples[0]}

    with tempfile.TemporaryDirectory() as out:
        args = GKDConfig(output_dir=out, per_device_train_batch_size=BATCH,
                         gradient_accumulation_steps=ACCUM, max_steps=STEPS, learning_rate=1e-3,
                         lmbda=0.5, beta=BETA, max_new_tokens=4, temperature=1.0,
                         logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                         bf16=False, fp16=False, seed=0, dataloader_num_workers=0,
                         disable_tqdm=True)
        trainer = KdlossGKDTrainer(model=student, teacher_model=teacher, args=args,
                                   train_dataset=Dataset.from_list(rows),
                                   processing_class=tokenizer, data_collator=collate)
        # the logits-level drop-in agrees with TRL's own loss on this batch
        inputs = collate(rows[:BATCH])
        with torch.no_grad():
            zs = student(input_ids=inputs["input_ids"]).logits[:, :-1]
            zt = teacher(input_ids=inputs["input_ids"]).logits[:, :-1]
        ours = KdlossGKDTrainer.generalized_jsd_loss(zs, zt, inputs["labels"][:, 1:], beta=BETA)
        trls = GKDTrainer.generalized_jsd_loss(zs, zt, inputs["labels"][:, 1:], beta=BETA)
        print(f"kdloss {ours.item():.6f} vs TRL {trls.item():.6f} (generalized_jsd_loss)")
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def train_plain(student, teacher):
    """The same loss in a plain loop; GKDTrainer users replace generalized_jsd_loss with
    kdloss_generalized_jsd_loss (or compute_loss with fused_gkd_loss), as train_with_trl does."""
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    losses = []
    for step in range(STEPS):
        micro = [batch(g) for _ in range(ACCUM)]
        n_items = sum(int((m["labels"][:, 1:] != -100).sum()) for m in micro)
        total = 0.0
        for inputs in micro:  # each micro-batch's loss: its sum / the step's n_items
            loss = fused_gkd_loss(student, teacher, inputs, num_items_in_batch=n_items)
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses


def gkd_classes():
    """(GKDConfig, GKDTrainer): trl.experimental.gkd in recent TRL, trl itself before; None
    without trl."""
    try:
        from trl.experimental.gkd import GKDConfig, GKDTrainer
    except ImportError:
        try:
            from trl import GKDConfig, GKDTrainer
        except ImportError:
            return None
    return GKDConfig, GKDTrainer


student, teacher = tiny_llama(32, 2), tiny_llama(64, 2)
teacher.eval()
if gkd_classes() is not None and os.environ.get("KDLOSS_EXAMPLE_NO_TRL") != "1":
    losses = train_with_trl(student, teacher)
else:
    losses = train_plain(student, teacher)
print(f"{len(losses)} steps, loss " + " ".join(f"{x:.4f}" for x in losses))
