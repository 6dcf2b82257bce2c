"""The dependency direction of docs/ARCHITECTURE.md Sec. 5: tools -> server -> (solver, haptics); solver and
haptics never import server or tools, and solver never imports haptics (it knows nothing of devices). And the
length of a function: a newcomer reads one at a time."""
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


MAX_FUNCTION_LINES = 120
PACKAGES = ("solver", "haptics", "server", "tools", "configs")


def long_functions(path: Path, root: Path = ROOT) -> list[str]:
    """The functions of a module longer than MAX_FUNCTION_LINES (def to last line) without a comment line in
    them starting ``# long:`` that says why, named by path relative to ``root`` and line."""
    lines = path.read_text().splitlines()
    out = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            size = node.end_lineno - node.lineno + 1
            body = lines[node.lineno - 1:node.end_lineno]
            if size > MAX_FUNCTION_LINES and not any(ln.strip().startswith("# long:") for ln in body):
                out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({size} lines)")
    return out


def test_the_length_check_sees_a_long_function_and_its_reason(tmp_path):
    path = tmp_path / "probe.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    path.write_text(f"def f():\n{body}\n")
    assert long_functions(path, tmp_path) == [f"probe.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"]
    path.write_text(f"def f():\n    # long: a table\n{body}\n")
    assert long_functions(path, tmp_path) == []


def test_no_function_is_longer_than_its_limit_unless_it_says_why():
    offenders = [f for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
                 for f in long_functions(path)]
    assert not offenders, offenders
