"""The actuator's memory of idempotency keys: a key is used once, ever.

Write-ahead: a key is recorded (appended and fsync'd) *before* the action starts, and its
final status after. A restarted actuator reloads the file and also folds the outcomes topic
(``note_outcome``), so a command redelivered after a crash is never acted on twice: a key
with a final outcome is a replay; a key started but never finished was interrupted by the
crash, and is reported ``timed_out`` rather than repeated.

Only what the actuator did with a verified command uses a key: a refusal (a stale command, a
replay) never does, whether written here by an older version or read back from the topic, so
a forgery refused under a real command's key cannot block that command. The outcomes folded
in are the ones the consumer verified (signed by a trusted actuator).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import orjson

from trainguard.events.payloads import CommandOutcome, OutcomeStatus

FINAL = {s.value for s in OutcomeStatus if s is not OutcomeStatus.ACCEPTED}


@dataclass
class Entry:
    key: str
    command_id: str
    status: str  # "started" or an OutcomeStatus value


class Ledger:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, Entry] = {}
        if path is not None and path.exists():
            for line in path.read_bytes().splitlines():
                try:
                    doc = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # a torn last line after a crash
                self._merge(Entry(doc["key"], doc["command_id"], doc["status"]))

    def _merge(self, entry: Entry) -> None:
        if entry.status == OutcomeStatus.REFUSED.value:
            return  # a refusal never uses up a key
        old = self.entries.get(entry.key)
        if old is None or old.status not in FINAL:
            self.entries[entry.key] = entry

    def note_outcome(self, outcome: CommandOutcome) -> None:
        """Fold an outcome read back from the topic (another instance, or before a crash)."""
        status = outcome.status.value
        self._merge(Entry(outcome.idempotency_key, outcome.command_id,
                          "started" if status == "accepted" else status))

    def seen(self, key: str) -> Entry | None:
        return self.entries.get(key)

    def record(self, key: str, command_id: str, status: str) -> None:
        self._merge(Entry(key, command_id, status))
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = orjson.dumps({"key": key, "command_id": command_id, "status": status}) + b"\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
