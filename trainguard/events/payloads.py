"""Typed payloads, one per event type. The envelope (``envelope.py``) wraps each of them.

Conventions, shared by every payload:
- times are integer microseconds since the Unix epoch (``*_time`` / ``*_at``), durations are
  float milliseconds (``*_ms``), sizes are bytes or MiB as the name says;
- a measurement a source cannot provide is ``None``, never a sentinel number;
- unknown fields are refused: a writer newer than this reader must bump ``schema_version``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trainguard.compat import StrEnum

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
    # The GPU index (on this node) the rank uses, from its environment: the one device of
    # CUDA_VISIBLE_DEVICES, else LOCAL_RANK; None when neither says.
    gpu: Count | None = None
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


class Section(StrEnum):
    """Where in its step a rank is (the SDK's ``Section``; the wire carries the index of this
    order): data loading, forward, backward, optimizer step, checkpoint save, or waiting in the
    gradient exchange after its last bucket (``comm``, told by the SDK's DDP ``StepTimer``)."""

    DATA = "data"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    CHECKPOINT = "checkpoint"
    COMM = "comm"


class Heartbeat(Payload):
    """v2 adds ``section`` and ``section_start`` (the trainer's wall-clock time, µs, its first
    heartbeat in this instance of the section was sent: at most one heartbeat interval after it
    entered it): both set or both absent. ``step`` is the last step the rank finished."""

    rank: Count
    binding_epoch: Count = 0
    step: Count | None = None
    phase: Literal["step", "data", "checkpoint", "init", "idle"] = "step"
    pid: Annotated[int, Field(gt=0)] | None = None
    section: Section | None = None
    section_start: TimeUs | None = None

    @model_validator(mode="after")
    def _section_with_start(self) -> Heartbeat:
        if (self.section is None) != (self.section_start is None):
            raise ValueError("section and section_start: both set or both absent")
        return self


class DepartureCause(StrEnum):
    """Why a rank said it was leaving (the SDK's departure record; the wire carries the index
    of this order): the training ended, a collective failed because another rank was lost
    (a consequence), or its own failure."""

    COMPLETED = "completed"
    PEER_LOST = "peer_lost"
    ERROR = "error"


class ProcessDeparture(Payload):
    """What a rank said just before it ended (``StepReporter.leaving``): the code it is leaving
    with and why. The agent attaches it to the rank's ``process.exit`` (``declared_*``)."""

    rank: Count
    binding_epoch: Count = 0
    pid: Annotated[int, Field(gt=0)] | None = None
    cause: DepartureCause
    exit_code: Annotated[int, Field(ge=0, le=255)]
    reason: Annotated[str, Field(max_length=1024)] | None = None


class ProcessExit(Payload):
    """``exit_code`` / ``signal``: the status the agent read (both None: it could not, as under
    Slurm or torchrun, where it is not the rank's parent). ``declared_*``: what the rank said
    just before it ended (its ``process.departure``), when it said anything: a rank killed by a
    signal says nothing."""

    pid: Annotated[int, Field(gt=0)]
    rank: Count | None = None
    binding_epoch: Count | None = None
    exit_code: int | None = None
    signal: int | None = None
    detected_by: Literal["pidfd", "waitpid", "poll", "psutil"] = "poll"
    declared_code: Annotated[int, Field(ge=0, le=255)] | None = None
    declared_cause: DepartureCause | None = None
    declared_reason: Annotated[str, Field(max_length=1024)] | None = None
    # No validator ties declared_code to declared_cause (the agent sets them together): a
    # validator would take this urgent type off the compiled decode path (events/fastpath.py);
    # a cause without a code, or a code without a cause, is read as no declaration.

    @property
    def ended(self) -> str:
        """How it ended, for people: "signal 9", "exit code 3", or "status unread" and what
        the rank declared ("said peer_lost, code 3: <reason>")."""
        if self.signal is not None:
            how = f"signal {self.signal}"
        elif self.exit_code is not None:
            how = f"exit code {self.exit_code}"
        else:
            how = "status unread"
        if self.declared_cause is not None and self.declared_code is not None:
            how += f", said {self.declared_cause.value}, code {self.declared_code}"
            if self.declared_reason:
                how += f": {self.declared_reason}"
        return how


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


class VerdictClass(StrEnum):
    """What the remediation policy does with an open verdict of a kind."""

    FAILURE = "failure"  # a rank or its unit is gone: restart the job around it at once
    LADDER = "ladder"  # a rank is degraded: the tier ladder, lightest action first
    INFO = "info"  # recorded (incidents, alerts, metrics); no command


class VerdictKind(StrEnum):
    """Every kind of verdict a rule can open. Its class (``verdict_class``) says how the
    policy treats it; every rule declares the kinds it emits (``RuleBase.kinds``)."""

    STRAGGLER = "straggler"
    JOB_SLOWDOWN = "job_slowdown"
    STAGE_IMBALANCE = "stage_imbalance"
    RANK_SILENT = "rank_silent"
    NODE_SILENT = "node_silent"  # a node's agent and every rank of the job there went silent
    RANK_STUCK = "rank_stuck"  # alive, but in one section of its step past its learned bound
    PROCESS_EXIT = "process_exit"
    XID_DRAIN = "xid_drain"
    XID_APP = "xid_app"
    XID_OTHER = "xid_other"
    LINK_DOWN = "link_down"
    LINK_FLAPPING = "link_flapping"
    THERMAL_THROTTLE = "thermal_throttle"
    POWER_THROTTLE = "power_throttle"
    ECC_DBE = "ecc_dbe"
    ECC_SBE_RATE = "ecc_sbe_rate"
    ROW_REMAP_FAILURE = "row_remap_failure"
    ROW_REMAP_PENDING = "row_remap_pending"
    HW_OUTLIER = "hw_outlier"
    DATA_STARVATION = "data_starvation"
    LOSS_NONFINITE = "loss_nonfinite"
    LOSS_SPIKE_AFTER_RESUME = "loss_spike_after_resume"
    OOM_KILL = "oom_kill"
    OOM_KILL_PROCESS = "oom_kill_process"
    EXTERNAL_FAULT = "external_fault"

    @property
    def verdict_class(self) -> VerdictClass:
        return VERDICT_CLASSES[self]


_K, _C = VerdictKind, VerdictClass
# Every kind's class, said once and explicitly: a kind added without one fails at import.
VERDICT_CLASSES: Mapping[VerdictKind, VerdictClass] = {
    _K.STRAGGLER: _C.LADDER,
    _K.JOB_SLOWDOWN: _C.INFO,  # the whole job: no rank to move
    _K.STAGE_IMBALANCE: _C.INFO,
    _K.RANK_SILENT: _C.FAILURE,
    _K.NODE_SILENT: _C.FAILURE,  # a node lost: every rank bound there moves (node-level)
    _K.RANK_STUCK: _C.FAILURE,  # a hang, located at the rank: handled as rank_silent is
    _K.PROCESS_EXIT: _C.FAILURE,
    _K.XID_DRAIN: _C.FAILURE,  # the GPU must be drained
    _K.XID_APP: _C.INFO,  # the application's own error
    _K.XID_OTHER: _C.INFO,
    _K.LINK_DOWN: _C.FAILURE,
    _K.LINK_FLAPPING: _C.INFO,
    _K.THERMAL_THROTTLE: _C.INFO,
    _K.POWER_THROTTLE: _C.INFO,
    _K.ECC_DBE: _C.INFO,
    _K.ECC_SBE_RATE: _C.INFO,
    _K.ROW_REMAP_FAILURE: _C.INFO,
    _K.ROW_REMAP_PENDING: _C.INFO,
    _K.HW_OUTLIER: _C.INFO,
    _K.DATA_STARVATION: _C.INFO,
    _K.LOSS_NONFINITE: _C.INFO,
    _K.LOSS_SPIKE_AFTER_RESUME: _C.INFO,
    _K.OOM_KILL: _C.FAILURE,  # a rank's process killed by the kernel: gone, like an exit
    _K.OOM_KILL_PROCESS: _C.INFO,  # another process on the node: memory pressure, no rank lost
    _K.EXTERNAL_FAULT: _C.INFO,  # a second-hand feed: a notice (docs/rules.md says why)
}
if set(VERDICT_CLASSES) != set(VerdictKind):
    raise RuntimeError("VERDICT_CLASSES: no class for "
                       f"{sorted(set(VerdictKind) - set(VERDICT_CLASSES))}")


def kinds_of(verdict_class: VerdictClass) -> frozenset[VerdictKind]:
    return frozenset(k for k in VerdictKind if k.verdict_class is verdict_class)


class ExitEvidence(BaseModel):
    """The part of a verdict's evidence the policy reads: the replica the verdict is about
    (``pid``, and ``binding_epoch`` when the exit was matched to a binding) and how it ended.
    The ``process_exit`` rule writes it (``as_evidence``), the policy reads it back (``of``);
    on the wire it stays fields of the flat ``Verdict.evidence``."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    pid: Annotated[int, Field(gt=0)] | None = None
    exit_code: int | None = None
    signal: int | None = None
    binding_epoch: Annotated[int, Field(ge=0)] | None = None
    declared_code: int | None = None  # with declared_cause, or neither (see _declared)
    declared_cause: Annotated[DepartureCause | None, Field(strict=False)] = None

    @model_validator(mode="before")
    @classmethod
    def _declared(cls, data: Any) -> Any:
        """A declaration is a code and a cause: one without the other is none."""
        if isinstance(data, Mapping) and (data.get("declared_code") is None
                                          or data.get("declared_cause") is None):
            return {k: v for k, v in data.items()
                    if k not in ("declared_code", "declared_cause")}
        return data

    def as_evidence(self) -> FlatMap:
        out: FlatMap = {"pid": self.pid, "exit_code": self.exit_code, "signal": self.signal,
                        "binding_epoch": self.binding_epoch}
        if self.declared_cause is not None and self.declared_code is not None:
            out["declared_code"] = self.declared_code
            out["declared_cause"] = self.declared_cause.value
        return out

    @classmethod
    def of(cls, evidence: FlatMap) -> ExitEvidence:
        """What a verdict's evidence says of its replica; nothing when these fields are not
        what this model says (strict: a bool or a string is never read as a pid)."""
        try:
            return cls.model_validate(evidence)
        except ValidationError:
            return cls()


class Verdict(Payload):
    verdict_id: Name
    rule: Name
    kind: VerdictKind
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


Reason = Annotated[str, Field(max_length=4096)]
# a rank in params and data: a JSON integer, never a bool, a float or a numeric string
Rank = Annotated[int, Field(ge=0, strict=True)]
Ms = Annotated[float, Field(ge=0, allow_inf_nan=False)]
UnitName = Annotated[str, Field(min_length=1, max_length=256)]


def _action_key(action: CommandAction) -> Any:
    """The hidden discriminator of a params/data model: set from the enclosing command's
    ``action`` when read, never written (the wire shape is the model's own fields)."""
    return Field(default=action, exclude=True, repr=False)


# --- command parameters, one model per action (``Command.params``) ---


class CommandParams(Payload):
    """What the parameters of every action carry."""

    rank: Rank | None = None  # the rank the command is about (migrate: the first it moves)
    reason: Reason = ""


class RaiseQuotaParams(CommandParams):
    action: Literal[CommandAction.RAISE_QUOTA] = _action_key(CommandAction.RAISE_QUOTA)
    quota_pct: NonNegFinite | None = None  # the unit's new CPU quota; None: no limit
    unit: UnitName | None = None  # the rank's unit when decided (the actuator looks it up)


class MigrateParams(CommandParams):
    action: Literal[CommandAction.MIGRATE] = _action_key(CommandAction.MIGRATE)
    ranks: Annotated[list[Rank], Field(min_length=1)]  # every rank moved to a spare
    resume: bool = True
    from_unit: UnitName | None = None  # ``rank``'s unit when decided
    from_units: list[UnitName | None] = Field(default_factory=list)  # per rank of ``ranks``
    avoid_domains: list[Name] = Field(default_factory=list)  # "node=n1", never moved into
    covered_verdicts: list[Name] = Field(default_factory=list)  # the other verdicts it answers


class ResumeParams(CommandParams):
    action: Literal[CommandAction.RESUME] = _action_key(CommandAction.RESUME)


class FenceParams(CommandParams):
    action: Literal[CommandAction.FENCE] = _action_key(CommandAction.FENCE)


class CheckpointNowParams(CommandParams):
    action: Literal[CommandAction.CHECKPOINT_NOW] = _action_key(CommandAction.CHECKPOINT_NOW)


class EscalateParams(CommandParams):
    action: Literal[CommandAction.ESCALATE] = _action_key(CommandAction.ESCALATE)


ActionParams = Annotated[
    RaiseQuotaParams | MigrateParams | ResumeParams | FenceParams | CheckpointNowParams
    | EscalateParams,
    Field(discriminator="action"),
]
COMMAND_PARAMS: Mapping[CommandAction, type[CommandParams]] = {
    CommandAction.RAISE_QUOTA: RaiseQuotaParams,
    CommandAction.MIGRATE: MigrateParams,
    CommandAction.RESUME: ResumeParams,
    CommandAction.FENCE: FenceParams,
    CommandAction.CHECKPOINT_NOW: CheckpointNowParams,
    CommandAction.ESCALATE: EscalateParams,
}


def _keyed(data: Any, field: str) -> Any:
    """Before validation: hand the enclosing ``action`` to ``field``'s model (a mapping, or
    absent: every field of the action's model at its default)."""
    if isinstance(data, dict):
        inner = data.get(field, {})
        if isinstance(inner, dict) and "action" not in inner:
            return {**data, field: {**inner, "action": data.get("action")}}
    return data


def _check_keyed(action: CommandAction, inner: BaseModel, field: str) -> None:
    got = getattr(inner, "action", None)
    if got != action:
        raise ValueError(f"{field}: {type(inner).__name__} is not for action {action.value}")


class Command(Payload):
    command_id: Name
    idempotency_key: Name
    action: CommandAction
    tier: Annotated[int, Field(ge=0, le=3)]
    issued_at: TimeUs
    issued_by: Name
    cause_verdict_ids: list[str] = Field(default_factory=list)
    # the model of ``action`` (``COMMAND_PARAMS``); absent: that model's defaults (the
    # validator fills it in, so it is never None)
    params: ActionParams = Field(default=None)  # type: ignore[assignment]
    signature: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _params_of_action(cls, data: Any) -> Any:
        return _keyed(data, "params")

    @model_validator(mode="after")
    def _params_match(self) -> Command:
        _check_keyed(self.action, self.params, "params")
        return self


class OutcomeStatus(StrEnum):
    ACCEPTED = "accepted"
    DONE = "done"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    REFUSED = "refused"


class RetryCondition(StrEnum):
    """Why a failed command changed nothing and is worth retrying: the condition may clear."""

    STORAGE_UNREACHABLE = "storage_unreachable"


# --- outcome data, one model per action (``CommandOutcome.data``); every field optional:
# an accepted, refused or failed outcome carries few or none of them ---


class OutcomeData(Payload):
    """What the data of every action's outcome carries (nothing yet)."""


class RaiseQuotaData(OutcomeData):
    action: Literal[CommandAction.RAISE_QUOTA] = _action_key(CommandAction.RAISE_QUOTA)
    unit: UnitName | None = None
    quota_pct: NonNegFinite | None = None


class RestartData(OutcomeData):
    """A migrate or resume: the whole process group fenced and relaunched at ``epoch``."""

    action: Literal[CommandAction.MIGRATE, CommandAction.RESUME] = Field(exclude=True, repr=False)
    retry: RetryCondition | None = None  # failed before anything was fenced; may clear
    epoch: Count | None = None
    fence_ms: Ms | None = None
    bind_ms: Ms | None = None
    total_ms: Ms | None = None
    released: list[str] = Field(default_factory=list)
    # migrate: the first rank moved, and every one
    rank: Rank | None = None
    from_unit: UnitName | None = None
    to_unit: UnitName | None = None
    choice: str | None = None  # why that spare
    # finished by a restarted actuator: the journal phase it was cut short after, and how long
    # the recovery took
    recovered_from: Literal["intent", "fenced", "launched", "done"] | None = None
    recovery_ms: Ms | None = None
    ranks: list[Rank] = Field(default_factory=list)
    from_units: list[UnitName] = Field(default_factory=list)
    to_units: list[UnitName] = Field(default_factory=list)
    avoided_domains: list[Name] = Field(default_factory=list)


class FenceData(OutcomeData):
    action: Literal[CommandAction.FENCE] = _action_key(CommandAction.FENCE)
    released: list[str] = Field(default_factory=list)
    fence_ms: Ms | None = None


class CheckpointNowData(OutcomeData):
    action: Literal[CommandAction.CHECKPOINT_NOW] = _action_key(CommandAction.CHECKPOINT_NOW)
    rank: Rank | None = None  # the rank asked to save
    pid: Annotated[int, Field(gt=0)] | None = None


class EscalateData(OutcomeData):
    action: Literal[CommandAction.ESCALATE] = _action_key(CommandAction.ESCALATE)
    reason: Reason = ""


ActionData = Annotated[
    RaiseQuotaData | RestartData | FenceData | CheckpointNowData | EscalateData,
    Field(discriminator="action"),
]
OUTCOME_DATA: Mapping[CommandAction, type[OutcomeData]] = {
    CommandAction.RAISE_QUOTA: RaiseQuotaData,
    CommandAction.MIGRATE: RestartData,
    CommandAction.RESUME: RestartData,
    CommandAction.FENCE: FenceData,
    CommandAction.CHECKPOINT_NOW: CheckpointNowData,
    CommandAction.ESCALATE: EscalateData,
}


def no_data(action: CommandAction) -> ActionData:
    """The data of an outcome that carries none (accepted, refused, ...)."""
    data: ActionData = OUTCOME_DATA[action].model_validate({"action": action})  # type: ignore[assignment]
    return data


class CommandOutcome(Payload):
    command_id: Name
    idempotency_key: Name
    action: CommandAction
    status: OutcomeStatus
    started_at: TimeUs | None = None
    finished_at: TimeUs | None = None
    detail: Annotated[str, Field(max_length=4096)] = ""
    # the model of ``action`` (``OUTCOME_DATA``); absent: that model's defaults (the
    # validator fills it in, so it is never None)
    data: ActionData = Field(default=None)  # type: ignore[assignment]

    @model_validator(mode="before")
    @classmethod
    def _data_of_action(cls, data: Any) -> Any:
        return _keyed(data, "data")

    @model_validator(mode="after")
    def _data_match(self) -> CommandOutcome:
        _check_keyed(self.action, self.data, "data")
        return self

    @property
    def retry(self) -> RetryCondition | None:
        """The condition that made a failed restart retryable, or None."""
        return self.data.retry if isinstance(self.data, RestartData) else None
    signature: str | None = None  # the actuator's (registry ``signed_by``)


# --- the pool: units and replicas ---------------------------------------------------------


class UnitState(StrEnum):
    SPARE = "spare"
    BOUND = "bound"
    DRAINING = "draining"
    FENCED = "fenced"
    FAILED = "failed"


class StopProof(StrEnum):
    """How a fenced replica was stopped, as its backend proved it (``pool.unit`` ``fenced``):
    the local backend's process confirmed dead, or the Slurm backend's step confirmed gone
    (no longer listed, or given up by Slurm once its node is DOWN). ``not_ours``: the backend
    did not start it, so it was never signalled and nothing is proven."""

    ALREADY_GONE = "already_gone"
    SIGTERM = "sigterm"
    SIGKILL = "sigkill"
    NOT_OURS = "not_ours"


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
    stopped: StopProof | None = None  # fenced: how the replica was stopped (absent: older logs)
    # tier 1 can cap/lift this unit's CPU share (False: its backend has no quota, e.g. Slurm)
    quota: bool = True
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


# --- the job's allocation ------------------------------------------------------------------


class SchedulerEnd(StrEnum):
    """How the scheduler ended the job's allocation: Slurm's final job state, lower case
    (``gone``: Slurm no longer lists the job at all, its record aged out). ``deliberate``: the
    user or the scheduler's own policy ended it (a cancel, the time limit, preemption, a
    deadline, the batch script's end), which is no fault of a unit; the others are failures
    trainguard cannot heal inside an allocation that no longer exists."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    PREEMPTED = "preempted"
    DEADLINE = "deadline"
    NODE_FAIL = "node_fail"
    FAILED = "failed"
    OUT_OF_MEMORY = "out_of_memory"
    BOOT_FAIL = "boot_fail"
    GONE = "gone"

    @property
    def deliberate(self) -> bool:
        return self in _DELIBERATE_ENDS


_DELIBERATE_ENDS = frozenset({SchedulerEnd.COMPLETED, SchedulerEnd.CANCELLED,
                              SchedulerEnd.TIMEOUT, SchedulerEnd.PREEMPTED,
                              SchedulerEnd.DEADLINE})


class JobEnded(Payload):
    """The scheduler ended the job's allocation: there is nothing left to restart the job in.
    Written once by the actuator, which watches the allocation (Slurm: ``squeue``). Decide
    stops acting on the job; its open incidents end ``ended`` (a deliberate end) or
    ``unrecoverable`` (a failure of the allocation itself)."""

    end: SchedulerEnd
    allocation: Name  # the scheduler's id of the allocation ("slurm:42")
    state: Annotated[str, Field(max_length=64)]  # the scheduler's own word ("CANCELLED")
    reason: Annotated[str, Field(max_length=1024)] = ""  # the scheduler's reason, if it gave one
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
    ENDED = "ended"  # the scheduler ended the job on purpose (a cancel, its time limit)

    @property
    def active(self) -> bool:
        """Still being worked on: detected, located or mitigating."""
        return self in _ACTIVE_INCIDENT

    @property
    def terminal(self) -> bool:
        """Closed for good: nothing that comes later moves it."""
        return self in _TERMINAL_INCIDENT


_ACTIVE_INCIDENT = frozenset({IncidentState.DETECTED, IncidentState.LOCATED,
                              IncidentState.MITIGATING})
# escalated is neither: a human has it, and the loop's own evidence may still recover it
_TERMINAL_INCIDENT = frozenset({IncidentState.RECOVERED, IncidentState.UNRECOVERABLE,
                                IncidentState.ENDED})


class IncidentTransition(Payload):
    incident_id: Name
    seq: Count
    from_state: IncidentState | None = None
    to_state: IncidentState
    reason: str = ""
    tier: Annotated[int, Field(ge=0, le=3)] | None = None
    cause_event_ids: list[str] = Field(default_factory=list)
    # the opening verdict's severity and kind, on every transition (alerts route on them)
    severity: Severity | None = None
    verdict_kind: VerdictKind | None = None
