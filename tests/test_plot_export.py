"""`suturesim plot` and `suturesim export` (issue 6, items 4 and 5): the PNG and its panels, exact round trips
of every number through CSV and NPZ, progress and the summary line, one-line errors with exit code 2.

The recordings are small and made here: a synthetic one written with McapRecorder (two devices, awkward floats,
a thread whose vertex count changes, stats and events) and a 2 s headless `suturesim run` (no stats)."""
from __future__ import annotations

import csv
import io
import json
import math
import struct
import subprocess
import sys

import numpy as np
import pytest

from suturesim.server import protocol as P
from suturesim.server.cli import main
from suturesim.server.recording import McapRecorder, read_messages
from suturesim.tools import export as E
from suturesim.tools import plot as PL

CLI = [sys.executable, "-m", "suturesim.server.cli"]
META = {"scenario": {"name": "synthetic-knot", "file": "", "yaml": "name: synthetic-knot\n"},
        "versions": {"suturesim": "test", "schema": "1"}}
# float64 values whose decimal form is easy to get wrong
AWKWARD = [0.1, 1 / 3, -0.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -1e-300, 123456789.12345679,
           math.inf, -math.inf, 0.30000000000000004]


def _write_synthetic(path, n_ticks: int = 300) -> None:
    """Two devices at every tick, state every 10 ticks (n = 6, then 4 after tick 200), stats every 100, events."""
    rng = np.random.default_rng(7)
    with McapRecorder(path, metadata=META, chunk_size=8192) as rec:
        def put(topic, payload, k):
            rec.write(topic, payload, k * 1_000_000, k * 1_000_000, k)

        put("event", P.encode_event(0, 0.0, "start", scenario="synthetic-knot", realtime=True), 0)
        for k in range(1, n_ticks + 1):
            t = k * 1e-3
            for j, dev in enumerate(("left", "right")):
                f = rng.normal(size=3) * 10.0 ** rng.integers(-8, 2)
                if k <= len(AWKWARD):
                    f[0] = AWKWARD[k - 1]
                put("force", P.encode_force(k, t, dev, rng.normal(size=3) * 0.1, f, abs(float(rng.normal())) + j,
                                            k % 16, stylus=rng.normal(size=3)), k)
            if k % 10 == 0:
                n = 6 if k <= 200 else 4
                x = np.cumsum(rng.normal(size=(n, 3)), axis=0).astype(np.float32) * np.float32(0.01)
                tension = (rng.normal(size=n - 1) * 1e-3).astype(np.float32)
                grasps = [{"id": "g0", "vertex": n - 1, "device": "left", "pos": [0.1, 0.2, 1 / 3],
                           "force": [1e-9, -0.0, 2.5]}]
                put("state", P.encode_state(k, t, x, tension, 0.25, grasps, 1, {"kinetic": 1 / 7, "elastic": 2e-9,
                                            "gravity": -1e-5}, {"iters": 3, "residual": 1e-13, "substeps": 4}), k)
            if k % 100 == 0:
                lat = {"p50": 4.1 * k, "p99": 21.0 + k / 3, "p999": 48.2, "max": 61.0 * k}
                put("stats", P.encode_stats(k, t, {"lateness_us": lat, "overruns": k // 100, "realtime": k > 100,
                                                   "substeps": {"mean": 3.5, "max": 5}}), k)
            if k == 150:
                put("event", P.encode_event(k, t, "grasp", id="g0", vertex=5, device="left", stiffness=1000.0), k)
                put("event", P.encode_event(k, t, "set", path="gravity", value=[0.0, 0.0, -9.81]), k)


# under -n one worker runs the module: its tests share the module's recordings
pytestmark = pytest.mark.xdist_group("plot-export")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    path = tmp_path_factory.mktemp("synthetic") / "synthetic.mcap"
    _write_synthetic(path)
    return path


@pytest.fixture(scope="module")
def headless(tmp_path_factory):
    """A 2 s headless run of the default scene: state and force, no stats."""
    path = tmp_path_factory.mktemp("headless") / "run.mcap"
    subprocess.run(CLI + ["run", "default", "--duration", "2", "--record", str(path)], check=True,
                   capture_output=True, timeout=300)
    return path


def _decoded(path, topic):
    return [P.decode(p, t) for t, p, _, _ in read_messages(path) if t == topic]


def _bits(a: float, b: float) -> bool:
    return struct.pack("<d", a) == struct.pack("<d", b)


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


# -- plot ------------------------------------------------------------------------------------------------


def test_plot_writes_png_with_three_panels(synthetic, tmp_path, capsys):
    out = tmp_path / "s.png"
    assert main(["plot", str(synthetic), "-o", str(out)]) == 0
    assert _png_size(out) == (1000, 1200)
    line = capsys.readouterr().out.strip()
    assert line.count("\n") == 0 and line.startswith("suturesim plot: ") and f"wrote {out} (1000x1200 px)" in line

    rec = E.load_recording(synthetic, ("state", "force", "stats"), progress=False)
    fig = PL.plot_recording(rec)
    ax_force, ax_tension, ax_late = fig.axes
    assert len(fig.axes) == 3
    assert [ax.get_title().split(":")[0] for ax in fig.axes] == list(PL.PANEL_TITLES[:3])   # no tissue: no gap
    assert "synthetic-knot" in fig.get_suptitle()
    assert ax_force.get_xlabel() == "scene time t (s)" and ax_force.get_ylabel() == "force (N)"
    assert [ln.get_label() for ln in ax_force.get_lines()] == ["left |force|", "left axial", "right |force|",
                                                              "right axial"]
    mag = ax_force.get_lines()[0].get_ydata()
    left = [m for m in _decoded(synthetic, "force") if m["device"] == "left"]
    with np.errstate(over="ignore"):   # numpy 2.4's row norms (axis=1) round the last bit differently from one
        np.testing.assert_allclose(mag, [np.linalg.norm(m["force"]) for m in left], rtol=1e-15, atol=0.0)
    # default: 4 evenly spaced times from the first state (0.01 s) to the last (0.3 s), snapped
    assert [ln.get_label() for ln in ax_tension.get_lines()][:4] == [
        "t = 0.010 s", "t = 0.110 s (asked 0.106667 s)", "t = 0.200 s (asked 0.203333 s)", "t = 0.300 s"]
    assert ax_tension.get_xlabel().startswith("arc length s (m)") and ax_tension.get_ylabel() == "tension (N)"
    assert "per-second p99 and max" in ax_late.get_title() and "3 s" in ax_late.get_title()
    assert ax_late.get_xlabel().startswith("tick lateness (µs)") and len(ax_late.patches) == 2 * 40


def test_plot_tension_is_against_arc_length_at_chosen_times(synthetic):
    rec = E.load_recording(synthetic, ("state",), progress=False)
    fig = PL.plot_recording(rec, times=[0.0501, 0.25, 0.2501])       # the last two snap to one message
    lines = [ln for ln in fig.axes[1].get_lines() if ln.get_label().startswith("t =")]
    assert [ln.get_label() for ln in lines] == ["t = 0.050 s", "t = 0.250 s"]
    state = _decoded(synthetic, "state")[24]                          # t = 0.25 s, n = 4 by then
    x = state["x"].astype(np.float64)
    seg = np.linalg.norm(np.diff(x, axis=0), axis=1)
    s_mid = np.concatenate([[0.0], np.cumsum(seg)[:-1]]) + seg / 2
    np.testing.assert_allclose(lines[1].get_xdata(), s_mid, rtol=1e-12)
    assert np.array_equal(lines[1].get_ydata(), state["tension"])
    assert "no force" in fig.axes[0].texts[0].get_text()              # force not loaded: said, not failed


def test_plot_headless_run_has_no_stats_panel_text(headless, tmp_path):
    out = tmp_path / "h.png"
    r = subprocess.run(CLI + ["plot", str(headless), "-o", str(out), "--devices", "stylus0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert _png_size(out) == (1000, 1200)
    assert r.stdout.count("\n") == 1 and "state 200, force 2000, stats 0, event 0" in r.stdout
    assert "devices stylus0" in r.stdout and "t 0.001 to 2.000 s" in r.stdout
    assert "reading" not in r.stderr          # not a terminal: no progress drawn
    fig = PL.plot_recording(E.load_recording(headless, progress=False))
    late = fig.axes[2]
    assert late.get_title().endswith("no stats") and "no stats messages" in late.texts[0].get_text()
    assert "default" in fig.get_suptitle()


def test_plot_devices_filter_and_unknown_device(synthetic, tmp_path, capsys):
    rec = E.load_recording(synthetic, ("force",), progress=False)
    fig = PL.plot_recording(rec, devices=["right"])
    assert [ln.get_label() for ln in fig.axes[0].get_lines()] == ["right |force|", "right axial"]
    assert main(["plot", str(synthetic), "-o", str(tmp_path / "x.png"), "--devices", "left,nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no device nope" in err and "devices: left, right" in err
    assert not (tmp_path / "x.png").exists()
    assert main(["plot", str(synthetic), "-o", str(tmp_path / "x.png"), "--times", "1,zero"]) == 2
    assert "--times" in capsys.readouterr().err


def test_plot_without_matplotlib_says_how_to_install(synthetic, tmp_path, monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)             # import matplotlib -> ImportError
    assert main(["plot", str(synthetic), "-o", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'suturesim[plot]'" in err and err.count("\n") == 1


# -- export ----------------------------------------------------------------------------------------------


def _read_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def test_export_csv_round_trips_exactly(synthetic, tmp_path, capsys):
    out = tmp_path / "csv"
    assert main(["export", str(synthetic), "--csv", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["events.csv", "force.csv", "state.csv", "stats.csv"]

    header, rows = _read_csv(out / "force.csv")
    assert header == ["seq", "t", "device", "pose_x", "pose_y", "pose_z", "stylus_x", "stylus_y", "stylus_z",
                      "force_x", "force_y", "force_z", "axial", "flags"]
    forces = _decoded(synthetic, "force")
    assert len(rows) == len(forces) == 600
    for r, m in zip(rows, forces):
        assert int(r[0]) == m["seq"] and r[2] == m["device"] and int(r[13]) == m["flags"]
        want = [m["t"], *m["pose"], *m["stylus"], *m["force"], m["axial"]]
        got = [float(c) for c in r[1:2] + r[3:13]]
        assert all(_bits(a, b) for a, b in zip(got, want)), (r, m)
    assert {r[9] for r in rows[:2 * len(AWKWARD):2]} == {repr(v) for v in AWKWARD}

    header, rows = _read_csv(out / "state.csv")
    assert header[:6] == ["seq", "t", "n", "x0_x", "x0_y", "x0_z"]
    assert header[3 + 18:3 + 18 + 5] == [f"tension{i}" for i in range(5)]
    assert header[-9:] == ["twist", "contacts", "energy.kinetic", "energy.elastic", "energy.gravity",
                           "solver.iters", "solver.residual", "solver.substeps", "grasps"]
    states = _decoded(synthetic, "state")
    assert len(rows) == len(states) == 30
    for r, m in zip(rows, states):
        n = m["n"]
        assert (int(r[0]), float(r[1]), int(r[2])) == (m["seq"], m["t"], n)
        x = np.array([float(c) for c in r[3:3 + 3 * n]]).astype(np.float32)
        assert x.tobytes() == m["x"].tobytes()                       # the float32 wire bits
        assert all(c == "" for c in r[3 + 3 * n:21])                 # a shorter thread: empty cells
        tension = np.array([float(c) for c in r[21:21 + n - 1]]).astype(np.float32)
        assert tension.tobytes() == m["tension"].tobytes() and all(c == "" for c in r[21 + n - 1:26])
        assert float(r[26]) == m["twist"] and int(r[27]) == m["contacts"]
        assert [float(c) for c in r[28:31]] == [m["energy"][k] for k in ("kinetic", "elastic", "gravity")]
        assert (int(r[31]), float(r[32]), int(r[33])) == tuple(m["solver"][k] for k in ("iters", "residual",
                                                                                          "substeps"))
        assert json.loads(r[34]) == m["grasps"]

    header, rows = _read_csv(out / "stats.csv")
    assert header == ["seq", "t", "lateness_us.max", "lateness_us.p50", "lateness_us.p99", "lateness_us.p999",
                      "overruns", "realtime", "substeps.max", "substeps.mean"]
    for r, m in zip(rows, _decoded(synthetic, "stats")):
        assert int(r[0]) == m["seq"] and float(r[4]) == m["lateness_us"]["p99"]
        assert float(r[2]) == m["lateness_us"]["max"] and r[7] == str(m["realtime"]) and int(r[6]) == m["overruns"]

    header, rows = _read_csv(out / "events.csv")
    assert header == ["seq", "t", "kind", "details"]
    events = _decoded(synthetic, "event")
    assert [r[2] for r in rows] == [m["kind"] for m in events] == ["start", "grasp", "set"]
    for r, m in zip(rows, events):
        assert json.loads(r[3]) == {k: v for k, v in m.items() if k not in ("v", "seq", "t", "kind")}
    assert json.loads(rows[2][3]) == {"path": "gravity", "value": [0.0, 0.0, -9.81]}

    line = capsys.readouterr().out
    assert line.count("\n") == 1
    assert ("636 messages (state 30, force 600, stats 3, event 3); devices left, right; t 0.000 to 0.300 s; "
            f"wrote {out / 'state.csv'}, {out / 'force.csv'}, {out / 'stats.csv'}, {out / 'events.csv'}") in line


def test_export_csv_loads_with_numpy_in_one_line(synthetic, tmp_path):
    E.write_csv(E.load_recording(synthetic, ("force",), progress=False), tmp_path)
    table = np.genfromtxt(tmp_path / "force.csv", delimiter=",", names=True, dtype=None, encoding="utf-8")
    assert table.shape == (600,) and table["device"][1] == "right" and table["force_x"][2] == 1 / 3


def test_export_npz_round_trips_bit_exact(synthetic, tmp_path, capsys):
    out = tmp_path / "rec.npz"
    assert main(["export", str(synthetic), "--npz", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    with np.load(out, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    assert json.loads(str(arrays["metadata"])) == META

    forces = _decoded(synthetic, "force")
    for dev in ("left", "right"):
        mine = [m for m in forces if m["device"] == dev]
        assert arrays[f"force/{dev}/seq"].tolist() == [m["seq"] for m in mine]
        for key in ("t", "axial", "pose", "stylus", "force"):
            want = np.array([m[key] for m in mine], dtype=np.float64)
            assert arrays[f"force/{dev}/{key}"].tobytes() == want.tobytes(), key
        assert arrays[f"force/{dev}/flags"].tolist() == [m["flags"] for m in mine]

    states = _decoded(synthetic, "state")
    x, tension = arrays["state/x"], arrays["state/tension"]
    assert x.dtype == np.float32 and x.shape == (30, 6, 3) and tension.shape == (30, 5)
    for i, m in enumerate(states):
        n = m["n"]
        assert x[i, :n].tobytes() == m["x"].tobytes() and np.isnan(x[i, n:]).all()
        assert tension[i, :n - 1].tobytes() == m["tension"].tobytes() and np.isnan(tension[i, n - 1:]).all()
    assert arrays["state/n"].tolist() == [m["n"] for m in states]
    assert arrays["state/t"].tobytes() == np.array([m["t"] for m in states]).tobytes()
    assert arrays["state/energy.kinetic"].tolist() == [m["energy"]["kinetic"] for m in states]
    assert [json.loads(g) for g in arrays["state/grasps"]] == [m["grasps"] for m in states]

    stats = _decoded(synthetic, "stats")
    assert arrays["stats/lateness_us.p99"].tolist() == [m["lateness_us"]["p99"] for m in stats]
    assert arrays["stats/overruns"].dtype == np.int64 and arrays["stats/realtime"].dtype == bool
    assert arrays["stats/realtime"].tolist() == [m["realtime"] for m in stats]
    assert arrays["event/kind"].tolist() == ["start", "grasp", "set"]
    assert json.loads(arrays["event/details"][1]) == {"device": "left", "id": "g0", "stiffness": 1000.0,
                                                      "vertex": 5}


def test_export_headless_and_topics_subset(headless, tmp_path, capsys):
    assert main(["export", str(headless), "--csv", str(tmp_path), "--topics", "force,stats"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["force.csv"]     # no stats in a headless run
    line = capsys.readouterr().out
    assert "state 200, force 2000, stats 0, event 0" in line and f"wrote {tmp_path / 'force.csv'}" in line
    header, rows = _read_csv(tmp_path / "force.csv")
    assert len(rows) == 2000 and "stylus_x" in header
    assert main(["export", str(headless), "--npz", str(tmp_path / "h.npz"), "--topics", "state"]) == 0
    with np.load(tmp_path / "h.npz") as z:
        assert sorted(k.split("/")[0] for k in z.files if k != "metadata") == ["state"] * 14
        assert z["state/x"].shape == (200, 101, 3) and z["state/seq"][0] == 10


# -- errors, progress ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["plot", "-o", "out.png"], ["export", "--csv", "out"]])
def test_bad_input_is_one_line_and_exit_2(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    text = tmp_path / "notes.mcap"
    text.write_text("these are not the messages you are looking for\n")
    (tmp_path / "empty.mcap").write_bytes(b"")
    cases = {"missing": (tmp_path / "missing.mcap", "No such file"), "not mcap": (text, "not an MCAP file"),
             "directory": (tmp_path, "Is a directory"), "empty": (tmp_path / "empty.mcap", "no messages")}
    for what, (path, message) in cases.items():
        assert main([command[0], str(path), *command[1:]]) == 2, what
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and message in err and err.startswith(f"suturesim {command[0]}: "), (what, err)
        assert out == "" and not (tmp_path / command[2]).exists()
    # the console entry point: the same one line, no traceback
    r = subprocess.run(CLI + [command[0], str(text), *command[1:]], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 2 and r.stderr == f"suturesim {command[0]}: {text}: not an MCAP file (bad magic)\n"


def test_export_bad_requests(synthetic, tmp_path, capsys):
    assert main(["export", str(synthetic), "--csv", str(tmp_path), "--topics", "force,knots"]) == 2
    assert "--topics: unknown knots" in capsys.readouterr().err
    assert main(["export", str(synthetic), "--npz", str(tmp_path / "out.zip")]) == 2
    assert "must end in .npz" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["export", str(synthetic), "--csv", str(blocker / "sub")]) == 2   # cannot create the directory
    assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(SystemExit) as exc:                              # argparse: exactly one output
        main(["export", str(synthetic), "--csv", str(tmp_path), "--npz", str(tmp_path / "x.npz")])
    assert exc.value.code == 2


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_rate_limited_and_only_on_a_terminal(synthetic):
    tty = _Tty()
    bar = E.Progress("reading", total=1000, stream=tty)
    for i in range(1000):
        bar.update(i)
    bar.update(1000, force=True)
    bar.close()
    frames = tty.getvalue().split("\r")
    assert 2 <= len(frames) <= 5 and "100 % (1000/1000)" in tty.getvalue()   # a fast loop: ~ first and last
    pipe = io.StringIO()
    bar = E.Progress("reading", total=10, stream=pipe)
    bar.update(10, force=True)
    assert pipe.getvalue() == ""

    tty = _Tty()
    E.load_recording(synthetic, progress=E.Progress("reading", 636, stream=tty))
    assert "reading: 100 % (636/636)" in tty.getvalue()
