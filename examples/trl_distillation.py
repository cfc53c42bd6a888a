"""TRL's DistillationTrainer with kdloss as its loss, on tiny models built from config (no download).

    python examples/trl_distillation.py        # CPU, seconds

DistillationTrainer (trl >= 1.16) trains the student on its own completions (on-policy) against
the teacher's full distribution, through trl.trainer.distillation_trainer._chunked_divergence_loss
on the two models' hidden states and LM heads. kdloss.torch.adapters.chunked_divergence_loss has
that function's signature and returns (loss, entropy sum, valid tokens) from ONE fused kdloss call:
the subclass below swaps it in for its own calls only (README, "TRL's DistillationTrainer").

The example trains the same student twice from the same weights and seed, once with TRL's own loss
and once with kdloss's, and prints both loss curves (they agree to about 1e-6 here: both compute
the loss in fp32; tests/python/test_examples.py checks 1e-3). The models are 2-layer Llamas from
LlamaConfig, the teacher random too (this shows the wiring, not a useful distillation). Needs trl
(scripts/deps.sh py installs trl==1.16.0); without it the script says so and exits.
"""
import copy
import os
import tempfile

import torch

from kdloss.torch.adapters import chunked_divergence_loss

V, STEPS, BATCH, PROMPT, COMPLETION, BETA = 96, 6, 4, 6, 8, 1.0  # beta 1: reverse KL
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
kdloss_calls = []  # one entry per loss call the kdloss run made (what it got: n_valid)


def tiny_llama(hidden, layers, seed):
    """A causal LM from config: no download."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=V, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, pad_token_id=0, eos_token_id=1,
                         bos_token_id=2, tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def tokenizer():
    """A word-level tokenizer over the ids t0..t{V-1} (t0 pad, t1 eos, t2 bos, t3 unk)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(V)}, unk_token="t3"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t1",
                                   bos_token="t2", unk_token="t3", padding_side="left")


def kdloss_trainer_class():
    """DistillationTrainer with kdloss's loss: TRL's _compute_loss reads the module-level
    _chunked_divergence_loss when it runs, so the subclass swaps it for the duration of its own
    calls (other trainers in the process keep TRL's)."""
    import trl.trainer.distillation_trainer as dt

    class KdlossDistillationTrainer(dt.DistillationTrainer):
        def _compute_loss(self, unwrapped_student, inputs, num_items_in_batch):
            trl_loss = dt._chunked_divergence_loss
            dt._chunked_divergence_loss = chunked_divergence_loss
            try:
                out = super()._compute_loss(unwrapped_student, inputs, num_items_in_batch)
            finally:
                dt._chunked_divergence_loss = trl_loss
            kdloss_calls.append(int(out[2]))
            return out
    return KdlossDistillationTrainer


def train(trainer_class, student, teacher):
    """The logged training losses of one run (seeded: the same completions for the same
    student)."""
    from datasets import Dataset
    from trl import DistillationConfig
    g = torch.Generator().manual_seed(1)
    prompts = [" ".join(f"t{int(i)}" for i in torch.randint(4, V, (PROMPT,), generator=g))
               for _ in range(BATCH * STEPS)]
    with tempfile.TemporaryDirectory() as out:
        args = DistillationConfig(output_dir=out, per_device_train_batch_size=BATCH,
                                  max_steps=STEPS, learning_rate=1e-3, beta=BETA,
                                  temperature=1.0, max_completion_length=COMPLETION,
                                  logging_steps=1, report_to=[], save_strategy="no",
                                  use_cpu=True, bf16=False, fp16=False, seed=0,
                                  dataloader_num_workers=0, disable_tqdm=True)
        trainer = trainer_class(model=student, teacher_model=teacher, args=args,
                                train_dataset=Dataset.from_dict({"prompt": prompts}),
                                processing_class=tokenizer())
        trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


try:
    import trl  # noqa: F401
    from trl import DistillationTrainer
except ImportError:
    DistillationTrainer = None

if DistillationTrainer is None:
    print("trl is not installed (pip install trl==1.16.0): nothing to run")
else:
    student, teacher = tiny_llama(32, 2, seed=0), tiny_llama(48, 2, seed=1)
    trl_losses = train(DistillationTrainer, copy.deepcopy(student), copy.deepcopy(teacher))
    losses = train(kdloss_trainer_class(), copy.deepcopy(student), copy.deepcopy(teacher))
    print(f"{len(losses)} steps, loss (kdloss) " + " ".join(f"{x:.6f}" for x in losses))
    print(f"{len(trl_losses)} steps, loss (TRL)    " + " ".join(f"{x:.6f}" for x in trl_losses))
    print(f"largest difference {max(abs(a - b) for a, b in zip(losses, trl_losses)):.2e}")
