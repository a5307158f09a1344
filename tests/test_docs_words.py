"""The repository describes its current state; its history lives in CHANGELOG.md alone.

No tracked file other than ``CHANGELOG.md`` may speak of working sessions (the whole word, any
case, singular or plural) or point at an issue by number ("issue 16", "issues 13-21", "Issue #4").
Code, docs and tests say what is true now and why, not when or in which round it was done.

The scan covers every file ``git ls-files`` lists (text files only: a file with a NUL byte or that
is not UTF-8 is skipped) and reports each hit as ``path:line: text``.
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: Files allowed to use the words, each with why.
EXEMPT_FILES = {
    "CHANGELOG.md": "the history of the project: the one place for rounds and issue numbers",
    "tests/test_docs_words.py": "this file names the words it looks for",
}

#: Text removed before the scan because the word is part of a third-party API, with why.
API_USES = [
    # pytest's fixture scope names: scope="session" is pytest's spelling, not project history.
    re.compile(r"""scope\s*=\s*["']session["']"""),
]

SESSION = re.compile(r"\bsessions?\b", re.IGNORECASE)
ISSUE_NUMBER = re.compile(r"\bissues?\s*#?\s*\d+", re.IGNORECASE)


def hits_in_text(text: str) -> list[tuple[int, str]]:
    """The offending lines of ``text``.

    Args:
        text: a file's contents (str).

    Returns:
        ``(line number, stripped line)`` for every line (1-based) that holds the word "session(s)"
        or "issue(s) <number>" once the :data:`API_USES` spellings are removed.
    """
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        for api in API_USES:
            line = api.sub("", line)
        if SESSION.search(line) or ISSUE_NUMBER.search(line):
            out.append((number, line.strip()))
    return out


def read_text(path: pathlib.Path) -> str | None:
    """The UTF-8 text of ``path``, or None for a binary file, a non-UTF-8 file or one that is gone
    from the working tree (deleted but still in the index)."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_scanner_finds_the_words_and_spares_api_names():
    """Hand-made lines: what must be caught and what must not."""
    text = "\n".join([
        "Measured in session 5.",               # 1: the word
        "the Sessions of the project",          # 2: plural, any case
        "docs (issue 21): compact packs",        # 3: issue number
        "see Issue #4 and issues 13-21",         # 4: '#' and plural
        '@pytest.fixture(scope="session")',      # 5: pytest's API: allowed
        "a sessionless loop, an issue with it",  # 6: neither whole word nor a number
        "tissue 12 and reissue 3",               # 7: not the word 'issue'
    ])
    assert [n for n, _ in hits_in_text(text)] == [1, 2, 3, 4]


def test_no_history_words_outside_the_changelog(tracked_files):
    """Every tracked text file but the exempt ones is free of "session(s)" and "issue N"."""
    bad = []
    for rel in tracked_files:
        if rel in EXEMPT_FILES:
            continue
        text = read_text(ROOT / rel)
        if text is None:
            continue
        lines = [f"{rel}:{n}: {line[:120]}" for n, line in hits_in_text(text)]
        bad.extend(lines)
    assert not bad, (
        f"{len(bad)} line(s) speak of sessions or issue numbers; history goes to CHANGELOG.md, "
        "code and docs describe the current state:\n" + "\n".join(bad))
