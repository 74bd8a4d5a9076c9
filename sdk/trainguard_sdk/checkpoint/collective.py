"""What the checkpoint manager needs from the job's process group, as a two-method
Protocol: gather one small object from every rank, and agree on a flag. ``Solo`` is the
single-process job; ``TorchCollective`` uses ``torch.distributed`` (imported when used)."""

from __future__ import annotations

from typing import Any, Protocol


class Collective(Protocol):
    rank: int
    world_size: int

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (a collective: every rank must call it)."""
        ...

    def any(self, flag: bool) -> bool:
        """True on every rank when any rank passed True (a collective)."""
        ...


class Solo:
    rank = 0
    world_size = 1

    def all_gather(self, obj: Any) -> list[Any]:
        return [obj]

    def any(self, flag: bool) -> bool:
        return flag


class TorchCollective:
    """The default process group of ``torch.distributed`` (initialised by the caller).
    ``device`` is where the flag tensor lives: "cpu" for gloo, the rank's CUDA device for
    NCCL. A failed or timed-out collective raises torch's error (a ``RuntimeError``)."""

    def __init__(self, device: str = "cpu") -> None:
        import torch.distributed as dist

        self._dist = dist
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.device = device

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, obj)
        return out

    def any(self, flag: bool) -> bool:
        import torch

        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self.device)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX)
        return bool(t.item())
