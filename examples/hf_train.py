"""A Hugging Face ``Trainer`` job with trainguard added: the lines marked ``# trainguard``.

    torchrun --nproc-per-node 2 --rdzv-id my-job examples/hf_train.py OUTPUT_DIR STEPS

A 1-layer GPT-2 with tiny dimensions, randomly initialised in code, on random tokens (nothing
downloaded). ``TrainguardCallback.attach`` takes the rank's identity from the launcher,
reports every optimizer step with this rank's own compute (DDP's overlap kept: its comm hook
goes on the Trainer's DDP model), heartbeats, and reports each checkpoint the Trainer saves
(every 5 steps here) to the node agent.
"""

from __future__ import annotations

import sys

import torch
from torch.utils.data import Dataset
from trainguard_sdk.integrations.hf import TrainguardCallback  # trainguard
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

SEQ = 16


class RandomTokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int, vocab: int) -> None:
        self.tokens = torch.randint(0, vocab, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def main() -> int:
    out, steps = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=128, n_positions=SEQ, n_embd=32, n_layer=1, n_head=2)
    args = TrainingArguments(
        output_dir=out, max_steps=steps, per_device_train_batch_size=8, learning_rate=1e-3,
        save_strategy="steps", save_steps=5, logging_strategy="no", report_to=[],
        use_cpu=True, ddp_backend="gloo", disable_tqdm=True, dataloader_num_workers=0)
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args,
                      train_dataset=RandomTokens(100_000, config.vocab_size))
    TrainguardCallback.attach(trainer)  # trainguard
    trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
