"""Shared-memory device link: seqlock records, validation, cross-process attach, resource-tracker behaviour."""

import multiprocessing as mp
import os
import subprocess
import sys
import textwrap
import time
import tracemalloc
from multiprocessing.shared_memory import SharedMemory

import numpy as np
import pytest

from suturesim.haptics.link import MAX_DEVICES, DeviceLink

N_TORTURE = 100_000


@pytest.fixture
def link():
    lk = DeviceLink.create(3)
    try:
        yield lk
    finally:
        lk.close()
        lk.unlink()


# ------------------------------------------------------------------------------------------ single process
def test_pose_round_trip(link):
    pos, quat = np.zeros(3), np.zeros(4)
    link.write_pose(0, np.array([0.01, -0.02, 0.3]), [1.0, 0.0, 0.0, 0.0], buttons=5, t_ns=123)
    seq, t_ns, buttons = link.read_pose(0, pos, quat)
    assert (seq, t_ns, buttons) == (2, 123, 5)
    np.testing.assert_array_equal(pos, [0.01, -0.02, 0.3])
    np.testing.assert_array_equal(quat, [1.0, 0.0, 0.0, 0.0])
    link.write_pose(0, (1, 2, 3), np.array([0.5, 0.5, 0.5, 0.5], dtype=np.float32), 2**32 - 1, -7)
    assert link.read_pose(0, pos, quat) == (4, -7, 2**32 - 1)
    np.testing.assert_array_equal(pos, [1, 2, 3])
    np.testing.assert_array_equal(quat, [0.5] * 4)


def test_force_round_trip(link):
    out = np.zeros(3)
    link.write_force(2, np.array([1.5, -2.0, 0.25]), axial=3.75, flags=0b1010, tick=99, t_ns=10**18)
    assert link.read_force(2, out) == (2, 10**18, 3.75, 0b1010, 99)
    np.testing.assert_array_equal(out, [1.5, -2.0, 0.25])
    link.write_force(2, [0, 0, 1], -1.0, 0, 100, 5)
    assert link.read_force(2, out) == (4, 5, -1.0, 0, 100)
    np.testing.assert_array_equal(out, [0, 0, 1])


def test_read_before_write_is_none_and_outputs_untouched(link):
    pos, quat, force = np.full(3, 7.0), np.full(4, 7.0), np.full(3, 7.0)
    for slot in range(link.n_devices):
        assert link.read_pose(slot, pos, quat) is None
        assert link.read_force(slot, force) is None
    assert (pos == 7).all() and (quat == 7).all() and (force == 7).all()


def test_slots_independent(link):
    pos, quat, force = np.zeros(3), np.zeros(4), np.zeros(3)
    for s in range(link.n_devices):
        link.write_pose(s, [s, s + 0.5, -s], [1, s, 0, 0], buttons=s, t_ns=1000 + s)
        link.write_force(s, [10 * s, 0, 1], axial=s, flags=s, tick=s, t_ns=2000 + s)
    link.write_force(1, [9, 9, 9], 9.0, 9, 9, 9)  # a second write to slot 1 only
    for s in range(link.n_devices):
        assert link.read_pose(s, pos, quat) == (2, 1000 + s, s)
        np.testing.assert_array_equal(pos, [s, s + 0.5, -s])
        np.testing.assert_array_equal(quat, [1, s, 0, 0])
        if s == 1:
            assert link.read_force(s, force) == (4, 9, 9.0, 9, 9)
            np.testing.assert_array_equal(force, [9, 9, 9])
        else:
            assert link.read_force(s, force) == (2, 2000 + s, float(s), s, s)
            np.testing.assert_array_equal(force, [10 * s, 0, 1])


def test_bad_slots_and_sizes(link):
    pos, quat, force = np.zeros(3), np.zeros(4), np.zeros(3)
    for bad in (-1, 3, 100, 1.0, "0", None):
        with pytest.raises(ValueError, match="slot"):
            link.write_pose(bad, [0, 0, 0], [1, 0, 0, 0], 0, 0)
        with pytest.raises(ValueError, match="slot"):
            link.read_pose(bad, pos, quat)
        with pytest.raises(ValueError, match="slot"):
            link.write_force(bad, [0, 0, 0], 0.0, 0, 0, 0)
        with pytest.raises(ValueError, match="slot"):
            link.read_force(bad, force)
    link.write_force(np.int64(2), [0, 0, 0], 0.0, 0, 0, 0)  # numpy integers are fine
    with pytest.raises(ValueError):
        link.write_force(0, [1, 2], 0.0, 0, 0, 0)
    with pytest.raises(ValueError):
        link.write_force(0, 1.0, 0.0, 0, 0, 0)
    with pytest.raises(ValueError):
        link.write_pose(0, [0, 0, 0], [1, 0, 0], 0, 0)
    with pytest.raises(ValueError):
        link.write_force(0, [0, 0, 0], 0.0, -1, 0, 0)  # flags must be uint32
    with pytest.raises(ValueError):
        link.write_pose(0, [0, 0, 0], [1, 0, 0, 0], 2**32, 0)  # buttons must be uint32
    assert link.read_force(0, force) is None  # nothing above was half written
    assert link.read_pose(0, pos, quat) is None
    for n in (0, MAX_DEVICES + 1):
        with pytest.raises(ValueError):
            DeviceLink.create(n)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_refused(link, bad):
    pos, quat, force = np.zeros(3), np.zeros(4), np.zeros(3)
    link.write_force(0, [1, 2, 3], 4.0, 0, 1, 1)
    link.write_pose(0, [1, 2, 3], [1, 0, 0, 0], 0, 1)
    with pytest.raises(ValueError, match="non-finite"):
        link.write_force(0, [1, bad, 3], 4.0, 0, 2, 2)
    with pytest.raises(ValueError, match="non-finite"):
        link.write_force(0, np.array([1, 2, 3.0]), bad, 0, 2, 2)
    with pytest.raises(ValueError, match="non-finite"):
        link.write_pose(0, np.array([bad, 0, 0]), [1, 0, 0, 0], 0, 2)
    with pytest.raises(ValueError, match="non-finite"):
        link.write_pose(0, [0, 0, 0], [1, 0, bad, 0], 0, 2)
    # the previous good records are intact
    assert link.read_force(0, force) == (2, 1, 4.0, 0, 1)
    np.testing.assert_array_equal(force, [1, 2, 3])
    assert link.read_pose(0, pos, quat) == (2, 1, 0)


def test_zero_forces_and_recovery_from_a_dead_writer(link):
    force = np.zeros(3)
    for s in range(link.n_devices):
        link.write_force(s, [1, 2, 3], 5.0, 0, tick=40 + s, t_ns=1)
    # Simulate physics dying inside a write to slot 1: its seq is left odd.
    k = (128 + 256 * 1 + 128) // 8
    link._u64[k] = link._u64[k] + 1
    assert link.read_force(1, force) is None  # bounded retries, no exception
    link.zero_forces(flags=8, t_ns=777)
    for s in range(link.n_devices):
        seq, t_ns, axial, flags, tick = link.read_force(s, force)
        assert seq % 2 == 0 and seq >= 4
        assert (t_ns, axial, flags, tick) == (777, 0.0, 8, 40 + s)
        np.testing.assert_array_equal(force, [0, 0, 0])
    # a restarted writer continues the sequence monotonically
    link.write_force(1, [1, 1, 1], 1.0, 0, 50, 900)
    assert link.read_force(1, force)[0] == 6


def test_clear_pose(link):
    pos, quat = np.zeros(3), np.zeros(4)
    link.write_pose(1, [1, 2, 3], [1, 0, 0, 0], 0, 1)
    link.clear_pose(1, 2)
    assert link.read_pose(1, pos, quat) is None
    link.write_pose(1, [4, 5, 6], [1, 0, 0, 0], 0, 3)
    assert link.read_pose(1, pos, quat) == (6, 3, 0)


def test_lifecycle():
    with DeviceLink.create(2) as owner:
        name = owner.name
        assert owner.is_owner and owner.owner_pid == os.getpid()
        other = DeviceLink.attach(name)
        assert not other.is_owner and other.n_devices == 2 and other.name == name
        with pytest.raises(RuntimeError):
            other.unlink()
        owner.write_force(1, [1, 2, 3], 0.5, 0, 0, 0)
        out = np.zeros(3)
        assert other.read_force(1, out) is not None and out[2] == 3
        other.close()
        other.close()  # idempotent
    with pytest.raises(FileNotFoundError):
        DeviceLink.attach(name)
    # a foreign segment is rejected
    shm = SharedMemory(create=True, size=4096)
    try:
        with pytest.raises(ValueError, match="not a suturesim"):
            DeviceLink.attach(shm.name)
    finally:
        shm.close()
        shm.unlink()


def test_steady_state_does_not_accumulate_memory(link):
    force_in, force, pos, quat = np.array([1.0, 2.0, 3.0]), np.zeros(3), np.zeros(3), np.zeros(4)
    p, q = np.array([0.1, 0.2, 0.3]), np.array([1.0, 0, 0, 0])

    def cycle(i):
        link.write_force(0, force_in, 1.0, 0, i, i)
        link.read_force(0, force)
        link.write_pose(0, p, q, 0, i)
        link.read_pose(0, pos, quat)

    for i in range(1000):
        cycle(i)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(20_000):
            cycle(i)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 4096, grown


@pytest.mark.timed   # a call's wall time
def test_per_call_cost(link):
    n = 50_000
    f, out = np.array([1.0, 2.0, 3.0]), np.zeros(3)
    p, q, pos, quat = np.array([0.1, 0.2, 0.3]), np.array([1.0, 0, 0, 0]), np.zeros(3), np.zeros(4)
    timings = {}
    for label, call in [
        ("write_force", lambda i: link.write_force(1, f, 2.0, 0, i, i)),
        ("read_force", lambda i: link.read_force(1, out)),
        ("write_pose", lambda i: link.write_pose(1, p, q, 0, i)),
        ("read_pose", lambda i: link.read_pose(1, pos, quat)),
    ]:
        for i in range(1000):
            call(i)
        t0 = time.perf_counter_ns()
        for i in range(n):
            call(i)
        timings[label] = (time.perf_counter_ns() - t0) / n / 1e3
    print("\nDeviceLink per-call cost (µs, incl. loop/lambda overhead): "
          + ", ".join(f"{k} {v:.2f}" for k, v in timings.items()))
    for v in timings.values():
        assert v < 100.0


# ----------------------------------------------------------------------------------------- multi process
def _force_writer(name, n, ready):
    link = DeviceLink.attach(name)
    ready.set()
    for i in range(n):
        link.write_force(0, (float(i), 2.0 * i, 3.0 * i), -float(i), i & 0xFFFFFFFF, i, 10 * i + 1)
    link.close()


@pytest.mark.timed   # the reader must overlap the writer: both processes need a CPU at once
def test_concurrent_writer_never_yields_a_torn_read():
    ctx = mp.get_context("spawn")
    with DeviceLink.create(1) as link:
        ready = ctx.Event()
        proc = ctx.Process(target=_force_writer, args=(link.name, N_TORTURE, ready))
        proc.start()
        try:
            assert ready.wait(60), "writer process did not start"
            out = np.zeros(3)
            last_seq, reads, nones, episodes, distinct, naive, naive_torn = 0, 0, 0, 0, 0, 0, 0
            was_none = False
            f64, i64, k = link._f64, link._i64, (128 + 128) // 8  # slot 0's force record, for the control
            deadline = time.monotonic() + 120
            final_seq = 2 * N_TORTURE
            while last_seq < final_seq:
                assert time.monotonic() < deadline, "timed out waiting for the writer"
                if reads % 8 == 0 and last_seq:  # control: an unchecked copy, to show tearing does happen
                    fx, fy, ax, tk = f64[k + 2], f64[k + 3], f64[k + 5], i64[k + 7]
                    naive += 1
                    naive_torn += not (fy == 2 * fx and ax == -fx and tk == fx)
                r = link.read_force(0, out)
                reads += 1
                if r is None:
                    nones += 1
                    episodes += not was_none and last_seq > 0
                    was_none = True
                    assert proc.is_alive() or link.read_force(0, out) is not None
                    continue
                was_none = False
                seq, t_ns, axial, flags, tick = r
                i = seq // 2 - 1  # the writer's i-th write (0-based) completes at seq 2(i+1)
                assert seq % 2 == 0
                assert seq >= last_seq, (seq, last_seq)
                assert tick == i and t_ns == 10 * i + 1 and axial == -i and flags == i, r
                assert out[0] == i and out[1] == 2 * i and out[2] == 3 * i, (r, out)
                distinct += seq != last_seq
                last_seq = seq
        finally:
            proc.join(60)
        assert proc.exitcode == 0
        print(f"\nseqlock torture: {N_TORTURE} writes, {reads} reads, {distinct} distinct records seen, "
              f"{nones} reads gave up (None) in {episodes} episodes after the first write (writer descheduled "
              f"mid-write); control: {naive_torn} of {naive} unchecked copies were torn")
        assert distinct > 100  # the reader really did overlap the writer


def _attach_child(name, q):
    link = DeviceLink.attach(name)
    force = np.zeros(3)
    r = link.read_force(0, force)
    link.write_pose(1, [0.1, 0.2, 0.3], [0.0, 1.0, 0.0, 0.0], buttons=3, t_ns=42)
    q.put((r, force.tolist(), link.n_devices))
    link.close()


def test_attach_from_spawned_child_and_segment_survives():
    ctx = mp.get_context("spawn")
    with DeviceLink.create(2) as link:
        link.write_force(0, [4.0, 5.0, 6.0], 7.0, 1, 11, 12)
        q = ctx.Queue()
        proc = ctx.Process(target=_attach_child, args=(link.name, q))
        proc.start()
        r, force, n = q.get(timeout=60)
        proc.join(60)
        assert proc.exitcode == 0
        assert r == (2, 12, 7.0, 1, 11) and force == [4.0, 5.0, 6.0] and n == 2
        pos, quat = np.zeros(3), np.zeros(4)
        assert link.read_pose(1, pos, quat) == (2, 42, 3)
        np.testing.assert_array_equal(pos, [0.1, 0.2, 0.3])
        time.sleep(0.2)
        again = DeviceLink.attach(link.name)  # still there after the child exited
        assert again.read_pose(1, pos, quat) == (2, 42, 3)
        again.close()


def _run(script, *args, timeout=60):
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout)


def test_segment_survives_an_unrelated_process_attaching_and_exiting(tmp_path):
    """A fresh interpreter has its own resource tracker; on Python < 3.13 it would unlink what it attached."""
    script = tmp_path / "attacher.py"
    script.write_text(textwrap.dedent("""
        import sys
        from suturesim.haptics.link import DeviceLink
        link = DeviceLink.attach(sys.argv[1])
        link.write_pose(0, [1.0, 2.0, 3.0], [1.0, 0.0, 0.0, 0.0], 1, 5)
        if sys.argv[2] == "close":
            link.close()
    """))
    with DeviceLink.create(1) as link:
        for mode in ("close", "no-close"):
            res = _run(script, link.name, mode)
            assert res.returncode == 0, res.stderr
            assert "leaked" not in res.stderr and "Traceback" not in res.stderr, res.stderr
            time.sleep(0.3)  # give a (wrongly) registered tracker time to unlink
            other = DeviceLink.attach(link.name)
            pos, quat = np.zeros(3), np.zeros(4)
            assert other.read_pose(0, pos, quat) is not None
            other.close()


_SHARED_TRACKER_SCRIPT = """
import multiprocessing as mp, os, sys, time
from suturesim.haptics.link import DeviceLink

def child(name):
    link = DeviceLink.attach(name)
    link.write_pose(0, [1.0, 2.0, 3.0], [1.0, 0.0, 0.0, 0.0], 0, 1)
    link.close()

if __name__ == "__main__":
    link = DeviceLink.create(1)
    print(link.name, flush=True)
    p = mp.get_context("spawn").Process(target=child, args=(link.name,))  # shares our resource tracker
    p.start(); p.join()
    assert p.exitcode == 0
    time.sleep(0.2)
    again = DeviceLink.attach(link.name)  # survived the child
    again.close()
    if sys.argv[1] == "crash":
        os._exit(0)  # no close/unlink: the owner's tracker registration must still clean up
    link.close(); link.unlink()
"""


@pytest.mark.skipif(os.name != "posix", reason="resource tracker is POSIX only")
@pytest.mark.parametrize("mode", ["clean", "crash"])
def test_child_sharing_the_owners_tracker(tmp_path, mode):
    """A multiprocessing child shares the owner's tracker: attaching must not erase the owner's registration
    (clean exit: no tracker KeyError; owner crash: the tracker still removes the segment)."""
    script = tmp_path / "owner.py"
    script.write_text(_SHARED_TRACKER_SCRIPT)
    res = _run(script, mode)
    assert res.returncode == 0, res.stderr
    name = res.stdout.split()[0]
    if mode == "clean":
        assert "Traceback" not in res.stderr and "KeyError" not in res.stderr and "leaked" not in res.stderr, \
            res.stderr
    deadline = time.monotonic() + 10
    while True:  # the tracker exits asynchronously after its last user
        try:
            DeviceLink.attach(name).close()
        except FileNotFoundError:
            break
        assert time.monotonic() < deadline, f"segment {name} leaked after mode={mode}"
        time.sleep(0.05)
