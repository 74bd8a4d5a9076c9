"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP), with every byte hashed
as it is written. Needs torch; imported by the manager only for the ``dcp`` layout.

``HashingFileSystemWriter`` is DCP's ``FileSystemWriter`` whose files go through
``atomic.HashingWriter`` (the checksum computed while writing, early write-back, fsync by
DCP), so each rank knows the checksum and size of the shard files it wrote (``__<rank>_<n>.distcp``)
without reading them back, and the coordinator knows those of ``.metadata``.

``model_and_optimizer_state`` / ``load_into`` use ``torch.distributed.checkpoint.state_dict``
(``get_state_dict`` / ``set_state_dict``): the same code for a plain module, DDP (replicated:
DCP's planner has each tensor written once, spread over the ranks) and FSDP2 ``fully_shard``
(DTensors: each rank writes its own shard; loading reshards).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint.filesystem import (
    FileSystem,
    FileSystemReader,
    FileSystemWriter,
)
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from trainguard_sdk.checkpoint.atomic import HashingWriter
from trainguard_sdk.checkpoint.checksum import SHA256

MODEL_KEY = "model"
OPTIM_KEY = "optim"


class _HashedStream:
    """The write side DCP sees: ``write``, ``tell``, ``flush``, ``fileno``, ``close``."""

    def __init__(self, fd: int, algorithm: str) -> None:
        self.fd = fd
        self.writer = HashingWriter(fd, algorithm=algorithm)
        self.closed = False

    def write(self, data: Any) -> int:
        return self.writer.write(data)

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.writer.size

    def flush(self) -> None:
        """Nothing is buffered."""

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.writer.close()
            finally:
                os.close(self.fd)


class HashingFileSystem(FileSystem):
    """DCP's local file system, recording (digest, size, algorithm) of every file written,
    by name."""

    def __init__(self, algorithm: str = SHA256) -> None:
        super().__init__()
        self.algorithm = algorithm
        self._lock = threading.Lock()
        self.digests: dict[str, tuple[str, int, str]] = {}

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str],
                      mode: str) -> Iterator[Any]:
        if "w" not in mode:
            with super().create_stream(path, mode) as reading:
                yield reading
            return
        target = Path(path)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        hashed = _HashedStream(fd, self.algorithm)
        try:
            yield hashed
        finally:
            hashed.close()
        with self._lock:
            self.digests[target.name] = (hashed.writer.hexdigest(), hashed.writer.size,
                                         self.algorithm)

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        with self._lock:
            digest = self.digests.pop(Path(path).name, None)
            if digest is not None:
                self.digests[Path(new_path).name] = digest


class HashingFileSystemWriter(FileSystemWriter):
    def __init__(self, path: Path, *, algorithm: str = SHA256, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.fs = HashingFileSystem(algorithm)

    def written(self) -> dict[str, tuple[str, int, str]]:
        """What this rank wrote in this save: name -> (digest, size, algorithm)."""
        fs = self.fs
        assert isinstance(fs, HashingFileSystem)
        with fs._lock:
            return dict(fs.digests)


def _signature(obj: Any) -> Any:
    """The structure of a state dict: keys, and every tensor's type, shape and dtype."""
    if isinstance(obj, dict):
        return tuple((k, _signature(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return tuple(_signature(v) for v in obj)
    if isinstance(obj, torch.Tensor):
        return (type(obj).__name__, tuple(obj.shape), obj.dtype)
    return type(obj).__name__


def _plain(obj: Any) -> bool:
    """Every tensor in it a plain ``torch.Tensor`` (no DTensor or other subclass)."""
    if isinstance(obj, dict):
        return all(_plain(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(_plain(v) for v in obj)
    return not isinstance(obj, torch.Tensor) or type(obj) is torch.Tensor


def plain(obj: Any) -> bool:
    """Every tensor in ``obj`` a plain ``torch.Tensor`` (what background staging handles)."""
    return _plain(obj)


def changed_by_step_only(model: torch.nn.Module,
                         optimizer: torch.optim.Optimizer) -> set[int]:
    """The storages (``data_ptr``) of the tensors that only ``optimizer.step()`` changes: the
    parameters and the optimizer's state. Buffers are not among them: a forward pass changes
    them (BatchNorm's running statistics, DDP's broadcast of buffers)."""
    ptrs = {p.data_ptr() for p in model.parameters()}
    for per_param in optimizer.state.values():
        ptrs.update(v.data_ptr() for v in per_param.values() if isinstance(v, torch.Tensor))
    return ptrs


@torch.no_grad()
def cloned_except(obj: Any, keep: set[int]) -> Any:
    """``obj`` with every tensor whose storage is not in ``keep`` cloned now (the buffers:
    small, and changed by the next forward pass); the others stay the live tensors."""
    if isinstance(obj, dict):
        return {k: cloned_except(v, keep) for k, v in obj.items()}
    if isinstance(obj, list):
        return [cloned_except(v, keep) for v in obj]
    if isinstance(obj, tuple):
        return tuple(cloned_except(v, keep) for v in obj)
    if isinstance(obj, torch.Tensor) and (obj.data_ptr() not in keep or not obj.numel()):
        return obj.detach().clone()
    return obj


def _flat_bytes(t: torch.Tensor) -> bool:
    """A CPU tensor whose value is exactly its ``nbytes`` bytes from ``data_ptr()``."""
    return (t.device.type == "cpu" and t.layout == torch.strided and t.is_contiguous()
            and not t.is_quantized and not t.is_conj() and not t.is_neg())


def _copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)``; between two contiguous CPU tensors a single memmove, which releases
    the GIL and uses no intra-op threads: torch's parallel copy stalls for whole scheduler
    time slices when the cores are oversubscribed (a busy training host), a memmove does not."""
    if (src.dtype == dst.dtype and src.nbytes == dst.nbytes and _flat_bytes(src)
            and _flat_bytes(dst)):
        if src.nbytes:
            ctypes.memmove(dst.data_ptr(), src.data_ptr(), src.nbytes)
    else:
        dst.copy_(src)


@torch.no_grad()
def _stage_into(src: Any, staged: Any) -> Any:
    """``src`` with every tensor copied into its counterpart in ``staged`` (same structure);
    other values are ``src``'s."""
    if isinstance(src, dict):
        return {k: _stage_into(v, staged[k]) for k, v in src.items()}
    if isinstance(src, list):
        return [_stage_into(v, s) for v, s in zip(src, staged)]
    if isinstance(src, tuple):
        return tuple(_stage_into(v, s) for v, s in zip(src, staged))
    if isinstance(src, torch.Tensor):
        _copy_into(staged, src)
        return staged
    return src


class ReusingStager(BlockingAsyncStager):
    """Stages (copies) the state into CPU buffers made once and reused while the state keeps
    its structure: a fresh copy would page-fault its way through new memory on every save
    (the training thread's stall doubles or worse). Pinned when CUDA is there (the copy from
    the GPU is then a DMA). CPU tensors are copied with one memmove each (``_copy_into``);
    DTensors and other subclasses through DCP's own ``_copy_state_dict``. One save at a time
    may use it (the manager waits for the previous save before staging the next)."""

    def __init__(self) -> None:
        super().__init__(cache_staged_state_dict=True)
        self._signature: Any = None
        self._plain = False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        signature = _signature(state_dict)
        if self.state_dict_cache is None or signature != self._signature:
            self.state_dict_cache = _create_cpu_state_dict(
                state_dict, pin_memory=torch.cuda.is_available())
            self._signature = signature
            self._plain = _plain(state_dict) and _plain(self.state_dict_cache)
        if self._plain:
            staged: dict[str, Any] = _stage_into(state_dict, self.state_dict_cache)
        else:
            staged = _copy_state_dict(state_dict, self.state_dict_cache)
        return staged  # blocking copies: done (from a GPU too) before training goes on


@contextlib.contextmanager
def crc32(enabled: bool) -> Iterator[None]:
    """torch.save's per-record CRC32 (DCP writes each tensor with torch.save) on or off for
    the block. It is a process-wide option: a torch.save elsewhere in the process meanwhile
    skips it too, which costs nothing (torch.load reads files with and without it); the
    manifest's checksum covers the bytes."""
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(enabled)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(before)


def _no_dist(group: Any) -> bool:
    return group is None and not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def _quiet_single_process(no_dist: bool) -> Iterator[None]:
    """DCP warns that it assumes a single process even when told so (``no_dist``)."""
    with warnings.catch_warnings():
        if no_dist:
            warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        yield


def model_and_optimizer_state(model: torch.nn.Module,
                              optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    module = getattr(model, "module", model)  # DistributedDataParallel -> its module
    model_sd, optim_sd = get_state_dict(module, optimizer)
    return {MODEL_KEY: model_sd, OPTIM_KEY: optim_sd}


def start_save(state: dict[str, Any], writer: HashingFileSystemWriter, *, group: Any,
               stager: ReusingStager | None) -> Any:
    """DCP's save of ``state`` through ``writer``; with a ``stager``, asynchronous: a Future
    (the state is staged, i.e. copied, before this returns: training may change it from then
    on); without, DCP's metadata once written."""
    no_dist = _no_dist(group)
    with _quiet_single_process(no_dist):
        if stager is not None:
            return dcp_async_save(state, storage_writer=writer, process_group=group,
                                  async_stager=stager, no_dist=no_dist)
        return dcp_save(state, storage_writer=writer, process_group=group, no_dist=no_dist)


def load_into(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
              group: Any) -> None:
    """Read the checkpoint at ``path`` into ``model`` and ``optimizer`` (a collective on
    ``group``: every rank calls it). DCP reads the slices each rank needs."""
    module = getattr(model, "module", model)
    state = model_and_optimizer_state(module, optimizer)
    no_dist = _no_dist(group)
    with _quiet_single_process(no_dist):
        dcp_load(state, storage_reader=FileSystemReader(path), process_group=group,
                 no_dist=no_dist)
    set_state_dict(module, optimizer, model_state_dict=state[MODEL_KEY],
                   optim_state_dict=state[OPTIM_KEY])
