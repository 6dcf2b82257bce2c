"""Force-safety pipeline (haptics/safety.py): each stage, their order, flags, reset, robustness, cost."""

import math
import time

import numpy as np
import pytest

from suturesim.haptics.safety import ForceSafety, SafetyConfig
from suturesim.server.protocol import FLAG_CLAMPED, FLAG_FAULT, FLAG_SLEWED, FLAG_WATCHDOG

DT = 0.001
# A configuration where every stage is effectively transparent, to test one stage at a time.
OPEN = dict(scale=1.0, max_force_n=1e6, max_slew_n_per_s=1e12, lowpass_hz=0.0, watchdog_s=1.0, ramp_down_s=0.05)


def make(device_max=None, **kw):
    cfg = dict(OPEN)
    cfg.update(kw)
    return ForceSafety(SafetyConfig(**cfg), device_max)


def run(fs, f, n=1, t0=0.0, dt=DT, fresh=True):
    """n steps with force f; returns (outputs (n,3), flags list). Force timestamp = now unless fresh=False."""
    out = np.zeros(3)
    outs, flags = [], []
    for i in range(n):
        now = t0 + (i + 1) * dt
        flags.append(fs.step(f, now if fresh else t0, now, dt, out))
        outs.append(out.copy())
    return np.array(outs), flags


# ------------------------------------------------------------------------------------------------- stages

def test_nan_guard_treats_input_as_zero_and_flags_fault():
    fs = make()
    out, fl = run(fs, [1.0, 2.0, 3.0])
    np.testing.assert_allclose(out[-1], [1, 2, 3])
    for bad in ([np.nan, 0, 0], [0, np.inf, 0], [0, 0, -np.inf]):
        out, fl = run(fs, bad)
        assert np.all(out[-1] == 0.0)
        assert fl[-1] == FLAG_FAULT


def test_scale():
    fs = make(scale=0.25)
    out, fl = run(fs, [4.0, -8.0, 2.0])
    np.testing.assert_allclose(out[-1], [1.0, -2.0, 0.5], rtol=0, atol=1e-15)
    assert fl[-1] == 0


def test_clamp_keeps_direction():
    fs = make(max_force_n=3.0)
    f = np.array([10.0, -20.0, 5.0])
    out, fl = run(fs, f)
    assert fl[-1] == FLAG_CLAMPED
    assert np.linalg.norm(out[-1]) == pytest.approx(3.0, abs=1e-12)
    np.testing.assert_allclose(out[-1] / np.linalg.norm(out[-1]), f / np.linalg.norm(f), atol=1e-15)


def test_clamp_applies_after_scale():
    fs = make(scale=0.1, max_force_n=3.0)
    out, fl = run(fs, [20.0, 0, 0])          # 2 N after scaling: not clamped
    assert fl[-1] == 0 and out[-1][0] == pytest.approx(2.0)


def test_clamp_uses_smaller_of_config_and_device_limits():
    f = [100.0, 0.0, 0.0]
    assert run(make(max_force_n=3.0, device_max=2.0), f)[0][-1][0] == pytest.approx(2.0)
    assert run(make(max_force_n=1.5, device_max=2.0), f)[0][-1][0] == pytest.approx(1.5)
    assert run(make(max_force_n=3.0, device_max=None), f)[0][-1][0] == pytest.approx(3.0)
    assert make(max_force_n=3.0, device_max=2.0).max_force_n == 2.0


def test_clamp_of_huge_finite_input_does_not_overflow():
    fs = make(max_force_n=3.0, scale=10.0)
    out, fl = run(fs, [1e308, -1e308, 1e308])
    assert fl[-1] == FLAG_CLAMPED
    np.testing.assert_allclose(out[-1], np.array([1, -1, 1]) * 3.0 / math.sqrt(3.0), atol=1e-12)


def test_slew_limit_bounds_per_step_change_exactly():
    slew = 500.0
    fs = make(max_slew_n_per_s=slew)
    target = np.array([1.0, -2.0, 0.5])
    out, fl = run(fs, target, n=50)
    steps = np.diff(np.vstack([np.zeros(3), out]), axis=0)
    mags = np.linalg.norm(steps, axis=1)
    assert np.all(mags <= slew * DT * (1 + 1e-12))
    n_lim = int(np.linalg.norm(target) // (slew * DT))
    np.testing.assert_allclose(mags[:n_lim], slew * DT, rtol=1e-12)
    assert all(f == FLAG_SLEWED for f in fl[:n_lim])
    np.testing.assert_allclose(out[-1], target, atol=1e-15)
    assert fl[-1] == 0
    # the change keeps the direction of the target
    np.testing.assert_allclose(out[0] / np.linalg.norm(out[0]), target / np.linalg.norm(target), atol=1e-12)


def test_lowpass_step_response_is_exact():
    fc = 200.0
    fs = make(lowpass_hz=fc)
    n = 40
    out, fl = run(fs, [1.0, 0.0, -2.0], n=n)
    t = DT * np.arange(1, n + 1)
    expect = 1.0 - np.exp(-2 * np.pi * fc * t)
    np.testing.assert_allclose(out[:, 0], expect, rtol=0, atol=1e-9)
    np.testing.assert_allclose(out[:, 2], -2.0 * expect, rtol=0, atol=1e-9)
    assert all(f == 0 for f in fl)


def test_lowpass_off_when_zero():
    fs = make(lowpass_hz=0.0)
    out, _ = run(fs, [1.0, 0, 0])
    assert out[-1][0] == 1.0


def test_watchdog_ramps_to_exactly_zero_and_stays_then_resumes_through_slew():
    ramp, wd, slew = 0.05, 0.005, 500.0
    fs = make(watchdog_s=wd, ramp_down_s=ramp, max_slew_n_per_s=slew)
    f = np.array([2.0, 0.0, 0.0])
    out = np.zeros(3)
    t = 0.0
    for _ in range(20):                                   # settle at f with fresh forces
        t += DT
        assert fs.step(f, t, t, DT, out) in (0, FLAG_SLEWED)
    np.testing.assert_allclose(out, f)
    t_last = t
    # still fresh while age <= watchdog_s
    while t + DT - t_last <= wd - 1e-12:
        t += DT
        assert fs.step(f, t_last, t, DT, out) == 0
    # stale: linear ramp from 2 N to zero over ramp_down_s
    mags = []
    for _ in range(int(round(ramp / DT)) + 20):
        t += DT
        fl = fs.step(f, t_last, t, DT, out)
        assert fl & FLAG_WATCHDOG
        mags.append(out[0])
    mags = np.array(mags)
    n_ramp = int(round(ramp / DT))
    np.testing.assert_allclose(mags[:n_ramp], 2.0 * (1 - np.arange(1, n_ramp + 1) / n_ramp), atol=1e-12)
    assert np.all(mags[n_ramp - 1:] == 0.0)               # exactly zero within ramp_down_s, and stays there
    assert np.all(np.diff(mags) <= 0)
    # fresh forces again: resume from zero through the slew limit
    prev = out.copy()
    for i in range(10):
        t += DT
        fl = fs.step(f, t, t, DT, out)
        assert not fl & FLAG_WATCHDOG
        assert np.linalg.norm(out - prev) <= slew * DT * (1 + 1e-12)
        prev = out.copy()
    assert out[0] == pytest.approx(min(2.0, 10 * slew * DT))


def test_watchdog_resume_mid_ramp_is_continuous():
    fs = make(watchdog_s=0.005, ramp_down_s=0.05, max_slew_n_per_s=500.0)
    out = np.zeros(3)
    f = [2.0, 0, 0]
    t = 0.0
    for _ in range(10):
        t += DT
        fs.step(f, t, t, DT, out)
    for _ in range(15):                                    # stale for a while: partial ramp
        t += DT
        fs.step(f, 0.0, t, DT, out)
    mid = out[0]
    assert 0.0 < mid < 2.0
    t += DT
    fs.step([-3.0, 0, 0], t, t, DT, out)                   # opposite direction: one slew step from mid
    assert out[0] == pytest.approx(mid - 500.0 * DT)


def test_watchdog_zero_ramp_drops_at_once():
    fs = make(watchdog_s=0.005, ramp_down_s=0.0)
    run(fs, [1.0, 0, 0], n=3)
    out = np.zeros(3)
    fl = fs.step([1.0, 0, 0], 0.0, 1.0, DT, out)
    assert np.all(out == 0.0) and fl == FLAG_WATCHDOG


def test_non_finite_timestamps_are_stale_and_fault():
    fs = make()
    run(fs, [1.0, 0, 0])
    out = np.zeros(3)
    fl = fs.step([1.0, 0, 0], math.nan, 1.0, DT, out)
    assert fl & FLAG_WATCHDOG and fl & FLAG_FAULT


# ---------------------------------------------------------------------------------------------- ordering

def test_huge_step_is_clamped_then_slew_limited():
    slew = 500.0
    fs = make(max_force_n=3.0, max_slew_n_per_s=slew)
    out, fl = run(fs, [1e9, 1e9, 0.0])
    assert fl[-1] == FLAG_CLAMPED | FLAG_SLEWED
    assert np.linalg.norm(out[-1]) == pytest.approx(slew * DT, rel=1e-12)
    out, fl = run(fs, [1e9, 1e9, 0.0], n=20)
    assert np.linalg.norm(out[-1]) == pytest.approx(3.0, rel=1e-12)    # reaches the clamp, never beyond


def test_defaults_full_pipeline_bounded():
    fs = ForceSafety(SafetyConfig(), device_max_force_n=3.3)
    out, fl = run(fs, [100.0, 0, 0], n=200)
    assert np.all(np.linalg.norm(out, axis=1) <= 3.0 + 1e-12)
    assert np.all(np.linalg.norm(np.diff(out, axis=0), axis=1) <= 500.0 * DT * (1 + 1e-12))


# -------------------------------------------------------------------------------------- reset, bad dt

def test_zero_on_start_and_reset():
    fs = make(max_slew_n_per_s=500.0)
    assert fs.last_output == (0.0, 0.0, 0.0) and fs.last_flags == 0
    run(fs, [2.0, 0, 0], n=10)
    assert fs.last_output[0] > 0
    fs.reset()
    assert fs.last_output == (0.0, 0.0, 0.0) and fs.last_flags == 0
    out, _ = run(fs, [2.0, 0, 0])                          # slews up from zero again
    assert out[-1][0] == pytest.approx(500.0 * DT)


@pytest.mark.parametrize("dt", [0.0, -1e-3, math.nan, math.inf, -math.inf, None, "x"])
def test_bad_dt_zeroes_and_faults(dt):
    fs = make()
    run(fs, [1.0, 1.0, 1.0], n=3)
    out = np.full(3, 7.0)
    assert fs.step([1.0, 1.0, 1.0], 0.0, 0.0, dt, out) == FLAG_FAULT
    assert np.all(out == 0.0) and fs.last_flags == FLAG_FAULT


@pytest.mark.parametrize("bad", [None, [1.0], "abc", [1.0, "x", 2.0], object()])
def test_malformed_input_never_raises(bad):
    fs = make()
    out = np.full(3, 7.0)
    fl = fs.step(bad, 0.0, 0.0, DT, out)
    assert fl & FLAG_FAULT and np.all(out == 0.0)


def test_broken_out_never_raises():
    fs = make()
    assert fs.step([1.0, 0, 0], 0.0, 0.0, DT, np.zeros(2)) == FLAG_FAULT
    assert fs.step([1.0, 0, 0], 0.0, 0.0, DT, None) == FLAG_FAULT


# --------------------------------------------------------------------------------------------- property

def test_never_non_finite_under_random_inputs():
    rng = np.random.default_rng(12345)
    cfg = SafetyConfig()
    fs = ForceSafety(cfg, device_max_force_n=2.5)
    out = np.zeros(3)
    specials = np.array([np.nan, np.inf, -np.inf, 1e308, -1e308, 1e-308, 0.0, 5e-324])
    n = 100_000
    mags = 10.0 ** rng.uniform(-6, 300, size=(n, 3))
    forces = mags * rng.choice([-1.0, 1.0], size=(n, 3))
    mask = rng.random((n, 3)) < 0.05
    forces[mask] = rng.choice(specials, size=mask.sum())
    dts = rng.choice([DT, 0.0, -DT, np.nan, np.inf, 1e-9, 0.5, 1e300], size=n, p=[.9, .02, .01, .01, .01, .02, .02, .01])
    ages = rng.choice([0.0, 0.003, 0.01, 1.0, np.nan], size=n, p=[.7, .1, .1, .05, .05])
    prev = np.zeros(3)
    now = 0.0
    for i in range(n):
        now += DT
        fl = fs.step(forces[i], now - ages[i], now, dts[i], out)
        assert np.isfinite(out).all(), (i, forces[i], dts[i], out)
        assert 0 <= fl <= 15
        assert np.linalg.norm(out) <= 2.5 * (1 + 1e-12)
        if fl == 0 or fl == FLAG_CLAMPED:                  # a clean step honours the slew limit
            assert np.linalg.norm(out - prev) <= 500.0 * dts[i] * (1 + 1e-9) + 1e-15
        prev[:] = out


# ---------------------------------------------------------------------------------------------- config

@pytest.mark.parametrize("field,value", [
    ("scale", math.nan), ("scale", -1.0), ("max_force_n", 0.0), ("max_force_n", math.inf),
    ("max_slew_n_per_s", -5.0), ("max_slew_n_per_s", math.nan), ("lowpass_hz", -1.0),
    ("lowpass_hz", math.inf), ("watchdog_s", 0.0), ("watchdog_s", math.nan), ("ramp_down_s", -0.1),
    ("ramp_down_s", math.inf), ("scale", "1.0"), ("max_force_n", None), ("lowpass_hz", True),
])
def test_config_validation_names_the_field(field, value):
    cfg = SafetyConfig(**{field: value})
    with pytest.raises(ValueError, match=field):
        cfg.validated()
    with pytest.raises(ValueError, match=field):
        ForceSafety(cfg)


def test_config_defaults_valid_and_device_limit_checked():
    assert SafetyConfig().validated() == SafetyConfig()
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="device_max_force_n"):
            ForceSafety(SafetyConfig(), bad)


# ------------------------------------------------------------------------------------------------- cost

@pytest.mark.timed   # a call's wall time
def test_per_call_cost():
    fs = ForceSafety(SafetyConfig(), device_max_force_n=3.3)
    out = np.zeros(3)
    f = np.array([1.0, -2.0, 0.5])
    n = 20_000
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        now = 0.0
        for _ in range(n):
            now += DT
            fs.step(f, now, now, DT, out)
        best = min(best, (time.perf_counter() - t0) / n)
    print(f"ForceSafety.step: {best * 1e6:.2f} us/call")
    assert best < 50e-6
