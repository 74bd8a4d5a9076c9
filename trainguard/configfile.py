"""Reading the files an operator writes (rule files, job specs, alerts configs, drill scenarios):
bytes -> strict UTF-8 text -> YAML, every failure a ONE-line message naming the file.

Each loader turns :class:`ConfigFileError` into its own error type; its validators use the
small checks below so that "finite and in range" and "text is text" mean the same everywhere.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

MAX_SHOWN = 80  # a value in a message is cut to this many characters


class ConfigFileError(ValueError):
    """A config file cannot be read or parsed; the message is one line naming the file."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) as one space."""
    return " ".join(text.split())


def show(value: Any) -> str:
    """``repr(value)`` on one line, cut to :data:`MAX_SHOWN` characters."""
    text = one_line(repr(value))
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN - 3] + "..."


def read_text(path: Path) -> str:
    """The file's text, decoded as strict UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigFileError(str(path), f"cannot read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigFileError(str(path), f"not valid UTF-8 (line {line}, byte {exc.start}: "
                                  f"{data[exc.start:exc.start + 1]!r})") from None


def parse_yaml(text: str, where: str) -> Any:
    """``text`` parsed as YAML (safe loader), with every string checked to be valid text."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigFileError(where, f"not YAML: {_yaml_reason(exc)}") from None
    except RecursionError:
        raise ConfigFileError(where, "not YAML: nested too deeply") from None
    check_text(doc, where)
    return doc


def load_yaml(path: Path) -> Any:
    return parse_yaml(read_text(path), str(path))


def _yaml_reason(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark
        at = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
        return one_line(f"{at}{exc.problem or exc.context or 'syntax error'}")
    return one_line(str(exc))


def check_text(doc: Any, where: str, path: str = "") -> None:
    """Every string (key or value) in ``doc`` is encodable text: YAML's ``"\\ud800"`` escape
    gives a lone surrogate that no UTF-8 writer (log, JSON, Kafka) accepts later."""
    if isinstance(doc, str):
        try:
            doc.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigFileError(where, f"field '{path or '(top)'}': not valid UTF-8 text "
                                         f"(got {show(doc)})") from None
    elif isinstance(doc, dict):
        for key, value in doc.items():
            check_text(key, where, path)
            check_text(value, where, f"{path}.{key}" if path else str(key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            check_text(value, where, f"{path}[{i}]")


def is_number(value: Any) -> bool:
    """An int or float, not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def finite_in(value: Any, lo: float, hi: float) -> bool:
    """A finite number within ``[lo, hi]`` (NaN and infinities never are)."""
    if not is_number(value):
        return False
    return (isinstance(value, int) or math.isfinite(value)) and lo <= value <= hi
