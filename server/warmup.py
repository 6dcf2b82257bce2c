"""The numba kernels compiled before the first tick, and said so.

numba compiles a kernel at its first call and caches the machine code (`cache=True`) in a ``__pycache__`` beside
the source, keyed by a hash of the source file, the numba version and the CPU. Two things follow:

- `pip install .` compiles every kernel the shipped scenes reach while it builds the package (setup.py runs
  :func:`compile_shipped_scenes` on the built copy), so the cache is installed with the code and a fresh
  install's first tick loads it in about a second instead of compiling for a minute.
- Whatever still has to be compiled (a different numba, a changed CPU, an editable install) is compiled in the
  physics process's warm-up before the first tick; :class:`CompileProgress` says so on the console while it
  lasts, with a count and the seconds spent, so that a first start is never a silent minute.

Run as ``python -m suturesim.server.warmup`` it compiles (or loads) every shipped scene's kernels and prints
what it did; CI runs it with ``--expect-cached`` after the install, which fails if the install's cache missed a
kernel.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Callable

from numba.core import event as numba_event

__all__ = ["CompileProgress", "compile_shipped_scenes"]


class CompileProgress(numba_event.Listener):
    """A context manager that counts numba compilations (cache misses only: loading a cached kernel is no
    compilation) and, once the first one starts, prints a line through ``say`` then one every ``every_s`` seconds
    until the context exits, and a summary then."""

    def __init__(self, say: Callable[[str], None], what: str = "suturesim", every_s: float = 5.0):
        super().__init__()
        self.say = say
        self.what = what
        self.every_s = every_s
        self.compiled = 0          # kernels whose compilation finished (nested ones included)
        self.started_at: float | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._install = None

    def on_start(self, event) -> None:
        if self.started_at is None:
            self.started_at = time.monotonic()
            self.say(f"{self.what}: compiling numba kernels (once after an install or upgrade of suturesim or "
                     "numba; later starts load them from the cache)")
            self._thread = threading.Thread(target=self._report, name="compile-progress", daemon=True)
            self._thread.start()

    def on_end(self, event) -> None:
        self.compiled += 1

    def _report(self) -> None:
        while not self._done.wait(self.every_s):
            self.say(f"{self.what}: compiling numba kernels: {self.compiled} done, "
                     f"{time.monotonic() - self.started_at:.0f} s")

    def __enter__(self) -> "CompileProgress":
        self._install = numba_event.install_listener("numba:compile", self)
        self._install.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._install.__exit__(*exc)
        self._done.set()
        if self._thread is not None:
            self._thread.join()
            self.say(f"{self.what}: compiled {self.compiled} numba kernels in "
                     f"{time.monotonic() - self.started_at:.1f} s")


def compile_shipped_scenes(say: Callable[[str], None] = print) -> int:
    """Build each shipped scene as `suturesim serve` does (without sockets) and run the physics process's warm-up
    on it: every kernel a tick of any shipped scene can reach is compiled into the cache, or loaded from it.
    Returns the number of kernels compiled."""
    from ..solver import contact, knot_type
    from ..solver.scenario import load_scenario, scenario_names
    from .config import ServerConfig
    from .physics import PhysicsLoop

    with CompileProgress(say, "suturesim install") as progress:
        contact.warm_up()
        knot_type.warm_up()
        for name in scenario_names():
            cfg = ServerConfig(file="<warm-up>", scenario=load_scenario(name))
            PhysicsLoop(cfg, sink=lambda topic, payload: None).warm_up()
    return progress.compiled


def main(argv: list[str] | None = None) -> int:
    """``python -m suturesim.server.warmup [--expect-cached]``: compile (or load) every shipped scene's kernels;
    with --expect-cached, exit 1 if any had to be compiled (the install's cache missed one)."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m suturesim.server.warmup", description=main.__doc__)
    ap.add_argument("--expect-cached", action="store_true",
                    help="exit 1 if a kernel had to be compiled rather than loaded from the cache")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    n = compile_shipped_scenes(lambda line: print(line, flush=True))
    print(f"suturesim: every shipped scene's kernels ready ({n} compiled) in {time.monotonic() - t0:.1f} s",
          flush=True)
    return 1 if args.expect_cached and n else 0


if __name__ == "__main__":
    sys.exit(main())
