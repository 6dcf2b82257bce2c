"""Docs, code, configs and tests state facts, invariants and reasons; the history of how they came about belongs
in git log. No tracked text file names a work session by its number or as an earlier or later one, or credits a
result to a script outside the repository (one under the temporary directory): a figure worth keeping names the
command in the repository that reproduces it (a `suturesim bench` or `suturesim validate` case, or a test). The
examples below are put together from parts, so that this file does not itself hold what it looks for.

The patterns leave the other senses of the word alone: a haptic or recording session, a trainee's session,
`start_new_session`, a session of `serve`."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".txt", ".toml", ".cfg", ".sh"}

PATTERNS = [
    re.compile(r"\bsessions? \d+", re.I),                       # a session's number, or a range of them
    re.compile(r"\bsessions? \d+'s\b|\bsession \d+\b", re.I),
    re.compile(r"\bCI stops? \d+\b|\bstops? \d+'s\b", re.I),    # a CI stop's number as a work-session label
    re.compile(r"\b(?:earlier|previous|later|next|this|last) (?:work )?session\b(?! of)", re.I),
    re.compile(r"\bthe session before\b", re.I),
    re.compile(r"\b(?:a|the) `?/tmp`? (?:script|build|worktree|rerun)s?\b", re.I),
    re.compile(r"`/tmp` (?:script|build|worktree|rerun)s?", re.I),
    re.compile(r"/tmp/[\w./-]*\.py\b"),
    re.compile(r"/tmp scripts?\b", re.I),
]


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = []
    for name in out.decode().split("\0"):
        if not name:
            continue
        path = ROOT / name
        if (path.suffix in SUFFIXES or path.name == "Dockerfile") and path.is_file():
            files.append(path)
    return files


def hits() -> list[str]:
    me = Path(__file__).resolve()
    found = []
    for path in tracked_text_files():
        if path.resolve() == me:
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue                        # binary
        for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if any(p.search(line) for p in PATTERNS):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:160]}")
    return found


def test_the_patterns_catch_work_session_references_and_not_other_sessions():
    w, s, t = "ses" + "sion", "st" + "op", "/t" + "mp"   # a work session, a CI stop, the temporary directory
    history = [f"({w} 17 measured, for a 200-segment knot)", f"since {w} 24's scaled drag",
               f"{w}s 26-27", f"{w.title()} 30, the scripted scene", f"read in an earlier {w}",
               f"a later {w}", f"in this {w}", f"the {w} before", f"CI {s} 31", f"{s} 31's note",
               f"(a `{t}` script, 32 000 ticks)", f"credited to a {t} script", f"(`{t}/rt/full2.py`)",
               f"measured with {t} scripts doing the same"]
    other = ["a haptic session", "a recording session", "a trainee's session", "start_new_session=True",
             "a 30 s session of serve", "the serve test asserts the whole session", "ipc:///tmp/suturesim.sock",
             "a short session's forces", "the thread comes to a stop 1 mm short", "tmp_path / 'session.mcap'"]
    for text in history:
        assert any(p.search(text) for p in PATTERNS), text
    for text in other:
        assert not any(p.search(text) for p in PATTERNS), text


def test_no_work_session_or_tmp_script_reference_in_the_tree():
    found = hits()
    assert not found, "work-session or /tmp-script references:\n" + "\n".join(found)
