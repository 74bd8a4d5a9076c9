"""`trainguard demo`: the whole loop, as far as it is built, on embedded defaults."""

from __future__ import annotations

import argparse
import json
import time

from trainguard.bus.config import KafkaConfig
from trainguard.dev.kafka import KafkaBroker


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="start a local broker and run the demo loop")
    demo.add_argument("--keep-broker", action="store_true",
                      help="leave the dev broker running afterwards")
    demo.add_argument("--seconds", type=float, default=14.0, help="how long the job runs")
    demo.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from trainguard.demo.contract_tour import run
    from trainguard.demo.loop import run_demo, summarise

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
        loop_cfg = KafkaConfig(bootstrap=info.bootstrap, topic_prefix=f"{cfg.topic_prefix}l",
                               client_id="trainguard-demo")
        summarise(run_demo(loop_cfg, seconds=args.seconds))
    finally:
        if not was_running and not args.keep_broker:
            broker.stop()
    return 0
