"""When to save, decided by every rank alone: no collective and no GPU sync per step. Torch-free.

Periodic saves follow from a policy every rank knows (``every_steps``). A save on command
(SIGUSR1 to one rank, the ``SAVE_NOW`` file seen by rank 0, ``request_save()``) lands on one
rank only; that rank writes ``save_at`` into a key-value store every rank reaches (the c10d
store of the default process group, or one handed in), and every rank reads that key, without
blocking, on polling steps only (``step % poll_every == 0``). ``save_at`` is itself a polling
step, at least ``poll_every + 1`` steps ahead of the step the request was seen at:

    save_at(s, K) = (s // K + 2) * K          (s: the requester's step, K: poll_every)

Why every rank saves the same step: data-parallel ranks run in lock step (each step's gradient
exchange needs every rank's step), so when the requester has finished step ``s`` and written
the key (a round trip: the store applied it), a peer that finishes step ``s + 1`` finished it
after that write. The polling steps between ``s + 1`` and ``save_at`` (``save_at`` included)
all read the key, so a peer learns ``save_at`` before it passes it unless the ranks are more
than ``K`` steps apart, which lock step rules out; a rank that finds ``save_at`` already
behind it says so (``RequestMissed``) instead of saving alone. A value in the store from
before this process started (a restarted job reusing its store) is older than the first step
this process polls, is the same for every rank, and is ignored by every rank.

Several requests before a save: the key is only moved forward once the pending save is behind
the requester; a request that arrives while one is pending is served by that one.
"""

from __future__ import annotations

from typing import Final, Protocol

KEY_PREFIX: Final = "trainguard/ckpt/save_at/"
MAX_CAS_TRIES: Final = 8


class KeyValueStore(Protocol):
    """The part of ``torch.distributed.Store`` used here (``TCPStore``, ``FileStore``,
    ``PrefixStore``, ``HashStore`` fit)."""

    def check(self, keys: list[str]) -> bool: ...

    def get(self, key: str) -> bytes: ...

    def compare_set(self, key: str, expected_value: str, desired_value: str) -> bytes: ...


class RequestMissed(RuntimeError):
    """A save requested for a step this rank has already passed: the ranks are further apart
    than the polling interval allows (never in data-parallel lock step)."""


def save_at(step: int, poll_every: int) -> int:
    """The step a request seen after ``step`` is served at: a polling step more than
    ``poll_every`` steps ahead."""
    if poll_every < 1:
        raise ValueError(f"poll_every: >= 1, got {poll_every!r}")
    return (step // poll_every + 2) * poll_every


def is_periodic(step: int, every_steps: int) -> bool:
    return every_steps > 0 and step % every_steps == 0


def _parse(raw: bytes, key: str) -> int:
    try:
        value = int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"store key {key!r}: an integer step, got {raw[:40]!r}") from None
    if value < 0:
        raise ValueError(f"store key {key!r}: a step >= 0, got {value}")
    return value


class SharedRequests:
    """One rank's view of the job's save-on-command channel through ``store``.

    ``propose(step)`` (the rank that received a request, after ``step``) and ``poll(step)``
    (every rank, on polling steps) both return the step a save is pending for, or None.
    ``taken(step)`` marks a pending save done."""

    def __init__(self, store: KeyValueStore, job_id: str, poll_every: int) -> None:
        if poll_every < 1:
            raise ValueError(f"poll_every: >= 1 with a shared store, got {poll_every!r}")
        self.store = store
        self.key = KEY_PREFIX + job_id
        self.poll_every = poll_every
        self.pending: int | None = None
        self._seen: int | None = None  # the last value read or written
        self._first_poll: int | None = None
        self.reads = 0  # store round trips (tests and the benchmark count them)

    def _read(self) -> int | None:
        self.reads += 1
        if not self.store.check([self.key]):
            return None
        return _parse(self.store.get(self.key), self.key)

    def propose(self, step: int) -> int:
        """Ask every rank to save at ``save_at(step)``, unless a save after ``step`` is
        already pending (then that one serves this request). The step that will be saved."""
        want = save_at(step, self.poll_every)
        current = self._read()
        for _ in range(MAX_CAS_TRIES):
            if current is not None and current > step:
                break  # pending, ahead of us: it serves this request too
            expected = "" if current is None else str(current)
            self.reads += 1
            current = _parse(self.store.compare_set(self.key, expected, str(want)), self.key)
            if current == want:
                break
        else:
            raise RuntimeError(f"store key {self.key!r}: could not set it in "
                               f"{MAX_CAS_TRIES} tries (last value {current})")
        assert current is not None
        self._seen = current
        self.pending = current
        return current

    def poll(self, step: int) -> int | None:
        """Read the key (call on polling steps, and it is cheap to call on the pending step).
        ``RequestMissed`` when a request from this run is already behind ``step``."""
        first = self._first_poll is None
        if first:
            self._first_poll = step
        value = self._read()
        if value is None or value == self._seen:
            return self.pending
        self._seen = value
        if value >= step:
            self.pending = value
        elif first or (self._first_poll is not None and value < self._first_poll):
            pass  # from before this process: the same for every rank, ignored by all
        else:
            raise RequestMissed(
                f"a save requested for step {value} was seen only at step {step}: the ranks are "
                f"more than poll_every={self.poll_every} steps apart")
        return self.pending

    def taken(self, step: int) -> None:
        if self.pending is not None and self.pending <= step:
            self.pending = None


class LocalRequests:
    """The single-process channel: a request is served at the step it is seen."""

    def __init__(self) -> None:
        self.pending: int | None = None

    def propose(self, step: int) -> int:
        self.pending = step
        return step

    def poll(self, step: int) -> int | None:
        return self.pending

    def taken(self, step: int) -> None:
        if self.pending is not None and self.pending <= step:
            self.pending = None
