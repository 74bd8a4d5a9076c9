"""Evidence checks computed from the event log: pure functions over a list of events (plus the
baseline and what the runner found on disk), never from a green status.

``evaluate(EvidenceInput) -> Evaluation`` runs the three kinds of check (progress, resources,
results), the expectations of the scenario, the recovery timings, and the conclusion."""

from trainguard.drills.evidence.evaluate import Evaluation, EvidenceInput, evaluate
from trainguard.drills.evidence.model import Artifacts, Check, CheckpointFile, Conclusion

__all__ = ["Artifacts", "Check", "CheckpointFile", "Conclusion", "Evaluation",
           "EvidenceInput", "evaluate"]
