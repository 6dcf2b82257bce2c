"""A hostile or unlucky local client cannot wedge the server, and nothing is lost silently (issue: lock down the
control surface, findings 1, 6 and 8): a physics process that stops ticking is killed and restarted from the
scene's last snapshot; a scene build that dies or hangs gets an error reply; recordings a client asks for are
new files inside the recordings directory only, answered after the file exists; a full disk or a dead recorder
is an `event` and an error on the next reply, and the partial recording stays readable.

Every test runs a real `suturesim serve` on loopback (tests/conftest.py's harness), with a server config whose
recordings directory is the test's own.
"""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from suturesim.server import protocol
from suturesim.server.recording import read_messages
from suturesim.server.snapshot import Snapshot, SnapshotScene
from suturesim.solver.scenario import load_scenario

from conftest import Daemon, Sub, wait_for


def _config(tmp_path: Path, extra: str = "") -> tuple[Path, Path]:
    rec = tmp_path / "recordings"
    cfg = tmp_path / "server.yaml"
    cfg.write_text(f"files:\n  recordings_dir: {rec}\nloop:\n  realtime: false\n{extra}")
    return cfg, rec


def _daemon(tmp_path: Path, extra: str = "", **kw) -> Daemon:
    cfg, _ = _config(tmp_path, extra)
    d = Daemon("--config", str(cfg), **kw)
    d.wait_serving()
    return d


def _status_within(d: Daemon, seconds: float = 1.0) -> dict:
    t0 = time.monotonic()
    st = d.request({"cmd": "status"}, timeout=seconds)
    assert st["ok"] and time.monotonic() - t0 <= seconds, st
    return st


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


# -- snapshot -------------------------------------------------------------------------------------------------
def test_a_snapshot_gives_back_the_newest_whole_state_and_its_scene():
    sc = load_scenario("default")
    state = sc.new_state()
    snap = Snapshot.create(SnapshotScene(sc.name, sc.file, sc.source, sc.base_dir), state)
    try:
        state.x[3] = (1.0, 2.0, 3.0)
        state.time[0] = 1.5
        snap.write(state)
        state.time[0] = 2.5
        snap.write(state)
        other = Snapshot.attach(snap.name)
        back = sc.new_state()
        assert other.restore(back)
        assert back.time[0] == 2.5 and np.array_equal(back.x, state.x)
        assert other.scene().name == "default" and other.scene().source == sc.source
        # a writer killed in the middle of a write leaves the other slot: the newest whole one
        other._hdr[5 + other.writes % 2] += np.uint64(1)
        assert other.restore(back) and back.time[0] == 2.5
        other.close()
        small = load_scenario("default", {"thread": {"segments": 10}}).new_state()
        assert not Snapshot.attach(snap.name).restore(small)   # another layout: nothing copied
    finally:
        snap.close()
        snap.unlink()


# -- liveness ------------------------------------------------------------------------------------------------
def test_a_physics_process_that_stops_ticking_is_restarted_from_its_snapshot(tmp_path):
    """SIGSTOP stands for any wedge (an endless tick): after fault.stall_s without a tick the supervisor kills
    it, zeroes the forces and starts a new one, which resumes the scene where its last snapshot (at most half
    a second old) left it, not from the scene's start."""
    d = _daemon(tmp_path, "fault:\n  stall_s: 1.0\n")
    try:
        wait_for(lambda: _status_within(d)["t"] > 6.0, 30.0, what="6 s of scene time")
        t_before = _status_within(d)["t"]
        old = d.physics_pid()
        os.kill(old, signal.SIGSTOP)
        t0 = time.monotonic()
        d.wait_serving(count=2, timeout=30.0)
        took = time.monotonic() - t0
        st = _status_within(d)
        said = [ln for ln in d.stderr if "stopped ticking" in ln]
        assert said and "forces zeroed" in said[0], d.output()
        assert st["pid"] != old and d.proc.poll() is None
        # resumed near where it stopped (a fresh start would be at a second or two)
        assert t_before - 0.6 <= st["t"] <= t_before + 3.0, (t_before, st["t"])
        assert 1.0 <= took < 15.0, took
    finally:
        d.close()


def test_a_dead_scene_builder_gets_an_error_reply_and_control_answers_on(tmp_path):
    """The worker that builds scenes for `load`/`set` dies (OOM killer) while building: the request is answered
    with the reason at once, not never, and the next `load` builds on a new worker."""
    d = _daemon(tmp_path)
    try:
        physics = d.physics_pid()
        workers = Daemon.children_of(physics)
        assert len(workers) == 1, workers
        os.kill(workers[0], signal.SIGSTOP)     # it takes the request and never answers ...
        sock = d._socket()
        import msgpack
        sock.send(msgpack.packb({"cmd": "load", "scenario": "wang2017-hanging"}))
        time.sleep(0.5)
        os.kill(workers[0], signal.SIGKILL)     # ... and dies
        assert sock.poll(5000), "no reply to a load whose builder died"
        reply = msgpack.unpackb(sock.recv(), raw=False)
        assert reply["ok"] is False and "scene builder process died" in reply["error"], reply
        _status_within(d)
        assert d.request({"cmd": "load", "scenario": "wang2017-hanging"}, timeout=30.0)["ok"]
        assert _status_within(d)["scenario"] == "wang2017-hanging"
    finally:
        d.close()


def test_a_scene_builder_killed_while_idle_is_replaced_at_the_next_load(tmp_path):
    """The builder dies between requests, once it has surely started and waits for one (an idle worker of a
    multiprocessing Pool held its queue's lock there, and replacing it then hung the loop for good): the next
    `load` gets an answer within a tick's worth of waiting, and the one after it builds."""
    d = _daemon(tmp_path)
    try:
        assert d.request({"cmd": "load", "scenario": "wang2017-hanging"}, timeout=30.0)["ok"]   # it is up
        physics = d.physics_pid()
        workers = Daemon.children_of(physics)
        assert len(workers) == 1, workers
        os.kill(workers[0], signal.SIGKILL)
        time.sleep(0.5)
        reply = d.request({"cmd": "load", "scenario": "wang2017-hanging"}, timeout=5.0)
        assert reply["ok"] is False and "scene builder process died" in reply["error"], reply
        _status_within(d)
        assert d.request({"cmd": "load", "scenario": "wang2017-hanging"}, timeout=30.0)["ok"]
        assert _status_within(d)["scenario"] == "wang2017-hanging"
        assert len(Daemon.children_of(physics)) == 1, "the dead builder reaped, one new one"
    finally:
        d.close()


def test_a_spawned_child_dies_with_its_parent_even_while_importing(tmp_path):
    """haptics/process.py child_main arms PR_SET_PDEATHSIG before the child imports its real entry point (the
    physics process imports numba for seconds): a parent killed meanwhile leaves no orphan."""
    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(30)\ndef main():\n    pass\n")
    parent = tmp_path / "parent.py"
    parent.write_text(
        "import multiprocessing as mp, sys, time\n"
        "from suturesim.haptics.process import child_main\n"
        "if __name__ == '__main__':\n"
        "    p = mp.get_context('spawn').Process(target=child_main, args=('slow_import', 'main'))\n"
        "    p.start()\n"
        "    print(p.pid, flush=True)\n"
        "    time.sleep(60)\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.Popen([sys.executable, str(parent)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        child = int(proc.stdout.readline())
        time.sleep(1.5)                         # the child is inside its slow import now
        proc.kill()
        proc.wait(5)
        wait_for(lambda: not Path(f"/proc/{child}").exists() or
                 Path(f"/proc/{child}/stat").read_text().split()[2] == "Z", 5.0, what="the child gone")
    finally:
        proc.kill()


# -- recordings ---------------------------------------------------------------------------------------------
def test_recordings_are_new_files_in_the_recordings_directory_only(tmp_path):
    d = _daemon(tmp_path)
    rec = tmp_path / "recordings"
    outside = tmp_path / "victim.txt"
    outside.write_text("keep me\n")
    before = _tree(tmp_path)
    try:
        for bad, why in ((f"../{outside.name}", "name"), (str(outside), "name"), ("a/b.mcap", "name"),
                         (".hidden.mcap", "name"), ("x" * 300 + ".mcap", "name")):
            reply = d.request({"cmd": "record_start", "name": bad})
            assert reply["ok"] is False and why in reply["error"], (bad, reply)
        reply = d.request({"cmd": "record_start", "path": str(outside)})
        assert reply["ok"] is False and "paths are not accepted" in reply["error"], reply
        assert _tree(tmp_path) == {k: v for k, v in before.items()}   # nothing made, nothing changed
        _status_within(d)

        ok = d.ok({"cmd": "record_start", "name": "first.mcap"})
        assert ok["path"] == str(rec / "first.mcap") and (rec / "first.mcap").is_file()
        assert (rec.stat().st_mode & 0o077) == 0, oct(rec.stat().st_mode)
        time.sleep(0.5)
        assert d.ok({"cmd": "record_stop"})["path"] == str(rec / "first.mcap")
        again = d.request({"cmd": "record_start", "name": "first.mcap"})
        assert again["ok"] is False and "exists" in again["error"], again
        os.symlink(outside, rec / "planted.mcap")
        planted = d.request({"cmd": "record_start", "name": "planted.mcap"})
        assert planted["ok"] is False, planted
        assert outside.read_text() == "keep me\n"
        listed = d.ok({"cmd": "recordings"})
        assert listed["dir"] == str(rec)
        assert [r["name"] for r in listed["recordings"]] == ["first.mcap"]
        assert listed["recordings"][0]["bytes"] > 0
        msgs = list(read_messages(rec / "first.mcap"))
        assert {t for t, *_ in msgs} >= {"force", "state"}
    finally:
        d.close()


@pytest.mark.timed   # the loop's worst lateness
def test_many_bad_record_requests_do_not_stall_the_loop(tmp_path):
    """Each recording request is answered off the tick (the supervisor's recording thread, one request out at a
    time): 60 refusals in a row, and no tick of the loop is held back (a tick that waited on the supervisor
    would be late by its whole answer; the loop's own stats show the latest tick of each second)."""
    d = _daemon(tmp_path)
    sub = Sub(d.pub, (protocol.TOPIC_STATS,))
    try:
        sub.wait_live()
        sub.drain()
        t0 = time.monotonic()
        for k in range(60):
            assert d.request({"cmd": "record_start", "name": f"../bad{k}.mcap"})["ok"] is False
        took = time.monotonic() - t0
        _status_within(d)
        # every stats message since the first request (queued while they were sent), and the next one
        worst = max(protocol.decode(p, t)["lateness_us"]["max"] for _, t, p in sub.collect(1.5)
                    if t == protocol.TOPIC_STATS)
        assert worst < 100_000, worst
        assert took < 30.0, took
    finally:
        sub.close()
        d.close()


def _limit_file_size(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_is_an_event_and_an_error_on_the_next_reply(tmp_path):
    """A recording that cannot be written on (here: past RLIMIT_FSIZE, as a full disk) is reported: an
    `record_error` event, the next control reply an error that says so (and that request not carried out),
    `status` shows it failed, and the file holds what was written before, readable."""
    cfg, rec = _config(tmp_path)
    d = Daemon("--config", str(cfg), preexec_fn=_limit_file_size(400_000))
    sub = None
    try:
        d.wait_serving()
        sub = Sub(d.pub, (protocol.TOPIC_EVENT,))
        sub.wait_live()
        d.ok({"cmd": "record_start", "name": "big.mcap"})
        ev, _ = sub.event("record_error", timeout=30.0)
        assert "big.mcap" in ev["reason"] and "large" in ev["reason"].lower(), ev
        reply = d.request({"cmd": "pause"})
        assert reply["ok"] is False and "recording failed" in reply["error"] and "not carried out" in reply["error"]
        st = _status_within(d)
        assert st["paused"] is False and st["recording"]["state"] == "failed"
        msgs = list(read_messages(rec / "big.mcap"))
        assert len(msgs) > 100
    finally:
        if sub is not None:
            sub.close()
        d.close()


def test_a_recorder_that_dies_is_an_event_and_an_error_on_the_next_reply(tmp_path):
    d = _daemon(tmp_path)
    sub = Sub(d.pub, (protocol.TOPIC_EVENT,))
    try:
        sub.wait_live()
        d.ok({"cmd": "record_start", "name": "doomed.mcap"})
        recorder = d.spawn_children_named("suturesim-recorder")
        assert len(recorder) == 1, d.spawn_children()
        time.sleep(1.5)   # flushed at least once (every 0.5 s)
        os.kill(recorder[0], signal.SIGKILL)
        ev, _ = sub.event("record_error", timeout=10.0)
        assert "died" in ev["reason"] and "doomed.mcap" in ev["reason"], ev
        reply = d.request({"cmd": "status"})
        assert reply["ok"] is False and "recording failed" in reply["error"], reply
        assert _status_within(d)["recording"]["state"] == "failed"
        assert len(list(read_messages(tmp_path / "recordings" / "doomed.mcap"))) > 100
    finally:
        sub.close()
        d.close()
