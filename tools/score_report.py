"""The one-page HTML report of a scored suture attempt (`suturesim score F.mcap --html OUT.html`).

One self-contained page (no script, no file beside it: the plots are inline SVG) for an instructor: the score and
the pass/fail table against the benchmarks; the phase timeline; the force on each hand and the thread's peak
tension against time, with the wound's gap; the needle's entry and exit on the tissue, seen from above, against
the scene's marks; the metrics and penalties as `suturesim score` prints them (tools/score.py). Every text that
comes from the recording (names, knots) is escaped.
"""
from __future__ import annotations

import html
import os
from dataclasses import dataclass, field

import numpy as np

from ..server import protocol
from ..server.assessment import Attempt
from .score import table

WIDTH = 900               # px: the page's plots
PLOT_H = 220
BINS = 900                # a time series is drawn as at most this many points, each bin's largest value
TISSUE_VIEW_M = 0.008     # m: the wound's view reaches at least this far from the marks' centre
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")


@dataclass
class Traces:
    """What the report draws, read from a recording (times in s of scene time)."""
    force: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)   # device -> (t, |F| N)
    tension: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))  # (t, largest N)
    gap: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))      # (t, mm)
    # the tissue as the first state showed it: its pads and marks, and each `puncture` event (pad, side, pos)
    # moved with its pad back to where the pad was then (pads move, and marks with them: a puncture is drawn
    # where it is on its pad)
    pads: list[dict] = field(default_factory=list)
    targets: list[dict] = field(default_factory=list)
    punctures: list[dict] = field(default_factory=list)


def read_traces(path: str | os.PathLike) -> Traces:
    """The report's series from the recording at ``path`` (it has been scored, so it reads)."""
    from ..server.recording import read_messages

    tr = Traces()
    first: dict[str, np.ndarray] = {}      # pad -> its centre in the first state (m)
    now: dict[str, np.ndarray] = {}        # pad -> its centre in the newest state
    for topic, payload, _, _ in read_messages(path):
        if topic == "force":
            m = protocol.decode(payload, "force")
            t, f = tr.force.setdefault(m["device"], ([], []))
            t.append(m["t"])
            f.append(float(np.linalg.norm(m["force"])))
        elif topic == "state":
            m = protocol.decode(payload, "state")
            if len(m["tension"]):
                tr.tension[0].append(m["t"])
                tr.tension[1].append(float(np.max(m["tension"])))
            tissue = m.get("tissue") or {}
            if tissue.get("gap") is not None:
                tr.gap[0].append(m["t"])
                tr.gap[1].append(1e3 * float(tissue["gap"]))
            if tissue.get("pads"):
                if not tr.pads:
                    tr.pads, tr.targets = tissue["pads"], tissue.get("targets") or []
                    first = {p["id"]: np.asarray(p["pos"], float) for p in tr.pads}
                now = {p["id"]: np.asarray(p["pos"], float) for p in tissue["pads"]}
        elif topic == "event":
            m = protocol.decode(payload, "event")
            if m["kind"] == "puncture" and m.get("pos") is not None:
                pos = np.asarray(m["pos"], float)
                if m.get("pad") in now and m.get("pad") in first:
                    pos = pos - now[m["pad"]] + first[m["pad"]]
                tr.punctures.append({**m, "pos": [float(v) for v in pos]})
    return tr


def _binned(t: list[float], y: list[float], t0: float) -> tuple[np.ndarray, np.ndarray]:
    """``y`` against ``t - t0``, at most BINS points: each bin's largest value (a peak stays visible)."""
    t_arr, y_arr = np.asarray(t, float) - t0, np.asarray(y, float)
    if len(t_arr) <= BINS:
        return t_arr, y_arr
    edges = np.linspace(t_arr[0], t_arr[-1], BINS + 1)
    idx = np.clip(np.searchsorted(edges, t_arr, side="right") - 1, 0, BINS - 1)
    peak = np.full(BINS, -np.inf)
    np.maximum.at(peak, idx, y_arr)
    keep = np.isfinite(peak)
    return (0.5 * (edges[:-1] + edges[1:]))[keep], peak[keep]


def _plot(series: list[tuple[str, np.ndarray, np.ndarray, str]], t_end: float, ylabel: str,
          marks: dict[str, float]) -> str:
    """An SVG line plot of ``series`` (label, t s, y, colour) over 0..t_end, phase times ``marks`` as dashed
    lines."""
    left, right, top, bottom = 56, 12, 12, 30
    w, h = WIDTH - left - right, PLOT_H - top - bottom
    y_max = max([float(np.max(y)) for _, _, y, _ in series if len(y)] + [1e-9]) * 1.1
    t_end = max(t_end, 1e-9)

    def px(t, y):
        return left + w * t / t_end, top + h * (1.0 - y / y_max)

    out = [f'<svg width="{WIDTH}" height="{PLOT_H}" viewBox="0 0 {WIDTH} {PLOT_H}" role="img">',
           f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fff" stroke="#999"/>']
    for k in range(5):                                  # y grid and labels
        y = y_max * k / 4
        _, yy = px(0.0, y)
        out.append(f'<line x1="{left}" x2="{left + w}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>'
                   f'<text x="{left - 4}" y="{yy + 4:.1f}" font-size="11" text-anchor="end">{y:.3g}</text>')
    step = max(1.0, round(t_end / 8.0))
    for k in range(int(t_end // step) + 1):             # t labels
        xx, _ = px(k * step, 0.0)
        out.append(f'<text x="{xx:.1f}" y="{top + h + 16}" font-size="11" text-anchor="middle">{k * step:g}'
                   '</text>')
    for name, t in marks.items():
        xx, _ = px(t, 0.0)
        out.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{top}" y2="{top + h}" stroke="#aaa" '
                   f'stroke-dasharray="3,3"><title>{html.escape(name)}</title></line>')
    for k, (label, t, y, colour) in enumerate(series):
        if not len(t):
            continue
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in (px(tt, yy) for tt, yy in zip(t, y)))
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.3" points="{pts}"/>')
        out.append(f'<text x="{left + 8 + 150 * k}" y="{top + 14}" font-size="12" fill="{colour}">'
                   f'{html.escape(label)}</text>')
    out.append(f'<text x="14" y="{top + h / 2:.0f}" font-size="11" transform="rotate(-90 14 {top + h / 2:.0f})" '
               f'text-anchor="middle">{html.escape(ylabel)}</text>'
               f'<text x="{left + w / 2:.0f}" y="{PLOT_H - 2}" font-size="11" text-anchor="middle">s from the '
               'start</text></svg>')
    return "".join(out)


def _timeline(a: Attempt, t_end: float) -> str:
    """The phases on one time axis."""
    left, w = 60, WIDTH - 120                        # room for a label centred on either end
    t_end = max(t_end, 1e-9)
    out = [f'<svg width="{WIDTH}" height="70" viewBox="0 0 {WIDTH} 70" role="img">',
           f'<line x1="{left}" x2="{left + w}" y1="30" y2="30" stroke="#666" stroke-width="2"/>']
    for k, (name, t) in enumerate(sorted(a.phases.items(), key=lambda kv: kv[1])):
        x = left + w * min(t, t_end) / t_end
        y = 18 if k % 2 == 0 else 52
        out.append(f'<circle cx="{x:.1f}" cy="30" r="4" fill="#1f77b4"/>'
                   f'<text x="{x:.1f}" y="{y}" font-size="11" text-anchor="middle">{html.escape(name)} '
                   f'{t:.1f} s</text>')
    return "".join(out) + "</svg>"


def _tissue(tr: Traces) -> str:
    """The wound from above (x to the right, y up) as it was at the start: the pads, the marks (crosses) and the
    punctures where they are on their pads (dots: entry green, exit red), framed on the marks (else the pads) with room for every puncture, and a 1 mm bar."""
    if not tr.pads:
        return "<p>No tissue in this recording.</p>"
    points = [np.asarray(tg["pos"][:2], float) for tg in tr.targets]
    if points:
        centre = np.mean(points, axis=0)
    else:
        centre = np.mean([np.asarray(p["pos"][:2], float) for p in tr.pads], axis=0)
    reach = max([TISSUE_VIEW_M] + [1.3 * float(np.max(np.abs(np.asarray(q[:2], float) - centre)))
                                   for q in [tg["pos"] for tg in tr.targets] + [e["pos"] for e in tr.punctures]])
    size = 420
    scale = (size - 20) / (2.0 * reach)               # px per m

    def px(p):
        return size / 2 + scale * (p[0] - centre[0]), size / 2 - scale * (p[1] - centre[1])

    out = [f'<svg width="{size}" height="{size}" viewBox="0 0 {size} {size}" role="img">',
           f'<rect width="{size}" height="{size}" fill="#fafafa"/>']
    for p in tr.pads:
        x0, y1 = px(np.asarray(p["pos"][:2]) - 0.5 * np.asarray(p["size"][:2]))
        x1, y0 = px(np.asarray(p["pos"][:2]) + 0.5 * np.asarray(p["size"][:2]))
        out.append(f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{x1 - x0:.1f}" height="{y1 - y0:.1f}" '
                   f'fill="#f6d5c8" stroke="#b07060"><title>{html.escape(str(p["id"]))}</title></rect>')
    for k, tg in enumerate(tr.targets):
        x, y = px(tg["pos"])
        out.append(f'<path d="M{x - 7:.1f},{y - 7:.1f} L{x + 7:.1f},{y + 7:.1f} M{x - 7:.1f},{y + 7:.1f} '
                   f'L{x + 7:.1f},{y - 7:.1f}" stroke="#000" stroke-width="1.5"/>'
                   f'<text x="{x:.1f}" y="{y - 12 if k % 2 == 0 else y + 22:.1f}" font-size="12" '
                   f'text-anchor="middle">{html.escape(str(tg["id"]))} mark</text>')
    for ev in tr.punctures:
        x, y = px(ev["pos"])
        colour = "#2ca02c" if ev.get("side") == "entry" else "#d62728"
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}" fill-opacity="0.8">'
                   f'<title>{html.escape(str(ev.get("pad")))} {html.escape(str(ev.get("side")))}</title>'
                   '</circle>')
    bar = 0.001 * scale
    out.append(f'<line x1="10" x2="{10 + bar:.1f}" y1="{size - 10}" y2="{size - 10}" stroke="#000" '
               f'stroke-width="2"/><text x="{14 + bar:.1f}" y="{size - 6}" font-size="11">1 mm</text>'
               '<text x="10" y="16" font-size="11">entry <tspan fill="#2ca02c">&#9679;</tspan> '
               'exit <tspan fill="#d62728">&#9679;</tspan> (every puncture), marks &#10005;</text></svg>')
    return "".join(out)


def render(a: Attempt, tr: Traces) -> str:
    """The report's HTML."""
    t_end = a.duration_s
    t0 = a.clock_start_s
    marks = dict(a.phases)
    forces = [(f"|F| {dev}", *_binned(t, f, t0), COLOURS[k % len(COLOURS)])
              for k, (dev, (t, f)) in enumerate(sorted(tr.force.items()))]
    tension = [("largest tension", *_binned(*tr.tension, t0), "#333")]
    gap = [("wound gap", *_binned(*tr.gap, t0), "#8c564b")]
    checks = "".join(
        f'<tr><td>{html.escape(c.what)}</td><td>{html.escape(_cell(c.value))}</td>'
        f'<td>{html.escape(_cell(c.limit))}</td><td class="{"pass" if c.passed else "fail"}">'
        f'{"pass" if c.passed else "FAIL"}</td></tr>' for c in a.checks)
    penalties = "".join(f"<tr><td>{html.escape(p.what)}</td><td>{p.points:.1f}</td><td>{html.escape(p.reason)}"
                        "</td></tr>" for p in a.penalties) or "<tr><td>none</td><td></td><td></td></tr>"
    who = " · ".join(html.escape(s) for s in (a.scenario, a.trainee, a.started) if s)
    verdict = "PASS" if a.passed else "FAIL"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>suturesim score: {html.escape(a.scenario)}</title>
<style>
body {{ font-family: sans-serif; margin: 24px; max-width: {WIDTH + 40}px; color: #222; }}
h1 {{ font-size: 22px; margin-bottom: 2px; }} h2 {{ font-size: 16px; margin: 22px 0 6px; }}
.score {{ font-size: 40px; font-weight: bold; }} .pass {{ color: #2a7d2a; }} .fail {{ color: #c0392b; }}
table {{ border-collapse: collapse; }} td, th {{ border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: left; }}
.row {{ display: flex; gap: 24px; align-items: flex-start; }} pre {{ font-size: 12px; background: #f7f7f7; padding: 8px; }}
</style></head><body>
<h1>Suture attempt</h1><div>{who}</div>
<div class="row"><div><div class="score">{a.score:.1f}</div>
<div>FLS-style: 600 s &minus; time &minus; penalties &middot; <b class="{verdict.lower()}">{verdict}</b>
against {html.escape(a.benchmarks)} benchmarks</div></div>
<table><tr><th>benchmark</th><th>value</th><th>limit</th><th></th></tr>{checks}</table></div>
<h2>Phases</h2>{_timeline(a, t_end)}
<h2>Force on each hand (N)</h2>{_plot(forces, t_end, "N", marks)}
<h2>The thread's largest tension (N) and the wound's gap (mm)</h2>{_plot(tension, t_end, "N", marks)}
{_plot(gap, t_end, "mm", marks)}
<div class="row"><div><h2>Entry and exit against the marks (from above)</h2>{_tissue(tr)}</div>
<div><h2>Penalties</h2><table><tr><th>what</th><th>points</th><th>why</th></tr>{penalties}</table></div></div>
<h2>Metrics</h2><pre>{html.escape(table(a))}</pre>
</body></html>
"""


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def write_report(recording: str | os.PathLike, a: Attempt, out: str | os.PathLike) -> None:
    """Write the report of ``a``, scored from ``recording``, to the HTML file ``out``."""
    page = render(a, read_traces(recording))
    with open(out, "w", encoding="utf-8") as f:
        f.write(page)
