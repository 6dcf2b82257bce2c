"""`suturesim plot F.mcap -o OUT.png [--times T1,T2,...] [--devices D1,D2]`: one PNG summarising a recording.

Three panels, read from the recording's topics (docs/PROTOCOL.md):

(a) ``force``: the magnitude of the force commanded to each device, |force| (N), solid, and the thread's axial
    force at its grasp, ``axial`` (N), dashed, against scene time t (s); one colour per device.
(b) ``state``: the tension (N) of every segment against arc length s (m) along the thread, at a few scene times
    (default 4, evenly spaced over the recording); each time snaps to the nearest ``state`` message. s is
    measured along the recorded positions (cumulative segment lengths) and each tension is drawn at its
    segment's midpoint.
(c) ``stats``: the distribution of the loop's lateness: every ``stats`` message carries percentiles of the
    last second's tick lateness (µs); the panel histograms the per-second p99 and max. A headless recording
    (`suturesim run`) has no ``stats``, and the panel says so.
(d) only for a scene with tissue (``state.tissue``): the wound's gap (mm) against scene time t (s), with the
    throws counted from the strands (docs/PHYSICS.md Sec. 9) on a second axis; read it with panel (a)'s axial
    force to see the suture tighten and the wound close.

The figure is drawn with matplotlib's Agg renderer (no display needed); matplotlib is an optional dependency,
``pip install 'suturesim[plot]'``.
"""
from __future__ import annotations

import os
import sys
import textwrap
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..server.recording import RecordingError
from .export import ExportError, Recording, error_line, load_recording, summary_line

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["FIGSIZE_IN", "DPI", "PANEL_TITLES", "PlotError", "plot_recording", "save_png", "snap_times",
           "arc_length_midpoints", "parse_floats", "run_plot"]

FIGSIZE_IN = (10.0, 12.0)
DPI = 100                      # so the PNG is 1000 x 1200 px
PANEL_TITLES = ("(a) force per device", "(b) tension along the thread", "(c) loop lateness", "(d) the wound's gap")
_INSTALL_HINT = "matplotlib is not installed: pip install 'suturesim[plot]'"


class PlotError(ExportError):
    """A problem with the request (an unknown device, no matplotlib), reported as one line (exit code 2)."""


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotError(_INSTALL_HINT) from exc
    return Figure, FigureCanvasAgg


def parse_floats(text: str | None, what: str) -> list[float] | None:
    """``"1,2.5"`` -> [1.0, 2.5]; None -> None. Raises :class:`PlotError` naming ``what``."""
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise PlotError(f"{what}: expected comma-separated numbers, got {text!r}") from None
    if not values or not all(np.isfinite(values)):
        raise PlotError(f"{what}: expected finite numbers, got {text!r}")
    return values


def snap_times(state_t: np.ndarray, times: Sequence[float] | None, count: int = 4) -> list[tuple[float, int]]:
    """(requested time (s), index of the nearest ``state`` message) for each time, without repeating an index.

    ``times`` None: ``count`` times evenly spaced from the first to the last ``state`` message.
    """
    if len(state_t) == 0:
        return []
    if times is None:
        times = np.linspace(float(np.nanmin(state_t)), float(np.nanmax(state_t)), count).tolist()
    out: list[tuple[float, int]] = []
    seen: set[int] = set()
    for req in times:
        i = int(np.nanargmin(np.abs(state_t - req)))
        if i not in seen:
            seen.add(i)
            out.append((float(req), i))
    return out


def arc_length_midpoints(x: np.ndarray) -> np.ndarray:
    """Arc length (m) at each segment's midpoint of the polyline ``x`` (n, 3) (m): shape (n-1,), float64."""
    seg = np.linalg.norm(np.diff(np.asarray(x, dtype=np.float64), axis=0), axis=1)
    return np.cumsum(seg) - 0.5 * seg


def _break_at_restarts(t: np.ndarray, *ys: np.ndarray) -> tuple[np.ndarray, ...]:
    """Insert NaN where t goes back (a `reset` or `load` restarts it), so lines do not jump back across."""
    back = np.flatnonzero(np.diff(t) < 0) + 1
    if len(back) == 0:
        return (t, *ys)
    return tuple(np.insert(np.asarray(a, dtype=np.float64), back, np.nan) for a in (t, *ys))


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, textwrap.fill(text, 80), ha="center", va="center", transform=ax.transAxes, fontsize=11)
    ax.set_xticks([])
    ax.set_yticks([])


def _panel_force(ax, rec: Recording, devices: Sequence[str]) -> None:
    ax.set_title(f"{PANEL_TITLES[0]}: |force| commanded (solid) and axial force at the grasp (dashed)")
    ax.set_xlabel("scene time t (s)")
    ax.set_ylabel("force (N)")
    if not devices:
        _no_data(ax, "no force messages in this recording")
        return
    dev = rec.force["device"]
    for k, name in enumerate(devices):
        mine = dev == name
        t = rec.force["t"][mine]
        with np.errstate(over="ignore"):     # a force beyond 1e154 N is inf in the plot, not an error
            mag = np.linalg.norm(rec.force["force"][mine], axis=1)
        t, mag, axial = _break_at_restarts(t, mag, rec.force["axial"][mine])
        colour = f"C{k % 10}"
        ax.plot(t, mag, color=colour, lw=1.0, label=f"{name} |force|")
        ax.plot(t, axial, color=colour, lw=1.0, ls="--", label=f"{name} axial")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=8, ncols=min(len(devices), 4))


def _panel_tension(ax, rec: Recording, times: Sequence[float] | None) -> None:
    ax.set_title(f"{PANEL_TITLES[1]}: at chosen scene times, each snapped to the nearest state message")
    ax.set_xlabel("arc length s (m), at segment midpoints")
    ax.set_ylabel("tension (N)")
    if not rec.state:
        _no_data(ax, "no state messages in this recording")
        return
    st = rec.state
    for k, (req, i) in enumerate(snap_times(st["t"], times)):
        n = int(st["n"][i])
        if n < 2:
            continue    # a single vertex has no segment
        s = arc_length_midpoints(st["x"][i, :n])
        label = f"t = {st['t'][i]:.3f} s" + ("" if abs(st["t"][i] - req) < 5e-4 else f" (asked {req:g} s)")
        ax.plot(s, st["tension"][i, :n - 1], color=f"C{k % 10}", lw=1.2, label=label)
    ax.axhline(0.0, color="0.5", lw=0.6)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)


def _panel_lateness(ax, rec: Recording) -> None:
    st = rec.stats
    if not st or "lateness_us.p99" not in st or "lateness_us.max" not in st:
        ax.set_title(f"{PANEL_TITLES[2]}: no stats")
        why = ("no stats messages in this recording: a headless `suturesim run` records only state and force; "
               "record a live server (`suturesim serve --record`) for the loop statistics") if not st else \
            "the stats messages carry no lateness_us.p99 / lateness_us.max"
        _no_data(ax, why)
        return
    p99, worst = st["lateness_us.p99"], st["lateness_us.max"]
    p99, worst = p99[np.isfinite(p99)], worst[np.isfinite(worst)]
    ax.set_title(f"{PANEL_TITLES[2]}: distribution over {len(st['seq'])} s of the per-second p99 and max "
                 "of tick lateness (1 stats message per second)", fontsize=10)
    ax.set_xlabel("tick lateness (µs), log scale")
    ax.set_ylabel("seconds (count of stats messages)")
    both = np.concatenate([p99, worst])
    positive = both[both > 0]
    # lateness spans decades (tens of µs typical, tens of ms in a stall): log bins when the data allows
    if len(positive) and positive.max() > 10 * positive.min():
        bins = np.geomspace(positive.min(), positive.max(), 41)   # 40 bins
        ax.set_xscale("log")
        p99, worst = np.clip(p99, positive.min(), None), np.clip(worst, positive.min(), None)
    else:
        bins = 40
        ax.set_xlabel("tick lateness (µs)")
    ax.hist(p99, bins=bins, alpha=0.6, color="C0", label=f"p99 per second (median {np.median(p99):.0f} µs)")
    ax.hist(worst, bins=bins, alpha=0.6, color="C3", label=f"max per second (median {np.median(worst):.0f} µs, "
                                                           f"worst {worst.max():.0f} µs)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)


def _panel_gap(ax, rec: Recording) -> None:
    st = rec.state
    ax.set_title(f"{PANEL_TITLES[3]}: the smallest separation of two tissue pads (solid) and the throws (steps)")
    ax.set_xlabel("scene time t (s)")
    ax.set_ylabel("gap (mm)")
    ax.plot(st["t"], 1e3 * st["tissue.gap"], color="C0", lw=1.2, label="gap")
    ax.grid(True, alpha=0.3)
    ax2 = ax.twinx()
    ax2.step(st["t"], np.maximum(st["tissue.throws"], 0), where="post", color="C3", lw=1.0, label="throws")
    ax2.set_ylabel("throws")
    ax2.set_ylim(-0.1, max(2, int(np.max(st["tissue.throws"], initial=0)) + 1))
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)


def has_gap(rec: Recording) -> bool:
    """Whether the recording's states carry a wound's gap (a scene with two tissue pads or more)."""
    return bool(rec.state) and "tissue.gap" in rec.state and bool(np.isfinite(rec.state["tissue.gap"]).any())


def plot_recording(rec: Recording, times: Sequence[float] | None = None,
                   devices: Sequence[str] | None = None) -> Figure:
    """The three-panel figure (four with a wound's gap; module docstring) of a loaded recording; ``times`` in s, ``devices`` by name
    (default: all). Raises :class:`PlotError` for a device the recording does not have."""
    Figure, FigureCanvasAgg = _matplotlib()
    known = rec.devices
    if devices is not None:
        missing = [d for d in devices if d not in known]
        if missing:
            raise PlotError(f"no device {', '.join(missing)} in {rec.path} (devices: {', '.join(known) or 'none'})")
    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)           # Agg: renders without a display, and no pyplot global state
    axes = fig.subplots(4 if has_gap(rec) else 3, 1)
    _panel_force(axes[0], rec, known if devices is None else list(devices))
    _panel_tension(axes[1], rec, times)
    _panel_lateness(axes[2], rec)
    if len(axes) == 4:
        _panel_gap(axes[3], rec)
    fig.suptitle(f"suturesim recording {os.path.basename(rec.path)}: scenario "
                 f"'{rec.scenario or 'unknown (no scenario metadata)'}'", fontsize=13)
    return fig


def save_png(fig: Figure, out: str | os.PathLike) -> None:
    """Write ``fig`` as a PNG of exactly FIGSIZE_IN x DPI pixels."""
    fig.savefig(out, format="png", dpi=DPI)


def run_plot(path: str, out: str, times: str | None = None, devices: str | None = None,
             progress: bool | None = None, print_line=print) -> int:
    """`suturesim plot`: exit code 0, or 2 with a one-line error on stderr for a bad input or output."""
    try:
        _matplotlib()               # before reading a large file
        wanted_times = parse_floats(times, "--times")
        wanted_devices = None if devices is None else [d.strip() for d in devices.split(",") if d.strip()] or None
        rec = load_recording(path, ("state", "force", "stats"), progress=progress)
        save_png(plot_recording(rec, wanted_times, wanted_devices), out)
    except (ExportError, RecordingError, OSError) as exc:
        print(f"suturesim plot: {error_line(exc)}", file=sys.stderr)
        return 2
    w, h = (int(round(v * DPI)) for v in FIGSIZE_IN)
    print_line(summary_line("plot", rec, [f"{out} ({w}x{h} px)"]))
    return 0

