"""A per-rank JSONL progress log (``--progress-file``): one line per event, appended and
flushed (not fsync'd), so tests and drills can check continuity without Kafka. A restarted
rank appends to the same file. Lines:

    {"kind": "start", "rank", "pid", "epoch", "resumed_from": step|null,
     "samples_consumed", "time"}
    {"kind": "step", "rank", "pid", "epoch", "step", "samples_consumed", "data_epoch",
     "loss", "time"}
    {"kind": "checkpoint", "rank", "pid", "epoch", "step", "samples_consumed", "time"}
    {"kind": "exit", "rank", "pid", "epoch", "code", "reason", "time"}

``epoch`` is the binding epoch (``TRAINGUARD_BINDING_EPOCH``: which replica of the rank wrote
the line); ``data_epoch`` is the pass over the data set; ``samples_consumed`` is the data
position after the step (job-wide); ``loss`` is this rank's loss on its part of the step;
``time`` is seconds since the epoch. A ``checkpoint`` line says this rank's part of the
checkpoint is written; on rank 0 it also says the checkpoint is committed (manifest durable).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, TextIO


class ProgressLog:
    def __init__(self, path: Path | None, *, rank: int, epoch: int) -> None:
        self.rank = rank
        self.epoch = epoch
        self.pid = os.getpid()
        self._file: TextIO | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - held open

    def write(self, kind: str, **fields: Any) -> None:
        if self._file is None:
            return
        line = {"kind": kind, "rank": self.rank, "pid": self.pid, "epoch": self.epoch,
                **fields, "time": time.time()}
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_progress(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a progress log (a torn last line, from a kill, is skipped)."""
    out: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
