"""`suturesim score F.mcap [--json] [--html OUT.html]` and `suturesim score DIR`: a suture attempt scored from its
recording, FLS-style (docs/ASSESSMENT.md).

A recording's messages are fed in log order to server/assessment.py's :class:`Scorer`, the same code the live
scorer runs; this module reads the file, prints the report (or its JSON), writes the HTML page
(tools/score_report.py), tabulates a directory of recordings, one CSV row each, and judges them against the
FLS's benchmarks or an instructor's, set by a directory of expert recordings (``--benchmarks DIR``).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

from ..server import protocol
from ..server.assessment import SCORE_CUTOFF, Attempt, Check, Scorer, fls_checks, rescore


class ScoreError(ValueError):
    """A recording that cannot be scored (unreadable, or no message of the scene in it)."""


def score_recording(path: str | os.PathLike) -> Attempt:
    """Score the MCAP recording at ``path``: its messages fed to a :class:`Scorer` in log order."""
    from ..server.recording import RecordingError, read_messages, read_metadata

    try:
        meta = read_metadata(path)
        scorer = Scorer(scenario=meta.get("scenario", {}).get("name", ""),
                        trainee=meta.get("server", {}).get("trainee", ""))
        fed = 0
        for topic, payload, log_time, _ in read_messages(path):
            if not scorer.a.started:      # the attempt's start: its first message's log time (UTC)
                scorer.a.started = datetime.fromtimestamp(log_time * 1e-9, timezone.utc).isoformat(
                    timespec="seconds")
            if topic in ("state", "force", "event"):
                try:
                    scorer.feed_payload(topic, payload)
                except (protocol.ProtocolError, KeyError, TypeError, ValueError) as exc:
                    raise ScoreError(f"{os.fspath(path)}: a {topic} message it cannot read: {exc}") from exc
                fed += 1
    except (RecordingError, OSError) as exc:
        raise ScoreError(str(exc)) from exc
    if not fed:
        raise ScoreError(f"{os.fspath(path)}: no state, force or event message to score")
    if scorer.a.rated_n is None:    # a recording without the server's `start` (a headless run): its scenario's
        scorer.a.rated_n = _rating(meta, path)
    return scorer.attempt()


def _rating(meta: dict, path: str | os.PathLike) -> float | None:
    """The rated strength (N) of the thread of the scenario a recording's metadata holds, or None (unrated, or no
    scenario it can build)."""
    from ..server.recording import RecordingError
    from ..solver.breakage import rating
    from ..solver.config import ConfigError
    from .replay import recorded_scenario

    try:
        return rating(recorded_scenario(meta, os.fspath(path)).model)
    except (RecordingError, ConfigError, yaml.YAMLError, OSError):
        return None


# -- printing ----------------------------------------------------------------------------------------------
def _f(v, fmt: str = ".1f") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return format(v, fmt)


def table(a: Attempt) -> str:
    """``a`` as a plain-text report."""
    lines = [f"suture attempt: {a.scenario or '?'}" + (f", trainee {a.trainee}" if a.trainee else "")
             + (f", started {a.started}" if a.started else ""),
             f"  score {a.score:.1f} (FLS-style: {SCORE_CUTOFF:g} s - time - penalties), "
             f"{'PASS' if a.passed else 'FAIL'} against {a.benchmarks} benchmarks", "", "phases (s from the start):"]
    lines += [f"  {name:<16} {t:8.2f}" for name, t in sorted(a.phases.items(), key=lambda kv: kv[1])] \
        or ["  none"]
    lines += ["", "placement:"]
    lines += [f"  {p.target:<8} {p.pad}/{p.side:<6} {p.offset_mm:6.2f} mm off the mark"
              + (f", at {p.angle_deg:.0f} deg to the face" if p.angle_deg is not None else "")
              for p in a.placements] or ["  no marked point punctured"]
    lines += [f"  bite depth {_f(a.bite_depth_mm, '.2f')} mm, {a.extra_punctures} extra punctures, "
              f"{a.withdrawals} withdrawals",
              f"  needle across its punctures: peak {a.peak_lateral_n:.2f} N, {a.lateral_impulse_ns:.3f} N s, "
              f"{a.tears} tears",
              "  thread drawn through the tissue: " + (", ".join(f"{pad} {mm:.1f} mm" for pad, mm in
                                                                sorted(a.drawn_mm.items())) or "none"),
              "  edges held by forceps: " + (", ".join(f"{pad} peak {f:.2f} N" for pad, f in
                                                       sorted(a.edge_peaks_n.items())) or "none"),
              "", "thread and knot:",
              f"  peak tension {a.peak_tension_n:.2f} N at {_f(a.peak_tension_at_s, '.2f')} s"
              + ("" if a.rated_n is None else f", {100 * a.tension_share:.0f} % of its rated {a.rated_n:g} N")
              + ("" if not a.breaks else f"; broke at {a.broke_at_s:.2f} s ({a.breaks} breaks)"),
              f"  knot {a.knot or 'none'}, throws {_f(a.throws, 'd')}, square {_f(a.knot_secure)}",
              f"  wound: gap at the end {_f(a.gap_end_mm, '.2f')} mm, closed {_f(a.closed_at_end)}, "
              f"reopened {a.reopened} times", "", "tools:"]
    if a.security is not None:
        lines.insert(lines.index("tools:") - 1, f"  {a.security.line()}")
    lines += [f"  {u.device:<10} path {u.path_m:6.3f} m, idle {u.idle_s:6.1f} s, {u.grasps} grasps "
              f"({u.missed_grasps} missed), {u.clutches} clutches, peak force {u.peak_force_n:.2f} N"
              for u in a.tools] or ["  none"]
    lines += [f"  needle drops {a.needle_drops}", "", "penalties:"]
    lines += [f"  {p.what:<18} {p.points:6.1f}  ({p.reason})" for p in a.penalties] or ["  none"]
    lines += ["", "benchmarks:"]
    lines += [f"  {c.what:<24} {_f(c.value, '.2f'):>8} against {_f(c.limit, 'g'):>5}  "
              f"{'pass' if c.passed else 'FAIL'}" for c in a.checks]
    return "\n".join(lines)


# the metrics an instructor's expert recordings set benchmarks for, lower being better: (name, the attempt's value)
EXPERT_METRICS = (
    ("time (s)", lambda a: a.completed_s),
    ("worst mark (mm)", lambda a: max((p.offset_mm for p in a.placements), default=None)),
    ("path of all tools (m)", lambda a: sum(u.path_m for u in a.tools)),
    ("peak tension (N)", lambda a: a.peak_tension_n),
    ("penalty points", lambda a: sum(p.points for p in a.penalties)),
)


@dataclass(frozen=True)
class Benchmarks:
    """Proficiency benchmarks from experts' recordings: each metric's limit is the largest value among the experts
    who finished (an attempt as good as the least good expert's passes; every expert passes their own)."""
    source: str
    experts: int
    limits: tuple[tuple[str, float], ...]

    def checks(self, a: Attempt) -> list[Check]:
        """``a`` against these benchmarks, and a square knot, a closed wound, (when it ran) the knot holding
        under the security test and (a rated thread) the thread unbroken, as the FLS's own checks ask."""
        values = dict((name, value(a)) for name, value in EXPERT_METRICS)
        out = [Check(name, values[name], limit, values[name] is not None and values[name] <= limit)
               for name, limit in self.limits]
        return out + [c for c in fls_checks(a)
                      if c.what in ("square knot", "wound closed at the end", "knot holds under tension",
                                    "thread not broken")]


def expert_benchmarks(directory: str | os.PathLike) -> Benchmarks:
    """The benchmarks set by every recording in ``directory`` (``*.mcap``) that reached cinched; raises
    ScoreError if none did or one cannot be read."""
    path = Path(directory)
    if not path.is_dir():
        raise ScoreError(f"--benchmarks {directory}: not a directory of recordings")
    done = [a for a in (score_recording(f) for f in sorted(path.glob("*.mcap"))) if a.completed_s is not None]
    if not done:
        raise ScoreError(f"--benchmarks {directory}: no recording in it finished the task (cinched)")
    limits = []
    for name, value in EXPERT_METRICS:
        seen = [v for v in (value(a) for a in done) if v is not None]
        if len(seen) == len(done):          # a metric some experts lack (no marks in their scene) sets none
            limits.append((name, float(max(seen))))
    return Benchmarks(str(path), len(done), tuple(limits))


def _judge(a: Attempt, benchmarks: Benchmarks | None) -> Attempt:
    if benchmarks is not None:
        a.checks = benchmarks.checks(a)
        a.benchmarks = f"the {benchmarks.experts} expert recordings' in {benchmarks.source}"
    return a


CSV_FIELDS = ("file", "scenario", "trainee", "started", "score", "passed", "completed_s", "worst_mark_mm", "knot",
              "gap_end_mm", "peak_tension_n", "tension_share", "breaks", "peak_lateral_n", "tears",
              "peak_edge_n", "drawn_mm", "extra_punctures", "withdrawals", "needle_drops", "path_m", "error")


def course(directory: Path, out, benchmarks: Benchmarks | None = None) -> int:
    """Every recording in ``directory``, one CSV row each (a row with ``error`` for one that cannot be
    scored), passed or not against ``benchmarks`` (default: the FLS's); returns the number scored."""
    w = csv.DictWriter(out, fieldnames=CSV_FIELDS)
    w.writeheader()
    done = 0
    for path in sorted(directory.glob("*.mcap")):
        row = {"file": path.name}
        try:
            a = _judge(score_recording(path), benchmarks)
        except ScoreError as exc:
            row["error"] = str(exc)
        else:
            done += 1
            row.update(scenario=a.scenario, trainee=a.trainee, started=a.started, score=f"{a.score:.1f}",
                       passed=a.passed, completed_s=_f(a.completed_s, ".2f"),
                       worst_mark_mm=_f(max((p.offset_mm for p in a.placements), default=None), ".2f"),
                       knot=a.knot or "", gap_end_mm=_f(a.gap_end_mm, ".2f"),
                       peak_tension_n=f"{a.peak_tension_n:.3f}", tension_share=_f(a.tension_share, ".3f"),
                       breaks=a.breaks, peak_lateral_n=f"{a.peak_lateral_n:.3f}", tears=a.tears,
                       peak_edge_n=_f(max(a.edge_peaks_n.values(), default=None), ".3f"),
                       drawn_mm=f"{sum(a.drawn_mm.values()):.1f}",
                       extra_punctures=a.extra_punctures,
                       withdrawals=a.withdrawals, needle_drops=a.needle_drops,
                       path_m=f"{sum(u.path_m for u in a.tools):.3f}")
        w.writerow(row)
    return done


def with_security(path: str | os.PathLike, a: Attempt, tension: float) -> Attempt:
    """``a`` with the knot security test run on the end of its recording ``path`` (tools/security.py), its
    penalties, score and checks again."""
    from ..server.recording import RecordingError
    from .security import security_of_recording

    try:
        a.security = security_of_recording(os.fspath(path), tension)
    except (RecordingError, ValueError) as exc:
        raise ScoreError(f"the knot security test cannot run: {exc}") from exc
    return rescore(a)


def run_score(target: str, as_json: bool = False, out=None, html: str | None = None,
              benchmarks: str | None = None, security: float | None = None) -> int:
    """`suturesim score`: a recording's report (or JSON; ``html``: also the HTML page, written there), or a
    directory's CSV, judged against the FLS's benchmarks or those of the expert recordings in ``benchmarks``;
    ``security``: also the knot security test, each end pulled with that many N. Exit code 2 for what cannot be
    scored or written."""
    out = out or sys.stdout
    path = Path(target)
    try:
        bm = None if benchmarks is None else expert_benchmarks(benchmarks)
        if path.is_dir():
            if security is not None:
                raise ScoreError("--security runs on one recording, not on a directory")
            course(path, out, bm)
            return 0
        a = score_recording(path)
        if security is not None:
            a = with_security(path, a, security)
        a = _judge(a, bm)
        if html is not None:
            from .score_report import write_report

            try:
                write_report(path, a, html)
            except OSError as exc:
                raise ScoreError(f"cannot write the report {html}: {exc}") from exc
    except ScoreError as exc:
        print(f"suturesim score: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(a.to_json()) if as_json else table(a), file=out)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="suturesim score", description=__doc__.split("\n")[0])
    p.add_argument("target", metavar="F.mcap|DIR")
    p.add_argument("--json", action="store_true")
    p.add_argument("--html", metavar="OUT.html")
    p.add_argument("--benchmarks", metavar="DIR")
    p.add_argument("--security", metavar="N", type=float, nargs="?", const=1.0, default=None)
    args = p.parse_args(argv)
    return run_score(args.target, args.json, html=args.html, benchmarks=args.benchmarks, security=args.security)


if __name__ == "__main__":
    sys.exit(main())
