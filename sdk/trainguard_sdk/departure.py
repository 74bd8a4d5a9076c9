"""Why a rank is leaving, from the exception that ends it: pure, standard library only.

A rank whose synchronous peer was lost fails in its next collective (gloo: a closed or reset
connection; NCCL: an aborted communicator or a watchdog timeout; torch's ``DistNetworkError``
/ ``DistBackendError`` / ``DistStoreError``). That rank is a consequence, not the cause: it says
so (``peer_lost``) in its departure record, so the decision service looks for the rank that
said nothing (killed by a signal, its node lost) instead of moving a healthy one. Any other
exception is the rank's own failure (``error``). torch is never imported: its error classes
are recognised by name along the exception's class hierarchy.
"""

from __future__ import annotations

from typing import Final

from trainguard_sdk.wire import DepartureCause

# torch.distributed's error classes (torch >= 2.1) raised when a collective or the store
# fails because the other side went away or stopped answering.
PEER_ERROR_CLASSES: Final = frozenset({"DistNetworkError", "DistBackendError", "DistStoreError"})
# What gloo and NCCL say (inside a plain RuntimeError) when a peer is gone or stalled.
PEER_ERROR_TEXT: Final = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "econnreset",
    "nccl communicator was aborted",
    "watchdog caught collective operation timeout",
    "timed out waiting",
    "socket timeout",
)
MAX_REASON_CHARS: Final = 500


def cause_of(exc: BaseException) -> DepartureCause:
    """``peer_lost`` when ``exc`` (or an exception it was raised from) is a distributed
    error that a lost or stalled peer causes; else ``error``."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if any(k.__name__ in PEER_ERROR_CLASSES for k in type(cur).__mro__):
            return "peer_lost"
        if isinstance(cur, RuntimeError):
            text = str(cur).lower()
            if any(t in text for t in PEER_ERROR_TEXT):
                return "peer_lost"
        cur = cur.__cause__ or cur.__context__
    return "error"


def reason_of(exc: BaseException) -> str:
    """``Type: message`` on one line, cut to ``MAX_REASON_CHARS``."""
    text = str(exc)
    return one_line(f"{type(exc).__name__}: {text}" if text.strip() else type(exc).__name__)


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) one space, cut to
    ``MAX_REASON_CHARS``: a reason is read on one line of a timeline."""
    return " ".join(text.split())[:MAX_REASON_CHARS]
