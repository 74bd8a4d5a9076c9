"""Codec rate: encode and decode (with full validation) of the two hottest event types.

    .venv/bin/python -m bench.bench_codec

Decoders side by side, per record (µs) and per second:
- ``decode``: what the edge runs: pydantic's ``validate_json`` on the bytes (``codec.py``);
- ``gate+assembly``: ``fastpath.decode_fast``, the compiled msgspec gate, then the pydantic
  objects assembled from its Structs (anything the gate refuses goes to ``decode``);
- ``msgspec gate``: msgspec's strict validation into the Structs compiled from the registry,
  without building the pydantic objects (what the edge would cost if consumers read Structs);
- ``orjson.loads``: parsing with no validation at all, the floor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from bench._common import median_rate
from trainguard.events import Subject, decode, encode, fastpath, make_event
from trainguard.events import payloads as p
from trainguard.events.samples import sample_events

N = 20_000


def node_record(gpus: int = 8) -> bytes:
    base = next(e for e in sample_events() if e.type == "telemetry.node")
    tele = base.payload
    assert isinstance(tele, p.NodeTelemetry)
    batch = tele.model_copy(update={
        "gpus": [tele.gpus[0].model_copy(update={"index": i}) for i in range(gpus)],
        "processes": [tele.processes[0].model_copy(update={"rank": i, "pid": 1000 + i})
                      for i in range(gpus)],
    })
    return encode(make_event(batch, event_id="benchnode01", job_id="job-bench",
                             event_time=base.event_time, source="bench",
                             subject=Subject(node="node-0")))


def _times(fn: Callable[[Any], object], arg: Any) -> Callable[[], int]:
    def run() -> int:
        for _ in range(N):
            fn(arg)  # results are dropped at once: no GC pressure from kept objects
        return N

    return run


def main() -> None:
    step_raw = encode(next(e for e in sample_events() if e.type == "step.report"))
    node_raw = node_record()
    cases = (("step.report", step_raw, 1), ("telemetry.node x8 GPU", node_raw, 8))
    decoders: tuple[tuple[str, Callable[[Any], object]], ...] = (
        ("decode", decode), ("gate+assembly", fastpath.decode_fast),
        ("msgspec gate", fastpath.decode_struct), ("orjson.loads", orjson.loads))
    for name, raw, samples in cases:
        ev = decode(raw)
        assert fastpath.decode_fast(raw) == ev
        enc = median_rate(_times(encode, ev))
        rates = {label: median_rate(_times(fn, raw)) for label, fn in decoders}
        dec = rates["decode"]
        print(f"{name:24s} {len(raw):5d} B  decode+validate {dec:10,.0f}/s "
              f"({dec * samples:12,.0f} samples/s)  encode {enc:10,.0f}/s  "
              f"raw orjson.loads {rates['orjson.loads']:10,.0f}/s  "
              f"validate cost ratio {dec / rates['orjson.loads']:.2f}")
        print("    " + "  ".join(f"{label} {1e6 / rate:6.1f} µs" for label, rate in rates.items())
              + f"  gate+assembly/decode speed-up {rates['gate+assembly'] / dec:.2f}x"
              + f"  gate/decode {rates['msgspec gate'] / dec:.2f}x")


if __name__ == "__main__":
    main()
