"""A deterministic, seeded data stream addressed by the global sample index: sample ``i`` is
a fixed function of (seed, i), so "the data position" is one integer (samples consumed by the
whole job) and a resume from it continues exactly where the checkpoint was.

The stream cycles over a synthetic classification set of ``size`` samples (features from a
seeded normal, labels from a fixed random linear teacher with noise), in a new seeded
permutation every pass (``epoch = i // size``). In a step that starts at position ``p`` with
global batch ``G = W * B``, rank ``r`` takes samples ``p + r*B .. p + (r+1)*B - 1``.
"""

from __future__ import annotations

from typing import Final

import torch

SEED_STRIDE: Final = 1_000_003


class SampleStream:
    def __init__(self, seed: int, *, size: int = 4096, features: int = 32,
                 classes: int = 4) -> None:
        if size < 1 or features < 1 or classes < 2:
            raise ValueError("size >= 1, features >= 1, classes >= 2")
        self.seed = seed
        self.size = size
        self.features = features
        self.classes = classes
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, features, generator=g)
        teacher = torch.randn(features, classes, generator=g)
        noise = 0.5 * torch.randn(size, classes, generator=g)
        self.y = (self.x @ teacher + noise).argmax(dim=1)
        self._perms: dict[int, torch.Tensor] = {}

    def epoch_of(self, position: int) -> int:
        return position // self.size

    def _perm(self, epoch: int) -> torch.Tensor:
        perm = self._perms.get(epoch)
        if perm is None:
            if len(self._perms) > 4:
                self._perms.clear()
            g = torch.Generator().manual_seed(self.seed * SEED_STRIDE + epoch + 1)
            perm = self._perms[epoch] = torch.randperm(self.size, generator=g)
        return perm

    def batch(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples ``start .. start + count - 1`` of the stream."""
        if start < 0 or count < 1:
            raise ValueError(f"start >= 0 and count >= 1, got {start}, {count}")
        idx = torch.arange(start, start + count)
        epochs = idx // self.size
        rows = torch.empty(count, dtype=torch.long)
        for epoch in torch.unique(epochs).tolist():
            mask = epochs == epoch
            rows[mask] = self._perm(int(epoch))[idx[mask] % self.size]
        return self.x[rows], self.y[rows]

    def rank_slice(self, position: int, rank: int, per_rank: int) -> tuple[int, int]:
        """(start, count) of ``rank``'s part of the step that starts at ``position``."""
        return position + rank * per_rank, per_rank
