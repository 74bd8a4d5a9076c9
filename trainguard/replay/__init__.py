"""Replay and what-if: re-run the rules and the incident fold over a recorded log and compare
with what was recorded (see docs/incidents.md, "Replay")."""

from trainguard.replay.diff import IncidentChange, IncidentDiff, VerdictDiff
from trainguard.replay.run import ReplayResult, replay_log
from trainguard.replay.window import Window, parse_when

__all__ = ["IncidentChange", "IncidentDiff", "ReplayResult", "VerdictDiff", "Window",
           "parse_when", "replay_log"]
