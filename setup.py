"""The package's build, as pyproject.toml declares it, with one step added: once the sources are copied into the
build directory, every numba kernel the shipped scenes reach is compiled there (server/warmup.py), so the
machine code is installed beside the code and the first `suturesim serve` after `pip install .` loads it
instead of compiling for a minute. The cache is keyed by the source's hash, the numba version and the CPU:
installed on another machine or beside another numba, it is ignored and the kernels compile at the first start
(which says so). SUTURESIM_NO_PRECOMPILE=1 in the environment skips the step (a wheel built for other
machines)."""
import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyCompiled(build_py):
    def run(self) -> None:
        super().run()
        if os.environ.get("SUTURESIM_NO_PRECOMPILE"):
            return
        # before, not instead of, what is there: pip's isolated build environment is found through PYTHONPATH
        path = [os.path.abspath(self.build_lib), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
        env.pop("NUMBA_CACHE_DIR", None)      # into the built package's own __pycache__, nowhere else
        env.pop("NUMBA_DISABLE_JIT", None)
        done = subprocess.run([sys.executable, "-m", "suturesim.server.warmup"], env=env, cwd=self.build_lib)
        if done.returncode != 0:
            print("suturesim: compiling the numba kernels at install failed; they compile at the first start",
                  file=sys.stderr)


setup(cmdclass={"build_py": BuildPyCompiled})
