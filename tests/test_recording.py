"""MCAP recordings: round trip, metadata, truncated files, SIGKILL of a writing process."""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from mcap.reader import make_reader

from suturesim.server import protocol as P
from suturesim.server.recording import McapRecorder, RecordingError, read_messages, read_metadata

META = {"config": {"rate_hz": "1000", "thread": "polyglactin"}, "versions": {"suturesim": "0.1.0"}}


def _write_sample(path, count=1000, **kw):
    expected = []
    with McapRecorder(path, metadata=META, **kw) as rec:
        for i in range(count):
            t_ns = 1_000_000 * i
            if i % 2:
                topic, payload = P.TOPIC_FORCE, P.encode_force(i, i * 1e-3, "left", [i, 0, 0], [0, 0, 1], 0.5, 0)
            else:
                topic, payload = "event", P.encode_event(i, i * 1e-3, "tick", n=i)
            rec.write(topic, payload, t_ns, publish_time_ns=t_ns + 7, sequence=i)
            expected.append((topic if isinstance(topic, str) else topic.decode(), payload, t_ns, t_ns + 7))
        rec.add_metadata("late", {"k": "v"})
    return expected


def test_round_trip_byte_exact(tmp_path):
    path = tmp_path / "rec.mcap"
    expected = _write_sample(path, chunk_size=4096)
    got = list(read_messages(path))
    assert got == expected
    md = read_metadata(path)
    assert md["config"] == META["config"] and md["versions"] == META["versions"] and md["late"] == {"k": "v"}

    # the file is a normal, complete MCAP for the stock reader too
    with open(path, "rb") as f:
        reader = make_reader(f)
        summary = reader.get_summary()
        assert summary.statistics.message_count == 1000
        channels = {c.topic: c for c in summary.channels.values()}
        assert set(channels) == {"force", "event"}
        assert all(c.message_encoding == "msgpack" and c.schema_id == 0 for c in channels.values())
        assert reader.get_header().profile == "suturesim"
        stock = [(c.topic, m.data, m.log_time, m.publish_time) for _, c, m in reader.iter_messages(log_time_order=True)]
    assert stock == expected


def test_log_time_order_when_written_out_of_order(tmp_path):
    path = tmp_path / "ooo.mcap"
    times = [5, 3, 9, 1, 9, 2, 7, 7, 0]
    with McapRecorder(path, chunk_size=64) as rec:  # tiny chunks: ordering must hold across chunks
        for i, t in enumerate(times):
            rec.write(b"event", bytes([i]), t)
    got = list(read_messages(path))
    assert [g[2] for g in got] == sorted(times)
    # stable among equal log times
    assert [g[1] for g in got if g[2] == 9] == [bytes([2]), bytes([4])]
    assert [g[1] for g in got if g[2] == 7] == [bytes([6]), bytes([7])]


def test_close_is_idempotent_and_write_after_close_fails(tmp_path):
    rec = McapRecorder(tmp_path / "c.mcap")
    rec.write("state", b"x", 1)
    rec.close()
    rec.close()
    assert rec.closed
    with pytest.raises(ValueError):
        rec.write("state", b"x", 2)


def test_truncated_files_read_a_clean_prefix(tmp_path):
    path = tmp_path / "full.mcap"
    expected = _write_sample(path, count=300, chunk_size=1024)
    data = path.read_bytes()
    cut_path = tmp_path / "cut.mcap"
    rng = random.Random(1)
    cuts = list(range(0, 200)) + [rng.randrange(len(data)) for _ in range(150)]
    for cut in cuts:
        cut_path.write_bytes(data[:cut])
        got = list(read_messages(cut_path))
        assert got == expected[:len(got)], cut
        read_metadata(cut_path)
    cut_path.write_bytes(data[: len(data) * 3 // 4])
    assert len(list(read_messages(cut_path))) > 100


def test_not_an_mcap_file(tmp_path):
    path = tmp_path / "bad.mcap"
    path.write_bytes(b"hello world, not mcap")
    with pytest.raises(RecordingError):
        list(read_messages(path))


def test_idle_writer_is_flushed_by_background_thread(tmp_path):
    path = tmp_path / "idle.mcap"
    rec = McapRecorder(path, flush_interval=0.1)
    try:
        rec.write("event", b"hello", 1)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and not list(read_messages(path)):
            time.sleep(0.02)
        assert list(read_messages(path)) == [("event", b"hello", 1, 1)]
    finally:
        rec.close()


CHILD = textwrap.dedent("""
    import sys, time
    from suturesim.server import protocol as P
    from suturesim.server.recording import McapRecorder
    # chunks far larger than what 2.5 s produce: only the time-based flush can save the data
    rec = McapRecorder(sys.argv[1], metadata={"config": {"a": "b"}}, chunk_size=64 << 20)
    import numpy as np
    x = np.linspace(0.0, 1.0, 300).reshape(100, 3)
    energy = {"kinetic": 0.0, "elastic": 0.0, "gravity": 0.0}
    solver = {"iters": 1, "residual": 0.0, "substeps": 1}
    print("started", flush=True)
    seq = 0
    end = time.monotonic() + 30.0
    while time.monotonic() < end:
        t_ns = time.time_ns()
        rec.write(b"force", P.encode_force(seq, seq * 1e-3, "left", [0, 0, 0], [0, 0, 0], 0.0, 0), t_ns)
        if seq % 10 == 0:
            rec.write(b"state", P.encode_state(seq, seq * 1e-3, x, x[1:, 0], 0.0, [], 0, energy, solver), t_ns)
        seq += 1
        time.sleep(0.0005)
""")


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
@pytest.mark.timed   # what was flushed within 1.5 s of the kill
def test_sigkill_loses_at_most_the_last_second(tmp_path):
    path = tmp_path / "killed.mcap"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        time.sleep(2.5)
        kill_ns = time.time_ns()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL

    got = list(read_messages(path))
    assert read_metadata(path) == {"config": {"a": "b"}}
    forces = [P.decode(payload, topic) for topic, payload, _, _ in got if topic == "force"]
    assert forces, "nothing readable after SIGKILL"
    # complete, in order, uncorrupted: seq 0..k without gaps
    assert [m["seq"] for m in forces] == list(range(len(forces)))
    log_times = [lt for _, _, lt, _ in got]
    assert log_times == sorted(log_times)
    for topic, payload, lt, pt in got:
        P.decode(payload, topic)
        assert pt == lt
    # everything logged up to (kill - 1.5 s) is there

    assert log_times[-1] >= kill_ns - 1_500_000_000, (kill_ns - log_times[-1]) / 1e9
