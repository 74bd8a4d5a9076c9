"""Each injector acting for real on this machine (root): signals on real processes, the cgroup
CPU controller, a loop-mounted ext4 frozen and remounted read-only, checkpoint files
corrupted on disk (and found corrupt by the checkpoint store), link faults inside network
namespaces with real TCP traffic, Toxiproxy latency. Fast: no broker, no torch."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from trainguard_sdk.checkpoint import manifest as mf
from trainguard_sdk.checkpoint.store import CheckpointStore, Invalid, Valid

from trainguard.drills.injectors.base import InjectionError
from trainguard.drills.injectors.checkpoint import CorruptNewest, corrupt_bytes
from trainguard.drills.injectors.cluster import ClusterPartition, HeadPartition
from trainguard.drills.injectors.link import LinkDown, NftLoss, TbfThrottle, ToxiLatency
from trainguard.drills.injectors.signals import Hang, NodeLoss, StopDuty, WorkerExit
from trainguard.drills.injectors.slowdown import CgroupThrottle
from trainguard.drills.injectors.storage import FsFreeze, LoopFs, ReadOnly, is_mounted
from trainguard.netlab import ToxiproxyServer, VethLab, ensure_toxiproxy_server
from trainguard.netlab.faults import wait_operstate

SPIN = "import time\nwhile True:\n    sum(range(20000))\n"


@pytest.fixture
def spinner() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen([sys.executable, "-c", SPIN])
    yield p
    if p.poll() is None:
        os.kill(p.pid, signal.SIGCONT)
        p.kill()
    p.wait(10)


def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def test_worker_exit_kills_and_says_when(spinner: subprocess.Popen[bytes]) -> None:
    before = time.time_ns() // 1000
    acted = WorkerExit(spinner.pid, "SIGKILL").inject()
    assert spinner.wait(5) == -signal.SIGKILL
    assert acted.at_us >= before and acted.params["signal"] == "SIGKILL"
    with pytest.raises(InjectionError, match="already gone"):
        WorkerExit(spinner.pid, "SIGTERM").inject()


def test_hang_stops_the_process_until_undone(spinner: subprocess.Popen[bytes]) -> None:
    h = Hang(spinner.pid)
    h.inject()
    time.sleep(0.3)
    assert psutil.Process(spinner.pid).status() == psutil.STATUS_STOPPED
    used = _cpu_s(spinner.pid)
    time.sleep(0.5)
    assert _cpu_s(spinner.pid) == used  # not one tick while stopped
    assert h.undo().params["alive"] is True
    time.sleep(0.3)
    assert psutil.Process(spinner.pid).status() != psutil.STATUS_STOPPED


def test_node_loss_kills_every_process_in_one_pass() -> None:
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
             for _ in range(3)]
    try:
        acted = NodeLoss([p.pid for p in procs], "SIGKILL", "node-b").inject()
        assert [p.wait(5) for p in procs] == [-signal.SIGKILL] * 3
        assert acted.params["pids"] == [p.pid for p in procs]
        spread = acted.params["spread_us"]
        assert isinstance(spread, int) and spread < 50_000
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_stop_duty_cycle_slows_and_always_ends_running(
        spinner: subprocess.Popen[bytes]) -> None:
    t0 = _cpu_s(spinner.pid)
    time.sleep(1.0)
    free = _cpu_s(spinner.pid) - t0
    duty = StopDuty(spinner.pid, stop_ms=150, run_ms=50)
    duty.inject()
    t1 = _cpu_s(spinner.pid)
    time.sleep(1.0)
    slowed = _cpu_s(spinner.pid) - t1
    acted = duty.undo()
    assert psutil.Process(spinner.pid).status() != psutil.STATUS_STOPPED
    cycles = acted.params["cycles"]
    assert isinstance(cycles, int) and cycles >= 3
    assert slowed < 0.6 * free, (slowed, free)


def test_cgroup_throttle_limits_cpu_and_undo_restores(spinner: subprocess.Popen[bytes]) -> None:
    th = CgroupThrottle(spinner.pid, 10, tag=f"t{os.getpid()}")
    acted = th.inject()
    group = Path(str(acted.params["cgroup"]))
    assert acted.params["cpu_quota_pct"] == 10
    time.sleep(0.3)
    t0 = _cpu_s(spinner.pid)
    time.sleep(1.5)
    used = _cpu_s(spinner.pid) - t0
    undone = th.undo()
    assert used < 0.35, f"a 10% quota let it use {used:.2f} s of CPU in 1.5 s"
    assert undone.params["restored_pct"] is None
    assert not group.exists()  # the drill's own cgroup is removed


@pytest.fixture
def loopfs(tmp_path: Path) -> Iterator[LoopFs]:
    base = Path(os.environ.get("TRAINGUARD_STATE", str(Path.home() / ".local/state")))
    root = base / f"drill-test-{os.getpid()}-{tmp_path.name}"
    with LoopFs(root / "fs.img", root / "mnt", size_mb=32) as fs:
        yield fs
    assert not is_mounted(root / "mnt") and not (root / "fs.img").exists()


def test_fsfreeze_blocks_writes_until_thawed(loopfs: LoopFs) -> None:
    target = loopfs.mountpoint / "f"
    freeze = FsFreeze(loopfs.mountpoint)
    freeze.inject()
    done = threading.Event()

    def write() -> None:
        with open(target, "wb") as fh:
            fh.write(b"x" * 4096)
            os.fsync(fh.fileno())
        done.set()

    t = threading.Thread(target=write, daemon=True)
    t.start()
    assert not done.wait(1.5), "a write went through a frozen file system"
    freeze.undo()
    assert done.wait(10), "the write did not finish after thawing"
    assert target.read_bytes() == b"x" * 4096


def test_readonly_remount_refuses_writes_until_undone(loopfs: LoopFs) -> None:
    ro = ReadOnly(loopfs.mountpoint, "readonly")
    ro.inject()
    with pytest.raises(OSError) as info:
        (loopfs.mountpoint / "g").write_text("no")
    assert info.value.errno == 30  # EROFS
    ro.undo()
    (loopfs.mountpoint / "g").write_text("yes")


def _checkpoint(root: Path, step: int) -> Path:
    d = root / f"step-{step:012d}"
    d.mkdir(parents=True)
    data = os.urandom(4096)
    (d / "state.pt").write_bytes(data)
    m = mf.Manifest(job_id="j", step=step, samples_consumed=step * 8, world_size=1,
                    created_at=1, files={"state.pt": mf.FileEntry(
                        hashlib.sha256(data).hexdigest(), len(data))})
    (d / mf.MANIFEST_NAME).write_bytes(mf.encode(m))
    return d


@pytest.mark.parametrize("mode", ["bitflip", "truncate"])
def test_corrupting_the_newest_checkpoint_is_seen_by_the_store(tmp_path: Path,
                                                               mode: str) -> None:
    _checkpoint(tmp_path, 10)
    newest = _checkpoint(tmp_path, 20)
    store = CheckpointStore(tmp_path)
    assert isinstance(store.verify(newest), Valid)
    inj = CorruptNewest(tmp_path, mode, keep_copy=True)
    acted = inj.inject()
    assert acted.params["step"] == 20 and acted.params["sha256_before"] != \
        acted.params["sha256_after"]
    bad = store.verify(newest)
    assert isinstance(bad, Invalid) and bad.committed and "state.pt" in bad.reason
    assert isinstance(store.verify(tmp_path / "step-000000000010"), Valid)
    inj.undo()
    assert isinstance(store.verify(newest), Valid)


def test_a_checkpoint_committed_after_the_corruption_is_corrupted_too(tmp_path: Path) -> None:
    """A save in flight at inject commits a newer checkpoint; the resume would find it valid
    and never see the corruption (a 2026-12-06 drill run). ``after_trigger`` corrupts it."""
    _checkpoint(tmp_path, 10)
    first = _checkpoint(tmp_path, 20)
    store = CheckpointStore(tmp_path)
    inj = CorruptNewest(tmp_path, "bitflip", keep_copy=True)
    assert inj.inject().params["step"] == 20
    assert inj.after_trigger(settle_s=0.0) == []  # nothing newer: nothing more
    later = _checkpoint(tmp_path, 30)  # the save that was writing commits
    again = inj.after_trigger(settle_s=0.0)
    assert [a.params["step"] for a in again] == [30]
    assert all(isinstance(store.verify(d), Invalid) for d in (first, later))
    assert isinstance(store.verify(tmp_path / "step-000000000010"), Valid)
    inj.undo()
    assert all(isinstance(store.verify(d), Valid) for d in (first, later))


def test_corrupt_bytes_is_exact() -> None:
    assert corrupt_bytes(b"abcd", "truncate") == (b"ab", 2)
    flipped, at = corrupt_bytes(b"abcd", "bitflip")
    assert at == 2 and flipped == b"abbd" and len(flipped) == 4
    with pytest.raises(InjectionError):
        corrupt_bytes(b"", "bitflip")


def _tcp_roundtrips(lab: VethLab, seconds: float) -> tuple[int, float]:
    """Bytes streamed from ns a to ns b in about ``seconds``: (bytes, seconds)."""
    server = lab.b.spawn_python("trainguard.netlab.traffic", "sink", "--bind", lab.addr_b,
                                "--port", "9977", "--max-seconds", "30")
    assert server.readline(20) == "ready"
    sender = lab.a.spawn_python("trainguard.netlab.traffic", "send", "--to",
                                f"{lab.addr_b}:9977", "--seconds", str(seconds))
    assert sender.readline(20) == "connected"
    import json
    result = json.loads(sender.readline(seconds + 30))
    sender.kill()
    server.kill()
    return int(result["bytes"]), float(result["seconds"])


def test_link_loss_throttle_and_flap_in_namespaces() -> None:
    with VethLab(gso_max_segs=1) as lab:
        free, _ = _tcp_roundtrips(lab, 1.0)
        loss = NftLoss(lab, 30)
        loss.inject()
        lossy, _ = _tcp_roundtrips(lab, 1.0)
        undone = loss.undo()
        seen, dropped = undone.params["packets_seen"], undone.params["packets_dropped"]
        assert isinstance(seen, int) and isinstance(dropped, int)
        assert 0 < dropped < seen
        assert lossy < free, (lossy, free)
        tbf = TbfThrottle(lab, "2mbit")
        tbf.inject()
        slow, secs = _tcp_roundtrips(lab, 2.0)
        tbf.undo()
        # 2 mbit/s = 250 kB/s on the wire; the sender also fills its socket buffer (~0.5 MB)
        assert slow / secs < 800_000 and slow < free / 4, (slow / secs, free)
        down = LinkDown(lab)
        down.inject()
        wait_operstate(lab.a, lab.dev_a, "down")
        down.undo()
        wait_operstate(lab.a, lab.dev_a, "up")
        flap = LinkDown(lab, flaps=2, hold_ms=100)
        assert flap.inject().params["flaps"] == 2
        wait_operstate(lab.a, lab.dev_a, "up")


LISTEN = ("import socket, sys, time\ns = socket.socket()\ns.bind((sys.argv[1], 9981))\n"
          "s.listen()\nprint('ready', flush=True)\ntime.sleep(120)\n")
PROBE = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], 9981), 1).close()\n"
         "    print('ok')\nexcept OSError as exc:\n    print(type(exc).__name__, exc)\n")


def _probe(prefix: list[str], addr: str) -> str:
    """A TCP connect from the side ``prefix`` runs in to ``addr``: 'ok' or the error."""
    return subprocess.run([*prefix, sys.executable, "-c", PROBE, addr], capture_output=True,
                          text=True, timeout=20).stdout.strip()


def test_partition_drops_both_ways_silently_and_undo_lifts_it() -> None:
    # a cluster node as the dev Slurm cluster makes one: a namespace whose eth0 is the peer of
    # a veth whose other end is in the root namespace
    ns, host = f"tgp-{os.getpid()}", f"tgpv{os.getpid() % 100000}"
    ip = ["ip", "netns", "exec", ns]
    listeners: list[subprocess.Popen[str]] = []
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "link", "add", host, "type", "veth", "peer", "name", "eth0",
                        "netns", ns], check=True)
        subprocess.run(["ip", "addr", "add", "10.251.9.1/30", "dev", host], check=True)
        subprocess.run(["ip", "link", "set", host, "up"], check=True)
        subprocess.run([*ip, "ip", "addr", "add", "10.251.9.2/30", "dev", "eth0"], check=True)
        subprocess.run([*ip, "ip", "link", "set", "eth0", "up"], check=True)
        for prefix, addr in (([], "10.251.9.1"), (ip, "10.251.9.2")):
            lp = subprocess.Popen([*prefix, sys.executable, "-c", LISTEN, addr],
                                  stdout=subprocess.PIPE, text=True)
            listeners.append(lp)
            assert lp.stdout is not None and lp.stdout.readline().strip() == "ready"
        both = [(ip, "10.251.9.1"), ([], "10.251.9.2")]  # node -> head, head -> node
        assert [_probe(p, a) for p, a in both] == ["ok", "ok"]
        part = ClusterPartition("n1", ns, host)
        part.inject()
        # neither way, silently: a timeout, never the sender's own stack refusing (EPERM)
        cut = [_probe(p, a) for p, a in both]
        assert all(c.startswith(("TimeoutError", "timeout")) for c in cut), cut
        assert part.undo().params["undo"] == "partition lifted"
        assert [_probe(p, a) for p, a in both] == ["ok", "ok"]
    finally:
        for lp in listeners:
            lp.kill()
        subprocess.run(["ip", "link", "del", host], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_head_partition_cuts_the_head_off_and_leaves_the_nodes_talking() -> None:
    # the dev Slurm cluster's shape: a bridge holding the head's address, two node namespaces
    # on it, each through a veth whose eth0 end is inside
    tag = os.getpid() % 100000
    bridge, head = f"tghb{tag}", "10.251.8.1"
    nodes = {f"n{i}": (f"tgh-{tag}-{i}", f"tghv{tag}{i}", f"10.251.8.{10 + i}")
             for i in (1, 2)}
    listeners: list[subprocess.Popen[str]] = []

    def inside(node: str) -> list[str]:
        return ["ip", "netns", "exec", nodes[node][0]]

    try:
        subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", f"{head}/24", "dev", bridge], check=True)
        subprocess.run(["ip", "link", "set", bridge, "up"], check=True)
        for node, (ns, veth, addr) in nodes.items():
            subprocess.run(["ip", "netns", "add", ns], check=True)
            subprocess.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                            "netns", ns], check=True)
            subprocess.run(["ip", "link", "set", veth, "master", bridge, "up"], check=True)
            subprocess.run([*inside(node), "ip", "addr", "add", f"{addr}/24", "dev", "eth0"],
                           check=True)
            subprocess.run([*inside(node), "ip", "link", "set", "eth0", "up"], check=True)
        for prefix, addr in (([], head), (inside("n1"), nodes["n1"][2]),
                             (inside("n2"), nodes["n2"][2])):
            lp = subprocess.Popen([*prefix, sys.executable, "-c", LISTEN, addr],
                                  stdout=subprocess.PIPE, text=True)
            listeners.append(lp)
            assert lp.stdout is not None and lp.stdout.readline().strip() == "ready"
        to_head = [(inside(n), head) for n in nodes]
        from_head: list[tuple[list[str], str]] = [([], nodes[n][2]) for n in nodes]
        between = [(inside("n1"), nodes["n2"][2]), (inside("n2"), nodes["n1"][2])]
        every = to_head + from_head + between
        assert [_probe(p, a) for p, a in every] == ["ok"] * 6
        part = HeadPartition(bridge, head, {n: ns for n, (ns, _, _) in nodes.items()})
        acted = part.inject()
        assert acted.params["nodes"] == "n1,n2"
        cut = [_probe(p, a) for p, a in to_head + from_head]
        assert all(c.startswith(("TimeoutError", "timeout")) for c in cut), cut  # silently
        assert [_probe(p, a) for p, a in between] == ["ok", "ok"]  # the nodes still talk
        assert part.undo().params["tables"] == 3
        assert [_probe(p, a) for p, a in every] == ["ok"] * 6
    finally:
        for lp in listeners:
            lp.kill()
        for ns, veth, _ in nodes.values():
            subprocess.run(["ip", "link", "del", veth], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


@pytest.mark.timeout(300)
def test_toxiproxy_latency_delays_a_round_trip() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def echo() -> None:
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(64):
                conn.sendall(data)

    threading.Thread(target=echo, daemon=True).start()
    with ToxiproxyServer(ensure_toxiproxy_server()) as tp:
        listen = tp.create_proxy("ranks", f"127.0.0.1:{port}")
        inj = ToxiLatency(tp, "ranks", latency_ms=100, jitter_ms=10)
        with socket.create_connection(("127.0.0.1", listen), timeout=10) as c:
            c.sendall(b"a")
            c.recv(8)
            inj.inject()
            t0 = time.monotonic()
            c.sendall(b"b")
            c.recv(8)
            slow = time.monotonic() - t0
            assert inj.undo().params["toxics_removed"] == 2
            t0 = time.monotonic()
            c.sendall(b"c")
            c.recv(8)
            fast = time.monotonic() - t0
    srv.close()
    assert slow >= 0.18, slow  # ~100 ms each way
    assert fast < slow / 2


def test_netwrap_runs_a_rank_in_its_node_namespace_keeping_its_pid(tmp_path: Path) -> None:
    import json

    with VethLab(gso_max_segs=1) as lab:
        mapping = {"u0": [lab.a.name, lab.dev_a], "u1": [lab.b.name, lab.dev_b]}
        (tmp_path / "map.json").write_text(json.dumps(mapping))
        code = ("import os, socket; print(os.getpid(), os.environ['GLOO_SOCKET_IFNAME'], "
                "os.readlink('/proc/self/ns/net'))")
        p = subprocess.run([sys.executable, "-m", "trainguard.drills.netwrap", "--map",
                            str(tmp_path / "map.json"), "--unit", "u1", "--", sys.executable,
                            "-c", code], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        _pid, ifname, netns = p.stdout.split()
        assert ifname == lab.dev_b
        assert netns != os.readlink("/proc/self/ns/net")
        child = subprocess.Popen([sys.executable, "-m", "trainguard.drills.netwrap", "--map",
                                  str(tmp_path / "map.json"), "--unit", "u0", "--",
                                  sys.executable, "-c", "import os; print(os.getpid())"],
                                 stdout=subprocess.PIPE, text=True)
        out, _ = child.communicate(timeout=60)
        assert int(out) == child.pid  # exec all the way: the backend's pid is the rank's
