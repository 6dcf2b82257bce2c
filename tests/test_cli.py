"""The `suturesim` command line: run with a recording, errors for bad input, validate's table."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import yaml

from suturesim.server import protocol
from suturesim.server.cli import main
from suturesim.server.recording import read_messages, read_metadata


def test_run_records_state_and_force(tmp_path, capsys):
    out = tmp_path / "ax.mcap"
    assert main(["run", "wang2017-axial-force", "--duration", "0.5", "--record", str(out)]) == 0
    text = capsys.readouterr().out
    assert "0.500 s simulated" in text
    msgs = list(read_messages(out))
    topics = [m[0] for m in msgs]
    assert topics.count("force") == 500          # every tick
    assert topics.count("state") == 50           # 100 Hz
    states = [protocol.decode(p, "state") for t, p, _, _ in msgs if t == "state"]
    assert [s["seq"] for s in states] == list(range(10, 501, 10))
    last = states[-1]
    assert last["n"] == 51 and last["x"].shape == (51, 3) and last["tension"].shape == (50,)
    assert np.all(np.isfinite(last["tension"]))
    forces = [protocol.decode(p, "force") for t, p, _, _ in msgs if t == "force"]
    assert forces[-1]["device"] == "vertex50"
    assert forces[-1]["axial"] > 0.05            # the 0.1 N pull, partly balanced by dynamics
    meta = read_metadata(out)
    assert yaml.safe_load(meta["scenario"]["yaml"])["name"] == "wang2017-axial-force"
    assert "numba" in meta["versions"]


def test_run_is_deterministic_and_its_digest_says_so(tmp_path, capsys):
    a, b = tmp_path / "a.mcap", tmp_path / "b.mcap"
    digests = []
    for p, duration in ((a, "0.2"), (b, "0.2"), (None, "0.201")):
        assert main(["run", "bench-suture", "--duration", duration] + (["--record", str(p)] if p else [])) == 0
        lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("state digest ")]
        assert len(lines) == 1
        digests.append(lines[0].split()[-1])
    pa = [m[1] for m in read_messages(a) if m[0] == "state"]
    pb = [m[1] for m in read_messages(b) if m[0] == "state"]
    assert pa and pa == pb
    assert digests[0] == digests[1] and len(digests[0]) == 64
    assert digests[2] != digests[0]      # one tick more


def test_the_state_digest_sees_one_bit():
    from suturesim.server.headless import state_digest
    from suturesim.solver.scenario import load_scenario

    state = load_scenario("needle-tie-surgeons-knot").new_state()
    before = state_digest(state)
    assert state_digest(state) == before
    for name in ("x", "x_prev", "tension", "nst"):
        view = getattr(state, name).reshape(-1).view(np.uint64)
        view[-1] ^= np.uint64(1)        # the last bit of the last value
        assert state_digest(state) != before, name
        view[-1] ^= np.uint64(1)
    assert state_digest(state) == before


def test_bad_scenario_names_file_key_and_reason(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("thread:\n  preset: wang2017-fig4\n  bending_stifness: 1.0\n")
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "thread.bending_stifness" in err and "unknown key" in err


def test_unknown_scenario(capsys):
    assert main(["run", "no-such-scenario"]) == 2
    assert "no such scenario" in capsys.readouterr().err


def test_console_script_help():
    r = subprocess.run([sys.executable, "-m", "suturesim.server.cli", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for cmd in ("run", "validate", "bench"):
        assert cmd in r.stdout


@pytest.mark.long
@pytest.mark.xdist_group("validate-no-contact")
def test_validate_full_table(validate_table):
    """The table of the solver's cases; the self-contact rows are tested one by one in test_validation_contact.
    `validate --no-contact` is run once, by conftest.py's validate_table, whose rows test_validation.py's long
    tests check too."""
    rc, out = validate_table.rc, validate_table.out
    assert "energy drift" in out and "stability sweep" in out
    assert rc == 0, out


def test_bench_quick_runs_and_prints_tables(capsys):
    """The benchmark command works end to end (its figures are measured by `suturesim bench`, not here)."""
    assert main(["bench", "all", "--quick", "--no-elastica", "--no-loop"]) == 0
    out = capsys.readouterr().out
    assert "bench-suture" in out and "newton" in out and "contraction" in out
    # the inbound section: every hostile request refused, the ordinary ones accepted
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and ("accepted" in ln or "refused" in ln)]
    assert "## 8. Inbound validation" in out and len(rows) == 10
    assert [ln.split(" | ")[0] for ln in rows if "accepted" in ln] == ["| `status` request",
                                                                      "| inline scenario (needle-tie-surgeons-knot)",
                                                                      "| stylus sample"]


def test_bench_out_replaces_a_sections_figures_and_keeps_its_notes():
    """`bench tissue --out` on docs/BENCHMARKS.md: the section's figures are the new run's, the other sections and
    the section's text below the KEEP_BELOW line (earlier runs, written by hand) are as they were."""
    from suturesim.tools.bench_loop import KEEP_BELOW, splice_section

    doc = "\n".join(["# Benchmarks", "", "## 6. Self-contact", "", "| old six |", "",
                     "## 7. Tissue", "", "| old figures |", "", KEEP_BELOW, "", "A hand note: p99 396 us.", "",
                     "## Notes on method", "", "how"])
    new = ["## 7. Tissue", "", "| new figures |", ""]
    out = splice_section(doc, new, "suturesim bench tissue --out docs/BENCHMARKS.md", "2026-11-28 04:05 UTC")
    assert "| new figures |" in out and "| old figures |" not in out
    assert "| old six |" in out and out.index("| old six |") < out.index("## 7. Tissue")
    seven = out[out.index("## 7. Tissue"):out.index("## Notes on method")]
    assert "*This section: `suturesim bench tissue --out docs/BENCHMARKS.md`, 2026-11-28 04:05 UTC.*" in seven
    assert seven.index("| new figures |") < seven.index(KEEP_BELOW) < seven.index("A hand note: p99 396 us.")
    assert out.endswith("## Notes on method\n\nhow")
    # run again: the notes are kept once, not piled up
    again = splice_section(out, new, "suturesim bench tissue --out docs/BENCHMARKS.md", "2026-11-29 10:00 UTC")
    assert again.count(KEEP_BELOW) == 1 and again.count("A hand note") == 1
    # a section without the line is replaced whole, as before
    plain = splice_section(doc.replace(KEEP_BELOW, ""), new, "c", "d")
    assert "A hand note" not in plain and "| new figures |" in plain


def test_bench_one_part_out_keeps_the_other_sections(tmp_path, monkeypatch):
    """`bench solver --out` and `bench suture --out` update their own sections (1; 2 and 3) of an existing
    document: a `bench solver --out docs/BENCHMARKS.md` once wrote Sec. 1 alone and lost Sec. 2-7. A suture run
    without PyElastica leaves Sec. 3 as it was. (The measurements are stubbed: this tests the writing.)"""
    from suturesim.solver.scenario import load_scenario
    from suturesim.tools import bench

    monkeypatch.setattr(bench, "measure_sweep", lambda budget, log: None)
    monkeypatch.setattr(bench, "render_sweep", lambda res: ["## 1. Solver", "", "| new one |", ""])
    monkeypatch.setattr(bench, "measure_scenarios", lambda budget, log: [None])
    monkeypatch.setattr(bench, "render_scenarios", lambda res, budget: ["## 2. Scenarios", "", "| new two |", ""])
    rod = bench.elastica_suture(load_scenario("bench-suture"))
    monkeypatch.setattr(bench, "measure_elastica", lambda budget, log: bench.ElasticaResult([], rod, skipped="no"))
    doc = tmp_path / "b.md"
    sections = [[f"## {k}. Part {k}", "", f"| old {k} |", ""] for k in range(1, 8)]
    doc.write_text("\n".join(["# Benchmarks", "", *sum(sections, []), "## Notes on method", "", "how"]) + "\n")
    assert bench.main(["solver", "--out", str(doc)]) == 0
    text = doc.read_text()
    assert "| new one |" in text and "| old 1 |" not in text
    assert all(f"| old {k} |" in text for k in range(2, 8)) and text.rstrip().endswith("how")
    assert bench.main(["suture", "--out", str(doc)]) == 0
    text = doc.read_text()
    assert "| new two |" in text and "| old 2 |" not in text and "| old 3 |" in text   # PyElastica skipped
    assert "| new one |" in text and all(f"| old {k} |" in text for k in range(4, 8))


def test_bench_all_out_keeps_every_sections_notes():
    """`bench all --out` writes the document anew, with each section's notes below its KEEP_BELOW line."""
    from suturesim.tools.bench_loop import KEEP_BELOW, keep_notes

    old = "\n".join(["# Benchmarks", "", "## 6. Self-contact", "", "| old six |", "", KEEP_BELOW, "", "six's notes",
                     "", "## 7. Tissue", "", "| old seven |", "", "## Notes on method", "", "how"])
    new = "\n".join(["# Benchmarks", "", "## 6. Self-contact", "", "| new six |", "", "## 7. Tissue", "",
                     "| new seven |", "", "## Notes on method", "", "how"])
    out = keep_notes(old, new)
    assert out.split("\n") == ["# Benchmarks", "", "## 6. Self-contact", "", "| new six |", "", KEEP_BELOW, "",
                                "six's notes", "", "## 7. Tissue", "", "| new seven |", "", "## Notes on method", "",
                                "how"]
    assert keep_notes(out, new) == out                 # again: kept once
    assert keep_notes(new, new) == new                 # nothing to keep: unchanged


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range():
    """The ports the tests and benches give a server: none can be taken meanwhile as an outgoing connection's
    local end, as the kernel hands those out from its ephemeral range only."""
    import socket

    from suturesim.tools.bench_loop import _ephemeral_low, free_ports
    ports = free_ports(8)
    assert len(set(ports)) == 8
    assert all(1024 <= p < _ephemeral_low() for p in ports), ports
    for p in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", p))


def test_bench_tissue_counts_a_scripted_suture_done_only_with_its_three_knots_and_the_wound_closed():
    """`bench tissue`'s table of how the scripted sutures end: a run is done with the half knot, the double throw
    and the surgeon's knot read in that order and the wound closed at the end; runs that ended alike are counted
    together, the most common first; the needle tie's wind counts as caught where the drive would make the
    surgeon's knot; the double throw's seats are given apart for the runs done and the others."""
    from suturesim.tools.bench_tissue import ENDING_KNOTS, Ending, TissueBench, render_tissue

    scene = "needle-tie-surgeons-knot"
    runs = [Ending(scene, 0.0, 0, 0.0, list(ENDING_KNOTS), "gap_closed", ENDING_KNOTS[-1], -2.6e-4),
            Ending(scene, 1e-12, 1, 5.0, list(ENDING_KNOTS), "gap_closed", ENDING_KNOTS[-1], -3.8e-4),
            Ending(scene, 1e-12, 2, 9.0, ENDING_KNOTS[:2], "gap_opened", ENDING_KNOTS[1], -7.9e-4),
            Ending(scene, 1e-12, 3, 12.0, ENDING_KNOTS[:2], "gap_opened", ENDING_KNOTS[1], -6.6e-4),
            Ending(scene, 1e-12, 4, 16.0, list(ENDING_KNOTS), "gap_opened", ENDING_KNOTS[-1], -2.6e-4),
            Ending(scene, 1e-12, 5, 5.0, list(reversed(ENDING_KNOTS)), "gap_closed", ENDING_KNOTS[0], -7.0e-4)]
    assert [e.done for e in runs] == [True, True, False, False, False, False]
    rows = {ln.split(" | ")[1]: ln for ln in render_tissue(TissueBench(ticks=np.ones(10), substeps=np.full(10, 4.0),
                                                                   endings=runs))
            if ln.startswith(f"| {scene} |")}
    assert set(rows) == {"as scripted", "1e-12"}
    assert "| 1 of 1 | 1 of 1 | -0.26 / - |" in rows["as scripted"]
    # where the double throw sat, the runs done apart from the others
    assert "| 1 of 5 | 2 of 5 | -0.38 / -0.79 to -0.26 | 2 × half knot, double throw; open / " in rows["1e-12"]


def test_bench_tissue_splits_the_rounds_by_what_kept_them_going():
    """`bench tissue`'s rounds tables, self-contact's and the tissue's: rounds a substep, the shares of the rounds in which the floor raised a gap
    and in which friction had not settled, and the share of substeps that ran out, for the whole scene and each
    phase that has ticks."""
    from suturesim.tools.bench_tissue import PHASES, TissueBench, render_tissue

    n = 5000   # 5 s: the first two phases
    rounds = np.zeros((n, 4))
    rounds[:4000] = [4.0, 0.0, 0.0, 0.0]          # the bite: one round a substep, settled at once
    rounds[4000:] = [24.0, 6.0, 18.0, 4.0]        # then six rounds a substep, out of rounds every substep
    lines = render_tissue(TissueBench(ticks=np.ones(n), substeps=np.full(n, 4.0), rounds=rounds,
                                      contact=(0.001, 6)))
    rows = [ln for ln in lines if ln.endswith("% |")]   # no tissue rounds: the contact's table alone
    # 16000 + 24000 rounds in 20000 substeps; 6000 and 18000 of them in the second phase's 4000 substeps
    assert rows == ["| whole scene (5 s) | 2.00 | 15 % | 45 % | 20 % |",
                    f"| {PHASES[0][0]}, 0-4 s | 1.00 | 0 % | 0 % | 0 % |",
                    f"| {PHASES[1][0]}, 4-6.5 s | 6.00 | 25 % | 75 % | 100 % |"]
    # the tissue's: five columns, the three pushes' shares between the rounds and the substeps out of rounds
    tissue = np.zeros((n, 5))
    tissue[:4000] = [16.0, 8.0, 16.0, 4.0, 4.0]   # the bite: four rounds a substep, the last one out
    tissue[4000:] = [4.0, 0.0, 0.0, 0.0, 0.0]
    lines = render_tissue(TissueBench(ticks=np.ones(n), substeps=np.full(n, 4.0), rounds=rounds,
                                      tissue_rounds=tissue, contact=(0.001, 6)))
    at = lines.index(next(ln for ln in lines if ln.startswith("| part of the scene | rounds a substep | rounds the "
                                                                "pads pushed in")))
    assert lines[at + 2:at + 5] == ["| whole scene (5 s) | 3.40 | 47 % | 94 % | 24 % | 80 % |",
                                    f"| {PHASES[0][0]}, 0-4 s | 4.00 | 50 % | 100 % | 25 % | 100 % |",
                                    f"| {PHASES[1][0]}, 4-6.5 s | 1.00 | 0 % | 0 % | 0 % | 0 % |"]
    # no self-contact and no tissue: no table
    assert not any("rounds a substep" in ln for ln in render_tissue(TissueBench(ticks=np.ones(10),
                                                                                substeps=np.full(10, 4.0))))
