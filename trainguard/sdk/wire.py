"""The step-socket datagram format, version 1: fixed little-endian ``struct`` layouts.

One datagram is one report. Every datagram starts with the same 6-byte header, then a body
whose layout the kind fixes, then the job id (ASCII, ``job_len`` bytes). A datagram's length
must be exactly ``header + body + job_len``; anything else is malformed.

Header (6 bytes)::

    off size  field
    0   2     magic      b"TG"
    2   1     version    1
    3   1     kind       1 = step report, 2 = heartbeat
    4   1     job_len    1..128 (bytes of the trailing job id)
    5   1     reserved   0

Step body (102 bytes; datagram = 108 + job_len)::

    6   4  u32 pid            0 = unknown
    10  4  u32 rank
    14  4  u32 world_size
    18  4  u32 dp_rank        } only meaningful when their flag is set;
    22  4  u32 pp_stage       } 0 otherwise
    26  4  u32 tp_rank        }
    30  4  u32 binding_epoch
    34  2  u16 flags          presence bits, see STEP_* below; unknown bits are malformed
    36  8  u64 samples_consumed
    44  8  u64 shard_offset   (flag)
    52  8  f64 compute_ms
    60  8  f64 comm_ms        (flag)
    68  8  f64 data_wait_ms   (flag)
    76  8  f64 step_ms        (flag)
    84  8  f64 loss           (flag) IEEE-754 as is: NaN and +/-Inf travel bit-exact
    92  8  u64 step
    100 8  u64 event_time_ns  wall clock, nanoseconds since the Unix epoch, taken in the hook
                              (``time.time_ns()``; the receiver gives microseconds: // 1000)

Heartbeat body (32 bytes; datagram = 38 + job_len)::

    6   4  u32 pid            0 = unknown
    10  4  u32 rank
    14  4  u32 binding_epoch
    18  2  u16 flags          HB_STEP: ``step`` is set
    20  1  u8  phase          index into PHASES
    21  1  u8  reserved       0
    22  8  u64 event_time_ns
    30  8  u64 step           (flag)

Nanoseconds travel because the ``// 1000`` of ``time.time_ns() // 1000`` (a multi-digit
integer division) costs the hook a third as much as the whole pack; frames (``StepFrame``,
``HeartbeatFrame``) carry ``event_time`` in microseconds, like every event.

The step body is split in two structs: the constant identity part (pid .. binding_epoch,
``STEP_ID``) is packed once per reporter, and each ``step()`` packs only the variable part
(flags .. event_time_ns, ``STEP_VAR``) into a preallocated buffer at ``STEP_VAR_OFFSET``; the
job id is written once at the tail. The heartbeat thread reads the last (step, time) back
from that buffer (``STEP_TAIL`` at ``STEP_STEP_OFFSET``), so ``step()`` stores nothing else; a
pack that fails zeroes the variable part, so heartbeats carry no step until the next good one.

A new field means a new version: receivers accept every version they know and count the
others as ``bad_version``.

Why a struct and not JSON: packing the variable part is one ``pack_into`` call into a held
buffer (no allocation, ~0.4-0.8 µs on the 2-core dev VM), against building a dict and
serialising it with orjson, which made the whole call ~1.4x as costly
(``bench/bench_step_hook.py``). This module imports nothing heavy: the trainer imports it.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Final, Literal

MAGIC: Final = b"TG"
VERSION: Final = 1
KIND_STEP: Final = 1
KIND_HEARTBEAT: Final = 2
MAX_JOB_LEN: Final = 128
MAX_DATAGRAM: Final = 512  # larger than any valid datagram; receivers read this much
U32_MAX: Final = 2**32 - 1
U64_MAX: Final = 2**64 - 1
# The envelope's JobId (trainguard/events/envelope.py), kept here so the trainer needs no
# pydantic; a unit test keeps the two equal.
JOB_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._:-]*$"
_JOB_RE: Final = re.compile(JOB_ID_PATTERN)

# Wire order of Heartbeat.phase values: the index is what travels.
Phase = Literal["init", "step", "data", "checkpoint", "idle"]
PHASES: Final[tuple[Phase, ...]] = ("init", "step", "data", "checkpoint", "idle")
PHASE_INDEX: Final[dict[str, int]] = {p: i for i, p in enumerate(PHASES)}

HEADER: Final = struct.Struct("<2sBBBB")
STEP_ID: Final = struct.Struct("<IIIIIII")  # pid rank world dp pp tp epoch
# flags samples shard compute comm wait step_ms loss step time_ns
STEP_VAR: Final = struct.Struct("<HQQdddddQQ")
HEARTBEAT: Final = struct.Struct("<2sBBBBIIIHBBQQ")  # whole fixed part, header included
STEP_ID_OFFSET: Final = HEADER.size
STEP_VAR_OFFSET: Final = HEADER.size + STEP_ID.size
STEP_FIXED: Final = STEP_VAR_OFFSET + STEP_VAR.size
STEP_STEP_OFFSET: Final = STEP_FIXED - 16  # (step, event_time_ns): what heartbeats read
STEP_TAIL: Final = struct.Struct("<QQ")
HEARTBEAT_FIXED: Final = HEARTBEAT.size

# Step presence flags.
STEP_DP_RANK: Final = 1 << 0
STEP_PP_STAGE: Final = 1 << 1
STEP_TP_RANK: Final = 1 << 2
STEP_SHARD_OFFSET: Final = 1 << 3
STEP_COMM_MS: Final = 1 << 4
STEP_DATA_WAIT_MS: Final = 1 << 5
STEP_STEP_MS: Final = 1 << 6
STEP_LOSS: Final = 1 << 7
STEP_FLAGS_KNOWN: Final = (1 << 8) - 1
# Heartbeat presence flags.
HB_STEP: Final = 1 << 0
HB_FLAGS_KNOWN: Final = HB_STEP

Bytes = bytes | bytearray | memoryview


class WireError(ValueError):
    """A datagram that is not a valid v1 report. ``kind`` is the counter's name."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class StepFrame:
    job_id: str
    event_time: int
    rank: int
    world_size: int
    step: int
    samples_consumed: int
    compute_ms: float
    pid: int | None = None
    dp_rank: int | None = None
    pp_stage: int | None = None
    tp_rank: int | None = None
    binding_epoch: int = 0
    shard_offset: int | None = None
    comm_ms: float | None = None
    data_wait_ms: float | None = None
    step_ms: float | None = None
    loss: float | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatFrame:
    job_id: str
    event_time: int
    rank: int
    phase: Phase = "step"
    step: int | None = None
    binding_epoch: int = 0
    pid: int | None = None


Frame = StepFrame | HeartbeatFrame


def check_job_id(job_id: str) -> bytes:
    """The job id's wire bytes; ValueError if the envelope would refuse it."""
    if not isinstance(job_id, str) or not _JOB_RE.fullmatch(job_id) or len(job_id) > MAX_JOB_LEN:
        raise ValueError(f"job_id {job_id!r}: 1..{MAX_JOB_LEN} chars matching {JOB_ID_PATTERN}")
    return job_id.encode("ascii")


def check_u32(name: str, value: int | None) -> int:
    """``value`` as a wire u32 (None -> 0); ValueError if it does not fit."""
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= U32_MAX:
        raise ValueError(f"{name}: an int in 0..{U32_MAX}, got {value!r}")
    return value


def step_identity(
    job: bytes, pid: int | None, rank: int, world_size: int, dp_rank: int | None,
    pp_stage: int | None, tp_rank: int | None, binding_epoch: int,
) -> tuple[bytearray, int]:
    """A step datagram buffer with header, identity and job id filled in, and the constant
    presence flags of the identity part. Each step then packs ``STEP_VAR`` at
    ``STEP_VAR_OFFSET``."""
    buf = bytearray(STEP_FIXED + len(job))
    HEADER.pack_into(buf, 0, MAGIC, VERSION, KIND_STEP, len(job), 0)
    STEP_ID.pack_into(buf, STEP_ID_OFFSET, check_u32("pid", pid), check_u32("rank", rank),
                      check_u32("world_size", world_size), check_u32("dp_rank", dp_rank),
                      check_u32("pp_stage", pp_stage), check_u32("tp_rank", tp_rank),
                      check_u32("binding_epoch", binding_epoch))
    buf[STEP_FIXED:] = job
    flags = ((STEP_DP_RANK if dp_rank is not None else 0)
             | (STEP_PP_STAGE if pp_stage is not None else 0)
             | (STEP_TP_RANK if tp_rank is not None else 0))
    return buf, flags


def encode_step(f: StepFrame) -> bytes:
    """The reference encoder (the reporter's hot path packs the same layout in place)."""
    buf, flags = step_identity(check_job_id(f.job_id), f.pid, f.rank, f.world_size, f.dp_rank,
                               f.pp_stage, f.tp_rank, f.binding_epoch)
    opt = ((STEP_SHARD_OFFSET, f.shard_offset), (STEP_COMM_MS, f.comm_ms),
           (STEP_DATA_WAIT_MS, f.data_wait_ms), (STEP_STEP_MS, f.step_ms), (STEP_LOSS, f.loss))
    for bit, value in opt:
        if value is not None:
            flags |= bit
    try:
        STEP_VAR.pack_into(
            buf, STEP_VAR_OFFSET, flags, f.samples_consumed, f.shard_offset or 0,
            f.compute_ms, _f(f.comm_ms), _f(f.data_wait_ms), _f(f.step_ms), _f(f.loss), f.step,
            f.event_time * 1000)
    except struct.error as exc:
        raise ValueError(str(exc)) from None
    return bytes(buf)


def encode_heartbeat(f: HeartbeatFrame) -> bytes:
    job = check_job_id(f.job_id)
    if f.phase not in PHASE_INDEX:
        raise ValueError(f"phase {f.phase!r}: one of {PHASES}")
    buf = bytearray(HEARTBEAT_FIXED + len(job))
    pack_heartbeat(buf, len(job), f.pid or 0, f.rank, f.binding_epoch, PHASE_INDEX[f.phase],
                   f.event_time * 1000, f.step)
    buf[HEARTBEAT_FIXED:] = job
    return bytes(buf)


def pack_heartbeat(buf: bytearray, job_len: int, pid: int, rank: int, binding_epoch: int,
                   phase: int, event_time_ns: int, step: int | None) -> None:
    """Pack a heartbeat's fixed part into ``buf`` (whose tail already holds the job id)."""
    try:
        HEARTBEAT.pack_into(buf, 0, MAGIC, VERSION, KIND_HEARTBEAT, job_len, 0, pid, rank,
                            binding_epoch, 0 if step is None else HB_STEP, phase, 0,
                            event_time_ns, step or 0)
    except struct.error as exc:
        raise ValueError(str(exc)) from None


def _f(value: float | None) -> float:
    return 0.0 if value is None else value


def decode(data: Bytes) -> Frame:
    """One datagram -> its frame. Raises ``WireError`` (only) for anything malformed."""
    n = len(data)
    if n < HEADER.size:
        raise WireError("bad_length", f"{n} bytes")
    magic, version, kind, job_len, _ = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise WireError("bad_magic", repr(bytes(magic)))
    if version != VERSION:
        raise WireError("bad_version", str(version))
    if kind == KIND_STEP:
        fixed = STEP_FIXED
    elif kind == KIND_HEARTBEAT:
        fixed = HEARTBEAT_FIXED
    else:
        raise WireError("bad_kind", str(kind))
    if n != fixed + job_len:
        raise WireError("bad_length", f"{n} bytes for kind {kind} with job_len {job_len}")
    job_id = _job(data, fixed, n)
    if kind == KIND_STEP:
        return _decode_step(data, job_id)
    return _decode_heartbeat(data, job_id)


def _job(data: Bytes, start: int, end: int) -> str:
    try:
        job_id = bytes(data[start:end]).decode("ascii")
    except UnicodeDecodeError:
        raise WireError("bad_job_id", "not ASCII") from None
    if not job_id or len(job_id) > MAX_JOB_LEN or not _JOB_RE.fullmatch(job_id):
        raise WireError("bad_job_id", repr(job_id[:MAX_JOB_LEN]))
    return job_id


def _decode_step(data: Bytes, job_id: str) -> StepFrame:
    pid, rank, world, dp, pp, tp, epoch = STEP_ID.unpack_from(data, STEP_ID_OFFSET)
    (flags, samples, shard, compute, comm, wait, step_ms, loss, step,
     event_time) = STEP_VAR.unpack_from(data, STEP_VAR_OFFSET)
    if flags & ~STEP_FLAGS_KNOWN:
        raise WireError("bad_flags", hex(flags))
    return StepFrame(
        job_id=job_id, event_time=event_time // 1000, rank=rank, world_size=world, step=step,
        samples_consumed=samples, compute_ms=compute, pid=pid or None,
        dp_rank=dp if flags & STEP_DP_RANK else None,
        pp_stage=pp if flags & STEP_PP_STAGE else None,
        tp_rank=tp if flags & STEP_TP_RANK else None,
        binding_epoch=epoch,
        shard_offset=shard if flags & STEP_SHARD_OFFSET else None,
        comm_ms=comm if flags & STEP_COMM_MS else None,
        data_wait_ms=wait if flags & STEP_DATA_WAIT_MS else None,
        step_ms=step_ms if flags & STEP_STEP_MS else None,
        loss=loss if flags & STEP_LOSS else None,
    )


def _decode_heartbeat(data: Bytes, job_id: str) -> HeartbeatFrame:
    (_, _, _, _, _, pid, rank, epoch, flags, phase, _, event_time,
     step) = HEARTBEAT.unpack_from(data, 0)
    if flags & ~HB_FLAGS_KNOWN:
        raise WireError("bad_flags", hex(flags))
    if phase >= len(PHASES):
        raise WireError("bad_phase", str(phase))
    return HeartbeatFrame(job_id=job_id, event_time=event_time // 1000, rank=rank,
                          phase=PHASES[phase], step=step if flags & HB_STEP else None,
                          binding_epoch=epoch, pid=pid or None)
