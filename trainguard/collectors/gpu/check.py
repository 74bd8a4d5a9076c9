"""A short NVML check for a real GPU node: ``python -m trainguard.collectors.gpu.check``.

Initialises NVML, takes ``--samples`` samples (default 3) ``--interval`` seconds apart
(default 1), prints every field of every GPU and the Xid events seen, and exits:

- 0: every GPU gave temperature, power and memory in every sample;
- 1: some GPU lacked one of those in some sample;
- 2: NVML is absent or cannot initialise (no nvidia-ml-py, no libnvidia-ml, no driver);
- 3: NVML is up but reports no GPU.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from trainguard.collectors.gpu.nvml_source import NvmlCollector, NvmlUnavailable, load_pynvml
from trainguard.events.payloads import GpuSample

EXIT_OK, EXIT_MISSING_FIELDS, EXIT_NO_NVML, EXIT_NO_GPU = 0, 1, 2, 3
REQUIRED = ("temperature_c", "power_w", "fb_used_mib", "fb_total_mib")


def missing_required(gpu: GpuSample) -> list[str]:
    return [name for name in REQUIRED if getattr(gpu, name) is None]


def _print_gpu(gpu: GpuSample, out: TextIO) -> None:
    print(f"  GPU {gpu.index}:", file=out)
    for name, value in gpu.model_dump().items():
        if name != "index":
            print(f"    {name:28} {value!r}", file=out)


def main(argv: Sequence[str] | None = None, *, nvml: Any | None = None,
         out: TextIO | None = None) -> int:
    out = out or sys.stdout
    p = argparse.ArgumentParser(prog="python -m trainguard.collectors.gpu.check",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--interval", type=float, default=1.0)
    args = p.parse_args(argv)
    try:
        binding = nvml if nvml is not None else load_pynvml()
        collector = NvmlCollector(node=socket.gethostname() or "localhost", nvml=binding)
        collector.open()
    except NvmlUnavailable as exc:
        print(f"NVML check: NVML is not available on this machine: {exc}", file=sys.stderr)
        print("NVML check: nothing to check without an NVIDIA driver and GPU (exit 2).",
              file=sys.stderr)
        return EXIT_NO_NVML
    try:
        return _run(collector, args.samples, args.interval, out)
    finally:
        collector.close()


def _run(collector: NvmlCollector, samples: int, interval: float, out: TextIO) -> int:
    n = len(collector.handles)
    print(f"NVML check: {n} GPU(s); Xid events watched on GPUs {collector.xid_registered}",
          file=out)
    if n == 0:
        print("NVML check: NVML reports no GPU", file=sys.stderr)
        return EXIT_NO_GPU
    bad: list[str] = []
    for k in range(samples):
        if k:
            time.sleep(interval)
        reading = collector.collect(time.time_ns() // 1000)
        print(f"sample {k + 1}/{samples}: {len(reading.gpus)} GPU sample(s), "
              f"malformed={reading.malformed}", file=out)
        seen = {g.index for g in reading.gpus}
        bad.extend(f"sample {k + 1}: GPU {i} gave no sample" for i in range(n) if i not in seen)
        for gpu in reading.gpus:
            _print_gpu(gpu, out)
            if miss := missing_required(gpu):
                bad.append(f"sample {k + 1}: GPU {gpu.index} has no {', '.join(miss)}")
        for ev in reading.discrete:
            print(f"  event: {ev.payload.model_dump()} subject={ev.subject.model_dump()}",
                  file=out)
    for line in bad:
        print(f"NVML check FAILED: {line}", file=sys.stderr)
    if not bad:
        print("NVML check OK: every GPU gave temperature, power and memory", file=out)
    return EXIT_MISSING_FIELDS if bad else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
