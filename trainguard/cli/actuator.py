"""`trainguard actuator`: carry out signed commands on one job through the local backend, and
refuse stale replicas. With ``--launch`` it also starts the job from its spec (ranks + spares).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from trainguard.cli.common import add_kafka_args, input_file, kafka_config, run_until_stopped
from trainguard.dev.paths import state_dir

if TYPE_CHECKING:
    from trainguard.actuators.slurm import SlurmBackend

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("actuator", help="execute signed remediation commands on a job "
                       "(local backend); optionally launch it")
    add_kafka_args(p)
    p.add_argument("--job-spec", type=input_file, required=True,
                   help="the job: command, units (CPU sets), ranks, spares, checkpoint dir")
    p.add_argument("--launch", action="store_true",
                   help="launch the job's ranks at start if the log has never seen it bound")
    p.add_argument("--state-dir", type=Path,
                   help="ledger of used idempotency keys and rank logs (default "
                   "$TRAINGUARD_STATE/actuator-<job>)")
    p.add_argument("--command-pubkey", type=input_file, help="decide's Ed25519 public key: only "
                   "commands it verifies are carried out (default "
                   "$TRAINGUARD_COMMAND_PUBKEY_FILE, else $TRAINGUARD_COMMAND_PUBKEY)")
    p.add_argument("--actuator-key", type=input_file, help="this actuator's own Ed25519 key: signs "
                   "its outcomes and pool events (default $TRAINGUARD_ACTUATOR_KEY_FILE, else "
                   "$TRAINGUARD_ACTUATOR_KEY)")
    p.add_argument("--actuator-pubkeys", type=input_file, help="other trusted actuator public keys "
                   "(default $TRAINGUARD_ACTUATOR_PUBKEYS_FILE, else "
                   "$TRAINGUARD_ACTUATOR_PUBKEYS; its own key is always trusted)")
    p.add_argument("--max-age-s", type=float, default=60.0,
                   help="refuse commands issued longer ago than this (default 60)")
    p.add_argument("--no-cgroups", action="store_true",
                   help="do not put units in CPU cgroups (tier 1 then fails, saying why)")
    p.add_argument("--metrics-port", type=int, default=0, help="port for /metrics (0: none)")
    p.add_argument("--metrics-addr", default="127.0.0.1", help="address for /metrics")
    p.add_argument("--backend", choices=("local", "slurm"), default="local",
                   help="where ranks run: local processes, or steps of a Slurm allocation "
                   "(units = its nodes; Slurm through its CLIs, SLURM_CONF from the environment)")
    p.add_argument("--slurm-job", type=int, default=None,
                   help="with --backend slurm: the allocation's Slurm job id (sbatch/salloc "
                   "--no-kill over the job's nodes and its spares)")
    p.add_argument("--watch-s", type=float, default=1.0,
                   help="with --backend slurm: ask Slurm this often whether it ended the "
                   "allocation (one squeue of that job; default 1)")
    p.add_argument("--fence-command", default=None, metavar="ARGV",
                   help="with --backend slurm: the command that powers a node off (a fence "
                   "agent: e.g. 'ipmitool -H {node}-bmc chassis power off'; {node} is "
                   "replaced), run for a node whose slurmd cannot confirm a cancel before its "
                   "steps count as gone. Split like a shell line, never run by one")
    p.add_argument("--teardown", action="store_true",
                   help="instead of serving: fence every replica of the job (bound on the "
                   "log, or alive in the replica journal) and stop its warm launcher, then exit")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from trainguard.actuators import metrics, signing
    from trainguard.actuators.backend import Backend
    from trainguard.actuators.jobspec import JobSpecError, load_job_spec
    from trainguard.actuators.local import LocalBackend
    from trainguard.actuators.service import Actuator, ActuatorOptions
    from trainguard.actuators.slurm import SlurmBackend
    from trainguard.actuators.slurm_cli import SlurmCli
    from trainguard.bus.kafka import KafkaBus

    try:
        job = load_job_spec(args.job_spec)
        key = signing.load_command_pubkey(key_file=args.command_pubkey)
        signer = signing.load_actuator_key(key_file=args.actuator_key)
        trusted = signing.KeySet()
        if args.actuator_pubkeys is not None or signing.has_actuator_pubkeys():
            trusted = signing.load_actuator_pubkeys(key_file=args.actuator_pubkeys)
    except (JobSpecError, signing.SigningKeyError) as exc:
        raise SystemExit(f"trainguard actuator: {exc}") from None
    cfg = kafka_config(args, client_id=f"trainguard-actuator-{job.job_id}")
    sdir = args.state_dir or state_dir() / f"actuator-{job.job_id}"
    backend: Backend
    if args.backend == "slurm":
        if args.slurm_job is None or args.slurm_job <= 0:
            raise SystemExit("trainguard actuator: --backend slurm needs --slurm-job "
                             f"(a positive Slurm job id; got {args.slurm_job})")
        if not args.watch_s > 0:  # NaN too
            raise SystemExit(f"trainguard actuator: --watch-s must be > 0 (got {args.watch_s})")
        fence = shlex.split(args.fence_command) if args.fence_command else None
        backend = SlurmBackend(SlurmCli(), args.slurm_job, sdir / "logs", power_off=fence)
        if not args.teardown:  # a teardown still closes what the journal holds
            _check_allocation(backend, args.slurm_job)
    else:
        backend = LocalBackend(sdir / "logs", use_cgroups=not args.no_cgroups)
    actuator = Actuator(KafkaBus(cfg), ActuatorOptions(job=job, key=key, signer=signer,
                                             trusted=trusted, state_dir=sdir,
                                             launch=args.launch, max_age_s=args.max_age_s,
                                             watch_s=args.watch_s),
                        backend)
    if args.teardown:
        for item in asyncio.run(actuator.teardown()):
            print(f"released: {item}")
        return 0
    metrics.serve(args.metrics_port, args.metrics_addr)
    run_until_stopped(actuator.run)
    return 0


def _check_allocation(backend: SlurmBackend, job_id: int) -> None:
    """Fail at start, in one line, when Slurm cannot be asked or lists no such job (a wrong
    ``--slurm-job``, or one gone longer than ``MinJobAge``). An allocation that ended but is
    still listed is let through: the actuator says ``job.ended`` for it, once."""
    from trainguard.events.payloads import SchedulerEnd

    try:
        end = backend.job_end()
    except OSError as exc:
        raise SystemExit(f"trainguard actuator: --slurm-job {job_id}: {exc}") from None
    if end is not None and end.end is SchedulerEnd.GONE:
        raise SystemExit(f"trainguard actuator: --slurm-job {job_id}: Slurm lists no such job "
                         "(never submitted, or ended longer ago than its MinJobAge)")
