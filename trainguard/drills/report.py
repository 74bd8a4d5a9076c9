"""Reports of a drill run: per scenario, Markdown and HTML with the preconditions, the
injection, the expected state, the actual evidence (event ids and times), the recovery action,
the conclusion, the recovery times with the conditions they depend on (observations, not an
SLA) and the incident timeline; and a run index with the combinations not yet verified.

Rendering is pure (``scenario_markdown`` / ``scenario_html`` from loaded values);
``write_reports`` reads the run directory and writes the files."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainguard.drills.evidence.evaluate import Evaluation
from trainguard.drills.evidence.model import Check
from trainguard.drills.scenario import FAULT_KINDS, Scenario, ScenarioError
from trainguard.events.clock import to_iso
from trainguard.events.envelope import Event
from trainguard.events.payloads import Command, CommandOutcome, Injection

NOT_YET = (
    "latency and jitter on the job's own path (no netem here; Toxiproxy cannot sit inside "
    "gloo's mesh): checked at the injector level only",
    "real multi-host node loss (here a node is a labelled group of CPU units on one machine, "
    "and its node agent stays up)",
    "NCCL on GPUs (here: gloo on CPU)",
    "two faults at once, or a fault during a recovery",
    "no spare left (spares = 0), and a world size other than the drill job's (4 ranks)",
)


def _ids(c: Check, n: int = 4) -> str:
    pairs = list(zip(c.event_ids, c.times, strict=False))[:n]
    more = f" (+{len(c.event_ids) - n})" if len(c.event_ids) > n else ""
    return ", ".join(f"`{i[:12]}` @ {to_iso(t)}" for i, t in pairs) + more


def _conditions(archive: Mapping[str, Any], job: Mapping[str, Any]) -> list[str]:
    rec = archive.get("recovery", {})
    return [f"checkpoint size: {rec.get('checkpoint_bytes')} bytes (the model: a 3-layer MLP)",
            f"checkpoint interval: every {job.get('ckpt_every')} steps "
            f"(keep {job.get('keep')})",
            f"spares: {job.get('spares')}; world size {job.get('world')}; "
            f"step floor {job.get('step_ms')} ms; collective timeout {job.get('timeout_s')} s",
            "machine: 2 shared CPU cores, many other processes (load varies): times are "
            "observations of this run, not an SLA"]


def _actions(events: Sequence[Event]) -> list[str]:
    out = []
    for e in events:
        p = e.payload
        if isinstance(p, Command):
            out.append(f"{to_iso(e.event_time)} command {p.action.value} (tier {p.tier}) "
                       f"params {dict(p.params)} `{e.event_id[:12]}`")
        elif isinstance(p, CommandOutcome) and p.status.value != "accepted":
            out.append(f"{to_iso(e.event_time)} outcome {p.action.value}: {p.status.value} — "
                       f"{p.detail[:200]} `{e.event_id[:12]}`")
    return out


def _injections(events: Sequence[Event]) -> list[str]:
    return [f"{to_iso(e.event_time)} {e.payload.fault}/{e.payload.phase} "
            f"{e.payload.target or ''} {dict(e.payload.params)} `{e.event_id[:12]}`"
            for e in events if isinstance(e.payload, Injection)]


def scenario_markdown(s: Scenario, ev: Evaluation, archive: Mapping[str, Any],
                      events: Sequence[Event], job: Mapping[str, Any]) -> str:
    L: list[str] = [f"# Drill {s.name}: {s.title}", "",
                    f"**Conclusion: {ev.conclusion.value}**", ""]
    L += [f"- {r}" for r in ev.reasons] + [""]
    if archive.get("abort"):
        L += [f"Drill aborted: {archive['abort']}", ""]
    p = s.preconditions
    L += ["## Preconditions", "", f"- every rank stepping: {p.steady_steps} steps at one epoch",
          f"- checkpoints written: >= {p.checkpoints}; spares: >= {p.spares}",
          f"- job {archive.get('task', {}).get('job_id')} frozen at "
          f"{archive.get('data', {}).get('read_position')}; code "
          f"{archive.get('task', {}).get('code_version', {}).get('commit')}"
          f" (dirty: {archive.get('task', {}).get('code_version', {}).get('dirty')})", "",
          "## Injection", "", f"Round {s.round}: `{s.fault.kind}` on {s.fault.target or '-'} "
          f"with {dict(s.fault.params)}, held {s.duration_s:g} s; rollback "
          f"`{s.rollback.action}`." + (f" Trigger: `{s.trigger.kind}` on {s.trigger.target}."
                                       if s.trigger else ""), ""]
    L += [f"- {x}" for x in _injections(events)] + [""]
    e = s.expect
    kinds = [str(v) for v in e.verdicts]
    L += ["## Expected state", "", f"- verdicts: {kinds or 'none'}; actions: "
          f"{list(e.actions) or 'none'}; resumed: {e.resumed}; incident: {e.incident}"
          + ("; a corrupt checkpoint reported" if e.checkpoint_corrupt else ""), ""]
    L += ["## Evidence", "", "| kind | check | result | detail | events |", "|---|---|---|---|---|"]
    for c in ev.checks:
        L.append(f"| {c.kind} | {c.name} | {c.status.value} | "
                 f"{c.detail.replace('|', '/')} | {_ids(c)} |")
    L += ["", "| expectation | result | detail | events |", "|---|---|---|---|"]
    for c in ev.expectations:
        L.append(f"| {c.name} | {c.status.value} | {c.detail.replace('|', '/')} | {_ids(c)} |")
    L += ["", "## Recovery action", ""]
    L += [f"- {a}" for a in _actions(events)] or ["- none"]
    L += ["", "## Recovery times (observations, not an SLA)", ""]
    L += [f"- {k}: {v}" for k, v in ev.timings.items()]
    L += ["", "Conditions they depend on:", ""] + [f"- {c}" for c in _conditions(archive, job)]
    resp = archive.get("responsibility", {})
    L += ["", "## Responsibility", ""] + [f"- {k}: {v}" for k, v in resp.items()]
    L += ["", f"Reproduce: `trainguard drill verify {archive.get('run_id')}` recomputes this "
          "conclusion from the recorded log (`events.jsonl`) and archives.", ""]
    return "\n".join(L)


def _md_to_html(markdown: str, verdict_colour: str) -> str:
    """The small Markdown subset the reports use: headings, tables, lists, paragraphs."""
    out: list[str] = []
    block: str | None = None

    def close() -> None:
        nonlocal block
        if block:
            out.append(f"</{block}>")
        block = None

    for line in markdown.splitlines():
        if line.startswith("|---"):
            continue
        kind = "table" if line.startswith("| ") else "ul" if line.startswith("- ") else None
        if kind != block:
            close()
            if kind:
                out.append(f"<{kind}>")
                block = kind
        if line.startswith("# "):
            out.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("## "):
            out.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif kind == "table":
            cells = [html.escape(c.strip()) for c in line.strip().strip("|").split(" | ")]
            tag = "th" if cells and cells[0] in ("kind", "expectation") else "td"
            bad = ' class="bad"' if any(c in ("fail", "unexplained") for c in cells) else ""
            out.append(f"<tr{bad}>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>")
        elif kind == "ul":
            out.append(f"<li>{html.escape(line[2:])}</li>")
        elif line.startswith("**Conclusion: "):
            text = line[len("**Conclusion: "):].rstrip("*")
            out.append(f'<p class="verdict" style="background:{verdict_colour}">'
                       f"{html.escape(text)}</p>")
        elif line.strip():
            out.append(f"<p>{html.escape(line)}</p>")
    close()
    return "\n".join(out)


def scenario_html(title: str, ev: Evaluation, markdown: str, timelines: Sequence[str]) -> str:
    colour = {"recovered automatically": "#1a7f37", "retest": "#9a6700"}.get(
        ev.conclusion.value, "#cf222e")
    frames = "".join(f'<h2>Incident timeline</h2><iframe srcdoc="{html.escape(t)}" '
                     'style="width:100%;height:520px;border:1px solid #ccc"></iframe>'
                     for t in timelines) or "<h2>Incident timeline</h2><p>no incident</p>"
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto}"
             "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
             "padding:3px 6px;vertical-align:top}tr.bad td{background:#ffebe9}"
             ".verdict{color:white;padding:8px 14px;font-size:20px;display:inline-block}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>"
            f"{html.escape(title)}</title><style>{style}</style></head><body>"
            + _md_to_html(markdown, colour) + frames + "</body></html>\n")


def index_markdown(run_id: str, rows: Sequence[tuple[str, str, str]],
                   not_run: Mapping[str, str], kinds_run: Sequence[str] = ()) -> str:
    L = [f"# Drill run {run_id}", "", "| scenario | round | conclusion |", "|---|---|---|"]
    L += [f"| [{n}]({n}/report.md) | {r} | {c} |" for n, r, c in rows]
    L += ["", "## Combinations not yet verified", ""]
    L += [f"- scenario {n}: {why}" for n, why in sorted(not_run.items())]
    L += [f"- {x}" for x in NOT_YET]
    L += [f"- fault kind `{k}`: not run in this run" for k in FAULT_KINDS
          if k not in kinds_run]
    return "\n".join(L) + "\n"


def _timelines(events: Sequence[Event], job_id: str) -> list[str]:
    try:
        from trainguard.incidents.query import incident_views
        from trainguard.timeline import build_timeline, render
    except ImportError:
        return []
    out = []
    for v in incident_views(list(events), job=job_id):
        out.append(render(build_timeline(v.incident, list(events)), "html"))
    return out


def write_reports(run_dir: Path) -> list[Path]:
    from trainguard.drills.runner import recorded_events, recorded_scenario

    meta = json.loads((run_dir / "run.json").read_text())
    kinds: list[str] = []
    written: list[Path] = []
    rows: list[tuple[str, str, str]] = []
    not_run: dict[str, str] = {}
    for name, info in sorted(meta["scenarios"].items()):
        if info.get("conclusion") is None:
            not_run[name] = info.get("not_run", "not run")
            continue
        sdir = run_dir / name
        try:
            s = recorded_scenario(sdir, name, info["source"])
        except ScenarioError as exc:
            not_run[name] = f"scenario unreadable: {exc}"
            continue
        ev = Evaluation.from_dict(json.loads((sdir / "evaluation.json").read_text()))
        archive = json.loads((sdir / "archive.json").read_text())
        events = recorded_events(sdir, archive)
        kinds.append(s.fault.kind)
        md = scenario_markdown(s, ev, archive, events, meta.get("job", {}))
        (sdir / "report.md").write_text(md)
        tls = _timelines(events, info.get("job_id", ""))
        (sdir / "report.html").write_text(scenario_html(f"Drill {name}", ev, md, tls))
        written += [sdir / "report.md", sdir / "report.html"]
        rows.append((name, str(s.round), ev.conclusion.value))
    (run_dir / "report.md").write_text(index_markdown(meta["run_id"], rows, not_run, kinds))
    written.append(run_dir / "report.md")
    return written
