"""The `tissue:` section of a scenario (docs/SCENARIOS.md): pads, the punctures' law, passes already made.

Read and checked before anything runs: a pad's size and springs, the drag law's order (kinetic <= static),
that each pass's two points lie on its pad's surface, that the thread's initial shape runs through them, and
that no other vertex starts inside a pad. Every error names the file, key and reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import ConfigError, Section
from .model import ThreadModel, ThreadState
from .tissue import (MAX_PUNCTURES, PD_C, PD_COUNT, PD_HALF, PD_INV_MASS, PD_K, PD_REST, PF_LOCAL, PF_SIGMA, PI_MATE,
                     PI_PAD, PI_STATE, PUN_ACTIVE, TP_COUNT, TP_EDGE_MU, TP_F_KINETIC, TP_F_STATIC, TP_K_LAT, TP_MU,
                     TP_RADIUS, TP_ROUNDS, TP_TEAR, TP_V_STICK, TP_VISCOUS, closest_on_thread, count_inside,
                     locate_punctures)


@dataclass
class PassSpec:
    """A pass of the thread through a pad, already made when the scenario starts."""
    pad: int
    entry: np.ndarray   # (3,) m, on the pad's surface at rest
    exit: np.ndarray
    key: str            # the key path, for errors found when the state is built
    file: str


@dataclass(frozen=True)
class Target:
    """A mark on a pad's surface where the needle should enter or leave it (a practice scene's targets)."""
    id: str
    pad: int
    local: tuple[float, float, float]   # m: from the pad's centre at rest; the mark moves with its pad
    kind: str                           # "entry" or "exit"


TARGET_KINDS = ("entry", "exit")
# N: the default lateral needle force at a puncture that tears the tissue there (`tissue.puncture.tear_force`).
# A tuning choice, no published figure: above what clean bites put across their punctures (docs/ASSESSMENT.md
# Sec. 3), within a stylus's 3.3 N
TEAR_FORCE = 2.0


@dataclass
class TissueSpec:
    par: np.ndarray                   # tissue.TP_*
    pads: np.ndarray                  # (P, tissue.PD_COUNT)
    ids: tuple
    passes: list[PassSpec] = field(default_factory=list)
    targets: tuple[Target, ...] = ()

    def thread_through(self, state: ThreadState, model: ThreadModel) -> None:
        """Put the passes into ``state`` as punctures at the thread's closest points; the thread must run
        through each point (within a tenth of a segment) and no vertex outside a tunnel may start in a pad."""
        x = state.x
        m = x.shape[0] - 1
        tol = 0.1 * float(np.median(model.rest_length))
        for k, ps in enumerate(self.passes):
            a, b = 2 * k, 2 * k + 1
            for q, point, name in ((a, ps.entry, "entry"), (b, ps.exit, "exit")):
                sig, d2 = closest_on_thread(x, point[0], point[1], point[2], 0, m - 1)
                if d2 > tol * tol:
                    raise ConfigError(ps.file, f"{ps.key}.{name}",
                                      f"the thread's initial shape passes {d2 ** 0.5 * 1e3:.3g} mm from this point; "
                                      f"it must run through it (within {tol * 1e3:.3g} mm)")
                state.pun_i[q, PI_STATE] = PUN_ACTIVE
                state.pun_i[q, PI_PAD] = ps.pad
                state.pun_i[q, PI_MATE] = b if q == a else a
                state.pun_f[q, PF_LOCAL:PF_LOCAL + 3] = point - model.pads[ps.pad, PD_REST:PD_REST + 3]
                state.pun_f[q, PF_SIGMA] = sig
            if abs(state.pun_f[a, PF_SIGMA] - state.pun_f[b, PF_SIGMA]) < 1e-9:
                raise ConfigError(ps.file, ps.key, "entry and exit are the same point of the thread")
        locate_punctures(1.0, x, model.rest_length, state.pst, state.pun_i, state.pun_f, True, model.needle_on,
                         0.0)
        if count_inside(x, model.rest_length, model.pads, state.pst, state.pun_i, state.pun_f, 0.0, 0.0,
                        1 if model.needle_on else 0) > 0:
            file = self.passes[0].file if self.passes else "scenario"
            raise ConfigError(file, "tissue.pads", "the thread's initial shape has vertices inside a pad "
                                                   "outside any pass through it")


def read_tissue(sec: Section | None, params, rest: np.ndarray) -> TissueSpec | None:
    """Validate the `tissue:` section (None if absent)."""
    if sec is None:
        return None
    par = np.zeros(TP_COUNT)
    psec = sec.section("puncture", {})
    par[TP_K_LAT] = psec.get("stiffness", float, 2000.0, above=0.0, maxval=1e7)
    par[TP_F_STATIC] = psec.get("drag_static", float, 0.3, minval=0.0, maxval=100.0)
    par[TP_F_KINETIC] = psec.get("drag_kinetic", float, 0.2, minval=0.0, maxval=100.0)
    if par[TP_F_KINETIC] > par[TP_F_STATIC]:
        raise psec.error("drag_kinetic", f"{par[TP_F_KINETIC]:g} N exceeds drag_static {par[TP_F_STATIC]:g} N: "
                                         "a thread that slides drags at most as hard as one that holds")
    par[TP_VISCOUS] = psec.get("drag_viscous", float, 1.0, minval=0.0, maxval=1e4)
    par[TP_V_STICK] = psec.get("stick_speed", float, 1e-3, above=0.0, maxval=1.0)
    par[TP_TEAR] = psec.get("tear_force", float, TEAR_FORCE, above=0.0, maxval=1000.0)
    psec.finish()
    par[TP_MU] = sec.get("friction", float, 0.3, minval=0.0, maxval=10.0)
    par[TP_RADIUS] = sec.get("radius", float, params.radius, minval=0.0, maxval=0.01)
    par[TP_ROUNDS] = sec.get("rounds", int, 8, minval=1, maxval=64)
    par[TP_EDGE_MU] = sec.get("edge_friction", float, 0.0, minval=0.0, maxval=10.0)

    pad_secs = sec.sections("pads")
    if not pad_secs:
        raise sec.error("pads", "give at least one pad")
    pads = np.zeros((len(pad_secs), PD_COUNT))
    ids: list[str] = []
    for i, ps in enumerate(pad_secs):
        pid = ps.get("id", str, f"pad{i}")
        if pid in ids:
            raise ps.error("id", f"duplicate pad id {pid!r}")
        ids.append(pid)
        size = ps.vector("size", 3)
        if min(size) <= 0.0:
            raise ps.error("size", f"must be three positive extents (m), got {size}")
        pads[i, PD_HALF:PD_HALF + 3] = 0.5 * np.array(size)
        pads[i, PD_REST:PD_REST + 3] = ps.vector("center", 3)
        fixed = ps.get("fixed", bool, False)
        mass = ps.get("mass", float, 0.01, above=0.0, maxval=100.0)
        pads[i, PD_INV_MASS] = 0.0 if fixed else 1.0 / mass
        k_raw = ps.raw("stiffness", 50.0)
        k = [k_raw] * 3 if not isinstance(k_raw, list) else ps.vector("stiffness", 3)
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1e6 for v in k):
            raise ps.error("stiffness", f"must be a number or [kx, ky, kz] in [0, 1e6] N/m, got {k_raw!r}")
        pads[i, PD_K:PD_K + 3] = k
        pads[i, PD_C] = ps.get("damping", float, 0.5, minval=0.0, maxval=1e4)
        if not fixed and min(k) == 0.0:
            raise ps.error("stiffness", "a pad that is not fixed needs a spring along every axis (N/m > 0)")
        ps.finish()
    for i in range(len(ids)):
        for j in range(i + 1, len(ids)):
            gap = np.abs(pads[i, PD_REST:PD_REST + 3] - pads[j, PD_REST:PD_REST + 3]) - (
                pads[i, PD_HALF:PD_HALF + 3] + pads[j, PD_HALF:PD_HALF + 3])
            if np.all(gap < 0.0):
                raise pad_secs[j].error("center", f"pad {ids[j]!r} overlaps pad {ids[i]!r} at rest")

    passes: list[PassSpec] = []
    for k, qs in enumerate(sec.sections("passes")):
        if 2 * (k + 1) > MAX_PUNCTURES:
            raise qs.error("pad", f"at most {MAX_PUNCTURES // 2} passes")
        pid = qs.get("pad", str)
        if pid not in ids:
            raise qs.error("pad", f"no pad {pid!r} (pads: {', '.join(ids)})")
        p = ids.index(pid)
        pts = []
        for key in ("entry", "exit"):
            pt = np.array(qs.vector(key, 3))
            rel = np.abs(pt - pads[p, PD_REST:PD_REST + 3]) - pads[p, PD_HALF:PD_HALF + 3]
            tol = 1e-6 + 1e-3 * float(pads[p, PD_HALF:PD_HALF + 3].min())
            if np.any(rel > tol) or np.all(rel < -tol):
                raise qs.error(key, f"must lie on the surface of pad {pid!r}, got {list(pt)}")
            pts.append(pt)
        passes.append(PassSpec(pad=p, entry=pts[0], exit=pts[1], key=qs.path,
                               file=qs.file))
        qs.finish()
    targets = _targets(sec, pads, ids)
    sec.finish()
    return TissueSpec(par=par, pads=pads, ids=tuple(ids), passes=passes, targets=targets)


def _targets(sec: Section, pads: np.ndarray, ids: list) -> tuple[Target, ...]:
    """The `tissue.targets` list: each mark's `id`, `pad`, `pos` (m, on that pad's surface at rest) and `kind`."""
    out: list[Target] = []
    for ts in sec.sections("targets"):
        tid = ts.get("id", str, f"target{len(out)}")
        if any(t.id == tid for t in out):
            raise ts.error("id", f"a target {tid!r} exists already")
        pid = ts.get("pad", str)
        if pid not in ids:
            raise ts.error("pad", f"no pad {pid!r} (pads: {', '.join(ids)})")
        p = ids.index(pid)
        pt = np.array(ts.vector("pos", 3))
        rel = np.abs(pt - pads[p, PD_REST:PD_REST + 3]) - pads[p, PD_HALF:PD_HALF + 3]
        tol = 1e-6 + 1e-3 * float(pads[p, PD_HALF:PD_HALF + 3].min())
        if np.any(rel > tol) or np.all(rel < -tol):
            raise ts.error("pos", f"must lie on the surface of pad {pid!r}, got {list(pt)}")
        local = pt - pads[p, PD_REST:PD_REST + 3]
        out.append(Target(tid, p, (float(local[0]), float(local[1]), float(local[2])),
                          ts.get("kind", str, choices=TARGET_KINDS)))
        ts.finish()
    return tuple(out)
