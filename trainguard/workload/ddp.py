"""The reference workload: one rank of a real PyTorch DDP job (gloo on CPU; NCCL when CUDA is
available) training a small MLP on a deterministic, seeded data stream, reporting every step
through the ``StepReporter`` and checkpointing through the ``CheckpointManager``.

    python -m trainguard.workload.ddp --job-id J --rank R --world-size W \\
        --master-addr 127.0.0.1 --master-port P --ckpt-dir D [--allow-tmp-ckpt] \\
        --steps N --ckpt-every K --keep K --seed S [--step-ms FLOOR] [--progress-file F]

    torchrun --nproc-per-node 4 --rdzv-id J -m trainguard.workload.ddp --ckpt-dir D --steps N

Identity: ``--job-id``, ``--rank`` and ``--world-size`` when given, else from the launcher
(``trainguard_sdk.identity_from_env``: trainguard's actuator, torchrun, Slurm). Without
``--master-port`` the ranks join through ``env://`` (torchrun's ``MASTER_ADDR`` /
``MASTER_PORT`` and its store); with it, rank 0 hosts the store. An elastic job run by
trainguard's actuator (torchrun agents as its replicas): the reported rank is the unit's slot
(``TRAINGUARD_RANK``) and the process joins the group, takes its data shard and reports it as
its ``dp_rank`` at torchrun's ``RANK`` (``_group_rank``).

Every rank starts by resuming from the newest checkpoint all ranks find valid (a fresh start
when there is none) and continues at its step + 1 with its data position; ranks run until
step N. Environment: ``TRAINGUARD_BINDING_EPOCH`` (this replica's binding epoch; else the
launcher's restart count, see ``trainguard_sdk.identity``),
``TRAINGUARD_AGENT_SOCKET`` (the node agent's step socket; see ``trainguard_sdk.paths``).
Save on command: SIGUSR1 to any rank, or create ``<ckpt-dir>/SAVE_NOW``.

Exit codes: 0 all steps done; 2 bad arguments or a refused checkpoint directory; 3 a peer was
lost (a collective failed, or waited past ``--timeout-s``, default 30 s), or not every rank
joined within ``--rendezvous-timeout-s`` (default 300 s); 4 a checkpoint could not be written;
5 the chosen checkpoint could not be loaded (changed after verification, or written by another
world size or job).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Final, NoReturn, Protocol

from trainguard_sdk.checkpoint.manifest import LAYOUT_STATE_PT, LAYOUTS
from trainguard_sdk.integrations.core import Timing
from trainguard_sdk.wire import Section

EXIT_OK: Final = 0
EXIT_USAGE: Final = 2
EXIT_PEER_LOST: Final = 3
EXIT_CKPT_WRITE: Final = 4
EXIT_CKPT_LOAD: Final = 5
ENV_BINDING_EPOCH: Final = "TRAINGUARD_BINDING_EPOCH"

log = logging.getLogger("trainguard.workload.ddp")


class StepSink(Protocol):
    def step(self, step: int, samples_consumed: int, compute_ms: float,
             comm_ms: float | None = None, data_wait_ms: float | None = None,
             step_ms: float | None = None, loss: float | None = None,
             shard_offset: int | None = None) -> bool: ...


@dataclass(frozen=True)
class StepFigures:
    """What the loop measured of one step itself, held until the timer's figures for it."""

    step: int
    position: int
    data_wait_ms: float
    step_ms: float
    loss: float


class StepLabels:
    """Reports each step's figures under that step's number: on CUDA ``StepTimer.stop()``
    gives the previous step's (``Timing.index`` says which start they belong to), so the
    loop's own figures of a step wait here until the timer's come."""

    def __init__(self) -> None:
        self._held: dict[int, StepFigures] = {}

    def report(self, sink: StepSink, index: int, figures: StepFigures | None,
               timing: Timing | None) -> int | None:
        """Hold ``figures`` (of the timer's start ``index``), then report the step ``timing``
        belongs to; its step number, or None when nothing was reported."""
        if figures is not None:
            self._held[index] = figures
        if timing is None:
            return None
        own = self._held.pop(timing.index, None)
        for old in [i for i in self._held if i < timing.index]:
            del self._held[old]
        if own is None:
            return None
        sink.step(own.step, own.position, compute_ms=timing.compute_ms, comm_ms=timing.comm_ms,
                  data_wait_ms=own.data_wait_ms, step_ms=own.step_ms, loss=own.loss)
        return own.step


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m trainguard.workload.ddp",
                                 description="One rank of the reference PyTorch DDP job.")
    ap.add_argument("--job-id", default=None, help="default: from the launcher's environment")
    ap.add_argument("--rank", type=int, default=None, help="default: from the launcher")
    ap.add_argument("--world-size", type=int, default=None, help="default: from the launcher")
    ap.add_argument("--master-addr", default="127.0.0.1")
    ap.add_argument("--master-port", type=int, default=None,
                    help="rank 0 hosts the store here (default: env://, e.g. under torchrun)")
    ap.add_argument("--ckpt-dir", required=True, help="durable checkpoint directory, shared")
    ap.add_argument("--allow-tmp-ckpt", action="store_true",
                    help="allow a checkpoint directory under /tmp or on tmpfs")
    ap.add_argument("--steps", type=int, required=True, help="run until this step")
    ap.add_argument("--ckpt-every", type=int, default=0, help="save every K steps (0: never)")
    ap.add_argument("--keep", type=int, default=3, help="keep the last K checkpoints")
    ap.add_argument("--ckpt-layout", choices=LAYOUTS, default=LAYOUT_STATE_PT,
                    help="state_pt: rank 0 writes model and optimizer (a replicated DDP model); "
                         "dcp: every rank writes its shard through torch.distributed.checkpoint, "
                         "in the background (sharded models; the manifest is written last)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-ms", type=float, default=0.0, help="minimum step time (ms)")
    ap.add_argument("--progress-file", type=Path, default=None, help="per-rank JSONL log")
    ap.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--hidden", type=int, default=64,
                    help="width of the model's hidden layers (its compute per step)")
    ap.add_argument("--timeout-s", type=float, default=30.0,
                    help="collective timeout: a lost or hung peer ends the rank (exit 3)")
    ap.add_argument("--rendezvous-timeout-s", type=float, default=300.0,
                    help="how long to wait for every rank to join (exit 3 after it)")
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU even when CUDA exists")
    ap.add_argument("--stall", default=None, metavar="SECTION:STEP:SECONDS",
                    help="a drill: sleep SECONDS inside SECTION (data, forward, backward, "
                         "optimizer) of step STEP, heartbeats going on")
    return ap


def _check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Check the arguments and take the identity; the binding epoch."""
    from trainguard_sdk import IdentityError, identity_from_env

    if (args.rank is None) != (args.world_size is None):
        ap.error("--rank and --world-size: give both or neither (neither: from the launcher)")
    if args.rank is not None and (args.world_size < 1 or not 0 <= args.rank < args.world_size):
        ap.error(f"--rank {args.rank}: must be in 0..--world-size-1 ({args.world_size})")
    try:
        ident = identity_from_env(os.environ, job_id=args.job_id, rank=args.rank,
                                  world_size=args.world_size)
    except IdentityError as exc:
        ap.error(str(exc))
    args.job_id, args.rank, args.world_size = ident.job_id, ident.rank, ident.world_size
    args.group_rank = _group_rank(ap, args, ident.launcher)
    for name in ("steps", "batch", "hidden"):
        if getattr(args, name) < 1:
            ap.error(f"--{name}: >= 1, got {getattr(args, name)}")
    if args.ckpt_every < 0 or args.keep < 1:
        ap.error("--ckpt-every >= 0 and --keep >= 1")
    if not args.timeout_s > 0 or not args.rendezvous_timeout_s > 0 or args.step_ms < 0:
        ap.error("--timeout-s > 0, --rendezvous-timeout-s > 0 and --step-ms >= 0")
    try:
        _stall(args.stall)
    except ValueError as exc:
        ap.error(str(exc))
    return ident.binding_epoch


def _group_rank(ap: argparse.ArgumentParser, args: argparse.Namespace, launcher: str) -> int:
    """This process's rank in the process group. It is the reported rank, except under a
    launcher that re-forms the group by itself (torchrun's c10d rendezvous assigns ``RANK`` at
    each round, in the order of the agents' addresses) run by trainguard's actuator: there
    ``TRAINGUARD_RANK`` is the unit's slot, which reports and verdicts name and which stays
    with the unit when a spare replaces a lost one, and ``RANK`` is where the process sits in
    this round's group (data shard, checkpoint writer)."""
    raw = os.environ.get("RANK")
    if launcher != "trainguard" or args.master_port is not None or raw is None:
        return int(args.rank)
    world = os.environ.get("WORLD_SIZE")
    if not raw.isdigit() or world != str(args.world_size) or int(raw) >= args.world_size:
        ap.error(f"RANK {raw!r} with WORLD_SIZE {world!r}: not a rank of the job's "
                 f"{args.world_size} (TRAINGUARD_WORLD_SIZE)")
    return int(raw)


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    epoch = _check(ap, args)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s rank {args.rank} %(levelname)s %(name)s: "
                               "%(message)s")

    from trainguard_sdk.checkpoint.location import CheckpointLocationError, durable_directory

    try:  # before the rendezvous: a refused directory must not leave peers waiting
        durable_directory(args.ckpt_dir, allow_tmp=args.allow_tmp_ckpt, setting="--ckpt-dir",
                          allow_setting="--allow-tmp-ckpt")
    except CheckpointLocationError as exc:
        print(f"rank {args.rank}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return _run(args, epoch)


def _run(args: argparse.Namespace, epoch: int) -> int:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    # A rank forked from a warm launcher inherits torch's thread pool from before its
    # environment was set: apply OMP_NUM_THREADS here (ranks pinned two to a core otherwise
    # spin against each other).
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))

    from trainguard_sdk import StepReporter
    from trainguard_sdk.checkpoint.collective import TorchCollective
    from trainguard_sdk.checkpoint.manager import (
        CheckpointConfig,
        CheckpointIncompatible,
        CheckpointManager,
    )
    from trainguard_sdk.checkpoint.store import CorruptFile
    from trainguard_sdk.ddp import StepTimer

    from trainguard.workload.data import SampleStream
    from trainguard.workload.model import SmallNet
    from trainguard.workload.progress import ProgressLog

    rank, world, group = args.rank, args.world_size, args.group_rank
    progress = ProgressLog(args.progress_file, rank=rank, epoch=epoch)
    # the data-parallel rank is the shard this process is fed: its place in the group
    reporter = StepReporter(args.job_id, rank, world, dp_rank=group, pp_stage=0, tp_rank=0,
                            binding_epoch=epoch)
    reporter.heartbeat("init")

    def leave(code: int, reason: str) -> NoReturn:
        """End the rank now: a broken process group cannot be torn down cleanly."""
        print(f"rank {rank}: {reason}", file=sys.stderr, flush=True)
        progress.write("exit", code=code, reason=reason[:500])
        progress.close()
        reporter.leaving(code, "peer_lost" if code == EXIT_PEER_LOST else "error", reason)
        reporter.close()
        sys.stderr.flush()
        os._exit(code)

    cuda = torch.cuda.is_available() and not args.cpu
    if cuda:
        local = group % torch.cuda.device_count()
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    # DDP's constructor imports torch's compiler stack (dynamo, sympy: seconds of CPU); do it
    # before joining, so that peers never wait on it inside a timed collective.
    importlib.import_module("torch._dynamo")
    try:
        if args.master_port is None:  # the launcher's rendezvous (torchrun: its own store)
            dist.init_process_group("nccl" if cuda else "gloo", init_method="env://",
                                    rank=group, world_size=world,
                                    timeout=timedelta(seconds=args.timeout_s))
        else:
            # Every rank is connected once the store is up (rank 0 waits for all, up to the
            # rendezvous timeout); from then on, collectives are bounded by --timeout-s.
            store = dist.TCPStore(  # type: ignore[attr-defined]  # public; stubs: no re-export
                args.master_addr, args.master_port, world, is_master=rank == 0,
                timeout=timedelta(seconds=args.rendezvous_timeout_s), wait_for_workers=True)
            dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank,
                                    world_size=world, timeout=timedelta(seconds=args.timeout_s))
    except Exception as exc:  # rendezvous timeout, refused connection, port in use
        leave(EXIT_PEER_LOST, f"cannot join the job: {exc}")
    config = CheckpointConfig(Path(args.ckpt_dir), every_steps=args.ckpt_every, keep=args.keep,
                              allow_tmp=args.allow_tmp_ckpt, layout=args.ckpt_layout,
                              setting_names=("--ckpt-dir", "--allow-tmp-ckpt"))
    manager = CheckpointManager(config, job_id=args.job_id,
                                collective=TorchCollective(str(device)), sink=reporter)
    manager.install_request_signal()

    stream = SampleStream(args.seed)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = SmallNet(stream.features, stream.classes, hidden=args.hidden).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    try:
        restored = manager.resume(model, optimizer)
    except (CorruptFile, CheckpointIncompatible) as exc:
        leave(EXIT_CKPT_LOAD, f"cannot load the checkpoint: {exc}")
    except RuntimeError as exc:
        leave(EXIT_PEER_LOST, f"lost a peer while resuming: {exc}")
    step = restored.progress.step if restored else 0
    position = restored.progress.samples_consumed if restored else 0
    progress.write("start", resumed_from=restored.progress.step if restored else None,
                   samples_consumed=position,
                   checkpoint=str(restored.path) if restored else None)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    # This rank's own compute, with DDP's overlap of backward and gradient exchange kept: the
    # timer's communication hook notes when this rank's last gradient bucket became ready
    # (compute ends there; the wait for the slowest peer is comm, not compute).
    # The reporter's heartbeats say which section of the step the rank is in (the timer enters
    # "comm" when this rank's last bucket is ready: from there it waits for its peers).
    timer = StepTimer(ddp, reporter=reporter)
    labels = StepLabels()  # on CUDA the timer's figures come a step late: each under its step
    loss_fn = torch.nn.CrossEntropyLoss()
    global_batch = args.batch * world
    stall = _stall(args.stall)
    section = reporter.section
    while step < args.steps:
        t0 = time.perf_counter()
        section(Section.DATA)
        _maybe_stall(stall, Section.DATA, step + 1)
        start, count = stream.rank_slice(position, group, args.batch)
        x, y = stream.batch(start, count)
        x, y = x.to(device), y.to(device)
        t1 = time.perf_counter()
        try:
            timer.start()
            optimizer.zero_grad(set_to_none=True)
            section(Section.FORWARD)
            _maybe_stall(stall, Section.FORWARD, step + 1)
            loss = loss_fn(ddp(x), y)
            section(Section.BACKWARD)
            _maybe_stall(stall, Section.BACKWARD, step + 1)
            loss.backward()  # the gradient exchange: fails or times out when a peer is lost
            section(Section.OPTIMIZER)
            _maybe_stall(stall, Section.OPTIMIZER, step + 1)
            optimizer.step()
            loss_value = float(loss.item())
        except RuntimeError as exc:
            leave(EXIT_PEER_LOST, f"lost a peer at step {step + 1}: {exc}")
        timing = timer.stop()  # on CUDA the previous step's figures (None at first)
        step += 1
        position += global_batch
        floor_s = args.step_ms / 1000 - (time.perf_counter() - t0)
        if floor_s > 0:
            time.sleep(floor_s)
        labels.report(reporter, timer.index,
                      StepFigures(step, position, data_wait_ms=(t1 - t0) * 1000,
                                  step_ms=(time.perf_counter() - t0) * 1000, loss=loss_value),
                      timing)
        progress.write("step", step=step, samples_consumed=position,
                       data_epoch=stream.epoch_of(position - 1), loss=loss_value)
        try:
            due = manager.due(step)
        except RuntimeError as exc:
            leave(EXIT_PEER_LOST, f"lost a peer at step {step}: {exc}")
        if due:
            reporter.heartbeat("checkpoint")
            section(Section.CHECKPOINT)
            try:
                manager.save(step, position, model, optimizer,
                             extra={"seed": args.seed, "batch": args.batch})
            except OSError as exc:
                leave(EXIT_CKPT_WRITE, f"cannot write the checkpoint of step {step}: {exc}")
            except RuntimeError as exc:
                leave(EXIT_PEER_LOST, f"lost a peer while checkpointing step {step}: {exc}")
            reporter.end_section()
            progress.write("checkpoint", step=step, samples_consumed=position)
    labels.report(reporter, timer.index, None, timer.flush())  # CUDA: the last step's figures
    manager.close()
    progress.write("exit", code=EXIT_OK, reason="done")
    progress.close()
    reporter.leaving(EXIT_OK, "completed", "done")
    reporter.close()
    dist.destroy_process_group()
    return EXIT_OK


Stall = tuple[Section, int, float]
_STALLABLE = ("data", "forward", "backward", "optimizer")


def _stall(spec: str | None) -> Stall | None:
    """``--stall SECTION:STEP:SECONDS``; ValueError naming the part that is wrong."""
    if spec is None:
        return None
    parts = spec.split(":")
    if len(parts) != 3 or parts[0] not in _STALLABLE:
        raise ValueError(f"--stall {spec!r}: SECTION:STEP:SECONDS, SECTION one of {_STALLABLE}")
    try:
        step, seconds = int(parts[1]), float(parts[2])
    except ValueError:
        raise ValueError(f"--stall {spec!r}: STEP an integer, SECONDS a number") from None
    if step < 1 or not seconds >= 0:
        raise ValueError(f"--stall {spec!r}: STEP >= 1 and SECONDS >= 0")
    return Section[parts[0].upper()], step, seconds


def _maybe_stall(stall: Stall | None, section: Section, step: int) -> None:
    if stall is not None and stall[0] == section and stall[1] == step:
        time.sleep(stall[2])


def run_and_exit(argv: list[str] | None = None) -> NoReturn:
    """``main``, then ``os._exit``: once the process group is destroyed and the logs closed,
    the interpreter's teardown of the compiler stack DDP imports lazily (dynamo, sympy) takes
    seconds and does nothing this rank needs."""
    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run_and_exit()
