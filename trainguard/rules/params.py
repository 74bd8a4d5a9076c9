"""Parameter specifications per rule kind: type, default and constraint, checked at load time.

Each kind's parameters are declared once here; the loader fills defaults, checks every value and
names the file, the rule and the field in its errors. Evaluators read the checked values only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Check = Callable[[Any], str | None]
# The largest magnitude any number in a rule file may have (ms, steps, counts, ratios): far
# beyond any sensible setting, small enough that every evaluator's arithmetic stays exact.
LIMIT = 1_000_000_000


@dataclass(frozen=True)
class Param:
    name: str
    kind: type | tuple[type, ...]
    default: Any
    check: Check | None = None
    doc: str = ""


def gt(bound: float) -> Check:
    return lambda v: None if v > bound else f"must be > {bound:g}"


def ge(bound: float) -> Check:
    return lambda v: None if v >= bound else f"must be >= {bound:g}"


def between(lo: float, hi: float) -> Check:
    return lambda v: None if lo <= v <= hi else f"must be between {lo:g} and {hi:g}"


def int_list(v: Any) -> str | None:
    ok = isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                     and 0 <= x <= LIMIT for x in v)
    return None if ok else f"must be a list of integers from 0 to {LIMIT:g}"


def ratio_list(v: Any) -> str | None:
    ok = isinstance(v, list) and len(v) >= 1 and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and 1 < x <= 100 for x in v)
    return None if ok else "must be a non-empty list of ratios above 1 (at most 100)"


def str_list(v: Any) -> str | None:
    return None if isinstance(v, list) and all(isinstance(x, str) for x in v) else (
        "must be a list of strings")


NUM = (int, float)
_STEP_WINDOW = (
    Param("window_steps", int, 3, ge(1), "steps averaged per window (sliding by one step)"),
    Param("k", int, 3, ge(1), "windows over threshold needed ..."),
    Param("n", int, 5, ge(1), "... out of the last n windows"),
    Param("close_lag_steps", int, 2, ge(1),
          "a step is evaluated once every known rank reported it or a rank is this far ahead"),
)

PARAMS: dict[str, tuple[Param, ...]] = {
    "straggler": (
        Param("threshold_ratio", NUM, 1.15, gt(1),
              "a rank whose own normal stands this far above its stage peers' normals (and by "
              "outlier_z) is slow from the start"),
        Param("effect_levels", list, [1.1, 1.3, 1.6, 2.0], ratio_list,
              "a step is over at a level when the rank is this far above its own normal "
              "against its peers; each level has its own rate and test (a large effect is "
              "told in fewer steps than a small one)"),
        Param("min_effect", NUM, 1.15, gt(1),
              "and a rank is flagged by a level below this only when the median of its last n "
              "steps is this far above its own normal: a low level tells a modest slowdown in "
              "fewer steps, this keeps a drift below it from being flagged"),
        Param("persistent_share", NUM, 0.75, between(0.5, 0.99),
              "the share of over-steps of a persistently slow rank (the test's alternative)"),
        Param("alpha", NUM, 1e-6, between(1e-12, 0.1),
              "the sequential test flags at log-likelihood ratio log(1/alpha)"),
        Param("over_rate_floor", NUM, 0.02, between(1e-4, 0.5),
              "the least own rate of over-steps (and of bursts) a rank is credited with"),
        Param("n", int, 5, ge(1), "the last n steps ..."),
        Param("k", int, 3, ge(1), "... of which k must be over to open"),
        Param("close_lag_steps", int, 2, ge(1),
              "a step is evaluated once every known rank reported it or a rank is this far ahead"),
        Param("min_peers", int, 3, ge(1),
              "learned peers (same job, same pp_stage) needed to judge a normal against the "
              "stage's; fewer: the rank is judged against its own history only"),
        Param("min_excess_ms", NUM, 5.0, ge(0),
              "a step is over only when the rank is also this many ms above its expected time"),
        Param("warmup_steps", int, 10, ge(0),
              "closed steps of a new replica (or of the job's first) left out"),
        Param("baseline_steps", int, 10, ge(1),
              "judged steps that learn a rank's own normal (their median log-ratio)"),
        Param("normal_memory_steps", int, 200, ge(1),
              "afterwards the normal and the rates follow a running mean over this many steps"),
        Param("outlier_z", NUM, 3.5, gt(0),
              "robust z of a rank's normal among its stage peers' normals"),
        Param("min_sigma", NUM, 0.02, gt(0), "floor of the peers' normals' MAD (log units)"),
        Param("resolve_ratio", NUM, 1.05, ge(1),
              "resolve once the median of the last n steps is within this of the reference ..."),
        Param("resolve_windows", int, 5, ge(1), "... for this many consecutive steps"),
        Param("resolve_excess_ms", NUM, 2.5, ge(0),
              "... or once that median is no slower than its peers, or less than this many ms "
              "above what the reference predicts (hysteresis: half of min_excess_ms; 0: off)"),
        Param("worsen_ratio", NUM, 1.5, gt(1),
              "an open verdict whose effect grows by this factor is resolved and reopened"),
        Param("burst_ratio", NUM, 2.0, gt(1),
              "a burst: one step's compute at least this times what its normal predicts ..."),
        Param("burst_min_excess_ms", NUM, 10.0, ge(0), "... and this many ms above it"),
        Param("burst_steps", int, 20, ge(1), "closed steps a rank's bursts are counted over"),
        Param("burst_k", int, 4, ge(1),
              "bursts within burst_steps needed to flag a rank slowed in bursts (a throttled "
              "cgroup: most steps normal, one in a few stalled), which medians miss ..."),
        Param("burst_alpha", NUM, 1e-3, between(1e-12, 0.5),
              "... and that many bursts must be this unlikely at the rank's own burst rate"),
        Param("burst_resolve_max", int, 1, ge(0),
              "a verdict resolves only with at most this many bursts within burst_steps"),
    ),
    "job_slowdown": (
        Param("threshold_ratio", NUM, 1.3, gt(1), "job median window / job baseline"),
        *_STEP_WINDOW,
        Param("baseline_steps", int, 10, ge(1), "closed steps that form the job baseline"),
        Param("min_rank_fraction", NUM, 0.6, between(0, 1),
              "share of ranks over threshold needed (most ranks slow together)"),
        Param("resolve_ratio", NUM, 1.1, ge(1), ""),
        Param("resolve_windows", int, 5, ge(1), ""),
        Param("min_span_ms", int, 3000, ge(0),
              "the windows over must have held this long in event time (0: at once)"),
    ),
    "stage_imbalance": (
        Param("threshold_ratio", NUM, 1.25, gt(1), "stage median / median of stage medians"),
        *_STEP_WINDOW,
        Param("min_stages", int, 2, ge(2), ""),
        Param("resolve_ratio", NUM, 1.1, ge(1), ""),
        Param("resolve_windows", int, 5, ge(1), ""),
    ),
    "liveness": (
        Param("k_step_times", NUM, 10.0, gt(0), "silence allowed, in median step times"),
        Param("floor_ms", NUM, 60000.0, gt(0), "silence always allowed"),
        Param("check_every_ms", NUM, 1000.0, gt(0), "event-time period of the silence check"),
        Param("node_k_intervals", NUM, 10.0, gt(0),
              "a node is silent after this many of its agent's intervals with nothing from "
              "its agent or its ranks ..."),
        Param("node_floor_ms", NUM, 10000.0, gt(0), "... and never before this long"),
    ),
    "section_hang": (
        Param("k", NUM, 3.0, gt(1), "bound = k x the longest recent duration of the section"),
        Param("floor_ms", NUM, 20000.0, gt(0), "a learned bound is never below this"),
        Param("initial_ms", NUM, 300000.0, gt(0),
              "the bound of a section before min_observations of it ended"),
        Param("min_observations", int, 10, ge(1), "ended instances before the bound is learned"),
        Param("checkpoint_initial_ms", NUM, 1800000.0, gt(0),
              "checkpoint sections: their own initial bound (saves are rare and long)"),
        Param("checkpoint_min_observations", int, 3, ge(1), ""),
        Param("window_n", int, 200, ge(1), "recent durations kept per section"),
        Param("check_every_ms", NUM, 1000.0, gt(0), "event-time period of the check"),
    ),
    "process_exit": (
        Param("ignore_clean_exit", bool, True, None, "exit code 0 without a signal is no fault"),
    ),
    "oom_kill": (
        Param("process_severity", str, "warning", None,
              "a kill of a process that is no rank of the job, located at the node"),
        Param("resolve_quiet_ms", NUM, 600000.0, gt(0),
              "a node's oom_kill_process verdict resolves after this long without a kill"),
    ),
    "external_fault": (),
    "xid": (
        Param("drain_codes", list, [48, 64, 74, 79, 92, 95, 119, 120, 140], int_list,
              "XIDs after which the GPU/node must be drained (critical, located at the GPU)"),
        Param("app_codes", list, [13, 31, 43, 45], int_list,
              "XIDs caused by the application (warning, located at the job)"),
        Param("app_severity", str, "warning", None, ""),
        Param("other_severity", str, "warning", None, "any other XID, located at the GPU"),
        Param("resolve_quiet_ms", NUM, 600000.0, gt(0),
              "non-drain XID verdicts resolve after this long without a repeat"),
    ),
    "link": (
        Param("flap_count", int, 3, ge(2), "down/carrier transitions within flap_window ..."),
        Param("flap_window_ms", NUM, 300000.0, gt(0), "... that make a link flapping"),
    ),
    "throttle": (
        Param("thermal_reasons", list, ["sw_thermal_slowdown", "hw_thermal_slowdown",
                                        "hw_slowdown"], str_list, ""),
        Param("power_reasons", list, ["hw_power_brake_slowdown"], str_list,
              "sw_power_cap is normal at full load and is not listed by default"),
        Param("max_temperature_c", NUM, 87.0, gt(0), ""),
        Param("sustain_samples", int, 3, ge(1), "consecutive samples before opening"),
        Param("clear_samples", int, 3, ge(1), "consecutive clean samples before resolving"),
    ),
    "ecc": (
        Param("dbe_max", int, 0, ge(0), "volatile DBE above this is critical"),
        Param("sbe_rate_per_hour", NUM, 100.0, gt(0), "volatile SBE growth rate (warning)"),
        Param("sbe_min_span_ms", NUM, 60000.0, gt(0), "span a rate is measured over"),
    ),
    "hw_outlier": (
        Param("z_threshold", NUM, 3.5, gt(0), "robust z (0.6745 (x - median) / MAD)"),
        Param("metrics", list, ["temperature_c", "power_w", "sm_clock_mhz"], str_list, ""),
        Param("min_peers", int, 4, ge(2), "GPUs of the job with a comparable sample"),
        Param("util_band_pct", NUM, 15.0, gt(0), "peers within this many points of SM util"),
        Param("min_util_pct", NUM, 30.0, ge(0), "only busy GPUs are compared"),
        Param("stale_ms", NUM, 30000.0, gt(0), "peer samples older than this are not used"),
        Param("sustain_samples", int, 3, ge(1), ""),
        Param("clear_samples", int, 3, ge(1), ""),
        Param("min_mad_fraction", NUM, 0.01, gt(0),
              "MAD floor as a share of the median, so identical peers do not give z=inf"),
        Param("recompute_ms", NUM, 1000.0, ge(0),
              "the job-wide statistics are recomputed at most this often in event time "
              "(one sort per interval, not one per node record: O(GPUs) instead of "
              "O(nodes x GPUs) per interval)"),
    ),
    "data_starvation": (
        Param("wait_share", NUM, 0.3, between(0, 1), "data_wait_ms / step time"),
        Param("window_steps", int, 5, ge(1), ""),
        Param("min_rank_fraction", NUM, 0.5, between(0, 1), ""),
        Param("max_gpu_util_pct", NUM, 60.0, between(0, 100),
              "if telemetry gives the job's SM util, its median must be below this"),
        Param("resolve_share", NUM, 0.15, between(0, 1), ""),
    ),
    "training_health": (
        Param("spike_ratio", NUM, 2.0, gt(1), "loss / pre-resume median loss"),
        Param("sustain_reports", int, 5, ge(1), "consecutive loss reports over spike_ratio"),
        Param("watch_steps", int, 200, ge(1), "steps after a resume that are watched"),
        Param("baseline_reports", int, 50, ge(1), "loss reports before the resume kept"),
        Param("resolve_reports", int, 20, ge(1), "finite, unspiked reports before resolving"),
    ),
}

KINDS = tuple(PARAMS)
