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


#: Diary phrases that a reference page, a results page or a card must not use, each with why. A
#: results page keeps its dated runs (a date is a fact), not the writers' diary.
DIARY_PHRASES = {
    "we checked": "a diary of what was done; say what is tested or measured, and how",
    "our reading": "the writers' opinion; state the evidence and what it supports",
    "this session": "the working history; it belongs to CHANGELOG.md",
    "this round": "the project's rounds are history (CHANGELOG.md); say what holds now",
    "last round": "the project's rounds are history (CHANGELOG.md); give the date or the version",
    "we would": "the writers' plans; a page says what exists (plans go to the issue tracker)",
    "we tried": "a diary of attempts; say what was measured, with its command",
    "today": "a relative date goes stale the day after; give the date, or say 'current'",
}
#: The folders (and single files) whose Markdown pages the diary scan covers.
DIARY_SCOPE = ("docs/", "policies/")
DIARY = re.compile(r"\b(" + "|".join(re.escape(p) for p in DIARY_PHRASES) + r")(?:'s)?\b", re.IGNORECASE)


def diary_hits(text: str) -> list[tuple[int, str, str]]:
    """The diary phrases of ``text``: ``(line number, phrase as in DIARY_PHRASES, stripped line)``
    for each line (1-based) that holds one (any case; ``today`` also in ``today's``)."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        for m in DIARY.finditer(line):
            out.append((number, m.group(1).lower(), line.strip()))
    return out


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


def test_diary_scanner_by_hand():
    """Hand-made lines: each phrase in any case, and words that merely contain one are spared."""
    text = "\n".join([
        "We checked that the cache holds.",         # 1
        "Our reading: practice helps.",             # 2
        "The target of this round is not met.",     # 3
        "under today's load",                       # 4
        "measured on 2026-11-26, the current recipe",  # 5: a date is fine
        "the day-to-day todays_value variable",     # 6: not the word 'today'
    ])
    assert [(n, p) for n, p, _ in diary_hits(text)] == [(1, "we checked"), (2, "our reading"), (3, "this round"),
                                                         (4, "today")]
    assert all(reason for reason in DIARY_PHRASES.values())


def test_no_diary_phrases_in_docs_and_cards(tracked_files):
    """Reference pages, results pages and policy cards (every tracked ``.md`` under docs/ and
    policies/, and the untracked new ones beside them) use none of :data:`DIARY_PHRASES`."""
    pages = {rel for rel in tracked_files if rel.endswith(".md") and rel.startswith(DIARY_SCOPE)}
    for folder in DIARY_SCOPE:
        pages |= {str(p.relative_to(ROOT)) for p in (ROOT / folder).rglob("*.md")}
    bad = []
    for rel in sorted(pages):
        text = read_text(ROOT / rel)
        if text is None:
            continue
        bad += [f"{rel}:{n}: '{p}' ({DIARY_PHRASES[p]}): {line[:100]}" for n, p, line in diary_hits(text)]
    assert not bad, f"{len(bad)} diary phrase(s) in docs/ or policies/:\n" + "\n".join(bad)


#: Reference pages that once grew into experiment logs, with the most lines each may have: their
#: measured runs belong on docs/results/ pages (tables with commands, seeds and dates).
REFERENCE_MAX_LINES = {"docs/trial.md": 300, "docs/training.md": 300}


def test_reference_pages_stay_reference_pages():
    """docs/trial.md and docs/training.md stay within their line budget (results go to docs/results/)."""
    long = {rel: n for rel, cap in REFERENCE_MAX_LINES.items()
            if (n := len((ROOT / rel).read_text(encoding="utf-8").splitlines())) > cap}
    assert not long, (f"reference pages over their budget {REFERENCE_MAX_LINES}: {long}; move measured runs to "
                      "docs/results/ and history to CHANGELOG.md")
