"""Progress evidence: the job resumed from the last valid checkpoint's step and data position;
no step skipped, repeated beyond the checkpoint, or restarted from zero; no data consumed
twice; and it kept stepping after the fault. Pure functions of a ``JobLog``."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass

from trainguard.drills.evidence.log import JobLog, Step
from trainguard.drills.evidence.model import Check, Status
from trainguard.events.payloads import CheckpointAction, CheckpointEvent


def _check(name: str, status: Status, detail: str, steps: list[Step] | None = None,
           extra_ids: tuple[str, ...] = (), extra_times: tuple[int, ...] = ()) -> Check:
    steps = steps or []
    return Check("progress", name, status, detail,
                 tuple(s.event_id for s in steps) + extra_ids,
                 tuple(s.time for s in steps) + extra_times)


@dataclass(frozen=True)
class Restart:
    """One new binding epoch that started after the fault: where it should have resumed."""

    epoch: int
    first: dict[int, Step]  # rank -> its first step report at this epoch
    expected_step: int  # the last valid checkpoint's step (0: none existed)
    expected_samples: int
    checkpoint: tuple[str, int] | None  # the `written` event of that checkpoint (id, time)
    corrupt_steps: tuple[int, ...]  # checkpoints reported corrupt before the restart
    loaded: tuple[tuple[str, int, int, int], ...]  # (event id, time, rank, step): `loaded`
    existed_before: bool  # any checkpoint at all had been written before the restart

    @property
    def start(self) -> int:
        return min(s.time for s in self.first.values())


def restarts(log: JobLog) -> list[Restart] | str:
    """Every epoch newer than the one running at the fault, or why they cannot be found."""
    fault = log.fault_start()
    if fault is None:
        return "no injection start on the log: the fault's time is unknown"
    old = log.epoch_before(fault)
    if old is None:
        return "no step report before the fault: the job's epoch at the fault is unknown"
    by = log.by_rank_epoch()
    epochs = sorted({e for (_, e) in by if e > old})
    out: list[Restart] = []
    prev_start = fault
    for epoch in epochs:
        first = {r: seq[0] for (r, e), seq in by.items() if e == epoch}
        start = min(s.time for s in first.values())
        # a step's checkpoint is corrupt from its report on, until it is written again (a job
        # that resumed from an older one reaches that step again and saves it anew)
        corrupt_at: dict[int, int] = {}
        for e in log.ckpt(CheckpointAction.CORRUPT, before=start):
            if isinstance(e.payload, CheckpointEvent):
                corrupt_at[e.payload.step] = max(corrupt_at.get(e.payload.step, -1), e.event_time)
        written = [e for e in log.ckpt(CheckpointAction.WRITTEN, before=start)
                   if isinstance(e.payload, CheckpointEvent)]
        valid = [e for e in written if isinstance(e.payload, CheckpointEvent)
                 and e.event_time > corrupt_at.get(e.payload.step, -1)]
        rewritten = {e.payload.step for e in valid if isinstance(e.payload, CheckpointEvent)}
        corrupt = set(corrupt_at) - rewritten
        best = max(valid, key=lambda e: (e.payload.step, e.event_time),  # type: ignore[attr-defined]
                   default=None)
        loaded = tuple((e.event_id, e.event_time,
                        e.subject.rank if e.subject.rank is not None else -1, e.payload.step)
                       for e in log.ckpt(CheckpointAction.LOADED)
                       if isinstance(e.payload, CheckpointEvent)
                       and prev_start <= e.event_time <= start)
        out.append(Restart(
            epoch=epoch, first=first,
            expected_step=best.payload.step if best else 0,  # type: ignore[attr-defined]
            expected_samples=best.payload.samples_consumed if best else 0,  # type: ignore[attr-defined]
            checkpoint=(best.event_id, best.event_time) if best else None,
            corrupt_steps=tuple(sorted(corrupt)), loaded=loaded,
            existed_before=bool(written)))
        prev_start = start
    return out


def resumed_from_last_valid(log: JobLog, expect_resumed: bool) -> Check:
    name = "resumed_from_last_valid_checkpoint"
    found = restarts(log)
    if isinstance(found, str):
        return _check(name, Status.UNEXPLAINED, found)
    if not found:
        if expect_resumed:
            return _check(name, Status.FAIL, "no replica of a newer binding epoch ever "
                          "reported a step after the fault: the job did not resume")
        return _check(name, Status.NOT_APPLICABLE, "no restart: the job kept its epoch")
    g = log.global_batch()
    if g is None:
        return _check(name, Status.UNEXPLAINED, "no two consecutive steps: the samples per "
                      "step (the data position's unit) are unknown")
    bad: list[str] = []
    cited: list[Step] = []
    ids: list[str] = []
    times: list[int] = []
    for r in found:
        want_step, want_pos = r.expected_step + 1, r.expected_samples + g
        for rank, s in sorted(r.first.items()):
            cited.append(s)
            if s.step != want_step or s.samples != want_pos:
                bad.append(f"epoch {r.epoch} rank {rank}: first step {s.step} at position "
                           f"{s.samples}, expected {want_step} at {want_pos} (checkpoint "
                           f"step {r.expected_step} + one step of {g} samples)")
        for eid, t, rank, step in r.loaded:
            ids.append(eid)
            times.append(t)
            if step != r.expected_step:
                bad.append(f"epoch {r.epoch} rank {rank} loaded checkpoint step {step}, the "
                           f"last valid one was step {r.expected_step}")
        if r.checkpoint:
            ids.append(r.checkpoint[0])
            times.append(r.checkpoint[1])
    if bad:
        return _check(name, Status.FAIL, "; ".join(bad), cited, tuple(ids), tuple(times))
    parts = [f"epoch {r.epoch}: every rank's first step is {r.expected_step + 1} at position "
             f"{r.expected_samples + g} = checkpoint step {r.expected_step} (position "
             f"{r.expected_samples})" + (f", newer corrupt checkpoint(s) {list(r.corrupt_steps)}"
                                         " skipped" if r.corrupt_steps else "")
             + ("" if r.loaded else "; no `loaded` event on the log")
             for r in found]
    return _check(name, Status.PASS, "; ".join(parts), cited, tuple(ids), tuple(times))


def no_step_skipped(log: JobLog) -> Check:
    name = "no_step_skipped"
    by = log.by_rank_epoch()
    if not by:
        return _check(name, Status.UNEXPLAINED, "no step reports on the log")
    g = log.global_batch()
    fails: list[str] = []
    unexplained: list[str] = []
    cited: list[Step] = []
    for (rank, epoch), seq in sorted(by.items()):
        for a, b in itertools.pairwise(seq):
            if b.step == a.step:
                if b.pid != a.pid:
                    continue  # two processes: the duplicate-replica check reports it
                unexplained.append(f"rank {rank} epoch {epoch}: step {a.step} reported twice "
                                   "by one process")
                cited += [a, b]
            elif b.step != a.step + 1:
                gap = b.step - a.step
                cited += [a, b]
                if g is not None and b.samples - a.samples == g * gap:
                    unexplained.append(
                        f"rank {rank} epoch {epoch}: no report for steps {a.step + 1}.."
                        f"{b.step - 1}, the data position moved as if they ran (a lost "
                        "report or a skipped step: the log cannot tell)")
                else:
                    fails.append(f"rank {rank} epoch {epoch}: step {a.step} -> {b.step}")
    notes: list[str] = []
    for rank in log.ranks():
        epochs = sorted((e, seq) for (r, e), seq in by.items() if r == rank)
        for (e0, s0), (e1, s1) in itertools.pairwise(epochs):
            if s1[0].step > s0[-1].step + 1:
                cited += [s0[-1], s1[0]]
                lost = range(s0[-1].step + 1, s1[0].step)
                peers = {x.step for (r, e), seq in by.items() if r != rank and e == e0
                         for x in seq}
                if peers and all(m in peers for m in lost):
                    # its last reports died with its node (the node's agent, killed with it,
                    # never forwarded them); its peers' reports of those steps prove it ran
                    # them: a lockstep (data-parallel) step does not complete without it
                    notes.append(f"rank {rank}: no report of epoch {e0} steps {lost[0]}.."
                                 f"{lost[-1]} reached the log, but its peers reported them at "
                                 f"epoch {e0}, which a lockstep step cannot complete without it")
                    continue
                fails.append(f"rank {rank}: epoch {e0} ended at step {s0[-1].step}, epoch {e1} "
                             f"began at {s1[0].step}: steps skipped")
    found = restarts(log)
    for r in found if isinstance(found, list) else []:
        for rank, s in sorted(r.first.items()):
            if s.step > r.expected_step + 1:
                fails.append(f"epoch {r.epoch} rank {rank} resumed from checkpoint step "
                             f"{r.expected_step} but began at step {s.step}: steps "
                             f"{r.expected_step + 1}..{s.step - 1} skipped")
                cited.append(s)
    if fails:
        return _check(name, Status.FAIL, "; ".join(fails), cited)
    if unexplained:
        return _check(name, Status.UNEXPLAINED, "; ".join(unexplained), cited)
    firsts = [seq[0] for seq in by.values()] + [seq[-1] for seq in by.values()]
    total = sum(len(seq) for seq in by.values())
    return _check(name, Status.PASS, f"{total} step reports over {len(by)} (rank, epoch) "
                  "runs, each consecutive; every new epoch began at or before the step after "
                  "the last one" + (f" ({'; '.join(notes)})" if notes else ""), firsts + cited)


def no_step_repeated_beyond_checkpoint(log: JobLog) -> Check:
    name = "no_step_repeated_beyond_checkpoint"
    found = restarts(log)
    if isinstance(found, str):
        return _check(name, Status.UNEXPLAINED, found)
    if not found:
        return _check(name, Status.NOT_APPLICABLE, "no restart")
    bad = [(r, rank, s) for r in found for rank, s in r.first.items()
           if s.step <= r.expected_step]
    cited = [s for r in found for s in r.first.values()]
    if bad:
        return _check(name, Status.FAIL, "; ".join(
            f"epoch {r.epoch} rank {rank} began at step {s.step}, at or before checkpoint "
            f"step {r.expected_step}: steps already covered by the checkpoint were run again"
            for r, rank, s in bad), cited)
    return _check(name, Status.PASS, "every restarted rank began after its checkpoint's step "
                  "(" + ", ".join(f"epoch {r.epoch}: > {r.expected_step}" for r in found) + ")",
                  cited)


def not_restarted_from_zero(log: JobLog) -> Check:
    name = "not_restarted_from_zero"
    found = restarts(log)
    if isinstance(found, str):
        return _check(name, Status.UNEXPLAINED, found)
    if not found:
        return _check(name, Status.NOT_APPLICABLE, "no restart")
    cited = [s for r in found for s in r.first.values()]
    zero = [r for r in found if any(s.step == 1 for s in r.first.values())]
    if zero:
        why = ["a checkpoint had been written before" if r.existed_before else
               "no valid checkpoint existed" for r in zero]
        return _check(name, Status.FAIL, "; ".join(
            f"epoch {r.epoch} began again at step 1 ({w})" for r, w in zip(zero, why,
                                                                           strict=True)), cited)
    return _check(name, Status.PASS, "no restarted epoch began at step 1", cited)


def no_data_consumed_twice(log: JobLog) -> Check:
    name = "no_data_consumed_twice"
    g = log.global_batch()
    if g is None or not log.steps:
        return _check(name, Status.UNEXPLAINED, "too few step reports to know the data "
                      "position per step")
    positions: dict[int, dict[int, Step]] = defaultdict(dict)
    for s in log.steps:
        positions[s.step].setdefault(s.samples, s)
    bad: list[str] = []
    cited: list[Step] = []
    for step, pos in sorted(positions.items()):
        if len(pos) > 1:
            bad.append(f"step {step} ended at positions {sorted(pos)} in different reports")
            cited += list(pos.values())
    owner: dict[int, int] = {}
    for step, pos in sorted(positions.items()):
        for p, s in pos.items():
            if p in owner and owner[p] != step:
                bad.append(f"position {p} reached by steps {owner[p]} and {step}: the same "
                           "samples consumed twice")
                cited.append(s)
            owner.setdefault(p, step)
    steps = sorted(positions)
    for a, b in itertools.pairwise(steps):
        if b == a + 1:
            pa, pb = min(positions[a]), min(positions[b])
            if pb - pa != g:
                bad.append(f"steps {a} -> {b}: position {pa} -> {pb}, not +{g}")
                cited += [positions[a][pa], positions[b][pb]]
    if bad:
        return _check(name, Status.FAIL, "; ".join(bad[:10]), cited[:40])
    ends = [next(iter(positions[steps[0]].values())), next(iter(positions[steps[-1]].values()))]
    return _check(name, Status.PASS, f"steps {steps[0]}..{steps[-1]}: every step ends at one "
                  f"data position, each {g} samples after the previous one, no position "
                  "reached twice", ends)


def progressed_after_fault(log: JobLog, settle_steps: int) -> Check:
    name = "progressed_after_fault"
    end = log.fault_end()
    if end is None:
        return _check(name, Status.UNEXPLAINED, "no injection on the log")
    after = [s for s in log.steps if s.time > end]
    if not after:
        return _check(name, Status.FAIL, "no step report after the fault")
    epoch = max(s.epoch for s in after)
    mine = [s for s in after if s.epoch == epoch]
    per_rank = {r: sorted({s.step for s in mine if s.rank == r}) for r in {s.rank for s in mine}}
    fewest = min(len(v) for v in per_rank.values())
    ranks_before = set(log.ranks())
    missing = sorted(ranks_before - set(per_rank))
    cited = sorted(mine, key=lambda s: s.time)
    cited = cited[:1] + cited[-1:]
    if missing:
        return _check(name, Status.FAIL, f"ranks {missing} never reported at epoch {epoch} "
                      "after the fault", cited)
    if fewest < settle_steps:
        return _check(name, Status.FAIL, f"only {fewest} steps per rank at epoch {epoch} after "
                      f"the fault (stable needs {settle_steps})", cited)
    return _check(name, Status.PASS, f"every rank made >= {fewest} steps at epoch {epoch} after "
                  f"the fault ended (stable after {settle_steps})", cited)
