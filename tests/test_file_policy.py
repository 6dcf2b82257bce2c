"""What a control client may make the server read or write (solver/sources.py, server/files.py): a scenario that
arrives over the network reads its preset and points file only under the shipped configs and files.scenarios_dir
(or, for a `set`, the files the running scenario already read); a refusal names the key, never quotes a file or
the OS, and reads the same for an outside path that exists and one that does not. The operator's own files stay
trusted. Recordings are plain names created exclusively in a private directory.

Unit-level, except one end-to-end test against a real daemon.
"""
from __future__ import annotations

import functools
import os
import pickle
import stat
import time
from pathlib import Path

import numpy as np
import pytest

from suturesim.server.config import FilesConfig, load_server_config
from suturesim.server.files import (FilesError, list_recordings, open_new_recording, recording_name_error,
                                    recordings_dir_ready)
from suturesim.solver.config import ConfigError
from suturesim.solver.presets import CONFIG_DIR
from suturesim.solver.scenario import build_scenario, load_scenario, load_scenario_request
from suturesim.solver.sources import FILE_REFUSED, POINTS_UNREADABLE, PRESET_REFUSED, SCENARIO_REFUSED, FilePolicy

SECRET = "SECRET-TOKEN-4711"
LEAKS = ("No such file", "Errno", "Permission denied", "Is a directory", "PATH=", SECRET)
THREAD = {"preset": "silk-3-0", "length": 1.0, "segments": 10}


def _points(n_seg: int = 10) -> np.ndarray:
    """n_seg + 1 points spanning exactly 1 m along x."""
    return np.column_stack([np.linspace(0.0, 1.0, n_seg + 1), np.zeros(n_seg + 1), np.zeros(n_seg + 1)])


@pytest.fixture
def dirs(tmp_path):
    """A scenarios directory (with a points file, a preset, a scenario) and an outside directory with secrets."""
    scen, outside = tmp_path / "scenarios", tmp_path / "outside"
    scen.mkdir()
    outside.mkdir()
    np.savetxt(scen / "pts.txt", _points())
    (scen / "mine-thread.yaml").write_text("length: 1.0\nsegments: 10\nmass: 0.01\nbending_stiffness: 1.0e-6\n")
    (scen / "mine.yaml").write_text("name: mine\nthread: {preset: mine-thread.yaml}\n"
                                    "shape: {kind: points, file: pts.txt}\n")
    (outside / "secret.yaml").write_text(f"{SECRET}: 1\n")
    (outside / "secret.txt").write_text(f"{SECRET}\n")
    return scen, outside


def _refusal(spec, scen) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_scenario_request(spec, str(scen))
    msg = str(info.value)
    assert not any(leak in msg for leak in LEAKS), msg
    return info.value


# -- load by string -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["/etc/passwd", "/proc/self/environ", "/etc/x.yaml"])
def test_load_of_an_absolute_path_is_refused(dirs, spec):
    err = _refusal(spec, dirs[0])
    assert err.key == "scenario" and err.file == "<load request>" and "absolute path" in err.reason


@pytest.mark.parametrize("spec", ["../../x.yaml", "../outside/secret.yaml", "sub/../../outside/secret.yaml"])
def test_load_escaping_the_scenarios_dir_is_refused(dirs, spec):
    err = _refusal(spec, dirs[0])
    assert err.key == "scenario" and "'..'" in err.reason


def test_load_of_a_symlink_out_of_the_scenarios_dir_is_refused_alike_for_existing_and_missing(dirs):
    scen, outside = dirs
    (scen / "escape.yaml").symlink_to(outside / "secret.yaml")
    (scen / "dangling.yaml").symlink_to(outside / "missing.yaml")
    a, b = _refusal("escape.yaml", scen), _refusal("dangling.yaml", scen)
    assert a.reason == b.reason == SCENARIO_REFUSED


def test_load_by_file_name_in_the_scenarios_dir_and_by_shipped_name(dirs):
    scen, _ = dirs
    sc = load_scenario_request("mine.yaml", str(scen))
    assert sc.name == "mine" and sc.base_dir == str(scen.resolve())
    assert set(sc.files_read) == {str((scen / "pts.txt").resolve()), str((scen / "mine-thread.yaml").resolve())}
    assert load_scenario_request("wang2017-hanging", str(scen)).name == "wang2017-hanging"
    assert "no such file in the scenarios directory" in _refusal("nope.yaml", scen).reason
    assert "no shipped scenario 'nope'" in _refusal("nope", scen).reason


# -- inline scenarios ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", ["../../../etc/x.yaml", "/etc/x.yaml", "../outside/secret.yaml",
                                    "../../../../../../etc/passwd", "/proc/self/environ.yaml"])
def test_inline_preset_outside_is_refused(dirs, preset):
    err = _refusal({"thread": {"preset": preset}}, dirs[0])
    assert (err.file, err.key, err.reason) == ("<load request>", "thread.preset", PRESET_REFUSED)


def test_refusal_is_the_same_for_an_existing_and_a_missing_outside_path(dirs):
    scen, outside = dirs
    for key, existing, missing in (
            ("preset", outside / "secret.yaml", outside / "missing.yaml"),
            ("file", outside / "secret.txt", outside / "missing.txt"),
            ("file", Path("/proc/self/environ"), Path("/proc/self/no-such-entry"))):
        msgs = []
        for path in (existing, missing):
            spec = ({"thread": {"preset": str(path)}} if key == "preset" else
                    {"thread": THREAD, "shape": {"kind": "points", "file": str(path)}})
            msgs.append(str(_refusal(spec, scen)))
        assert msgs[0] == msgs[1], msgs


def test_inline_points_file_outside_is_refused(dirs):
    scen, _ = dirs
    err = _refusal({"thread": THREAD, "shape": {"kind": "points", "file": "/proc/self/environ"}}, scen)
    assert (err.file, err.key, err.reason) == ("<load request>", "shape.file", FILE_REFUSED)


def test_symlinks_inside_the_scenarios_dir_pointing_out_are_refused(dirs):
    scen, outside = dirs
    (scen / "link.txt").symlink_to(outside / "secret.txt")
    (scen / "link.yaml").symlink_to(outside / "secret.yaml")
    (scen / "linkdir").symlink_to(outside)
    assert _refusal({"thread": THREAD, "shape": {"kind": "points", "file": "link.txt"}}, scen).reason == FILE_REFUSED
    assert _refusal({"thread": {"preset": "link.yaml"}}, scen).reason == PRESET_REFUSED
    assert _refusal({"thread": {"preset": "linkdir/secret.yaml"}}, scen).reason == PRESET_REFUSED


def test_inline_references_resolve_in_the_scenarios_dir_not_the_working_directory(dirs, monkeypatch, tmp_path):
    scen, _ = dirs
    monkeypatch.chdir(tmp_path)
    sc = load_scenario_request({"name": "inline", "thread": {"preset": "mine-thread.yaml"},
                                "shape": {"kind": "points", "file": "pts.txt"}}, str(scen))
    np.testing.assert_array_equal(sc.initial.x, _points())
    assert sc.base_dir == str(scen) and len(sc.files_read) == 2


def test_unreadable_content_inside_the_scenarios_dir_is_not_quoted(dirs):
    scen, _ = dirs
    (scen / "words.txt").write_text(f"0 0 {SECRET}\n")
    (scen / "bad.yaml").write_text(f"{SECRET}: [unclosed\n")
    (scen / "list.yaml").write_text(f"- {SECRET}\n")
    os.mkfifo(scen / "fifo.txt")    # would block a plain open; refused as not a regular file
    err = _refusal({"thread": THREAD, "shape": {"kind": "points", "file": "words.txt"}}, scen)
    assert err.reason == POINTS_UNREADABLE
    for name in ("bad.yaml", "list.yaml"):
        assert "cannot read the preset" in _refusal({"thread": {"preset": name}}, scen).reason
    assert _refusal({"thread": THREAD, "shape": {"kind": "points", "file": "fifo.txt"}}, scen).reason == \
        "not a regular file"
    assert _refusal({"thread": THREAD, "shape": {"kind": "points", "file": "nope.txt"}}, scen).reason == \
        "no such file: nope.txt"


# -- trusted input and `set` -------------------------------------------------------------------------------------
def test_trusted_shipped_choi_scenario_reads_its_points_file():
    sc = load_scenario("choi2021-overhand-n1")
    knot = str((CONFIG_DIR / "scenarios" / "choi2021-overhand-n1.knot.txt").resolve())
    assert knot in sc.files_read and sc.model.n_vertices == 301
    assert sc.base_dir == str(Path(sc.file).parent)


def _set_rebuild(sc, over: dict, scen: Path, admit: bool = True):
    """What control `set` builds (server/control.py): the running scenario's source with ``over`` merged, at its
    own base_dir, under the network policy admitting the files it read; through pickle, as in the worker."""
    data = {**sc.source, **{k: {**sc.source.get(k, {}), **v} for k, v in over.items()}}
    policy = FilePolicy(roots=(scen,), files=frozenset(map(Path, sc.files_read)) if admit else frozenset())
    build = pickle.loads(pickle.dumps(functools.partial(build_scenario, policy=policy, base_dir=sc.base_dir)))
    return build(data, "<set x>")


def test_set_on_the_choi_scenario_rebuilds_and_cannot_reach_out(dirs):
    scen, _ = dirs
    sc = load_scenario("choi2021-overhand-n1")
    again = _set_rebuild(sc, {"thread": {"air_drag_linear": 0.03}}, scen)
    np.testing.assert_array_equal(again.initial.x, sc.initial.x)
    assert again.files_read == sc.files_read and again.base_dir == sc.base_dir
    for over, key in (({"shape": {"file": "../../../../../../etc/passwd"}}, "shape.file"),
                      ({"shape": {"file": "/proc/self/environ"}}, "shape.file"),
                      ({"thread": {"preset": "/x.yaml"}}, "thread.preset")):
        with pytest.raises(ConfigError) as info:
            _set_rebuild(sc, over, scen)
        assert info.value.key == key and info.value.file == "<set x>", info.value
        assert not any(leak in str(info.value) for leak in LEAKS)


def test_set_on_a_trusted_scenario_keeps_its_own_files_and_only_those(tmp_path, dirs):
    """The operator's scenario outside every root, its preset and points beside it: a `set` rebuilds it (those
    two files admitted by name), but cannot read a neighbour of theirs."""
    scen, _ = dirs
    own = tmp_path / "operator"
    own.mkdir()
    np.savetxt(own / "pts.txt", _points())
    np.savetxt(own / "other.txt", _points())
    (own / "thread.yaml").write_text("length: 1.0\nsegments: 10\nmass: 0.01\nbending_stiffness: 1.0e-6\n")
    (own / "scene.yaml").write_text("thread: {preset: thread.yaml}\nshape: {kind: points, file: pts.txt}\n")
    sc = load_scenario(str(own / "scene.yaml"))
    assert sc.base_dir == str(own)
    assert _set_rebuild(sc, {"thread": {"air_drag": 1e-4}}, scen).model.n_vertices == 11
    with pytest.raises(ConfigError, match="shape.file: " + FILE_REFUSED):
        _set_rebuild(sc, {"shape": {"file": "other.txt"}}, scen)
    with pytest.raises(ConfigError, match="thread.preset: " + PRESET_REFUSED):
        _set_rebuild(sc, {"thread": {"air_drag": 1e-4}}, scen, admit=False)


def test_policy_is_picklable_and_always_has_the_shipped_configs(tmp_path):
    policy = FilePolicy(roots=(tmp_path,), files=frozenset({tmp_path / "a" / ".." / "b.txt"}))
    assert pickle.loads(pickle.dumps(policy)) == policy
    assert policy.roots == (CONFIG_DIR.resolve(), tmp_path.resolve())
    assert policy.files == frozenset({(tmp_path / "b.txt").resolve()})
    assert policy.allows(CONFIG_DIR / "threads" / "silk-3-0.yaml") and policy.allows(tmp_path / "b.txt")
    assert not policy.allows(tmp_path.parent / "b.txt") and not policy.allows("/etc/passwd")


# -- server config `files:` ---------------------------------------------------------------------------------------
def test_files_config_defaults_follow_xdg_and_nothing_is_created(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    cfg = load_server_config()
    assert cfg.files == FilesConfig(recordings_dir=str(tmp_path / "xdg/suturesim/recordings"),
                                    scenarios_dir=str(tmp_path / "xdg/suturesim/scenarios"))
    assert not (tmp_path / "xdg").exists()
    monkeypatch.delenv("XDG_DATA_HOME")
    assert FilesConfig().scenarios_dir == str(Path.home() / ".local/share/suturesim/scenarios")


def test_files_config_relative_to_the_config_file_and_checked(tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "server.yaml").write_text("files: {scenarios_dir: scen, recordings_dir: /abs/rec}\n")
    cfg = load_server_config(conf / "server.yaml")
    assert cfg.files.scenarios_dir == str(conf / "scen") and cfg.files.recordings_dir == "/abs/rec"
    (conf / "afile").write_text("")
    (conf / "server.yaml").write_text("files: {scenarios_dir: afile}\n")
    with pytest.raises(ConfigError, match="files.scenarios_dir: .*is not a directory"):
        load_server_config(conf / "server.yaml")
    (conf / "server.yaml").write_text("files: {scenario_dir: x}\n")
    with pytest.raises(ConfigError, match="files.scenario_dir: unknown key"):
        load_server_config(conf / "server.yaml")


# -- recordings ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../x.mcap", "a/b.mcap", ".hidden.mcap", "x" * 296 + ".mcap", "run1", "run.txt",
                                  ".mcap", "", "a b.mcap", "/abs.mcap", "run\0.mcap"])
def test_bad_recording_names(name):
    assert recording_name_error(name) is not None


@pytest.mark.parametrize("name", ["run1.mcap", "2026-11-29_a.b.mcap", "x" * 123 + ".mcap"])
def test_good_recording_names(name):
    assert recording_name_error(name) is None


def test_recordings_dir_is_made_private_and_checked(tmp_path):
    d = recordings_dir_ready(tmp_path / "a" / "rec")
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert recordings_dir_ready(d) == d
    os.chmod(d, 0o770)
    with pytest.raises(FilesError, match="writable by group or others"):
        recordings_dir_ready(d)
    os.chmod(d, 0o700)
    (tmp_path / "link").symlink_to(d)
    with pytest.raises(FilesError, match="symbolic link"):
        recordings_dir_ready(tmp_path / "link")
    (tmp_path / "file").write_text("")
    with pytest.raises(FilesError, match="not a directory"):
        recordings_dir_ready(tmp_path / "file")


def test_recordings_are_created_exclusively_and_never_follow_a_symlink(tmp_path):
    d = recordings_dir_ready(tmp_path / "rec")
    fd, path = open_new_recording(d, "run1.mcap")
    try:
        os.write(fd, b"mcap")
    finally:
        os.close(fd)
    assert path == d / "run1.mcap" and stat.S_IMODE(os.stat(path).st_mode) & 0o137 == 0
    with pytest.raises(FilesError, match="run1.mcap exists; recordings are never overwritten"):
        open_new_recording(d, "run1.mcap")
    assert path.read_bytes() == b"mcap"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (d / "planted.mcap").symlink_to(victim)
    (d / "dangling.mcap").symlink_to(tmp_path / "created-through-link")
    for name in ("planted.mcap", "dangling.mcap"):
        with pytest.raises(FilesError, match="never overwritten"):
            open_new_recording(d, name)
    assert victim.read_text() == "keep" and not (tmp_path / "created-through-link").exists()
    for bad in ("../x.mcap", "a/b.mcap", ".hidden.mcap", "x" * 300):
        with pytest.raises(FilesError):
            open_new_recording(d, bad)
    (tmp_path / "dirlink").symlink_to(d)
    with pytest.raises(FilesError, match="symlink is not accepted"):
        open_new_recording(tmp_path / "dirlink", "run2.mcap")


def test_list_recordings_lists_regular_mcap_files_only(tmp_path):
    d = recordings_dir_ready(tmp_path / "rec")
    for name in ("b.mcap", "a.mcap"):
        os.close(open_new_recording(d, name)[0])
    (d / "a.mcap").write_bytes(b"12345")
    (d / "notes.txt").write_text("x")
    (d / "sub.mcap").mkdir()
    (d / "link.mcap").symlink_to(d / "a.mcap")
    rows = list_recordings(d)
    assert [(r["name"], r["bytes"]) for r in rows] == [("a.mcap", 5), ("b.mcap", 0)]
    assert all(abs(r["mtime"] - time.time()) < 60 for r in rows)
    assert list_recordings(tmp_path / "none") == []


# -- end to end ---------------------------------------------------------------------------------------------------
def test_daemon_refuses_reads_outside_and_keeps_serving(tmp_path, dirs):
    """A real daemon with files.scenarios_dir set, serving the operator's own scenario from outside it: a `set`
    rebuilds that with its own points file but cannot point it elsewhere; each attack on `load` gets an error
    reply that leaks nothing, and the server answers `status` within 1 s after each; a scenario in the
    directory loads by file name."""
    from conftest import Daemon

    scen, outside = dirs
    (scen / "escape.yaml").symlink_to(outside / "secret.yaml")
    own = tmp_path / "operator"
    own.mkdir()
    np.savetxt(own / "pts.txt", _points())
    (own / "scene.yaml").write_text("name: own\nthread: {preset: silk-3-0, length: 1.0, segments: 10}\n"
                                    "shape: {kind: points, file: pts.txt}\n")
    cfg = tmp_path / "server.yaml"
    cfg.write_text(f"files: {{scenarios_dir: {scen}}}\nloop: {{realtime: false}}\n")
    d = Daemon("--config", str(cfg), "--scenario", str(own / "scene.yaml"))
    try:
        d.wait_serving()
        d.ok({"cmd": "set", "path": "thread.air_drag", "value": 1e-4})     # rereads its own pts.txt
        for value in ("../outside/secret.txt", str(outside / "secret.txt"), "/proc/self/environ"):
            reply = d.request({"cmd": "set", "path": "shape.file", "value": value})
            assert reply["ok"] is False and FILE_REFUSED in reply["error"], reply
            assert not any(leak in reply["error"] for leak in LEAKS), reply
        attacks = [
            ("/proc/self/environ", "absolute path"), ("/etc/passwd", "absolute path"),
            ("../outside/secret.yaml", "'..'"), ("escape.yaml", SCENARIO_REFUSED),
            ({"thread": {"preset": "../../../etc/x.yaml"}}, PRESET_REFUSED),
            ({"thread": {"preset": str(outside / "secret.yaml")}}, PRESET_REFUSED),
            ({"thread": THREAD, "shape": {"kind": "points", "file": "/proc/self/environ"}}, FILE_REFUSED),
            ({"thread": THREAD, "shape": {"kind": "points", "file": str(own / "pts.txt")}}, FILE_REFUSED),
        ]
        for spec, reason in attacks:
            reply = d.request({"cmd": "load", "scenario": spec})
            assert reply["ok"] is False and reason in reply["error"], (spec, reply)
            assert not any(leak in reply["error"] for leak in LEAKS), reply
            assert d.request({"cmd": "status"}, timeout=1.0)["scenario"] == "own"
        assert d.ok({"cmd": "load", "scenario": "mine.yaml"})["scenario"] == "mine"
        d.ok({"cmd": "set", "path": "thread.air_drag", "value": 1e-4})
        reply = d.request({"cmd": "set", "path": "shape.file", "value": "../outside/secret.txt"})
        assert reply["ok"] is False and FILE_REFUSED in reply["error"], reply
        assert d.request({"cmd": "status"}, timeout=1.0)["scenario"] == "mine"
    finally:
        d.close()
