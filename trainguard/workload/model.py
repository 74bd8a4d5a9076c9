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
