"""`suturesim run`: a scenario run headless, as fast as the machine allows, with the same solver and the same
messages as the daemon, optionally recorded to MCAP (`state` at the scenario's rate, `force` every tick)."""
from __future__ import annotations

import hashlib
import platform
import sys
import time
from dataclasses import dataclass

import numpy as np
import yaml

from ..solver import diagnostics
from ..solver.integrator import STAT_MAX_RESIDUAL, SolverDivergence, Stepper
from ..solver.model import ThreadState
from ..solver.scenario import Scenario
from . import protocol
from .messages import MessageBuilder
from .scene import SceneRunner, state_period


@dataclass
class RunSummary:
    scenario: str
    sim_time_s: float
    wall_s: float
    ticks: int
    substeps_min: int
    substeps_max: int
    max_residual: float        # max constraint residual |G_j|/l_j^2 over every substep (= |psi_j|/l_j^2 if inextensible)
    max_tension_n: float
    final_energy_j: dict
    finite: bool
    messages: int
    ticks_redone: int = 0      # ticks the Stepper ran again (past the substep budget if need be)
    ticks_past_budget: int = 0  # of those, ticks kept with more substeps than solver.max_substeps
    digest: str = ""           # state_digest of the final state

    @property
    def real_time_factor(self) -> float:
        return self.sim_time_s / self.wall_s if self.wall_s > 0 else float("inf")

    def lines(self) -> list[str]:
        e = self.final_energy_j
        return [
            f"scenario {self.scenario}: {self.sim_time_s:.3f} s simulated in {self.wall_s:.3f} s wall "
            f"({self.real_time_factor:.2f}x real time), {self.ticks} ticks, substeps {self.substeps_min}"
            f"..{self.substeps_max} per tick",
            f"max constraint residual {self.max_residual:.2e}, max tension {self.max_tension_n:.6g} N, energy (J): kinetic "
            f"{e['kinetic']:.6g}, elastic {e['elastic']:.6g}, gravity {e['gravity']:.6g}",
            f"{'finite' if self.finite else 'NOT FINITE'}; {self.ticks_redone} ticks redone "
            f"({self.ticks_past_budget} past the substep budget); {self.messages} messages recorded",
            f"state digest {self.digest}",
        ]


# what a run's outcome is: the thread's positions over its last substep, tensions, twist, the grasps' forces, the
# pads, the punctures and the needle (not the solver's scratch, whose layout may change without the physics)
DIGEST_FIELDS = ("x", "x_prev", "tension", "twist", "grasp_force", "pst", "pun_i", "pun_f", "nst")


def state_digest(state: ThreadState) -> str:
    """SHA-256 (hex) of the final state's DIGEST_FIELDS, their bytes as stored (float64, int64): two runs of a
    scenario ended in the same state bit for bit exactly when their digests are equal (across versions and
    machines, as long as the scene builds the same thread)."""
    h = hashlib.sha256()
    for name in DIGEST_FIELDS:
        h.update(np.ascontiguousarray(getattr(state, name)).tobytes())
    return h.hexdigest()


def recording_metadata(name: str, file: str, source: dict) -> dict[str, dict[str, str]]:
    """The scenario (its name, file and content as read), versions and machine, as MCAP metadata (string
    maps)."""
    import numba

    try:
        from importlib.metadata import version
        ours = version("suturesim")
    except Exception:  # pragma: no cover - running from a source tree without metadata
        ours = "unknown"
    return {
        "scenario": {"name": name, "file": file, "yaml": yaml.safe_dump(source)},
        "versions": {"suturesim": ours, "python": platform.python_version(), "numpy": np.__version__,
                     "numba": numba.__version__, "schema": str(protocol.SCHEMA_VERSION)},
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "node": platform.node()},
    }


def run_scenario(scenario: Scenario, duration: float | None = None, record: str | None = None,
                 progress: bool = False) -> RunSummary:
    """Run ``scenario`` for ``duration`` s of simulated time (default: the scenario's) as fast as possible."""
    model = scenario.model
    state = scenario.new_state()
    duration = scenario.duration if duration is None else duration
    ticks = int(round(duration / model.solver.tick))
    every = state_period(scenario.state_rate, model.solver.tick)
    builder = MessageBuilder(scenario)
    recorder = None
    if record:
        from .recording import McapRecorder
        recorder = McapRecorder(record, metadata=recording_metadata(scenario.name, scenario.file,
                                                                     scenario.source))
    messages = 0
    sub_min, sub_max, max_res, max_t = 1 << 30, 0, 0.0, 0.0
    finite = True
    t_wall = time.perf_counter()
    last_report = t_wall

    def publish(topic: bytes, payload: bytes) -> None:
        # every message of a tick is published after its step: stamped with the scene time it ended at
        nonlocal messages
        t_ns = int(round(state.time[0] * 1e9))
        recorder.write(topic, payload, t_ns, t_ns, runner.seq)
        if topic != protocol.TOPIC_EVENT:
            messages += 1

    # the daemon's tick (server/scene.py), its messages recorded instead of published
    runner = SceneRunner(Stepper(model, state), builder, publish if recorder is not None else None, every)
    ran = 0
    try:
        for k in range(1, ticks + 1):
            try:
                n, _ = runner.tick(k)
            except SolverDivergence as exc:
                print(f"suturesim: {exc}", file=sys.stderr)
                finite = False
                break
            ran = k
            sub_min = min(sub_min, n)
            sub_max = max(sub_max, n)
            max_res = max(max_res, float(state.stats[STAT_MAX_RESIDUAL]))
            if not np.isfinite(state.stats[STAT_MAX_RESIDUAL]):
                finite = False
                break
            if progress and k % 1000 == 0:
                now = time.perf_counter()
                if now - last_report > 1.0:
                    last_report = now
                    print(f"\r  t = {state.time[0]:.1f} / {duration:.1f} s", end="", file=sys.stderr, flush=True)
        if progress:
            print("\r", end="", file=sys.stderr)
    finally:
        if recorder is not None:
            recorder.close()
    wall = time.perf_counter() - t_wall
    finite = finite and bool(np.all(np.isfinite(state.x)))
    max_t = float(np.max(np.abs(state.tension))) if state.tension.size else 0.0
    return RunSummary(scenario=scenario.name, sim_time_s=float(state.time[0]), wall_s=wall, ticks=ran,
                      substeps_min=sub_min if ticks else 0, substeps_max=sub_max, max_residual=max_res,
                      max_tension_n=max_t, final_energy_j=diagnostics.energies(model, state), finite=finite,
                      messages=messages, ticks_redone=runner.stepper.retries,
                      ticks_past_budget=runner.stepper.past_budget, digest=state_digest(state))
