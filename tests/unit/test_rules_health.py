"""Hardware outlier, data starvation and training health: fires, does not fire, resolves."""

from __future__ import annotations

import pytest

from tests.unit.rules_support import T0, S, kinds, run
from trainguard.events.envelope import Event
from trainguard.events.payloads import CheckpointAction, Verdict
from trainguard.rules.synth import checkpoint, gpu, step_report, telemetry

pytestmark = pytest.mark.unit


def fleet(i: int, hot_gpu: bool) -> list[Event]:
    out = []
    for n in range(2):
        gpus = []
        for g in range(8):
            temp = 62.0 + g % 3 + n
            if hot_gpu and n == 1 and g == 5:
                temp = 84.0
            gpus.append(gpu(g, temp=temp, power=400.0 + g, clock=1980.0 - g * 5, util=95.0))
        out.append(telemetry("j", f"n{n}", T0 + i * 10 * S + n, i, gpus))
    return out


def test_hw_outlier_fires_on_the_gpu_and_resolves() -> None:
    events = [e for i in range(6) for e in fleet(i, hot_gpu=True)]
    events += [e for i in range(6, 10) for e in fleet(i, hot_gpu=False)]
    out = run(events)
    assert kinds(out) == [("hw_outlier", "open"), ("hw_outlier", "resolved")]
    assert (out[0].subject.node, out[0].subject.gpu) == ("n1", 5)
    ev = out[0].payload.evidence if isinstance(out[0].payload, Verdict) else {}
    assert ev["metrics"] == ["temperature_c"]
    assert isinstance(ev["temperature_c_z"], float) and ev["temperature_c_z"] > 3.5


def test_hw_outlier_quiet_on_a_uniform_fleet_and_idle_gpus() -> None:
    events = [e for i in range(10) for e in fleet(i, hot_gpu=False)]
    # an idle GPU is cool and slow clocked: not comparable, not an outlier
    events.append(telemetry("j", "n9", T0 + 55 * S, 1, [gpu(0, temp=35.0, clock=300.0,
                                                          util=0.0)]))
    assert kinds(run(events)) == []


def _steps(share: float, first: int, n: int) -> list[Event]:
    wait = 500.0 * share / (1 - share)
    return [step_report("j", r, s, T0 + s * S + r, 500.0, world=4, data_wait_ms=wait,
                        step_ms=500.0 + wait)
            for s in range(first, first + n) for r in range(4)]


def test_data_starvation_located_at_data_source() -> None:
    events = _steps(0.05, 0, 10) + _steps(0.5, 10, 10) + _steps(0.02, 20, 10)
    out = run(events)
    assert kinds(out) == [("data_starvation", "open"), ("data_starvation", "resolved")]
    assert out[0].subject.unit == "data-source"


def test_data_starvation_needs_idle_gpus_when_known() -> None:
    busy = [telemetry("j", "n0", T0, 1, [gpu(g, util=97.0) for g in range(4)])]
    assert kinds(run(busy + _steps(0.5, 0, 20))) == []
    assert kinds(run(_steps(0.1, 0, 20))) == []


def _loss_run(first: int, n: int, loss: float, t0: int) -> list[Event]:
    return [step_report("j", 0, s, t0 + (s - first) * S, 500.0, world=1, loss=loss)
            for s in range(first, first + n)]


def test_loss_nan_carries_last_checkpoint_and_resolves() -> None:
    events = _loss_run(0, 10, 2.0, T0)
    events.append(checkpoint("j", CheckpointAction.WRITTEN, 8, T0 + 8 * S + 1))
    events += _loss_run(10, 2, float("nan"), T0 + 10 * S)
    events += _loss_run(12, 25, 2.0, T0 + 12 * S)
    out = run(events)
    assert kinds(out) == [("loss_nonfinite", "open"), ("loss_nonfinite", "resolved")]
    ev = out[0].payload.evidence if isinstance(out[0].payload, Verdict) else {}
    assert (ev["last_checkpoint_step"], ev["last_checkpoint_path"]) == (8, "/ckpt/step-8")
    assert ev["loss"] == "nan"


def test_loss_spike_after_resume() -> None:
    events = _loss_run(0, 60, 2.0, T0)
    events.append(checkpoint("j", CheckpointAction.LOADED, 50, T0 + 61 * S))
    events += _loss_run(51, 10, 6.0, T0 + 62 * S)
    events += _loss_run(61, 30, 2.1, T0 + 72 * S)
    out = run(events)
    assert kinds(out) == [("loss_spike_after_resume", "open"),
                          ("loss_spike_after_resume", "resolved")]
    ev = out[0].payload.evidence if isinstance(out[0].payload, Verdict) else {}
    assert ev["last_checkpoint_step"] == 50 and ev["baseline_loss"] == 2.0


def test_no_spike_without_resume_or_when_brief() -> None:
    events = _loss_run(0, 60, 2.0, T0)
    events.append(checkpoint("j", CheckpointAction.LOADED, 50, T0 + 61 * S))
    events += _loss_run(51, 3, 6.0, T0 + 62 * S)  # 3 < sustain 5
    events += _loss_run(54, 30, 2.0, T0 + 65 * S)
    assert kinds(run(events)) == []
    assert kinds(run(_loss_run(0, 30, 2.0, T0) + _loss_run(30, 10, 6.0, T0 + 30 * S))) == []
