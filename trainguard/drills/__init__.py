"""Fault drills: scenarios as files, real injections, a frozen baseline, evidence computed from
the event log, a conclusion per scenario, and a report another engineer can re-derive.

See docs/drills.md (the runbook)."""
