"""One realistic example of every event type: for the docs, the demo and contract tests."""

from __future__ import annotations

from trainguard.events import payloads as p
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id

T0 = 1_790_000_000_000_000  # 2026-09-21T14:13:20Z, in µs


def sample_events(job_id: str = "job-demo", t0: int = T0) -> list[Event]:
    verdict_id = derived_id("straggler", job_id, 3, t0)
    cmd_id = derived_id("command", verdict_id, "raise_quota")
    payloads: list[tuple[p.Payload, Subject, str]] = [
        (p.NodeTelemetry(
            interval_ms=1000, seq=41,
            gpus=[p.GpuSample(index=0, uuid="GPU-0a1b", model="NVIDIA H100 80GB HBM3",
                              temperature_c=61, power_w=512.3, power_limit_w=700,
                              sm_util_pct=97, fb_used_mib=61234, fb_total_mib=81559,
                              throttle_reasons=["sw_power_cap"], xids=[])],
            nics=[p.NicSample(name="eth0", operstate="up", carrier=True, carrier_changes=2,
                              rx_bytes=10_000, tx_bytes=20_000, rx_bytes_per_s=1.2e9)],
            paths=[p.PeerPath(peer="10.0.0.2", rtt_ms=0.21, retransmits=0)],
            processes=[p.ProcessSample(pid=4242, rank=3, job_id=job_id,
                                       state=p.ProcessState.RUNNING, cpu_pct=98.5,
                                       rss_bytes=3_221_225_472, threads=24)]),
         Subject(node="node-a"), "agent@node-a"),
        (p.NodeHealth(kind=p.NodeHealthKind.XID, code=79, device="0000:3b:00",
                      message="NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."),
         Subject(node="node-a", gpu=0), "agent@node-a"),
        (p.StepReport(rank=3, world_size=4, dp_rank=3, pp_stage=0, tp_rank=0, binding_epoch=1,
                      step=120, samples_consumed=3840, shard_offset=960, compute_ms=182.5,
                      comm_ms=20.1, data_wait_ms=1.5, step_ms=205.0, loss=2.31, pid=4242),
         Subject(node="node-a", rank=3), "sdk@node-a"),
        (p.Heartbeat(rank=3, binding_epoch=1, step=120, phase="checkpoint", pid=4242),
         Subject(node="node-a", rank=3), "sdk@node-a"),
        (p.ProcessExit(pid=4242, rank=3, binding_epoch=1, exit_code=None, signal=9,
                       detected_by="pidfd"),
         Subject(node="node-a", rank=3), "agent@node-a"),
        (p.ProcessDeparture(rank=2, binding_epoch=1, pid=4241, cause=p.DepartureCause.PEER_LOST,
                            exit_code=3, reason="lost a peer at step 101: Connection closed by "
                            "peer"),
         Subject(node="node-a", rank=2), "agent@node-a"),
        (p.CheckpointEvent(action=p.CheckpointAction.WRITTEN, step=100, samples_consumed=3200,
                           path="/data/ckpt/job-demo/step-100", sha256="0" * 64,
                           size_bytes=1_048_576, write_ms=84.0),
         Subject(rank=0), "sdk@node-a"),
        (p.Verdict(verdict_id=verdict_id, rule="straggler", kind=p.VerdictKind.STRAGGLER,
                   state=p.VerdictState.OPEN, severity=p.Severity.WARNING,
                   first_anomalous_time=t0 - 5_000_000, decided_time=t0,
                   evidence={"rank_value_ms": 310.0, "peer_median_ms": 182.0, "ratio": 1.7,
                             "windows_sustained": 3, "samples": 40},
                   rules_version="r1"),
         Subject(node="node-a", rank=3), "streams"),
        (p.Command(command_id=cmd_id, idempotency_key=cmd_id, action=p.CommandAction.RAISE_QUOTA,
                   tier=1, issued_at=t0, issued_by="decider", cause_verdict_ids=[verdict_id],
                   params=p.RaiseQuotaParams(rank=3, unit="cpuset-3", quota_pct=200,
                                             reason="straggler")),
         Subject(rank=3, unit="cpuset-3"), "decider"),
        (p.CommandOutcome(command_id=cmd_id, idempotency_key=cmd_id,
                          action=p.CommandAction.RAISE_QUOTA, status=p.OutcomeStatus.DONE,
                          started_at=t0 + 1000, finished_at=t0 + 21_000,
                          data=p.RaiseQuotaData(unit="cpuset-3", quota_pct=200)),
         Subject(rank=3, unit="cpuset-3"), "actuator@node-a"),
        (p.PoolUnit(unit="cpuset-3", state=p.UnitState.BOUND, node="node-a",
                    labels={"node": "node-a", "rack": "r1"}, rank=3, epoch=2, pid=4243,
                    command_id=cmd_id, resources={"cpus": "6-7", "cpu_quota_pct": 100}),
         Subject(node="node-a", rank=3, unit="cpuset-3"), "actuator@node-a"),
        (p.ReplicaRefused(rank=3, stale_epoch=1, current_epoch=2, pid=4242, action="killed",
                          reason="step report from epoch 1 after rank 3 was rebound"),
         Subject(node="node-a", rank=3), "actuator@node-a"),
        (p.JobEnded(end=p.SchedulerEnd.TIMEOUT, allocation="slurm:42", state="TIMEOUT",
                    reason="TimeLimit"),
         Subject(), "actuator@head"),
        (p.Injection(drill_id="drill-1", scenario="worker-exit", fault="sigkill", phase="start",
                     target="rank-3", params={"signal": 9}),
         Subject(rank=3), "drill"),
        (p.IncidentTransition(incident_id=derived_id("incident", verdict_id), seq=0,
                              from_state=None, to_state=p.IncidentState.DETECTED,
                              reason="straggler verdict", cause_event_ids=[verdict_id]),
         Subject(rank=3), "incidents"),
    ]
    return [
        make_event(payload, event_id=derived_id("sample", job_id, i), job_id=job_id,
                   event_time=t0 + i * 1000, source=source, subject=subject)
        for i, (payload, subject, source) in enumerate(payloads)
    ]
