"""Incident timelines: one time axis, tracks (task, network, GPU, resources, actions,
detection), the four questions answered; text, JSON, Markdown and self-contained HTML."""

from trainguard.timeline.build import build_timeline
from trainguard.timeline.model import QUESTIONS, TRACKS, Answer, Mark, Timeline
from trainguard.timeline.render import FORMATS, render

__all__ = ["FORMATS", "QUESTIONS", "TRACKS", "Answer", "Mark", "Timeline", "build_timeline",
           "render"]
