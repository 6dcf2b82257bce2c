"""`suturesim export F.mcap (--csv DIR | --npz OUT.npz) [--topics T,...]`: a recording as plain tables, for
analysis elsewhere (pandas, numpy, MATLAB, R).

This module turns a recording into numpy columns, one table per topic (:func:`load_recording`, also what
`suturesim plot` draws from), and writes those tables as CSV files or one NPZ archive. Every number comes back
exactly as it was published: CSV cells are the shortest decimal that parses back to the same float64 (Python's
``repr``), NPZ arrays hold the very bits, and the float32 wire arrays (``state`` ``x`` and ``tension``) stay
float32 in NPZ and are written to CSV as the float64 decimal of the float32 value, so parsing as float64 and
casting to float32 gives back the wire bits.

CSV layout (one file per topic, header row, comma separated; ``pandas.read_csv(DIR / "force.csv")`` loads one):

``force.csv``
    one row per message, in recording order: ``seq, t, device, pose_x, pose_y, pose_z, [stylus_x, stylus_y,
    stylus_z,] force_x, force_y, force_z, axial, flags``. Units: t s, pose/stylus m, force/axial N. The
    ``stylus`` columns appear when the recording has them (recordings made before `force.stylus` existed do
    not); a row without them holds ``nan``.
``state.csv``
    wide, one row per message: ``seq, t, n, x0_x, x0_y, x0_z, ..., x{N-1}_z, tension0, ..., tension{N-2},
    twist, contacts, energy.kinetic, energy.elastic, energy.gravity, solver.iters, solver.residual,
    solver.substeps, grasps`` where N is the largest vertex count in the file. Vertex i's position (m) is
    ``x{i}_x/_y/_z``; ``tension{i}`` (N) is segment i, between vertices i and i + 1. A message with fewer
    vertices (after a `set` of `thread.segments`) leaves the cells beyond its ``n`` empty. ``grasps`` is the
    message's grasp list as JSON. ``solver.substeps`` is -1 where the message has none (older recordings).
    The positions as an (m, N, 3) array: ``df.filter(regex=r"^x\\d+_").to_numpy().reshape(len(df), -1, 3)``.
``stats.csv``
    one row per message: ``seq, t``, then every key flattened with dots in sorted order (``lateness_us.p99``,
    ...; µs), the union over the file, as in the NPZ ``stats`` arrays (a numeric key missing from a message:
    ``nan``). Booleans are ``True``/``False``; lists are JSON.
``events.csv``
    one row per message: ``seq, t, kind, details``; ``details`` is a JSON object of the payload's other fields.

NPZ layout (``numpy.load(OUT.npz)``, no pickles): ``metadata`` (a JSON string: the MCAP metadata records,
``{name: {key: value}}``), then per topic, with nested payload keys joined by dots:

* ``force/<device>/seq, t, pose (k, 3), stylus (k, 3) (if recorded), force (k, 3), axial, flags``;
* ``state/seq, t, n, x (m, N, 3) float32, tension (m, N-1) float32, twist, contacts, energy.kinetic,
  energy.elastic, energy.gravity, solver.iters, solver.residual, solver.substeps, grasps`` (JSON strings);
  ``x``/``tension`` entries beyond a message's own ``n`` are NaN; in a recording of a scene with tissue also
  ``tissue.gap`` (m, the wound's gap; NaN with one pad) and ``tissue.throws`` (-1 where a message has none);
* ``stats/seq, t, <flattened key>``: bool or int64 when every message has the key with that type, otherwise
  float64 with NaN where it is missing (strings and lists: JSON strings);
* ``event/seq, t, kind, details`` (JSON strings).

Messages that do not decode (another schema version, a corrupt payload) are skipped and counted in the summary.
The whole recording is decoded into memory first (about twice its array size at the peak: ~200 MB and ~15 s for
ten minutes of a live server, 665 000 messages, on the development machine); the CSV is then written 2048 rows
at a time.
"""
from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TextIO

import numpy as np

from ..server import protocol
from ..server.recording import RecordingError, read_messages, read_metadata

__all__ = ["TOPICS", "CSV_NAMES", "ExportError", "Progress", "Recording", "load_recording", "write_csv",
           "write_npz", "npz_arrays", "summary_line", "parse_topics", "error_line", "run_export"]

TOPICS = ("state", "force", "stats", "event")
CSV_NAMES = {"state": "state.csv", "force": "force.csv", "stats": "stats.csv", "event": "events.csv"}
_STATE_SCALARS = ("twist", "contacts", "energy.kinetic", "energy.elastic", "energy.gravity", "solver.iters",
                  "solver.residual", "solver.substeps")
# Rows are gathered as Python tuples and turned into numpy blocks this often, so a long recording costs about
# its array size in memory instead of a Python object per number.
_BLOCK_ROWS = 16384


class ExportError(Exception):
    """A problem with the input or the request, reported as one line (exit code 2)."""


# -- progress ----------------------------------------------------------------------------------------------


class Progress:
    """A one-line progress display on stderr, redrawn at most every ``interval`` s (0.2: five times a second).

    It draws only on a terminal (``enabled`` defaults to ``stream.isatty()``), so logs and pipes get only the
    summary line the commands print at the end.
    """

    def __init__(self, what: str, total: int | None = None, stream: TextIO | None = None,
                 enabled: bool | None = None, interval: float = 0.2):
        self.what = what
        self.total = total
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _isatty(self.stream) if enabled is None else enabled
        self.interval = interval
        self._last = -math.inf
        self._drawn = False

    def update(self, done: int, force: bool = False) -> None:
        """Report ``done`` items (of ``total``, when known)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        if self.total:
            text = f"{self.what}: {100.0 * done / self.total:3.0f} % ({done}/{self.total})"
        else:
            text = f"{self.what}: {done}"
        print(f"\r{text}\x1b[K", end="", file=self.stream, flush=True)
        self._drawn = True

    def close(self) -> None:
        """End the progress line (the next output starts on a fresh line)."""
        if self._drawn:
            print("\r\x1b[K", end="", file=self.stream, flush=True)
            self._drawn = False


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _message_count(path: str | os.PathLike) -> int | None:
    """Messages in the file from its MCAP summary, or None (a truncated file has no summary)."""
    try:
        from mcap.reader import make_reader

        with open(path, "rb") as f:
            summary = make_reader(f).get_summary()
        return None if summary is None or summary.statistics is None else int(summary.statistics.message_count)
    except Exception:  # noqa: BLE001 - only a progress estimate; read_messages reports real problems
        return None


# -- columns -----------------------------------------------------------------------------------------------


class _Table:
    """Rows of fixed columns appended one by one, kept as numpy blocks (see _BLOCK_ROWS)."""

    def __init__(self, dtypes: dict[str, Any]):
        self.dtypes = dtypes
        self._rows: list[tuple] = []
        self._blocks: list[list[np.ndarray]] = []

    def append(self, row: tuple) -> None:
        self._rows.append(row)
        if len(self._rows) >= _BLOCK_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            cols = list(zip(*self._rows))
            self._blocks.append([np.array(c, dtype=dt) for c, dt in zip(cols, self.dtypes.values())])
            self._rows = []

    def __len__(self) -> int:
        return sum(len(b[0]) for b in self._blocks) + len(self._rows)

    def columns(self) -> dict[str, np.ndarray]:
        self._flush()
        out = {}
        for i, (name, dt) in enumerate(self.dtypes.items()):
            parts = [b[i] for b in self._blocks]
            col = np.concatenate(parts) if parts else np.zeros((0,), dtype=dt)
            if col.dtype == object:  # strings: a fixed-width unicode array loads without pickles
                col = col.astype(str) if len(col) else np.zeros((0,), dtype="<U1")
            out[name] = col
        return out


def _json(value: Any) -> str:
    # repr-exact floats; bytes (never in documented payloads) as hex so a stray one cannot stop an export
    return json.dumps(value, separators=(",", ":"), default=lambda o: o.hex() if isinstance(o, bytes) else str(o))


def _flatten(m: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in m.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


_NAN3 = (math.nan, math.nan, math.nan)


@dataclass
class Recording:
    """A recording as numpy columns, one table per topic, rows in recording (log time) order.

    Units as on the wire (docs/PROTOCOL.md): t s, positions m, forces N, energies J, lateness µs. Tables:
    ``force`` (all devices, with a ``device`` column), ``state`` (``x`` (m, N, 3) and ``tension`` (m, N-1)
    float32, NaN beyond each row's ``n``), ``stats`` (flattened keys), ``event`` (``details`` as JSON). A topic
    that was not loaded, or has no messages, has an empty dict.
    """
    path: str
    metadata: dict[str, dict[str, str]]
    counts: dict[str, int]                 # messages in the file per topic, loaded or not
    loaded: tuple[str, ...]                # topics that were decoded
    skipped: int = 0                       # messages of loaded topics that did not decode
    force: dict[str, np.ndarray] = field(default_factory=dict)
    state: dict[str, np.ndarray] = field(default_factory=dict)
    stats: dict[str, np.ndarray] = field(default_factory=dict)
    event: dict[str, np.ndarray] = field(default_factory=dict)

    def table(self, topic: str) -> dict[str, np.ndarray]:
        return getattr(self, topic)

    def rows(self, topic: str) -> int:
        t = self.table(topic)
        return len(t["seq"]) if t else 0

    @property
    def devices(self) -> list[str]:
        """Device names of the ``force`` messages, in order of first appearance."""
        if not self.force:
            return []
        names, first = np.unique(self.force["device"], return_index=True)
        return [str(names[i]) for i in np.argsort(first)]

    @property
    def scenario(self) -> str | None:
        """The scenario name from the metadata (``scenario.name``), if recorded."""
        return self.metadata.get("scenario", {}).get("name") or None

    def time_span(self) -> tuple[float, float] | None:
        """(first, last) scene time t (s) over the loaded messages, or None if there are none."""
        ts = [self.table(tp)["t"] for tp in self.loaded if self.rows(tp)]
        ts = [t[np.isfinite(t)] for t in ts]
        ts = [t for t in ts if len(t)]
        if not ts:
            return None
        return float(min(t.min() for t in ts)), float(max(t.max() for t in ts))


def load_recording(path: str | os.PathLike, topics: Iterable[str] = TOPICS,
                   progress: Progress | bool | None = None) -> Recording:
    """Read and decode the ``topics`` of the MCAP recording ``path`` into numpy columns (:class:`Recording`).

    ``progress``: a :class:`Progress`, or True/False/None to make one on stderr (None: only on a terminal).
    Raises :class:`~suturesim.server.recording.RecordingError` for a file that is not MCAP or is corrupt,
    ``OSError`` for one that cannot be read, and :class:`ExportError` for a recording with no messages.
    """
    path = os.fspath(path)
    wanted = tuple(t for t in TOPICS if t in set(topics))
    metadata = read_metadata(path)           # also the first check that the file is MCAP at all
    if not isinstance(progress, Progress):
        progress = Progress(f"reading {os.path.basename(path)}", _message_count(path),
                            enabled=progress)

    # devices as small ints while reading: one str object per 1 kHz message would cost more than the numbers
    device_codes: dict[str, int] = {}
    force = _Table({"seq": np.int64, "t": np.float64, "device": np.int32, "pose": np.float64,
                    "stylus": np.float64, "force": np.float64, "axial": np.float64, "flags": np.int64})
    state = _Table({"seq": np.int64, "t": np.float64, "n": np.int64,
                    **{k: (np.int64 if k in ("contacts", "solver.iters", "solver.substeps") else np.float64)
                       for k in _STATE_SCALARS}, "grasps": object})
    xs, tensions = _Stack(), _Stack()
    gaps: list[float] = []          # state.tissue.gap per state message (nan: none), kept if any message has tissue
    throws: list[int] = []
    has_tissue = False
    stats: list[dict[str, Any]] = []
    events = _Table({"seq": np.int64, "t": np.float64, "kind": object, "details": object})
    counts = {t: 0 for t in TOPICS}
    skipped = 0
    has_stylus = False
    done = 0
    try:
        for topic, payload, _log_ns, _pub_ns in read_messages(path):
            done += 1
            counts[topic] = counts.get(topic, 0) + 1
            if done % 256 == 0:
                progress.update(done)
            if topic not in wanted:
                continue
            try:
                m = protocol.decode(payload, topic)
            except protocol.ProtocolError:
                skipped += 1     # the protocol says: drop what does not decode (another `v`, corruption)
                continue
            if topic == "force":
                stylus = m.get("stylus")
                has_stylus = has_stylus or stylus is not None
                code = device_codes.setdefault(m["device"], len(device_codes))
                force.append((m["seq"], m["t"], code, m["pose"], _NAN3 if stylus is None else stylus,
                              m["force"], m["axial"], m["flags"]))
            elif topic == "state":
                solver, energy = m["solver"], m["energy"]
                xs.append(m["x"])
                tensions.append(m["tension"])
                state.append((m["seq"], m["t"], m["n"], m["twist"], m["contacts"], energy["kinetic"],
                              energy["elastic"], energy["gravity"], solver["iters"], solver["residual"],
                              solver.get("substeps", -1), _json(m["grasps"])))
                tissue = m.get("tissue")
                has_tissue = has_tissue or tissue is not None
                gap = tissue.get("gap") if tissue is not None else None
                gaps.append(float(gap) if isinstance(gap, (int, float)) and not isinstance(gap, bool) else np.nan)
                thr = tissue.get("throws") if tissue is not None else None
                throws.append(thr if isinstance(thr, int) and not isinstance(thr, bool) else -1)
            elif topic == "stats":
                stats.append(_flatten({k: v for k, v in m.items() if k != "v"}))
            else:
                details = {k: v for k, v in m.items() if k not in ("v", "seq", "t", "kind")}
                events.append((m["seq"], m["t"], m["kind"], _json(details)))
    finally:
        progress.update(done, force=True)
        progress.close()
    if done == 0:
        raise ExportError(f"{path}: no messages (an empty recording, or one cut off before its first flush)")

    rec = Recording(path=path, metadata=metadata, counts=counts, loaded=wanted, skipped=skipped)
    if len(force):
        rec.force = force.columns()
        names = np.array(list(device_codes), dtype=str)
        rec.force["device"] = names[rec.force["device"]]
        if not has_stylus:
            del rec.force["stylus"]
    if len(state):
        rec.state = state.columns()
        rec.state["x"], rec.state["tension"] = xs.array(), tensions.array()
        if has_tissue:   # a suture scene: the wound's gap (m) and the throws, per state message (NPZ only)
            rec.state["tissue.gap"] = np.array(gaps, dtype=np.float64)
            rec.state["tissue.throws"] = np.array(throws, dtype=np.int64)
    if stats:
        rec.stats = _stats_columns(stats)
    if len(events):
        rec.event = events.columns()
    return rec


class _Stack:
    """float32 arrays of possibly different lengths (a `set` of thread.segments changes n) appended one by one
    and stacked into (rows, longest, ...) blocks as they come, NaN-padded past each array's own length."""

    def __init__(self) -> None:
        self._pending: list[np.ndarray] = []
        self._blocks: list[np.ndarray] = []

    def append(self, a: np.ndarray) -> None:
        self._pending.append(np.array(a))   # a copy: the decoded array is a view that keeps the payload alive
        if len(self._pending) >= 4096:
            self._blocks.append(self._padded(self._pending, max(len(x) for x in self._pending)))
            self._pending = []

    @staticmethod
    def _padded(arrays: list[np.ndarray], longest: int) -> np.ndarray:
        if all(len(a) == longest for a in arrays):
            return np.stack(arrays)
        out = np.full((len(arrays), longest) + arrays[0].shape[1:], np.nan, dtype=np.float32)
        for i, a in enumerate(arrays):
            out[i, :len(a)] = a
        return out

    def array(self) -> np.ndarray:
        if self._pending:
            self._blocks.append(self._padded(self._pending, max(len(x) for x in self._pending)))
            self._pending = []
        longest = max(b.shape[1] for b in self._blocks)
        blocks = [b if b.shape[1] == longest else self._padded(list(b), longest) for b in self._blocks]
        return blocks[0] if len(blocks) == 1 else np.concatenate(blocks)


def _stats_columns(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    keys = sorted({k for r in rows for k in r} - {"seq", "t"})
    out = {"seq": np.array([r["seq"] for r in rows], dtype=np.int64),
           "t": np.array([r["t"] for r in rows], dtype=np.float64)}
    for k in keys:
        vals = [r.get(k, None) for r in rows]
        present = [v for v in vals if v is not None]
        complete = len(present) == len(vals)
        if complete and all(isinstance(v, bool) for v in present):
            out[k] = np.array(vals, dtype=bool)
        elif complete and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
            out[k] = np.array(vals, dtype=np.int64)
        elif all(isinstance(v, (int, float)) for v in present):   # bools count as 0/1 here
            out[k] = np.array([math.nan if v is None else float(v) for v in vals], dtype=np.float64)
        else:
            out[k] = np.array(["" if v is None else (v if isinstance(v, str) else _json(v)) for v in vals],
                              dtype=str)
    return out


# -- writers -----------------------------------------------------------------------------------------------


def _csv_layout(topic: str, table: dict[str, np.ndarray]) -> tuple[list[str], list[np.ndarray]]:
    """Header and cell blocks of one topic's CSV: each block is an (rows, cells) array, side by side."""
    header: list[str] = []
    blocks: list[np.ndarray] = []

    def add(names: list[str], col: np.ndarray) -> None:
        header.extend(names)
        blocks.append(col.reshape(len(col), -1))

    if topic == "force":
        for k in ("seq", "t", "device"):
            add([k], table[k])
        for name in ("pose", "stylus", "force"):
            if name in table:
                add([f"{name}_{a}" for a in "xyz"], table[name])
        for k in ("axial", "flags"):
            add([k], table[k])
    elif topic == "state":
        for k in ("seq", "t", "n"):
            add([k], table[k])
        add([f"x{i}_{a}" for i in range(table["x"].shape[1]) for a in "xyz"], table["x"])
        add([f"tension{i}" for i in range(table["tension"].shape[1])], table["tension"])
        for k in _STATE_SCALARS + ("grasps",):
            add([k], table[k])
    elif topic == "event":
        for k in ("seq", "t", "kind", "details"):
            add([k], table[k])
    else:
        for k, col in table.items():
            add([k], col)
    return header, blocks


def _csv_rows(topic: str, table: dict[str, np.ndarray], blocks: list[np.ndarray], i0: int, i1: int) -> list[list]:
    """Rows i0..i1 as Python values: floats become their repr, the shortest decimal that parses back exactly."""
    # float32 -> float64 is exact; a float32's own short repr would not parse back exactly as float64
    parts = [(b[i0:i1].astype(np.float64) if b.dtype == np.float32 else b[i0:i1]).tolist() for b in blocks]
    rows = [[c for part in r for c in part] for r in zip(*parts)]
    if topic == "state":
        n, width = table["n"][i0:i1].tolist(), table["x"].shape[1]
        if any(k != width for k in n):   # a shorter thread: empty cells, not nan, past its own n
            xs = 3                        # x columns start after seq, t, n
            ts = xs + 3 * width
            for r, k in zip(rows, n):
                r[xs + 3 * k:ts] = [""] * (3 * (width - k))
                r[ts + k - 1:ts + width - 1] = [""] * (width - k)
    return rows


def write_csv(rec: Recording, out_dir: str | os.PathLike, topics: Iterable[str] = TOPICS,
              progress: bool | None = None) -> list[Path]:
    """Write one CSV file per topic with messages (layout: module docstring) into ``out_dir`` (created if
    needed); returns the files written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for topic in TOPICS:
        if topic not in set(topics) or not rec.rows(topic):
            continue
        table = rec.table(topic)
        header, blocks = _csv_layout(topic, table)
        path = out_dir / CSV_NAMES[topic]
        total = rec.rows(topic)
        bar = Progress(f"writing {path.name}", total, enabled=progress)
        step = 2048                      # rows converted to Python objects at a time: bounds the memory
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(header)
            for i0 in range(0, total, step):
                w.writerows(_csv_rows(topic, table, blocks, i0, min(i0 + step, total)))
                bar.update(min(i0 + step, total))
        bar.close()
        written.append(path)
    return written


def npz_arrays(rec: Recording, topics: Iterable[str] = TOPICS) -> dict[str, np.ndarray]:
    """The NPZ archive's arrays by name (layout: module docstring)."""
    arrays: dict[str, np.ndarray] = {"metadata": np.array(json.dumps(rec.metadata, sort_keys=True))}
    topics = set(topics)
    if "force" in topics and rec.force:
        device = rec.force["device"]
        for name in rec.devices:
            mine = device == name
            for k, col in rec.force.items():
                if k != "device":
                    arrays[f"force/{name}/{k}"] = col[mine]
    for topic in ("state", "stats", "event"):
        if topic in topics:
            for k, col in rec.table(topic).items():
                arrays[f"{topic}/{k}"] = col
    return arrays


def write_npz(rec: Recording, out: str | os.PathLike, topics: Iterable[str] = TOPICS) -> Path:
    """Write the topics as one compressed NPZ archive (layout: module docstring); returns its path."""
    out = Path(out)
    if out.suffix != ".npz":          # numpy would append .npz itself and the summary would name the wrong file
        raise ExportError(f"{out}: the NPZ output must end in .npz")
    if out.parent != Path(""):
        out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **npz_arrays(rec, topics))
    return out


# -- command -----------------------------------------------------------------------------------------------


def summary_line(command: str, rec: Recording, outputs: Sequence[str | os.PathLike]) -> str:
    """One line: messages per topic, devices, scene time span and what was written."""
    counts = ", ".join(f"{t} {c}" for t, c in rec.counts.items())
    span = rec.time_span()
    span_text = "no messages decoded" if span is None else f"t {span[0]:.3f} to {span[1]:.3f} s"
    skipped = f", {rec.skipped} undecodable skipped" if rec.skipped else ""
    devices = ", ".join(rec.devices) or "none"
    wrote = ", ".join(os.fspath(o) for o in outputs) or "nothing (no messages of the chosen topics)"
    return (f"suturesim {command}: {rec.path}: {sum(rec.counts.values())} messages ({counts}{skipped}); "
            f"devices {devices}; {span_text}; wrote {wrote}")


def parse_topics(text: str | None) -> tuple[str, ...]:
    """``"force,state"`` -> ("state", "force") in file order; None -> all. Raises :class:`ExportError`."""
    if text is None:
        return TOPICS
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in TOPICS]
    if bad or not names:
        raise ExportError(f"--topics: unknown {', '.join(bad) or '(none given)'}; choose from {','.join(TOPICS)}")
    return tuple(t for t in TOPICS if t in names)


def run_export(path: str, csv_dir: str | None = None, npz: str | None = None, topics: str | None = None,
               out: Callable[[str], None] = print, progress: bool | None = None) -> int:
    """`suturesim export`: exit code 0, or 2 with a one-line error on stderr for a bad input or output."""
    try:
        if (csv_dir is None) == (npz is None):
            raise ExportError("give exactly one of --csv DIR and --npz OUT.npz")
        chosen = parse_topics(topics)
        rec = load_recording(path, chosen, progress=progress)
        if csv_dir is not None:
            outputs = write_csv(rec, csv_dir, chosen, progress=progress)
        else:
            outputs = [write_npz(rec, npz, chosen)]
    except (ExportError, RecordingError, OSError) as exc:
        print(f"suturesim export: {error_line(exc)}", file=sys.stderr)
        return 2
    out(summary_line("export", rec, outputs))
    return 0


def error_line(exc: BaseException) -> str:
    """``exc`` as one line for the terminal (an OSError as "file: reason")."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return " ".join(str(exc).split())
