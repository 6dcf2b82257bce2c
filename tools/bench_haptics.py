"""`suturesim bench haptics`: the device path of `suturesim serve --device openhaptics`, through the libHD
emulator (haptics/hd_emulator.c, loaded as libHD.so by pyOpenHaptics, so the real binding and our servo callback
run at 1 kHz on the emulator's scheduler thread).

Measured:

* pose-to-force latency: for every new force the servo callback reads, the time since the stylus pose it was
  computed from was read from the device (the driver measures it: physics echoes each pose's timestamp with the
  force it produced, same clock). The first second of forces (the physics process coming up) is left out;
* the servo callback's own duration (begin frame -> end frame and error check);
* from the emulator's log, independently: every force the motors were given (count, largest magnitude against
  the clamp, non-finite values) and the period between consecutive forces.

The stylus follows a hand-like script (device frame, mm): slack, then pulls past the thread's reach and back,
circles and pulls again, so the force spans zero to the clamp.
"""
from __future__ import annotations

import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..haptics import emulator as emu
from ..server.physics import PHASE_TARGET_NS
from .bench_loop import Server

CONFIG = """\
scenario: default
device: openhaptics
devices:
  stylus0:
    transform: {rotation_deg: [0, 0, 0], scale: 0.001, offset: [0.45, 0.0, 0.0]}
"""
START_S = 4.0     # the script holds still this long: the server comes up meanwhile


def hand_script(seconds: float) -> list[tuple]:
    """(t_s, x_mm, y_mm, z_mm, buttons): hold, then 6 s cycles of: slack 40 mm in, pull 10 mm past the reach
    (taut, at the clamp), ease to 0.5 mm past (taut, below it), a 20 mm circle inside the reach."""
    rows = [(0.0, 0.0, 0.0, 0.0, 0), (1.0, -40.0, 0.0, 0.0, 0), (START_S, -40.0, 0.0, 0.0, 0)]
    t = START_S
    while t < START_S + seconds:
        rows += [(t + 1.5, 10.0, 0.0, 0.0, 0), (t + 2.5, 0.5, 0.0, 0.0, 0), (t + 3.0, -20.0, 0.0, 0.0, 0)]
        for k in range(1, 25):
            a = 2 * math.pi * k / 24
            rows.append((t + 3.0 + 2.0 * k / 24, -40.0 + 20.0 * math.cos(a), 20.0 * math.sin(a), 0.0, 0))
        rows.append((t + 6.0, -40.0, 0.0, 0.0, 0))
        t += 6.0
    return rows


@dataclass
class HapticsResult:
    seconds: float
    latency: dict          # µs: count, p50, p99, max (driver-measured)
    latency_hist: list     # forces by the nearest whole number of servo periods: 0, 1, ..., 9, >= 10
    callback: dict         # µs: count, p50, p99, max
    forces: int            # forces the emulator applied
    max_force: float       # N, largest magnitude applied
    clamp: float           # N, the effective clamp reported by the driver
    nonfinite: int
    period_us: dict        # between consecutive forces at the motors: p50, p99, max
    errors: dict
    exit_code: int | None
    skipped: str | None = None


def measure_haptics(quick: bool, log: Callable[[str], None]) -> HapticsResult:
    seconds = 10.0 if quick else 60.0
    try:
        lib = emu.build_emulator()
    except emu.EmulatorBuildError as exc:
        return HapticsResult(seconds, {}, [], {}, 0, 0.0, 0.0, 0, {}, {}, None, skipped=str(exc))
    with tempfile.TemporaryDirectory(prefix="suturesim-bench-haptics-") as tmp:
        tmp = Path(tmp)
        cfg = tmp / "server.yaml"
        cfg.write_text(CONFIG)
        stats_file = tmp / "device-stats.json"
        env = emu.emulator_env(lib, emu.write_script(tmp / "script.txt", hand_script(seconds)), tmp / "emu.bin")
        env["SUTURESIM_DEVICE_STATS"] = str(stats_file)
        server = Server(env=env)
        server.cmd += ["--config", str(cfg), "--device", "openhaptics"]
        log(f"haptics: serve --device openhaptics on the emulator for {seconds:g} s ...")
        server.start()
        try:
            if not server.ready.wait(120.0):
                raise RuntimeError(f"the server did not start: {server.tail()}")
            time.sleep(max(0.0, START_S - server.ready_wall_s) + seconds)
        finally:
            server.stop()
        stats = json.loads(stats_file.read_text())["stylus0"] if stats_file.exists() else {}
        clamp_line = next((ln for ln in server.lines if "force clamp" in ln), "")
        clamp = float(clamp_line.split("force clamp ")[1].split(" N")[0]) if clamp_line else float("nan")
        rec = emu.read_log(tmp / "emu.bin")
    f = rec[rec["kind"] == emu.LOG_FORCE]
    vec = np.column_stack([f["a"], f["b"], f["c"]])
    mags = np.linalg.norm(vec, axis=1)
    period = np.diff(f["t_ns"]) / 1000.0
    q = np.percentile
    return HapticsResult(
        seconds=seconds, latency=stats.get("latency_us", {}), latency_hist=stats.get("latency_hist_periods", []),
        callback=stats.get("callback_us", {}), forces=int(f.size),
        max_force=float(np.nanmax(mags)) if mags.size else 0.0, clamp=clamp,
        nonfinite=int((~np.isfinite(vec)).any(axis=1).sum()),
        period_us={"p50": float(q(period, 50)), "p99": float(q(period, 99)), "max": float(period.max())}
        if period.size else {}, errors=stats.get("errors", {}), exit_code=server.exit_code)


def render_haptics(r: HapticsResult) -> list[str]:
    out = ["## 5. Haptic device path (OpenHaptics through the libHD emulator)", ""]
    if r.skipped:
        return out + [f"Skipped: {r.skipped}", ""]
    lat, cb, per = r.latency, r.callback, r.period_us
    late = sum(r.latency_hist[2:])
    late_pct = 100.0 * late / max(1, sum(r.latency_hist))

    def us(d: dict, k: str) -> str:
        return f"{d[k]:.0f}" if k in d else "-"

    out += [f"`suturesim serve --device openhaptics` for {r.seconds:g} s on the emulator, a hand-like stylus path "
            "(slack, pulls to the clamp and back, circles); the server exited with code "
            f"{r.exit_code}.", "",
            "| Measure | count | p50 (µs) | p99 (µs) | max (µs) | target |",
            "|---|---|---|---|---|---|",
            f"| pose-to-force latency (driver) | {lat.get('count', 0)} | {us(lat, 'p50')} | {us(lat, 'p99')} | "
            f"{us(lat, 'max')} | ≤ 2000 |",
            f"| servo callback duration | {cb.get('count', 0)} | {us(cb, 'p50')} | {us(cb, 'p99')} | "
            f"{us(cb, 'max')} | |",
            f"| period between forces at the motors (emulator log) | {r.forces} | {us(per, 'p50')} | "
            f"{us(per, 'p99')} | {us(per, 'max')} | 1000 |", "",
            "Latency histogram (forces by the nearest whole number of servo periods, 0, 1, 2, ..., 9, last bin "
            f"≥ 10; a period is 1 ms): {r.latency_hist}; {late} forces ({late_pct:.2f} %) two periods or more "
            "after their pose.", "",
            f"Forces applied: {r.forces}, largest {r.max_force:.4f} N against a clamp of {r.clamp:g} N (the "
            f"emulator's nominal max continuous force), {r.nonfinite} non-finite; HD errors: "
            f"{r.errors or 'none'}.", "",
            "Latency is the time from the servo callback that read a pose to the first servo callback that reads "
            "a force computed from it: one servo period when the physics tick fits between two callbacks. The "
            f"physics loop phase-locks its ticks to {PHASE_TARGET_NS / 1e6:g} ms after the device's poses "
            "(server/physics.py), so it does while neither process is held up. The first second of forces is "
            "left out (the physics process is still coming up).", ""]
    return out
