"""server/warmup.py: a compile is said while it lasts, a cache load is not; and the install's compile leaves
every shipped scene's kernels in the cache."""
from __future__ import annotations

import time

from numba import njit

from suturesim.server.warmup import CompileProgress


def test_a_compile_is_said_with_a_count_and_a_cached_call_is_not():
    lines: list[str] = []

    @njit   # no cache: a compile every time this test runs
    def slow_to_compile(a):
        s = 0.0
        for i in range(a.shape[0]):
            s += a[i] * a[i]
        return s

    import numpy as np
    with CompileProgress(lines.append, "test", every_s=0.01) as progress:
        slow_to_compile(np.ones(3))
        time.sleep(0.05)
    assert progress.compiled >= 1
    assert lines[0].startswith("test: compiling numba kernels")
    assert lines[-1].startswith(f"test: compiled {progress.compiled} numba kernels in ")
    assert any(": compiling numba kernels: " in line and " done, " in line for line in lines[1:-1])

    quiet: list[str] = []
    with CompileProgress(quiet.append, "test") as again:
        slow_to_compile(np.ones(4))                # the same signature: compiled already
    assert again.compiled == 0 and quiet == []
