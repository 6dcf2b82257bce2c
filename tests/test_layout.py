"""The dependency direction of docs/ARCHITECTURE.md Sec. 5: tools -> server -> (solver, haptics); solver and
haptics never import server or tools, and solver never imports haptics (it knows nothing of devices)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {"solver": ("server", "tools", "haptics"), "haptics": ("server", "tools"), "server": ("tools",)}


def imported_packages(path: Path) -> set[str]:
    """The suturesim sub-packages a module imports (absolute or relative)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level >= 2 and node.module:            # from ..server.x import y
                out.add(node.module.split(".")[0])
            elif node.level == 2 and not node.module:      # from .. import server
                out.update(a.name.split(".")[0] for a in node.names)
            elif node.level == 0 and node.module and node.module.startswith("suturesim."):
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("suturesim."))
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependency_direction(package):
    offenders = []
    for path in sorted((ROOT / package).glob("*.py")):
        bad = imported_packages(path) & set(FORBIDDEN[package])
        if package == "server" and path.name == "cli.py":
            bad -= {"tools"}  # the command table dispatches `validate` and `bench` (server/cli.py docstring)
        if bad:
            offenders.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not offenders, offenders
