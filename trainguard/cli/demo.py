"""`trainguard demo`: the whole loop on a local PyTorch DDP job with injected faults, on
embedded defaults (see trainguard/demo/whole_loop.py)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from trainguard.bus.config import KafkaConfig
from trainguard.dev.kafka import KafkaBroker


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="run the whole loop on a local DDP job with faults")
    demo.add_argument("--keep-broker", action="store_true",
                      help="leave the dev broker running afterwards")
    demo.add_argument("--run-dir", type=Path,
                      help="where logs, checkpoints and timeline pages go "
                      "(default .run/demo/<time>)")
    demo.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from trainguard.demo.contract_tour import run
    from trainguard.demo.whole_loop import DemoError, default_run_dir, run_whole_loop

    broker = KafkaBroker()
    was_running = broker.running() is not None
    info = broker.start()
    print(f"[demo] Kafka {info.version} at {info.bootstrap} (state {info.state_dir})")
    cfg = KafkaConfig(bootstrap=info.bootstrap, topic_prefix=f"demo{int(time.time())}",
                      client_id="trainguard-demo")
    try:
        result = run(cfg)
        print("[demo] contract tour (bad input goes to the dead-letter topic):",
              json.dumps(result["dead_letters"], indent=2))
        try:
            run_whole_loop(args.run_dir or default_run_dir())
        except DemoError as exc:
            print(f"[demo] FAILED: {exc}")
            return 1
    finally:
        if not was_running and not args.keep_broker:
            broker.stop()
    return 0
