"""Rule kind -> evaluator class."""

from __future__ import annotations

from trainguard.rules.base import RuleBase
from trainguard.rules.external import ExternalFaultRule
from trainguard.rules.gpu_health import EccRule, ThrottleRule
from trainguard.rules.link import LinkRule
from trainguard.rules.liveness import LivenessRule, ProcessExitRule
from trainguard.rules.oom import OomKillRule
from trainguard.rules.outlier import HwOutlierRule
from trainguard.rules.sections import SectionHangRule
from trainguard.rules.slowdown import JobSlowdownRule, StageImbalanceRule
from trainguard.rules.starvation import DataStarvationRule
from trainguard.rules.straggler import StragglerRule
from trainguard.rules.training import TrainingHealthRule
from trainguard.rules.xid import XidRule

EVALUATORS: dict[str, type[RuleBase]] = {
    "straggler": StragglerRule,
    "job_slowdown": JobSlowdownRule,
    "stage_imbalance": StageImbalanceRule,
    "liveness": LivenessRule,
    "section_hang": SectionHangRule,
    "process_exit": ProcessExitRule,
    "xid": XidRule,
    "link": LinkRule,
    "throttle": ThrottleRule,
    "ecc": EccRule,
    "hw_outlier": HwOutlierRule,
    "data_starvation": DataStarvationRule,
    "training_health": TrainingHealthRule,
    "oom_kill": OomKillRule,
    "external_fault": ExternalFaultRule,
}
