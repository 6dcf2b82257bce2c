"""What a suture's state means to the people watching it: the wound's gap, the knot the thread is tied in and
its throws, how the strands are wound, and what happened to the punctures.

The knot is read from the thread's topology (solver/knot_type.py): the Jones polynomial of the thread closed far
away names it (unknot, half knot, double throw, square, granny, surgeon's knot) and counts its throws. The
strands' Gauss linking integral (the thread from the needle to the first puncture it passes, and from the last
puncture to the tail; exact for polylines by the solid-angle formula of Klenin & Langowski 2000, Biopolymers
54:307) is reported beside it: it counts how often the strands are twisted round each other, which is not a
knot (hands turning round each other twist the strands, and any closure undoes a twist; docs/PHYSICS.md
Sec. 9). `SutureWatch` turns these into the server's events. SI units.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .knot_type import KnotReading, KnotType, warm_up as warm_up_knots
from .tissue import (MAX_PUNCTURES, PD_HALF, PF_FORCE, PF_LOCAL, PF_SIGMA, PI_MATE, PI_PAD, PI_STATE, PS_X,
                     PUN_ACTIVE, PUN_FREE, PUN_NEEDLE, PUN_PASSED, TP_RADIUS, TP_TEAR)

STATE_NAMES = {PUN_ACTIVE: "thread", PUN_NEEDLE: "needle", PUN_PASSED: "passed"}
LINK_EVERY = 100          # ticks between two readings of the strands' linking (10 Hz at 1 kHz)
KNOT_EVERY = 250          # ticks between two readings of the knot (4 Hz)
# The readings are spread over the ticks after the one that starts them, a budget a tick, so that no tick pays
# for a whole one: in one piece, the suture's linking integral took about 150 us and a knot's 12-crossing state
# sum 0.9-1.7 ms, ten and four times a second, which put them in the tick's p99 (docs/BENCHMARKS.md Sec. 7).
# A knot read's state sum: crossings x states a tick (about 25 us). A 12-crossing diagram's 4096 states then
# take 49 ticks after the one that draws the diagram.
KNOT_BUDGET = 1000
# A linking read: pairs of segments a tick (about 0.1 us each); the suture's two strands of about 40 segments
# each take seven ticks.
LINK_BUDGET = 250
# the ticks within those periods that start a reading: apart from each other and from the server's `state` message
# (every 10th tick); the ticks that add to a reading are those without a `state` message (SutureWatch.check)
LINK_PHASE = 3
KNOT_PHASE = 128
GAP_CLOSED = 2e-4         # m above the crack the edges close to (integrator.PAD_CRACK thread radii): closed
GAP_OPEN = 1e-3           # m above it: open again (hysteresis, so a closing wound does not chatter)


@njit(cache=True, error_model="numpy")
def pad_gap(pads: np.ndarray, pst: np.ndarray) -> float:
    """The smallest separation (m) of two pads' boxes (the wound's gap; inf with fewer than two pads)."""
    best = math.inf
    for p in range(pads.shape[0]):
        for q in range(p + 1, pads.shape[0]):
            sep = -math.inf
            for d in range(3):
                s = abs(pst[q, PS_X + d] - pst[p, PS_X + d]) - pads[p, PD_HALF + d] - pads[q, PD_HALF + d]
                if s > sep:
                    sep = s
            if sep < best:
                best = sep
    return best


@njit(cache=True, error_model="numpy")
def _unit_cross(a, b):
    cx = a[1] * b[2] - a[2] * b[1]
    cy = a[2] * b[0] - a[0] * b[2]
    cz = a[0] * b[1] - a[1] * b[0]
    n = math.sqrt(cx * cx + cy * cy + cz * cz)
    if n < 1e-300:
        return 0.0, 0.0, 0.0, False
    return cx / n, cy / n, cz / n, True


@njit(cache=True, error_model="numpy")
def linking(x: np.ndarray, a0: int, a1: int, b0: int, b1: int) -> float:
    """The Gauss linking integral of the polylines x[a0..a1] and x[b0..b1] (vertex ranges, inclusive): the
    exact solid angle each pair of segments subtends, summed, over 4 pi (Klenin & Langowski 2000, Eq. 15)."""
    return solid_angles(x, a0, a1, b0, b1) / (4.0 * math.pi)


@njit(cache=True, error_model="numpy")
def solid_angles(x: np.ndarray, a0: int, a1: int, b0: int, b1: int) -> float:
    """The signed solid angles (sr) the segments of x[a0..a1] subtend with those of x[b0..b1], summed: the
    linking integral times 4 pi, added up a slice of x[a0..a1] at a time by LinkReading."""
    total = 0.0
    r = np.empty((4, 3))
    nrm = np.empty((4, 3))
    for i in range(a0, a1):
        for j in range(b0, b1):
            for d in range(3):
                r[0, d] = x[j, d] - x[i, d]           # r13
                r[1, d] = x[j + 1, d] - x[i, d]       # r14
                r[2, d] = x[j + 1, d] - x[i + 1, d]   # r24
                r[3, d] = x[j, d] - x[i + 1, d]       # r23
            ok = True
            for k in range(4):
                nx, ny, nz, good = _unit_cross(r[k], r[(k + 1) % 4])
                if not good:
                    ok = False
                    break
                nrm[k, 0] = nx
                nrm[k, 1] = ny
                nrm[k, 2] = nz
            if not ok:
                continue
            omega = 0.0
            for k in range(4):
                c = nrm[k, 0] * nrm[(k + 1) % 4, 0] + nrm[k, 1] * nrm[(k + 1) % 4, 1] + nrm[k, 2] * nrm[(k + 1) % 4, 2]
                omega += math.asin(min(1.0, max(-1.0, c)))
            # the sign of (r34 x r12) . r13
            ex = x[j + 1, 0] - x[j, 0]
            ey = x[j + 1, 1] - x[j, 1]
            ez = x[j + 1, 2] - x[j, 2]
            fx = x[i + 1, 0] - x[i, 0]
            fy = x[i + 1, 1] - x[i, 1]
            fz = x[i + 1, 2] - x[i, 2]
            s = (ey * fz - ez * fy) * r[0, 0] + (ez * fx - ex * fz) * r[0, 1] + (ex * fy - ey * fx) * r[0, 2]
            if s > 0.0:
                total += omega
            elif s < 0.0:
                total -= omega
    return total


class LinkReading:
    """One linking read spread over calls: ``LinkReading(x, a1, b0, out)`` copies the thread x (n, 3) into
    ``out`` (its preallocated copy, m), and each ``advance(budget)`` adds the solid angles of about ``budget``
    pairs of segments (whole rows of the strand x[0..a1]) against x[b0..n-1]; it returns the linking number of
    the copy once every row is in, None before. Allocates nothing."""

    def __init__(self, x: np.ndarray, a1: int, b0: int, out: np.ndarray):
        np.copyto(out, x)
        self.x, self.a1, self.b0 = out, a1, b0
        self.row = 0
        self.total = 0.0

    def advance(self, budget: int) -> float | None:
        x, a1, b0 = self.x, self.a1, self.b0
        b1 = x.shape[0] - 1
        last = min(a1, self.row + max(1, budget // max(1, b1 - b0)))
        self.total += solid_angles(x, self.row, last, b0, b1)
        self.row = last
        return self.total / (4.0 * math.pi) if last == a1 else None


def strands(pun_i: np.ndarray, pun_f: np.ndarray, n_vertices: int) -> tuple[int, int] | None:
    """(last vertex of the needle's strand, first vertex of the tail's strand): the thread either side of the
    thread-held punctures; None while none holds the thread."""
    held = [pun_f[q, PF_SIGMA] for q in range(pun_i.shape[0]) if pun_i[q, PI_STATE] == PUN_ACTIVE]
    if not held:
        return None
    lo = int(math.floor(min(held)))
    hi = min(int(math.ceil(max(held))), n_vertices - 1)
    return lo, hi


@njit(cache=True, error_model="numpy")
def lateral_force(pun_f: np.ndarray, q: int) -> float:
    """Puncture q's lateral needle force (N), while the needle runs through it."""
    return math.sqrt(pun_f[q, PF_FORCE] ** 2 + pun_f[q, PF_FORCE + 1] ** 2 + pun_f[q, PF_FORCE + 2] ** 2)


@njit(cache=True, error_model="numpy")
def lateral_over(pun_i: np.ndarray, pun_f: np.ndarray, limit: float, torn: np.ndarray) -> int:
    """The first needle-held puncture not yet ``torn`` whose lateral needle force (lateral_force, N) exceeds
    ``limit`` (N), or -1."""
    for q in range(pun_i.shape[0]):
        if pun_i[q, PI_STATE] == PUN_NEEDLE and not torn[q] and lateral_force(pun_f, q) > limit:
            return q
    return -1


@njit(cache=True, error_model="numpy")
def states_changed(pun_i: np.ndarray, prev: np.ndarray) -> bool:
    """Whether a puncture's state (pun_i[:, PI_STATE]) differs from ``prev``: the watch's every-tick test, one
    kernel call where np.array_equal on the column cost the tick about 3 us."""
    for q in range(pun_i.shape[0]):
        if pun_i[q, PI_STATE] != prev[q]:
            return True
    return False


class SutureWatch:
    """Turns a tissue scene's state into events (puncture, thread_through, puncture_closed, needle_out, tear,
    gap_closed, gap_opened, knot, throw), and keeps the knot, throws and linking that the `state` topic's
    `tissue` map reports (server/messages.py). ``check`` runs every tick; it allocates when something happened,
    and when it reads the knot (KNOT_EVERY ticks: the thread closed and reduced on that tick; its diagram, its
    state sum KNOT_BUDGET at a time and its name on the spare ticks after, so that no tick pays for a whole
    12-crossing sum). The linking is read from a copy of the thread taken every LINK_EVERY ticks, LINK_BUDGET
    pairs of segments a spare tick; a spare tick adds to one reading only, the linking's first."""

    def __init__(self, model):
        self.model = model
        self.on = bool(model.tissue_on)
        self.prev = np.zeros(MAX_PUNCTURES, np.int64)
        self.crack = 3.0 * float(model.tissue_par[TP_RADIUS])
        self.closed = False
        self.throws = 0
        self.link = 0.0
        self.knot = "unknot"
        self.seen = "unknot"      # the knot read last time: a new one counts once read twice running
        self.ticks = 0
        self.reading: KnotReading | None = None   # a knot read whose state sum is still being added up
        self.link_reading: LinkReading | None = None   # a linking read still being added up ...
        self.link_x = np.empty((model.inv_mass.shape[0], 3))   # ... on this copy of the thread
        self.tear = float(model.tissue_par[TP_TEAR])
        self.torn = np.zeros(MAX_PUNCTURES, np.bool_)   # punctures that have torn (one `tear` event each)

    def warm_up(self, state) -> None:
        """Call every kernel ``check`` can reach once (numba loads them at a first call)."""
        pad_gap(self.model.pads, state.pst)
        states_changed(state.pun_i, self.prev)
        lateral_over(state.pun_i, state.pun_f, self.tear, self.torn)
        lateral_force(state.pun_f, 0)
        if state.x.shape[0] >= 4:
            linking(state.x, 0, 1, 2, 3)
            solid_angles(state.x, 0, 1, 2, 3)
        warm_up_knots()

    def reset(self, state) -> None:
        self.prev[:] = state.pun_i[:, PI_STATE]
        g = pad_gap(self.model.pads, state.pst)
        self.closed = bool(g <= self.crack + GAP_CLOSED)
        self.throws = 0
        self.link = 0.0
        self.knot = self.seen = "unknot"
        self.ticks = 0
        self.reading = None
        self.link_reading = None
        self.torn[:] = False

    def check(self, state, emit, spare: bool = True) -> None:
        """Emit (kind, **details) for what changed since the last call. ``spare``: this tick has room for a slice
        of a reading (the server's loop says no on the ticks it builds a `state` message on)."""
        if not self.on:
            return
        pun_i = state.pun_i
        if states_changed(pun_i, self.prev):
            cur = pun_i[:, PI_STATE]
            ids = self.model.pad_ids
            for q in np.flatnonzero(cur != self.prev):
                old, new = int(self.prev[q]), int(cur[q])
                pad = ids[int(pun_i[q, PI_PAD])]
                if new == PUN_NEEDLE and old == PUN_FREE:
                    self.torn[q] = False
                    pos = state.pst[pun_i[q, PI_PAD], PS_X:PS_X + 3] + state.pun_f[q, PF_LOCAL:PF_LOCAL + 3]
                    emit("puncture", pad=pad, side="entry" if pun_i[q, PI_MATE] < 0 else "exit",
                         pos=[float(v) for v in pos])
                elif new == PUN_ACTIVE and old == PUN_NEEDLE:
                    emit("thread_through", pad=pad)
                elif new == PUN_FREE and old == PUN_NEEDLE:
                    emit("needle_out", pad=pad)
                elif new == PUN_FREE and old in (PUN_ACTIVE, PUN_PASSED):
                    emit("puncture_closed", pad=pad)
            self.prev[:] = cur
        # a needle levered across its punctures tears the tissue there: once per puncture
        q = lateral_over(pun_i, state.pun_f, self.tear, self.torn)
        if q >= 0:
            self.torn[q] = True
            pad = int(pun_i[q, PI_PAD])
            pos = state.pst[pad, PS_X:PS_X + 3] + state.pun_f[q, PF_LOCAL:PF_LOCAL + 3]
            emit("tear", pad=self.model.pad_ids[pad], force=float(lateral_force(state.pun_f, q)), limit=self.tear,
                 pos=[float(v) for v in pos])
        if self.model.pads.shape[0] >= 2:
            g = float(pad_gap(self.model.pads, state.pst))
            if not self.closed and g <= self.crack + GAP_CLOSED:
                self.closed = True
                emit("gap_closed", gap=g)
            elif self.closed and g > self.crack + GAP_OPEN:
                self.closed = False
                emit("gap_opened", gap=g)
        self.ticks += 1
        if spare:
            if self.link_reading is not None:
                link = self.link_reading.advance(LINK_BUDGET)
                if link is not None:
                    self.link = link
                    self.link_reading = None
            elif self.reading is not None:   # the knot: its diagram, its state sum KNOT_BUDGET at a time, its name
                kt = self.reading.advance(KNOT_BUDGET)
                if kt is not None:
                    self.reading = None
                    self._read(kt, emit)
        if self.ticks % LINK_EVERY == LINK_PHASE:
            ends = strands(pun_i, state.pun_f, state.x.shape[0])
            if ends is not None:
                lo, hi = ends
                n = state.x.shape[0] - 1
                if lo >= 1 and hi <= n - 1:
                    self.link_reading = LinkReading(state.x, lo, hi, self.link_x)
                else:
                    self.link, self.link_reading = 0.0, None
        if self.ticks % KNOT_EVERY == KNOT_PHASE:
            self.reading = KnotReading(state.x)   # drawn, summed and named on the spare ticks after

    def _read(self, kt: KnotType, emit) -> None:
        # a knot counts once it has been read twice running: a strand sliding over another mid-reading, or a
        # diagram too crossed to resolve, does not make an event
        if kt.name not in ("unresolved", self.knot) and kt.name == self.seen:
            self.knot = kt.name
            emit("knot", name=kt.name, hand=kt.hand, throws=kt.throws, jones=[list(pc) for pc in kt.jones])
            if kt.throws is not None and kt.throws != self.throws:
                self.throws = kt.throws
                emit("throw", throws=kt.throws, linking=self.link)
        self.seen = kt.name
