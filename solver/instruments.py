"""The instruments the styluses drive, as the thread meets them: each tool is two kinematic capsules, its jaw
and its shaft, that the thread cannot pass through and that hold it by Coulomb friction.

A capsule is the set of points within ``radius`` of a segment [A, B] (m). The server places every tool's
capsules each tick from its stylus's pose (``place_capsules``, called by server/physics.py) and gives them the
velocity that takes them there across the tick; ``move_tools`` (stage 1) moves them one substep along it, as a
live grasp's target is ramped. Their mass is infinite: the thread gives way, the tool does not.

One round of ``tool_contact`` (after a solve, on xbar) treats each thread segment closer to a capsule's axis
than the capsule's radius plus the thread's (``TC_TOUCH``):

* **No passing through.** The closest points of the segment and the axis at the substep's start (x, and the
  capsule where it was, TC_A0/TC_B0) give the normal n; the gap is measured along n between the same points
  now (xbar, TC_A/TC_B), so a segment that would cross the axis within one substep shows a negative gap on the
  side it came from and is put back there (as needle.needle_thread keeps the thread off the needle). The
  correction d = touch - gap moves the segment's point, split between its two vertices by their inverse masses
  (w_j (1 - s), w_j+1 s over (1 - s)^2 w_j + s^2 w_j+1, which moves the point by exactly d). A segment a
  little inside at the start is led out at RECOVER_SPEED; one deep inside (nearer the axis than IN_JAW of the
  touch distance: between an open jaw's prongs, where the jaw let go of it or was put down on it) is left
  alone until it leaves.
* **Friction**, at the position level (Macklin et al. 2014, "Unified particle physics for real-time
  applications", Sec. 6.1): the point's slip over the substep relative to the capsule's point under it,
  without its normal part, is undone entirely when it is within mu_s d (sticking), else shortened by mu_k d.
  A thread wound round a jaw is pressed onto it by its own tension, so the wraps hold by the capstan's
  friction while the jaw moves along its axis.

**What the hand feels.** A push (and its friction) c on a segment's point changes the momentum of its vertices
by m_j dx_j / h + m_j+1 dx_j+1 / h = c / (w_pt h), with the same effective masses the solve used (the split
above); ``TC_IMPULSE`` sums it over every round of the tick's substeps. At rest it balances the tension the
thread pulls round the tool with (momentum, nothing else acting), and the server adds minus it over the tick to
the force of the device whose tool it is.

A tool's own hold is excluded: the segments ``TC_SKIP0``..``TC_SKIP1`` (the thread held in its jaw and the
thread next to it, or the first segments of a needle it holds) do not meet that tool's capsules, which would
otherwise push out of the jaw the very point the jaw's coupling holds in it.

Units: SI. Kernels compile with ``cache=True`` and allocate nothing.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .contact import closest_if_near, segment_closest, segment_move, tangential

# a capsule's row (ThreadState.tool_cap)
TC_A = 0        # 3: the axis's first end now (m): the jaw's tip for a jaw, the hinge for a shaft
TC_B = 3        # 3: its other end now (m)
TC_A0 = 6       # 3: the first end one substep earlier (m)
TC_B0 = 9       # 3: the other end one substep earlier (m)
TC_VA = 12      # 3: the first end's velocity across the tick (m/s)
TC_VB = 15      # 3: the other end's (m/s)
TC_TOUCH = 18   # m: the capsule's radius plus the thread's; 0: the row is no capsule
TC_MU_S = 19    # static friction coefficient, thread on the tool
TC_MU_K = 20    # kinetic (<= static)
TC_SKIP0 = 21   # the first thread segment this capsule does not meet (-1: none)
TC_SKIP1 = 22   # the last
TC_PUSHES = 23  # contacts this capsule answered in the last tick (every round of every substep)
TC_IMPULSE = 24  # 3: the impulse it gave the thread over the last tick (N s); the hand holding the tool feels
                 # minus it over the tick
TC_COUNT = 27

# a tool's shape (server/jaws.py ToolShape.par): its jaw from the tip back to the hinge and its shaft on from there,
# along the tool's axis (body +z), and the thread's friction on them
SH_JAW_LENGTH = 0   # m
SH_JAW_RADIUS = 1   # m
SH_SHAFT_LENGTH = 2  # m
SH_SHAFT_RADIUS = 3  # m
SH_MU_S = 4
SH_MU_K = 5
SH_COUNT = 6

MAX_TOOLS = 4             # tools (styluses) at once
CAPSULES_PER_TOOL = 2     # its jaw and its shaft
MAX_CAPSULES = MAX_TOOLS * CAPSULES_PER_TOOL
RECOVER_SPEED = 0.05      # m/s: how fast a thread found a little inside a capsule is led out of it
IN_JAW = 0.5              # a thread closer to a capsule's axis than this fraction of the touch distance at a
                          # substep's start is between the jaw's prongs and is left alone


def tool_capsules() -> np.ndarray:
    """A state's capsule table: MAX_CAPSULES rows, none of them a capsule yet."""
    caps = np.zeros((MAX_CAPSULES, TC_COUNT))
    caps[:, TC_SKIP0] = -1.0
    caps[:, TC_SKIP1] = -1.0
    return caps


@njit(cache=True, error_model="numpy")
def place_capsules(caps: np.ndarray, c0: int, tip: np.ndarray, quat: np.ndarray, shape: np.ndarray,
                   thread_radius: float, skip0: int, skip1: int, tick: float, max_step: float,
                   fresh: bool) -> None:
    """Put a tool's jaw and shaft (rows ``c0`` and ``c0 + 1`` of ``caps``) where its tip ``tip`` (m) and its
    orientation ``quat`` (w, x, y, z, unit; the axis is its body +z) put them by the end of this tick of ``tick``
    s: each end gets the velocity that takes it there (move_tools moves it a substep at a time), or is set there
    at once when ``fresh`` (a tool that just appeared) or when the tip is further than ``max_step`` (m; the
    device's max_speed over a tick) from where the jaw is: a jump (a reset, a scripted teleport) swept through
    the scene would whip the thread. ``shape``: SH_*; ``thread_radius`` (m) is added to each capsule's; the
    thread segments ``skip0``..``skip1`` (-1: none) are the ones its jaw holds."""
    w, x, y, z = quat[0], quat[1], quat[2], quat[3]
    ax = 2.0 * (x * z + w * y)          # q (0, 0, 1) q^-1: the rotation matrix's third column
    ay = 2.0 * (y * z - w * x)
    az = 1.0 - 2.0 * (x * x + y * y)
    if not fresh:
        jx = tip[0] - caps[c0, TC_A]
        jy = tip[1] - caps[c0, TC_A + 1]
        jz = tip[2] - caps[c0, TC_A + 2]
        fresh = jx * jx + jy * jy + jz * jz > max_step * max_step
    hinge = shape[SH_JAW_LENGTH]
    for k in range(CAPSULES_PER_TOOL):
        c = c0 + k
        a = 0.0 if k == 0 else hinge                                  # the jaw: tip to hinge; the shaft: on
        b = hinge if k == 0 else hinge + shape[SH_SHAFT_LENGTH]
        for d in range(3):
            u = ax if d == 0 else (ay if d == 1 else az)
            pa = tip[d] + a * u
            pb = tip[d] + b * u
            if fresh:
                caps[c, TC_A + d] = pa
                caps[c, TC_A0 + d] = pa
                caps[c, TC_B + d] = pb
                caps[c, TC_B0 + d] = pb
                caps[c, TC_VA + d] = 0.0
                caps[c, TC_VB + d] = 0.0
            else:
                caps[c, TC_VA + d] = (pa - caps[c, TC_A + d]) / tick
                caps[c, TC_VB + d] = (pb - caps[c, TC_B + d]) / tick
        caps[c, TC_TOUCH] = (shape[SH_JAW_RADIUS] if k == 0 else shape[SH_SHAFT_RADIUS]) + thread_radius
        caps[c, TC_MU_S] = shape[SH_MU_S]
        caps[c, TC_MU_K] = shape[SH_MU_K]
        caps[c, TC_SKIP0] = skip0
        caps[c, TC_SKIP1] = skip1


@njit(cache=True, error_model="numpy")
def move_tools(h: float, caps: np.ndarray) -> int:
    """Stage 1's share: every capsule one substep h (s) along its velocity, the old ends kept in TC_A0/TC_B0.
    Returns how many rows are capsules."""
    n = 0
    for c in range(caps.shape[0]):
        if caps[c, TC_TOUCH] <= 0.0:
            continue
        n += 1
        for d in range(3):
            caps[c, TC_A0 + d] = caps[c, TC_A + d]
            caps[c, TC_B0 + d] = caps[c, TC_B + d]
            caps[c, TC_A + d] += caps[c, TC_VA + d] * h
            caps[c, TC_B + d] += caps[c, TC_VB + d] * h
    return n


@njit(cache=True, error_model="numpy")
def tool_contact(h: float, x: np.ndarray, xbar: np.ndarray, w_eff: np.ndarray, caps: np.ndarray,
                 scratch: np.ndarray, parted: np.ndarray) -> int:
    """One round of the thread against every capsule (after a solve, on ``xbar``): no passing through, then
    Coulomb friction, as the module's docstring says. ``h``: the substep (s); ``x``: the positions at the
    substep's start (m); ``scratch`` (>= 3); ``parted`` (m,) the segments that broke (solver/breakage.py),
    which touch nothing. Returns how many segment-capsule contacts were pushed."""
    m = x.shape[0] - 1
    pushed = 0
    for c in range(caps.shape[0]):
        touch = caps[c, TC_TOUCH]
        if touch <= 0.0:
            continue
        a0x, a0y, a0z = caps[c, TC_A0], caps[c, TC_A0 + 1], caps[c, TC_A0 + 2]
        b0x, b0y, b0z = caps[c, TC_B0], caps[c, TC_B0 + 1], caps[c, TC_B0 + 2]
        a1x, a1y, a1z = caps[c, TC_A], caps[c, TC_A + 1], caps[c, TC_A + 2]
        b1x, b1y, b1z = caps[c, TC_B], caps[c, TC_B + 1], caps[c, TC_B + 2]
        # a bound on how far any point of the capsule moved this substep
        cap_move = max(math.sqrt((a1x - a0x) ** 2 + (a1y - a0y) ** 2 + (a1z - a0z) ** 2),
                       math.sqrt((b1x - b0x) ** 2 + (b1y - b0y) ** 2 + (b1z - b0z) ** 2))
        half_cap = 0.5 * math.sqrt((b0x - a0x) ** 2 + (b0y - a0y) ** 2 + (b0z - a0z) ** 2)
        skip0 = int(caps[c, TC_SKIP0])
        skip1 = int(caps[c, TC_SKIP1])
        mu_s = caps[c, TC_MU_S]
        mu_k = caps[c, TC_MU_K]
        for j in range(m):
            if skip0 <= j <= skip1 or parted[j] != 0:
                continue
            wj = w_eff[j]
            wk = w_eff[j + 1]
            if wj == 0.0 and wk == 0.0:
                continue
            # quick reject on the start geometry: midpoints further apart than both half lengths, the contact
            # distance and both moves this substep
            ex = x[j + 1, 0] - x[j, 0]
            ey = x[j + 1, 1] - x[j, 1]
            ez = x[j + 1, 2] - x[j, 2]
            reach = (half_cap + 0.5 * math.sqrt(ex * ex + ey * ey + ez * ez) + touch
                     + 2.0 * (segment_move(x, xbar, j) + cap_move))
            if not closest_if_near(x, j, a0x, a0y, a0z, b0x, b0y, b0z, reach, scratch):
                continue
            s = scratch[0]
            t = scratch[1]
            d0 = math.sqrt(scratch[2])
            if d0 < IN_JAW * touch:
                # deep inside at the start: the thread lies between an open jaw's prongs (the jaw has just let
                # go of it, or was put down on it), and stays there until it leaves; pushing it out would move
                # a thread the hand just laid down
                continue
            # the normal at the start, from the capsule's axis to the thread
            px0 = x[j, 0] + s * ex
            py0 = x[j, 1] + s * ey
            pz0 = x[j, 2] + s * ez
            qx0 = a0x + t * (b0x - a0x)
            qy0 = a0y + t * (b0y - a0y)
            qz0 = a0z + t * (b0z - a0z)
            nx = (px0 - qx0) / d0
            ny = (py0 - qy0) / d0
            nz = (pz0 - qz0) / d0
            # the same points now
            px = xbar[j, 0] + s * (xbar[j + 1, 0] - xbar[j, 0])
            py = xbar[j, 1] + s * (xbar[j + 1, 1] - xbar[j, 1])
            pz = xbar[j, 2] + s * (xbar[j + 1, 2] - xbar[j, 2])
            qx = a1x + t * (b1x - a1x)
            qy = a1y + t * (b1y - a1y)
            qz = a1z + t * (b1z - a1z)
            gap = nx * (px - qx) + ny * (py - qy) + nz * (pz - qz)
            # a segment already inside at the start (a tool that appeared over the thread) is led out at
            # RECOVER_SPEED, not thrown out in one substep: the whole depth at once is a velocity of depth / h
            depth = min(touch, d0 + RECOVER_SPEED * h) - gap
            # every depth counts, however small: a thread resting on a tool under its tension sinks into it by
            # T h^2 / (rho R) a substep (0.2 nm at 32 substeps), and that is the normal impulse friction has
            if depth <= 0.0:
                continue
            w_pt = (1.0 - s) * (1.0 - s) * wj + s * s * wk
            if w_pt <= 0.0:
                continue
            # the point's slip relative to the capsule's point under it over the substep, tangential part
            sx, sy, sz, slip = tangential((px - px0) - (qx - qx0), (py - py0) - (qy - qy0), (pz - pz0) - (qz - qz0),
                                          nx, ny, nz)
            # the point's correction: out to the surface along n, and back along the slip by friction
            cx = depth * nx
            cy = depth * ny
            cz = depth * nz
            if slip > 0.0:
                if slip <= mu_s * depth:
                    keep = 1.0                          # sticking: the whole slip undone
                else:
                    keep = min(mu_k * depth / slip, 1.0)   # sliding: shortened by mu_k d
                cx -= keep * sx
                cy -= keep * sy
                cz -= keep * sz
            fj = wj * (1.0 - s) / w_pt
            fk = wk * s / w_pt
            xbar[j, 0] += fj * cx
            xbar[j, 1] += fj * cy
            xbar[j, 2] += fj * cz
            xbar[j + 1, 0] += fk * cx
            xbar[j + 1, 1] += fk * cy
            xbar[j + 1, 2] += fk * cz
            # the momentum the push gave the vertices that move (a kinematic one takes none): m dx / h each
            share = ((1.0 - s if wj > 0.0 else 0.0) + (s if wk > 0.0 else 0.0)) / (w_pt * h)
            caps[c, TC_IMPULSE] += share * cx
            caps[c, TC_IMPULSE + 1] += share * cy
            caps[c, TC_IMPULSE + 2] += share * cz
            caps[c, TC_PUSHES] += 1.0
            pushed += 1
    return pushed


@njit(cache=True, error_model="numpy")
def tool_clearance(x: np.ndarray, caps: np.ndarray, scratch: np.ndarray) -> float:
    """The least distance (m) from the thread's centre line to any capsule's surface less the thread's radius
    (touch less the axis distance, negated: negative when the thread is inside a capsule), over the segments
    each capsule meets; inf without capsules. The tests' check that the thread stays out of the tools."""
    best = math.inf
    for c in range(caps.shape[0]):
        touch = caps[c, TC_TOUCH]
        if touch <= 0.0:
            continue
        skip0 = int(caps[c, TC_SKIP0])
        skip1 = int(caps[c, TC_SKIP1])
        for j in range(x.shape[0] - 1):
            if skip0 <= j <= skip1:
                continue
            segment_closest(x[j, 0], x[j, 1], x[j, 2], x[j + 1, 0], x[j + 1, 1], x[j + 1, 2],
                            caps[c, TC_A], caps[c, TC_A + 1], caps[c, TC_A + 2],
                            caps[c, TC_B], caps[c, TC_B + 1], caps[c, TC_B + 2], scratch)
            g = math.sqrt(scratch[2]) - touch
            if g < best:
                best = g
    return best
