"""Typed payloads, one per event type. The envelope (``envelope.py``) wraps each of them.

Conventions, shared by every payload:
- times are integer microseconds since the Unix epoch (``*_time`` / ``*_at``), durations are
  float milliseconds (``*_ms``), sizes are bytes or MiB as the name says;
- a measurement a source cannot provide is ``None``, never a sentinel number;
- unknown fields are refused: a writer newer than this reader must bump ``schema_version``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Finite = Annotated[float, Field(allow_inf_nan=False)]
NonNegFinite = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Pct = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0)]
TimeUs = Annotated[int, Field(ge=0, lt=2**53)]
Name = Annotated[str, Field(min_length=1, max_length=256)]
Scalar = str | int | float | bool | None
# Evidence and parameters stay flat and small: scalars or lists of scalars.
FlatMap = dict[str, Scalar | list[Scalar]]


class Payload(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, ser_json_inf_nan="strings", validate_default=False
    )


# --- telemetry.node ------------------------------------------------------------------------


class GpuSample(Payload):
    index: Count
    uuid: str | None = None
    model: str | None = None
    pci_bus_id: str | None = None
    temperature_c: Finite | None = None
    memory_temperature_c: Finite | None = None
    power_w: NonNegFinite | None = None
    power_limit_w: NonNegFinite | None = None
    sm_util_pct: Pct | None = None
    mem_util_pct: Pct | None = None
    fb_used_mib: NonNegFinite | None = None
    fb_total_mib: NonNegFinite | None = None
    sm_clock_mhz: NonNegFinite | None = None
    mem_clock_mhz: NonNegFinite | None = None
    throttle_reasons: list[str] = Field(default_factory=list)
    ecc_sbe_volatile: Count | None = None
    ecc_dbe_volatile: Count | None = None
    ecc_sbe_aggregate: Count | None = None
    ecc_dbe_aggregate: Count | None = None
    remapped_rows_correctable: Count | None = None
    remapped_rows_uncorrectable: Count | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    nvlink_links_up: Count | None = None
    nvlink_links_total: Count | None = None
    nvlink_crc_errors: Count | None = None
    nvlink_replay_errors: Count | None = None
    nvlink_recovery_errors: Count | None = None
    pcie_replay_count: Count | None = None
    xids: list[Count] = Field(default_factory=list)
    recovery_action: str | None = None


class PeerPath(Payload):
    peer: Name
    rtt_ms: NonNegFinite | None = None
    rtt_var_ms: NonNegFinite | None = None
    retransmits: Count | None = None
    lost: Count | None = None


class NicSample(Payload):
    name: Name
    kind: Literal["ethernet", "infiniband", "other"] = "ethernet"
    operstate: str | None = None
    carrier: bool | None = None
    carrier_changes: Count | None = None
    speed_mbps: NonNegFinite | None = None
    rx_bytes: Count | None = None
    tx_bytes: Count | None = None
    rx_packets: Count | None = None
    tx_packets: Count | None = None
    rx_errors: Count | None = None
    tx_errors: Count | None = None
    rx_dropped: Count | None = None
    tx_dropped: Count | None = None
    rx_bytes_per_s: NonNegFinite | None = None
    tx_bytes_per_s: NonNegFinite | None = None
    rx_packets_per_s: NonNegFinite | None = None
    tx_packets_per_s: NonNegFinite | None = None
    ib_counters: dict[str, Count] = Field(default_factory=dict)


class ProcessState(StrEnum):
    RUNNING = "running"
    SLEEPING = "sleeping"
    STOPPED = "stopped"
    ZOMBIE = "zombie"
    EXITED = "exited"
    UNKNOWN = "unknown"


class ProcessSample(Payload):
    pid: Annotated[int, Field(gt=0)]
    rank: Count | None = None
    job_id: str | None = None
    state: ProcessState
    exit_code: int | None = None
    cpu_pct: NonNegFinite | None = None
    rss_bytes: Count | None = None
    threads: Count | None = None


class NodeTelemetry(Payload):
    """All samples of one node for one interval: the unit the fleet pipeline pays for."""

    interval_ms: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    seq: Count
    gpus: list[GpuSample] = Field(default_factory=list)
    nics: list[NicSample] = Field(default_factory=list)
    paths: list[PeerPath] = Field(default_factory=list)
    processes: list[ProcessSample] = Field(default_factory=list)
    tcp_retransmits: Count | None = None


# --- node.health ---------------------------------------------------------------------------


class NodeHealthKind(StrEnum):
    XID = "xid"
    PCIE_AER = "pcie_aer"
    LINK_DOWN = "link_down"
    LINK_UP = "link_up"
    OOM_KILL = "oom_kill"
    EXTERNAL_FAULT_START = "external_fault_start"
    EXTERNAL_FAULT_END = "external_fault_end"
    NODE_CONDITION = "node_condition"


class NodeHealth(Payload):
    """A discrete health signal of a node: kernel log lines, imported fault logs."""

    kind: NodeHealthKind
    code: int | None = None
    device: str | None = None
    fault_class: str | None = None
    message: Annotated[str, Field(max_length=4096)] = ""
    origin: Literal[
        "kmsg", "journal", "dmesg", "nvml", "dcgm", "sysfs", "import", "kubernetes"
    ] = "kmsg"


# --- task: step.report, heartbeat, process.exit, checkpoint ---------------------------------


class StepReport(Payload):
    """One training step of one rank, as the trainer-side hook saw it."""

    rank: Count
    world_size: Annotated[int, Field(gt=0)]
    dp_rank: Count | None = None
    pp_stage: Count | None = None
    tp_rank: Count | None = None
    binding_epoch: Count = 0
    step: Count
    samples_consumed: Count
    shard_offset: Count | None = None
    compute_ms: NonNegFinite
    comm_ms: NonNegFinite | None = None
    data_wait_ms: NonNegFinite | None = None
    step_ms: NonNegFinite | None = None
    # NaN/Inf losses are real signals; they travel as the strings "NaN" / "Infinity".
    loss: float | None = None
    pid: Annotated[int, Field(gt=0)] | None = None


class Heartbeat(Payload):
    rank: Count
    binding_epoch: Count = 0
    step: Count | None = None
    phase: Literal["step", "data", "checkpoint", "init", "idle"] = "step"
    pid: Annotated[int, Field(gt=0)] | None = None


class ProcessExit(Payload):
    pid: Annotated[int, Field(gt=0)]
    rank: Count | None = None
    binding_epoch: Count | None = None
    exit_code: int | None = None
    signal: int | None = None
    detected_by: Literal["pidfd", "waitpid", "poll", "psutil"] = "poll"


class CheckpointAction(StrEnum):
    WRITTEN = "written"
    VERIFIED = "verified"
    CORRUPT = "corrupt"
    LOADED = "loaded"


class CheckpointEvent(Payload):
    action: CheckpointAction
    step: Count
    samples_consumed: Count
    path: Name
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    size_bytes: Count | None = None
    write_ms: NonNegFinite | None = None
    reason: str | None = None


# --- decisions: verdict, command, command.outcome ------------------------------------------


class VerdictState(StrEnum):
    OPEN = "open"
    RESOLVED = "resolved"


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class Verdict(Payload):
    verdict_id: Name
    rule: Name
    kind: Name
    state: VerdictState
    severity: Severity
    first_anomalous_time: TimeUs
    decided_time: TimeUs
    evidence: FlatMap = Field(default_factory=dict)
    rules_version: str | None = None


class CommandAction(StrEnum):
    RAISE_QUOTA = "raise_quota"
    MIGRATE = "migrate"
    RESUME = "resume"
    FENCE = "fence"
    CHECKPOINT_NOW = "checkpoint_now"
    ESCALATE = "escalate"


class Command(Payload):
    command_id: Name
    idempotency_key: Name
    action: CommandAction
    tier: Annotated[int, Field(ge=0, le=3)]
    issued_at: TimeUs
    issued_by: Name
    cause_verdict_ids: list[str] = Field(default_factory=list)
    params: FlatMap = Field(default_factory=dict)
    signature: str | None = None


class OutcomeStatus(StrEnum):
    ACCEPTED = "accepted"
    DONE = "done"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    REFUSED = "refused"


# ``CommandOutcome.data`` key: a failed command changed nothing, and the condition it names
# (e.g. ``RETRY_STORAGE_UNREACHABLE``) may clear by itself, so the command is worth retrying.
OUTCOME_RETRY = "retry"
RETRY_STORAGE_UNREACHABLE = "storage_unreachable"


class CommandOutcome(Payload):
    command_id: Name
    idempotency_key: Name
    action: CommandAction
    status: OutcomeStatus
    started_at: TimeUs | None = None
    finished_at: TimeUs | None = None
    detail: Annotated[str, Field(max_length=4096)] = ""
    data: FlatMap = Field(default_factory=dict)
    signature: str | None = None  # the actuator's (registry ``signed_by``)


# --- the pool: units and replicas ---------------------------------------------------------


class UnitState(StrEnum):
    SPARE = "spare"
    BOUND = "bound"
    DRAINING = "draining"
    FENCED = "fenced"
    FAILED = "failed"


class PoolUnit(Payload):
    """A compute unit of the pool changed state (event-sourced: the pool is rebuilt from these).

    ``bound`` names the job (the envelope's ``job_id``), ``rank`` and ``epoch`` of the binding;
    ``fenced`` means the replica that held it was stopped, confirmed dead and the unit released
    (``released`` lists what was given back: cgroup, sockets, temp files).
    """

    unit: Name
    state: UnitState
    node: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    rank: Count | None = None
    epoch: Count | None = None
    pid: Annotated[int, Field(gt=0)] | None = None
    command_id: str | None = None
    reason: Annotated[str, Field(max_length=4096)] = ""
    resources: FlatMap = Field(default_factory=dict)
    released: list[str] = Field(default_factory=list)
    signature: str | None = None  # the actuator's (registry ``signed_by``)


class ReplicaRefused(Payload):
    """A replica with a stale binding epoch showed itself and was refused (reports discarded,
    the process killed)."""

    rank: Count
    stale_epoch: Count
    current_epoch: Count
    pid: Annotated[int, Field(gt=0)] | None = None
    action: Literal["discarded", "killed", "already_gone"]
    reason: Annotated[str, Field(max_length=4096)] = ""
    signature: str | None = None  # the actuator's (registry ``signed_by``)


# --- drills and incidents ------------------------------------------------------------------


class Injection(Payload):
    drill_id: Name
    scenario: Name
    fault: Name
    phase: Literal["start", "stop", "rollback"]
    target: str | None = None
    params: FlatMap = Field(default_factory=dict)


class IncidentState(StrEnum):
    DETECTED = "detected"
    LOCATED = "located"
    MITIGATING = "mitigating"
    RECOVERED = "recovered"
    ESCALATED = "escalated"
    UNRECOVERABLE = "unrecoverable"


class IncidentTransition(Payload):
    incident_id: Name
    seq: Count
    from_state: IncidentState | None = None
    to_state: IncidentState
    reason: str = ""
    tier: Annotated[int, Field(ge=0, le=3)] | None = None
    cause_event_ids: list[str] = Field(default_factory=list)
