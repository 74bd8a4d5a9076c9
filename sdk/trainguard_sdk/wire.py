"""The step-socket datagram format, versions 1 and 2: fixed little-endian ``struct`` layouts.

One datagram is one report. Every datagram starts with the same 6-byte header, then a body
whose layout the kind fixes, then the job id (ASCII, ``job_len`` bytes). A datagram's length
must be exactly ``header + body + job_len`` (for a checkpoint, the body includes its path and
reason, whose lengths it carries); anything else is malformed.

Header (6 bytes)::

    off size  field
    0   2     magic      b"TG"
    2   1     version    1, or 2 for a heartbeat with a section (below)
    3   1     kind       1 = step report, 2 = heartbeat, 3 = checkpoint, 4 = departure
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

Heartbeat body, version 2 (40 bytes; datagram = 46 + job_len): version 1's, then::

    38  8  u64 section_start_ns  (flag HB_SECTION) wall clock when the sender first saw the
                                 rank in this section instance (the reporter: its first
                                 heartbeat in it, at most one interval after it was
                                 entered); the section's index travels in byte 21 (the
                                 reserved byte of version 1): an index into SECTIONS

Checkpoint body (92 bytes + path + reason; datagram = 98 + path_len + reason_len + job_len)::

    6   4  u32 pid            0 = unknown
    10  4  u32 rank
    14  4  u32 binding_epoch
    18  2  u16 flags          CK_SHA256 / CK_SIZE / CK_WRITE_MS; unknown bits are malformed
    20  1  u8  action         index into CHECKPOINT_ACTIONS
    21  1  u8  reserved       0
    22  8  u64 step
    30  8  u64 samples_consumed
    38  8  u64 size_bytes     (flag)
    46  8  f64 write_ms       (flag)
    54  8  u64 event_time_ns
    62  32     sha256         (flag) the raw digest; zeros otherwise
    94  2  u16 path_len       1..MAX_PATH_BYTES, UTF-8 bytes (an undecodable file name
                              travels with "?" for its bad bytes)
    96  2  u16 reason_len     0..MAX_REASON_BYTES, UTF-8 bytes (0 = no reason); text that
                              is not UTF-8 is malformed (``bad_text``)
    98  ...    path, then reason, then the job id

Departure body (24 bytes + reason; datagram = 30 + reason_len + job_len)::

    6   4  u32 pid            0 = unknown
    10  4  u32 rank
    14  4  u32 binding_epoch
    18  1  u8  cause          index into DEPARTURE_CAUSES: "completed" (the training ended),
                              "peer_lost" (a collective failed because another rank was
                              lost: a consequence), "error" (the rank's own failure)
    19  1  u8  exit_code      the code the process is leaving with (0..255)
    20  8  u64 event_time_ns
    28  2  u16 reason_len     0..MAX_REASON_BYTES, UTF-8 bytes (0 = no reason)
    30  ...    reason, then the job id

A departure is what a rank says just before it ends (``StepReporter.leaving``): the agent
attaches it to the rank's ``process.exit``. Under a launcher that is the rank's parent
(slurmstepd, torchrun's agent) the node agent cannot read the exit status, and a rank killed
by a signal says nothing, so an exit with no status and no departure is the presumed cause
among exits that said they lost a peer.

Checkpoint records are rare (a few per checkpoint), so they are encoded from a frame
(``encode_checkpoint``) rather than packed in place, and they may be larger than the other
kinds: ``MAX_DATAGRAM`` covers the largest one.

Nanoseconds travel because the ``// 1000`` of ``time.time_ns() // 1000`` (a multi-digit
integer division) costs the hook a third as much as the whole pack; frames (``StepFrame``,
``HeartbeatFrame``) carry ``event_time`` in microseconds, like every event.

The step body is split in two structs: the constant identity part (pid .. binding_epoch,
``STEP_ID``) is packed once per reporter, and each ``step()`` packs only the variable part
(flags .. event_time_ns, ``STEP_VAR``) into a preallocated buffer at ``STEP_VAR_OFFSET``; the
job id is written once at the tail. The heartbeat thread reads the last (step, time) back
from that buffer (``STEP_TAIL`` at ``STEP_STEP_OFFSET``), so ``step()`` stores nothing else; a
pack that fails zeroes the variable part, so heartbeats carry no step until the next good one.

Version 2 changes only the heartbeat: a sender sends heartbeats as version 2 and step and
checkpoint reports as version 1 (their layouts are unchanged), so an agent that knows only
version 1 still takes every step and checkpoint report and counts only heartbeats as
``bad_version``; a version-1 heartbeat decodes here with ``section`` None.

Version rules. A new field in an existing kind means a new version: receivers accept every
version they know and count the others as ``bad_version``. A new *kind* is additive within a
version (kinds 3, checkpoint, and 4, departure, came after 1 and 2 in version 1): a receiver
that predates it counts such datagrams as ``bad_kind`` and keeps the reports around them, so a
newer trainer never breaks an older agent; it only loses the new kind's records there.

Why a struct and not JSON: packing the variable part is one ``pack_into`` call into a held
buffer (no allocation, ~0.4-0.8 µs on the 2-core dev VM), against building a dict and
serialising it with orjson, which made the whole call ~1.4x as costly
(``bench/bench_step_hook.py``). This module imports nothing heavy: the trainer imports it.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final, Literal, Union

MAGIC: Final = b"TG"
VERSION: Final = 1  # step and checkpoint reports
HEARTBEAT_VERSION: Final = 2  # heartbeats (version 1 heartbeats are still decoded)
VERSIONS: Final = frozenset({1, 2})
KIND_STEP: Final = 1
KIND_HEARTBEAT: Final = 2
KIND_CHECKPOINT: Final = 3
KIND_DEPARTURE: Final = 4
MAX_JOB_LEN: Final = 128
MAX_PATH_BYTES: Final = 1024
MAX_REASON_BYTES: Final = 1024
MAX_DATAGRAM: Final = 4096  # larger than any valid datagram; receivers read this much
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



class Section(IntEnum):
    """Where in its step a rank is (``StepReporter.section``); the value is what travels.
    COMM: waiting for the gradient exchange after the last bucket was handed to it."""

    DATA = 0
    FORWARD = 1
    BACKWARD = 2
    OPTIMIZER = 3
    CHECKPOINT = 4
    COMM = 5


SECTIONS: Final[tuple[Section, ...]] = tuple(Section)

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
HEARTBEAT_V1_FIXED: Final = HEARTBEAT.size
HEARTBEAT2: Final = struct.Struct("<2sBBBBIIIHBBQQQ")  # version 2: + section_start_ns
HEARTBEAT_FIXED: Final = HEARTBEAT2.size
# header .. event_time_ns, then the digest, then the two lengths
CHECKPOINT: Final = struct.Struct("<2sBBBBIIIHBBQQQdQ32sHH")
CHECKPOINT_FIXED: Final = CHECKPOINT.size
DEPARTURE: Final = struct.Struct("<2sBBBBIIIBBQH")  # header .. event_time_ns, reason_len
DEPARTURE_FIXED: Final = DEPARTURE.size

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
HB_SECTION: Final = 1 << 1  # version 2 only
HB_FLAGS_KNOWN: Final = HB_STEP
HB2_FLAGS_KNOWN: Final = HB_STEP | HB_SECTION
# Checkpoint presence flags.
CK_SHA256: Final = 1 << 0
CK_SIZE: Final = 1 << 1
CK_WRITE_MS: Final = 1 << 2
CK_FLAGS_KNOWN: Final = (1 << 3) - 1

# Wire order of CheckpointEvent.action values: the index is what travels.
CheckpointAction = Literal["written", "verified", "corrupt", "loaded"]
CHECKPOINT_ACTIONS: Final[tuple[CheckpointAction, ...]] = (
    "written", "verified", "corrupt", "loaded")
CHECKPOINT_ACTION_INDEX: Final[dict[str, int]] = {
    a: i for i, a in enumerate(CHECKPOINT_ACTIONS)}
# Wire order of a departure's cause (the contract's DepartureCause; a unit test keeps the two
# equal): the index is what travels.
DepartureCause = Literal["completed", "peer_lost", "error"]
DEPARTURE_CAUSES: Final[tuple[DepartureCause, ...]] = ("completed", "peer_lost", "error")
DEPARTURE_CAUSE_INDEX: Final[dict[str, int]] = {c: i for i, c in enumerate(DEPARTURE_CAUSES)}
_SHA256_RE: Final = re.compile(r"^[0-9a-f]{64}$")

Bytes = Union[bytes, bytearray, memoryview]


class WireError(ValueError):
    """A datagram that is not a valid v1 report. ``kind`` is the counter's name."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class HeartbeatFrame:
    job_id: str
    event_time: int
    rank: int
    phase: Phase = "step"
    step: int | None = None
    binding_epoch: int = 0
    pid: int | None = None
    section: Section | None = None
    section_start: int | None = None  # microseconds, like event_time; set with section


@dataclass(frozen=True)
class CheckpointFrame:
    job_id: str
    event_time: int
    rank: int
    action: CheckpointAction
    step: int
    samples_consumed: int
    path: str
    sha256: str | None = None  # 64 lowercase hex digits
    size_bytes: int | None = None
    write_ms: float | None = None
    reason: str | None = None
    binding_epoch: int = 0
    pid: int | None = None


@dataclass(frozen=True)
class DepartureFrame:
    job_id: str
    event_time: int
    rank: int
    cause: DepartureCause
    exit_code: int
    reason: str | None = None
    binding_epoch: int = 0
    pid: int | None = None


Frame = Union[StepFrame, HeartbeatFrame, CheckpointFrame, DepartureFrame]


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
    if (f.section is None) != (f.section_start is None):
        raise ValueError("section and section_start: both set or both None")
    if f.section is not None and f.section not in SECTIONS:
        raise ValueError(f"section {f.section!r}: one of {[s.name for s in SECTIONS]}")
    buf = bytearray(HEARTBEAT_FIXED + len(job))
    pack_heartbeat(buf, len(job), f.pid or 0, f.rank, f.binding_epoch, PHASE_INDEX[f.phase],
                   f.event_time * 1000, f.step, f.section,
                   None if f.section_start is None else f.section_start * 1000)
    buf[HEARTBEAT_FIXED:] = job
    return bytes(buf)


def encode_heartbeat_v1(f: HeartbeatFrame) -> bytes:
    """A version-1 heartbeat (no section): what trainers before version 2 sent; for tests."""
    job = check_job_id(f.job_id)
    try:
        head = HEARTBEAT.pack(MAGIC, 1, KIND_HEARTBEAT, len(job), 0, f.pid or 0, f.rank,
                              f.binding_epoch, 0 if f.step is None else HB_STEP,
                              PHASE_INDEX[f.phase], 0, f.event_time * 1000, f.step or 0)
    except (struct.error, KeyError) as exc:
        raise ValueError(str(exc)) from None
    return head + job


def pack_heartbeat(buf: bytearray, job_len: int, pid: int, rank: int, binding_epoch: int,
                   phase: int, event_time_ns: int, step: int | None,
                   section: int | None = None, section_start_ns: int | None = None) -> None:
    """Pack a version-2 heartbeat's fixed part into ``buf`` (whose tail already holds the job
    id). ``section`` is sent only with its ``section_start_ns``."""
    flags = 0 if step is None else HB_STEP
    if section is not None and section_start_ns is not None:
        flags |= HB_SECTION
    else:
        section, section_start_ns = 0, 0
    try:
        HEARTBEAT2.pack_into(buf, 0, MAGIC, HEARTBEAT_VERSION, KIND_HEARTBEAT, job_len, 0, pid,
                             rank, binding_epoch, flags, phase, section, event_time_ns,
                             step or 0, section_start_ns)
    except struct.error as exc:
        raise ValueError(str(exc)) from None


def encode_checkpoint(f: CheckpointFrame) -> bytes:
    """A checkpoint datagram; ValueError naming the field that does not fit. A reason longer
    than ``MAX_REASON_BYTES`` is cut (at a character boundary), not refused."""
    job = check_job_id(f.job_id)
    if f.action not in CHECKPOINT_ACTION_INDEX:
        raise ValueError(f"action {f.action!r}: one of {CHECKPOINT_ACTIONS}")
    path = f.path.encode("utf-8", "replace")  # an undecodable file name: "?" for its bytes
    if not 1 <= len(path) <= MAX_PATH_BYTES:
        raise ValueError(f"path: 1..{MAX_PATH_BYTES} UTF-8 bytes, got {len(path)}")
    reason = _reason_bytes(f.reason)
    flags = 0
    digest = bytes(32)
    if f.sha256 is not None:
        if not isinstance(f.sha256, str) or not _SHA256_RE.fullmatch(f.sha256):
            raise ValueError(f"sha256: 64 lowercase hex digits, got {f.sha256!r}")
        digest = bytes.fromhex(f.sha256)
        flags |= CK_SHA256
    if f.size_bytes is not None:
        flags |= CK_SIZE
    if f.write_ms is not None:
        flags |= CK_WRITE_MS
    try:
        head = CHECKPOINT.pack(
            MAGIC, VERSION, KIND_CHECKPOINT, len(job), 0, check_u32("pid", f.pid),
            check_u32("rank", f.rank), check_u32("binding_epoch", f.binding_epoch), flags,
            CHECKPOINT_ACTION_INDEX[f.action], 0, f.step, f.samples_consumed,
            f.size_bytes or 0, _f(f.write_ms), f.event_time * 1000, digest, len(path),
            len(reason))
    except struct.error as exc:
        raise ValueError(str(exc)) from None
    return head + path + reason + job


def encode_departure(f: DepartureFrame) -> bytes:
    """A departure datagram; ValueError naming the field that does not fit. A reason longer
    than ``MAX_REASON_BYTES`` is cut (at a character boundary), not refused."""
    job = check_job_id(f.job_id)
    if f.cause not in DEPARTURE_CAUSE_INDEX:
        raise ValueError(f"cause {f.cause!r}: one of {DEPARTURE_CAUSES}")
    code = f.exit_code
    if not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= 255:
        raise ValueError(f"exit_code: an int in 0..255, got {code!r}")
    reason = _reason_bytes(f.reason)
    try:
        head = DEPARTURE.pack(
            MAGIC, VERSION, KIND_DEPARTURE, len(job), 0, check_u32("pid", f.pid),
            check_u32("rank", f.rank), check_u32("binding_epoch", f.binding_epoch),
            DEPARTURE_CAUSE_INDEX[f.cause], code, f.event_time * 1000, len(reason))
    except struct.error as exc:
        raise ValueError(str(exc)) from None
    return head + reason + job


def _reason_bytes(reason: str | None) -> bytes:
    """A reason's wire bytes, cut to ``MAX_REASON_BYTES`` at a character boundary."""
    out = b"" if not reason else reason.encode("utf-8", "replace")
    if len(out) > MAX_REASON_BYTES:
        out = out[:MAX_REASON_BYTES].decode("utf-8", "ignore").encode("utf-8")
    return out


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
    if version not in VERSIONS or (version == 2 and kind != KIND_HEARTBEAT):
        raise WireError("bad_version", str(version))
    if kind == KIND_STEP:
        fixed = STEP_FIXED
    elif kind == KIND_HEARTBEAT:
        fixed = HEARTBEAT_FIXED if version == 2 else HEARTBEAT_V1_FIXED
    elif kind == KIND_CHECKPOINT:
        return _decode_checkpoint(data, n, job_len)
    elif kind == KIND_DEPARTURE:
        return _decode_departure(data, n, job_len)
    else:
        raise WireError("bad_kind", str(kind))
    if n != fixed + job_len:
        raise WireError("bad_length", f"{n} bytes for kind {kind} with job_len {job_len}")
    job_id = _job(data, fixed, n)
    if kind == KIND_STEP:
        return _decode_step(data, job_id)
    return _decode_heartbeat(data, job_id, version)


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


def _decode_heartbeat(data: Bytes, job_id: str, version: int) -> HeartbeatFrame:
    section: Section | None = None
    section_start: int | None = None
    if version == 2:
        (_, _, _, _, _, pid, rank, epoch, flags, phase, sec, event_time, step,
         start_ns) = HEARTBEAT2.unpack_from(data, 0)
        if flags & ~HB2_FLAGS_KNOWN:
            raise WireError("bad_flags", hex(flags))
        if flags & HB_SECTION:
            if sec >= len(SECTIONS):
                raise WireError("bad_section", str(sec))
            section, section_start = SECTIONS[sec], start_ns // 1000
    else:
        (_, _, _, _, _, pid, rank, epoch, flags, phase, _, event_time,
         step) = HEARTBEAT.unpack_from(data, 0)
        if flags & ~HB_FLAGS_KNOWN:
            raise WireError("bad_flags", hex(flags))
    if phase >= len(PHASES):
        raise WireError("bad_phase", str(phase))
    return HeartbeatFrame(job_id=job_id, event_time=event_time // 1000, rank=rank,
                          phase=PHASES[phase], step=step if flags & HB_STEP else None,
                          binding_epoch=epoch, pid=pid or None, section=section,
                          section_start=section_start)


def _decode_checkpoint(data: Bytes, n: int, job_len: int) -> CheckpointFrame:
    if n < CHECKPOINT_FIXED:
        raise WireError("bad_length", f"{n} bytes for a checkpoint")
    (_, _, _, _, _, pid, rank, epoch, flags, action, _, step, samples, size, write_ms,
     event_time, digest, path_len, reason_len) = CHECKPOINT.unpack_from(data, 0)
    if n != CHECKPOINT_FIXED + path_len + reason_len + job_len:
        raise WireError("bad_length", f"{n} bytes for a checkpoint with path_len {path_len}, "
                                      f"reason_len {reason_len}, job_len {job_len}")
    if flags & ~CK_FLAGS_KNOWN:
        raise WireError("bad_flags", hex(flags))
    if action >= len(CHECKPOINT_ACTIONS):
        raise WireError("bad_action", str(action))
    if not 1 <= path_len <= MAX_PATH_BYTES or reason_len > MAX_REASON_BYTES:
        raise WireError("bad_length", f"path_len {path_len}, reason_len {reason_len}")
    start = CHECKPOINT_FIXED
    try:
        path = bytes(data[start:start + path_len]).decode("utf-8")
        reason = bytes(data[start + path_len:start + path_len + reason_len]).decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("bad_text", "path or reason is not UTF-8") from None
    job_id = _job(data, start + path_len + reason_len, n)
    return CheckpointFrame(
        job_id=job_id, event_time=event_time // 1000, rank=rank,
        action=CHECKPOINT_ACTIONS[action], step=step, samples_consumed=samples, path=path,
        sha256=bytes(digest).hex() if flags & CK_SHA256 else None,
        size_bytes=size if flags & CK_SIZE else None,
        write_ms=write_ms if flags & CK_WRITE_MS else None,
        reason=reason if reason_len else None, binding_epoch=epoch, pid=pid or None)


def _decode_departure(data: Bytes, n: int, job_len: int) -> DepartureFrame:
    if n < DEPARTURE_FIXED:
        raise WireError("bad_length", f"{n} bytes for a departure")
    (_, _, _, _, _, pid, rank, epoch, cause, code, event_time,
     reason_len) = DEPARTURE.unpack_from(data, 0)
    if n != DEPARTURE_FIXED + reason_len + job_len or reason_len > MAX_REASON_BYTES:
        raise WireError("bad_length", f"{n} bytes for a departure with reason_len "
                                      f"{reason_len}, job_len {job_len}")
    if cause >= len(DEPARTURE_CAUSES):
        raise WireError("bad_cause", str(cause))
    try:
        reason = bytes(data[DEPARTURE_FIXED:DEPARTURE_FIXED + reason_len]).decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("bad_text", "reason is not UTF-8") from None
    job_id = _job(data, DEPARTURE_FIXED + reason_len, n)
    return DepartureFrame(
        job_id=job_id, event_time=event_time // 1000, rank=rank, cause=DEPARTURE_CAUSES[cause],
        exit_code=code, reason=reason if reason_len else None, binding_epoch=epoch,
        pid=pid or None)
