"""The thread breaks: a segment pulled past the thread's rated strength parts, and both pieces go on.

A suture's rating is its knot-pull tensile strength (the USP minimum for its size, docs/MATERIALS.md): the
force at which the strand breaks with a knot tied in it. The knot is where a tied suture breaks, so the
rating is read against the largest tension of any segment: the segment where the tension peaks parts once
that peak has stayed above the rating for BREAK_TICKS ticks running (a single tick's peak can be a contact's
impulse, not a load the thread carries).

A parted segment keeps its two vertices but joins them by nothing: its inextensibility constraint is gone
(constraints.solve_multipliers gives it the identity row, its multiplier 0), as are the two hinges that
bend across it (forces.accumulate_forces), every contact pair it was in (contact_response.rebuild_neighbours)
and its contact with the tools (instruments.tool_contact). The end-to-end twist of the uniform-twist model
has no meaning for two pieces with free ends and is dropped (a piece's twist relaxes at once: the model
carries no twist dynamics of its own). Each piece keeps its rest lengths, and the momentum of the two
together is what the thread had.

The parts are in the state (ThreadState.parted, .breakage), as MuJoCo keeps which equality constraints are
active in mjData: a reset mends the thread, and a resimulation parts it on the same tick.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .model import ThreadModel, ThreadState

BK_PARTED = 0      # segments parted so far
BK_OVER = 1        # ticks running in which some segment's tension exceeded the rated strength
BK_COUNT = 2

BREAK_TICKS = 3    # ticks over the rating before the segment parts (3 ms at 1 kHz)


@njit(cache=True, error_model="numpy")
def find_break(tension: np.ndarray, parted: np.ndarray, strength: float, breakage: np.ndarray) -> int:
    """After a tick: the segment to part now, or -1. ``tension`` (N) per segment, ``strength`` (N) the rating;
    ``breakage`` counts the ticks running over it (BK_OVER), which this call advances or clears."""
    j_max = -1
    t_max = strength
    for j in range(tension.shape[0]):
        if parted[j] == 0 and tension[j] > t_max:
            t_max = tension[j]
            j_max = j
    if j_max < 0:
        breakage[BK_OVER] = 0
        return -1
    breakage[BK_OVER] += 1
    if breakage[BK_OVER] < BREAK_TICKS:
        return -1
    breakage[BK_OVER] = 0
    return j_max


def part(state: ThreadState, j: int) -> None:
    """Part segment ``j`` of the thread (between the ticks): the segment carries nothing from now on, a grasp on
    a point inside it moves to the nearer of its two vertices, the twist is dropped, and the contact list is
    built again before the next substep (without the segment's pairs)."""
    state.parted[j] = 1
    state.breakage[BK_PARTED] += 1
    state.tension[j] = 0.0
    state.tension_in[j] = 0.0
    state.tension_floor[j] = 0.0
    state.twist[0] = 0.0
    for g in range(state.grasp_vertex.shape[0]):
        if state.grasp_vertex[g] == j and state.grasp_frac[g] > 0.0:
            if state.grasp_frac[g] >= 0.5:
                state.grasp_vertex[g] = j + 1
            state.grasp_frac[g] = 0.0
    state.x_ref[:] = np.inf


def rating(model: ThreadModel) -> float | None:
    """The thread's rated strength (N), or None for a thread that never breaks (as events carry it)."""
    s = float(model.params.knot_pull_strength)
    return s if s < np.inf else None


def whole(state: ThreadState) -> bool:
    """Whether the thread has not broken."""
    return int(state.breakage[BK_PARTED]) == 0


def pieces(parted: np.ndarray) -> list[tuple[int, int]]:
    """The thread's pieces as (first vertex, last vertex) pairs, in order along the thread: [(0, n - 1)] for a
    whole thread of n vertices."""
    cuts = np.flatnonzero(parted)
    first = 0
    out = []
    for j in cuts:
        out.append((first, int(j)))
        first = int(j) + 1
    out.append((first, parted.shape[0]))
    return out
