"""`trainguard decide`: the decision service — verdicts in, signed commands out."""

from __future__ import annotations

import argparse

from trainguard.cli.common import (
    add_kafka_args,
    check_ids,
    input_file,
    kafka_config,
    run_until_stopped,
)
from trainguard.cli.flags import renamed


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("decide", help="run the remediation policy: verdicts -> signed commands")
    add_kafka_args(p)
    renamed(p, p.add_argument("--command-key", type=input_file, help="Ed25519 command signing "
                              "key (default $TRAINGUARD_COMMAND_KEY_FILE, else "
                              "$TRAINGUARD_COMMAND_KEY)"), "--key-file")
    p.add_argument("--actuator-pubkeys", type=input_file, help="trusted actuator public keys: "
                   "outcomes and pool events are believed only when signed by one (default "
                   "$TRAINGUARD_ACTUATOR_PUBKEYS_FILE, else $TRAINGUARD_ACTUATOR_PUBKEYS)")
    p.add_argument("--command-pubkey", type=input_file, help="decide's earlier public keys, still "
                   "trusted when reading its own commands back after a key rotation (default "
                   "$TRAINGUARD_COMMAND_PUBKEY_FILE, else $TRAINGUARD_COMMAND_PUBKEY; optional)")
    renamed(p, p.add_argument("--job-id", action="append", help="only this job (repeatable; "
                              "default: every job)"), "--job")
    p.add_argument("--group-id", help="run as one of several decide instances in this consumer "
                   "group (named <prefix>-decide...): each is active for the jobs whose "
                   "commands partition it holds and a standby for the rest, taking them over "
                   "when the other stops or dies (default: one instance, active for every job)")
    p.add_argument("--window-s", type=float, default=5.0,
                   help="one policy window, in seconds (default 5)")
    p.add_argument("--tier-windows", type=int, default=2,
                   help="windows a tier gets before the next one (M, default 2)")
    p.add_argument("--settle-s", type=float, default=1.0,
                   help="collect a job's failure verdicts this long before choosing the cause")
    p.add_argument("--backlog-settle-s", type=float, default=15.0,
                   help="hold a job's failures this long instead when a silence verdict "
                   "comes more than --backlog-lag-s after it was decided (the streams were "
                   "catching up, e.g. after a broker outage; default 15, 0: no longer)")
    p.add_argument("--backlog-lag-s", type=float, default=5.0,
                   help="how late a silence verdict must come to count as from a backlog "
                   "(default 5)")
    p.add_argument("--scheduler-settle-s", type=float, default=5.0,
                   help="hold a job's failures this long instead when they are only exits "
                   "nobody accounted for (no code, signal or declaration: every rank killed by "
                   "the scheduler) or exits by SIGTERM, for the actuator's word that the "
                   "scheduler ended the job (default 5; measured: that word came 0.8 s after "
                   "the exits of an srun job, 2.6 s after a torchrun job's)")
    p.add_argument("--quota-pct", type=float,
                   help="tier-1 quota in %% of a core (default: no limit)")
    p.add_argument("--storm-restarts", type=int, default=3,
                   help="restarts without checkpoint progress that stop remediation (N)")
    p.add_argument("--storm-window-s", type=float, default=600.0, help="... within (T)")
    p.add_argument("--outcome-timeout-s", type=float, default=180.0,
                   help="escalate when a command has no final outcome after this")
    p.add_argument("--checkpoint-wait-s", type=float, default=30.0,
                   help="before migrating a straggler, ask the job to save and wait this long "
                        "for the checkpoint (0: migrate at once; default 30)")
    p.add_argument("--metrics-port", type=int, default=0, help="port for /metrics (0: none)")
    p.add_argument("--metrics-addr", default="127.0.0.1", help="address for /metrics")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from trainguard.actuators import metrics
    from trainguard.actuators.decider import Decider, DeciderOptions
    from trainguard.actuators.policy import PolicyConfig
    from trainguard.actuators.signing import (
        KeySet,
        SigningKeyError,
        has_command_pubkey,
        load_actuator_pubkeys,
        load_command_pubkey,
        load_key,
    )
    from trainguard.bus.kafka import KafkaBus

    try:
        key = load_key(key_file=args.command_key)
        actuators = load_actuator_pubkeys(key_file=args.actuator_pubkeys)
        previous = KeySet()
        if args.command_pubkey is not None or has_command_pubkey():
            previous = load_command_pubkey(key_file=args.command_pubkey)
        pol = PolicyConfig(window_s=args.window_s, tier_windows=args.tier_windows,
                           settle_s=args.settle_s, quota_pct=args.quota_pct,
                           backlog_settle_s=args.backlog_settle_s,
                           backlog_lag_s=args.backlog_lag_s,
                           scheduler_settle_s=args.scheduler_settle_s,
                           storm_restarts=args.storm_restarts,
                           storm_window_s=args.storm_window_s,
                           outcome_timeout_s=args.outcome_timeout_s,
                           checkpoint_wait_s=args.checkpoint_wait_s)
    except (SigningKeyError, ValueError) as exc:
        raise SystemExit(f"trainguard decide: {exc}") from None
    for job in args.job_id or ():
        check_ids(job_id=job)
    cfg = kafka_config(args, client_id="trainguard-decide")
    metrics.serve(args.metrics_port, args.metrics_addr)
    decider = Decider(KafkaBus(cfg), DeciderOptions(key=key, actuators=actuators,
                                                    previous=previous, policy=pol,
                                                    group_id=args.group_id,
                                          jobs=frozenset(args.job_id) if args.job_id else None))
    run_until_stopped(decider.run)
    return 0
