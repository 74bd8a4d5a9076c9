"""Result evidence: the loss after the fault stays within a stated tolerance of the baseline
at the same step; checkpoint files are intact (every committed checkpoint verifies against its
manifest's checksums). Pure.

The loss is compared up to ``LOSS_HORIZON`` steps after each resume. A resumed DDP job
rebuilds its gradient buckets in the order its gradients became ready, which can change which
rank starts each element's ring reduction: the same sums, added in another order, differ in
the last bit, and training amplifies that as it goes (measured on ``slurm-straggler-node``:
3e-8 at the resume, 2e-6 720 steps later, 1e-3 after 790, 7e-3 after 1,420). A wrong resume
(the wrong weights, data position or optimizer state) shows at once, well inside the horizon;
a run with no resume after the fault is compared to its end."""

from __future__ import annotations

from trainguard.drills.evidence.log import JobLog
from trainguard.drills.evidence.model import Artifacts, Baseline, Check, Status
from trainguard.events.payloads import CheckpointAction

LOSS_HORIZON = 200  # steps after a resume whose loss is compared (see above)


def loss_within_tolerance(log: JobLog, baseline: Baseline | None, tol: float) -> Check:
    name = "loss_within_tolerance_of_baseline"
    if baseline is None or not baseline.losses:
        return Check("results", name, Status.UNEXPLAINED, "no baseline run to compare with")
    fault = log.fault_start()
    if fault is None:
        return Check("results", name, Status.UNEXPLAINED, "no injection start on the log")
    # each run (rank, epoch) that began after the fault: its first LOSS_HORIZON steps
    began = {k: seq[0].step for k, seq in log.by_rank_epoch().items()
             if seq and seq[0].time >= fault}
    after = [s for s in log.steps if s.time >= fault and s.loss is not None
             and s.step - began.get((s.rank, s.epoch), s.step) < LOSS_HORIZON]
    if not after:
        return Check("results", name, Status.NOT_APPLICABLE,
                     "no step report with a loss after the fault: nothing to compare")
    # by data shard: a rank's loss is that of the samples it was fed (the baseline's ranks
    # are their shards)
    compared = [(s, baseline.losses[(s.shard, s.step)]) for s in after
                if (s.shard, s.step) in baseline.losses]
    if not compared:
        return Check("results", name, Status.UNEXPLAINED,
                     f"none of the {len(after)} step reports after the fault has a baseline "
                     "loss at the same data shard and step")
    worst = max(compared, key=lambda c: abs((c[0].loss or 0.0) - c[1]))
    diff = abs((worst[0].loss or 0.0) - worst[1])
    over = [c for c in compared if abs((c[0].loss or 0.0) - c[1]) > tol]
    cited = [c[0] for c in compared[:1]] + [worst[0]] + [c[0] for c in compared[-1:]]
    ids = tuple(s.event_id for s in cited)
    times = tuple(s.time for s in cited)
    steps = sorted({c[0].step for c in compared})
    if over:
        first = min(over, key=lambda c: c[0].time)[0]
        return Check("results", name, Status.FAIL,
                     f"{len(over)} of {len(compared)} losses after the fault differ from the "
                     f"baseline by more than {tol:g} (first: rank {first.rank} step "
                     f"{first.step}; worst {diff:.3g} at rank {worst[0].rank} step "
                     f"{worst[0].step})", (*ids, first.event_id), (*times, first.time))
    horizon = f" (up to {LOSS_HORIZON} steps after each resume)" if began else ""
    return Check("results", name, Status.PASS,
                 f"{len(compared)} losses at steps {steps[0]}..{steps[-1]} after the "
                 f"fault{horizon}, every one within {tol:g} of the baseline at the same rank "
                 f"and step (largest difference {diff:.3g})", ids, times)


def checkpoint_files_intact(log: JobLog, artifacts: Artifacts | None) -> Check:
    name = "checkpoint_files_intact"
    if artifacts is None or not artifacts.collected:
        return Check("results", name, Status.UNEXPLAINED,
                     "the checkpoint directory was not verified after the drill")
    written = log.ckpt(CheckpointAction.WRITTEN)
    ids = tuple(e.event_id for e in written[-3:])
    times = tuple(e.event_time for e in written[-3:])
    live = [c for c in artifacts.checkpoints if not c.quarantined and c.committed]
    broken = [c for c in live if not c.valid]
    valid = [c for c in live if c.valid]
    aside = [c for c in artifacts.checkpoints if c.quarantined]
    if broken:
        return Check("results", name, Status.FAIL, "checkpoints that fail verification and "
                     "were not set aside: " + "; ".join(f"step {c.step}: {c.reason}"
                                                         for c in broken), ids, times)
    if not valid:
        return Check("results", name, Status.FAIL, "no valid checkpoint is left", ids, times)
    written_steps = {e.payload.step for e in written}  # type: ignore[attr-defined]
    unlogged = sorted(c.step for c in valid if c.step not in written_steps)
    if unlogged:
        return Check("results", name, Status.UNEXPLAINED, f"checkpoints {unlogged} verify on "
                     "disk but no `written` event says who wrote them", ids, times)
    return Check("results", name, Status.PASS,
                 f"{len(valid)} committed checkpoint(s) (steps {[c.step for c in valid]}) verify "
                 "against their manifests' SHA-256 and sizes"
                 + (f"; set aside in quarantine: steps {[c.step for c in aside]}" if aside
                    else ""), ids, times)
