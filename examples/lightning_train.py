"""A PyTorch Lightning DDP job with trainguard added: the lines marked ``# trainguard``.

    torchrun --nproc-per-node 2 --rdzv-id my-job examples/lightning_train.py CKPT_DIR STEPS

(or ``python examples/lightning_train.py CKPT_DIR STEPS`` with ``TRAINGUARD_JOB_ID`` set:
Lightning's own launcher starts the second process). ``TrainguardCallback`` takes the rank's
identity from the launcher, reports every step with this rank's own compute (DDP's overlap
kept: its comm hook goes on the strategy's DDP model), heartbeats, and reports each
checkpoint ModelCheckpoint writes (every 5 steps here) to the node agent.
"""

from __future__ import annotations

import sys

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from trainguard_sdk.integrations.lightning import TrainguardCallback  # trainguard


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> int:
    ckpt_dir, steps = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 16), torch.randint(0, 4, (4096,)))
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"),
        max_steps=steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[TrainguardCallback(),  # trainguard
                   ModelCheckpoint(ckpt_dir, every_n_train_steps=5, save_top_k=-1)])
    trainer.fit(Classifier(), DataLoader(data, batch_size=32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
