"""Docs, code, configs and tests state facts, invariants and reasons; the history of how they came about belongs
in git log. No tracked text file names a work session ("session 31", "stop 31", "an earlier session") or credits a
result to a script outside the repository ("a /tmp script", "/tmp/rt/x.py"): a figure worth keeping names the
command in the repository that reproduces it (a `suturesim bench` or `suturesim validate` case, or a test).

The patterns leave the other senses of the word alone: a haptic or recording session, a trainee's session,
`start_new_session`, a session of `serve`."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".txt", ".toml", ".cfg", ".sh"}

PATTERNS = [
    re.compile(r"\bsessions? \d+", re.I),                       # session 31, sessions 26-27
    re.compile(r"\bsessions? \d+'s\b|\bsession \d+\b", re.I),
    re.compile(r"\bCI stops? \d+\b|\bstops? \d+'s\b", re.I),    # "stop 31" as a work-session label
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
    history = ["(session 17 measured, for a 200-segment knot)", "since session 24's scaled drag",
               "sessions 26-27", "Session 30, the scripted scene", "read in an earlier session",
               "a later session", "in this session", "the session before", "CI stop 31", "stop 31's note",
               "(a `/tmp` script, 32 000 ticks)", "credited to a /tmp script", "(`/tmp/rt/full2.py`)",
               "measured with /tmp scripts doing the same"]
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
