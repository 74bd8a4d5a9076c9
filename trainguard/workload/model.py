"""The reference workload's model: a small MLP classifier. Dropout makes the torch RNG part
of the training state (a resume that did not restore it would diverge)."""

from __future__ import annotations

import torch
from torch import nn


class SmallNet(nn.Module):
    def __init__(self, features: int, classes: int, hidden: int = 64,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


def average_gradients(model: nn.Module, world_size: int) -> None:
    """The data-parallel gradient exchange: every gradient summed over the ranks (one
    all-reduce of the flattened gradients), then divided by the world size."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    torch.distributed.all_reduce(flat)
    flat /= world_size
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset:offset + n].view_as(g))
        offset += n
