"""Pure helpers of the process collector: wait statuses, /proc stat, psutil states."""

from __future__ import annotations

import os
import signal

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.collectors.process import (
    map_status,
    parse_stat_exit_code,
    split_returncode,
    split_wait_status,
)
from trainguard.events.payloads import ProcessState


def _stat_line(comm: str, exit_status: int) -> str:
    # Fields 3..52 after the comm: state, then 48 numbers, the last being exit_code.
    rest = ["Z"] + ["0"] * 48 + [str(exit_status)]
    return f"4242 ({comm}) " + " ".join(rest) + "\n"


def test_stat_exit_code_is_field_52_even_with_odd_comm() -> None:
    assert parse_stat_exit_code(_stat_line("python", 3 << 8)) == 3 << 8
    assert parse_stat_exit_code(_stat_line("a) (b c", 9)) == 9
    assert parse_stat_exit_code("4242 (python) Z 1 2 3") is None  # Linux < 3.5
    assert parse_stat_exit_code("garbage") is None


@given(st.text(max_size=300))
def test_stat_parser_never_raises(text: str) -> None:
    parse_stat_exit_code(text)


def test_wait_status_split() -> None:
    assert split_wait_status(3 << 8) == (3, None)
    assert split_wait_status(0) == (0, None)
    assert split_wait_status(signal.SIGKILL) == (None, 9)
    assert split_wait_status(signal.SIGSEGV | 0x80) == (None, signal.SIGSEGV)  # core dumped
    assert split_wait_status(0x137F) == (None, None)  # stopped: not an exit
    assert os.WIFSTOPPED(0x137F)


def test_returncode_split() -> None:
    assert split_returncode(3) == (3, None)
    assert split_returncode(-9) == (None, 9)


def test_status_mapping() -> None:
    assert map_status(psutil.STATUS_STOPPED) is ProcessState.STOPPED
    assert map_status(psutil.STATUS_TRACING_STOP) is ProcessState.STOPPED
    assert map_status(psutil.STATUS_ZOMBIE) is ProcessState.ZOMBIE
    assert map_status(psutil.STATUS_DISK_SLEEP) is ProcessState.SLEEPING
    assert map_status(psutil.STATUS_RUNNING) is ProcessState.RUNNING
    assert map_status("something-new") is ProcessState.UNKNOWN


def test_it_is_a_collector() -> None:
    from trainguard.collectors.base import Collector
    from trainguard.collectors.process import ProcessCollector

    c: Collector = ProcessCollector("node-a")
    assert c.name == "process"
    assert c.collect(1).processes == []


@pytest.mark.parametrize("env,gpu", [
    ({"CUDA_VISIBLE_DEVICES": "3"}, 3),
    ({"CUDA_VISIBLE_DEVICES": "3", "LOCAL_RANK": "1"}, 3),
    ({"CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_RANK": "1"}, None),
    ({"CUDA_VISIBLE_DEVICES": "GPU-4a2b"}, None),
    ({"LOCAL_RANK": "5"}, 5),
    ({"LOCAL_RANK": "-1"}, None),
    ({}, None),
])
def test_gpu_of_a_rank_from_its_environment(env: dict[str, str], gpu: int | None) -> None:
    from trainguard.collectors.process import gpu_of

    assert gpu_of(env) == gpu
