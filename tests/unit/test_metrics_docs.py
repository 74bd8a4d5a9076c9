"""docs/observability.md names every metric the service exports, with its labels."""

from __future__ import annotations

from pathlib import Path

from trainguard.metrics.registry import PipelineMetrics

DOC = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()


def test_every_exported_metric_is_documented_with_its_labels() -> None:
    metrics = PipelineMetrics()
    for family in metrics.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        rows = [line for line in DOC.splitlines() if line.startswith(f"| `{name}` |")]
        assert rows, f"{name} is not in docs/observability.md"
        labels = {lbl for s in family.samples for lbl in s.labels if lbl != "le"}
        for attr in vars(metrics).values():
            if getattr(attr, "_name", None) == family.name:
                labels |= set(attr._labelnames)
        for label in labels:
            assert f"`{label}`" in rows[0], (name, label)
