"""What the checkpoint manager needs from the job's process group, as a two-method
Protocol: gather one small object from every rank, and agree on a flag. ``Solo`` is the
single-process job; ``TorchCollective`` uses ``torch.distributed`` (imported when used).

Optional, found with ``getattr`` (a collective without them still works):
``store`` (a c10d key-value store every rank reaches: save requests travel through it with no
per-step collective, see ``schedule.py``), ``side()`` (a collective on a process group of its
own, for the background work of sharded saves, so that it never interleaves with the training
loop's collectives) and ``group`` (that collective's ``torch.distributed`` process group).
"""

from __future__ import annotations

import threading
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
    group: Any = None
    store: Any = None

    def side(self) -> Solo:
        return self

    def all_gather(self, obj: Any) -> list[Any]:
        return [obj]

    def any(self, flag: bool) -> bool:
        return flag


class TorchCollective:
    """The default process group of ``torch.distributed`` (initialised by the caller), or
    ``group``. ``device`` is where the flag tensor lives: "cpu" for gloo, the rank's CUDA
    device for NCCL. A failed or timed-out collective raises torch's error (a
    ``RuntimeError``). ``store``: the key-value store for save requests; by default the
    default process group's own store (the launcher's rendezvous store under a prefix)."""

    def __init__(self, device: str = "cpu", *, store: Any = None, group: Any = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.group = group
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size(group)
        self.device = device
        self._store = store
        self._side: TorchCollective | None = None
        self._side_lock = threading.Lock()

    @property
    def store(self) -> Any:
        """The store save requests travel through; None when torch does not expose the
        default group's (then the manager falls back to agreeing with a collective)."""
        if self._store is None:
            try:
                from torch.distributed.distributed_c10d import _get_default_store
            except ImportError:  # pragma: no cover - every torch this SDK supports has it
                return None
            self._store = _get_default_store()
        return self._store

    def side(self) -> TorchCollective:
        """A collective on a gloo group of its own (made on the first call: every rank must
        make that call at the same point of the program, as for any new group)."""
        with self._side_lock:
            if self._side is None:
                group = self._dist.new_group(backend="gloo")
                self._side = TorchCollective("cpu", store=self._store, group=group)
            return self._side

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, obj, group=self.group)
        return out

    def any(self, flag: bool) -> bool:
        import torch

        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self.device)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.group)
        return bool(t.item())
