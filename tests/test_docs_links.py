"""The repository documents itself: every relative link in README.md and docs/*.md leads to a file inside the
repository, and no tracked file points outside it to the first architecture draft (OUTSIDE below names what
is looked for); docs/ARCHITECTURE.md is the architecture."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) and ![alt](target), the target up to the first space or closing parenthesis; [text]: target
INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
OUTSIDE = ("DESIGN.md", "../shared")


def links(text: str) -> list[str]:
    """The link targets of a Markdown text, code blocks and code spans left out."""
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    return INLINE.findall(text) + REFERENCE.findall(text)


def is_relative(target: str) -> bool:
    return not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) and not target.startswith(("#", "//"))


def test_the_architecture_is_documented_in_the_repository():
    assert (ROOT / "docs" / "ARCHITECTURE.md").is_file()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_to_files_in_the_repository(doc):
    bad = []
    for target in links(doc.read_text(encoding="utf-8")):
        if not is_relative(target):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        if not path:
            continue
        resolved = (doc.parent / path).resolve()
        if not resolved.is_relative_to(ROOT):
            bad.append(f"{target}: outside the repository")
        elif not resolved.exists():
            bad.append(f"{target}: no such file")
    assert not bad, f"{doc.relative_to(ROOT)}: {bad}"


def test_the_link_finder_finds_links():
    text = "See [a](docs/A.md#x), ![p](docs/p.png \"title\") and `[not](a-link)`.\n\n[ref]: ../other/B.md\n"
    assert links(text) == ["docs/A.md#x", "docs/p.png", "../other/B.md"]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_no_tracked_file_points_outside_the_repository():
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    offenders = []
    for name in files.decode().split("\0"):
        if not name or name == "tests/test_docs_links.py":   # this file names what it looks for
            continue
        path = ROOT / name
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:   # a binary file (an image)
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if any(word in line for word in OUTSIDE):
                offenders.append(f"{name}:{n}: {line.strip()[:100]}")
    assert not offenders, offenders
