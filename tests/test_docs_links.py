"""The docs point only at things that exist.

* The design of gpusim is ``docs/design.md``. No file tracked by git mentions an outside design
  brief called ``DESIGN.md`` (a file users never see), except ``CHANGELOG.md``, the one place for
  history. Checked on the bytes of every tracked file, so code, tests and docs are all covered.
* In ``README.md`` and ``docs/*.md``: every relative Markdown link to a ``.md`` page resolves to a
  file (relative to the page that holds it), every ``#anchor`` on such a link names a heading of
  the target page (GitHub's heading slugs), and every plain mention of a ``docs/<page>.md`` path
  names an existing page.
"""

from __future__ import annotations

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
#: The outside brief's file name, which no tracked file may mention.
OUTSIDE_BRIEF = b"DESIGN.md"
#: Tracked files allowed to mention it: the history, and this test.
ALLOWED = {"CHANGELOG.md", "tests/test_docs_links.py"}

#: ``[text](target)`` links (images too); the target up to the closing parenthesis or a space.
LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
#: Plain mentions of a docs page by its path from the repository root.
DOCS_PATH = re.compile(r"(?<![\w./-])docs/([\w.-]+\.md)\b")
FENCE = re.compile(r"^\s*(```|~~~)")


def doc_pages() -> list[pathlib.Path]:
    """README.md and every docs/*.md page."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: inline code marks and link syntax dropped, lower case,
    punctuation other than ``-`` and ``_`` removed, spaces turned into ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
    """The heading anchors of ``page`` (duplicates get GitHub's ``-1``, ``-2`` ... suffixes);
    headings inside code fences do not count."""
    seen: dict[str, int] = {}
    out = set()
    in_fence = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        m = None if in_fence else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: pathlib.Path) -> list[str]:
    """``"<page>: <target>: <why>"`` for each link or docs path of ``page`` that points nowhere."""
    text = page.read_text(encoding="utf-8")
    name = page.relative_to(REPO).as_posix()
    bad = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s), mailto, ... and anchors within the page
        path, _, anchor = target.partition("#")
        if not path.endswith(".md"):
            continue
        dest = (page.parent / path).resolve()
        if not dest.is_file():
            bad.append(f"{name}: {target}: no such file")
        elif anchor and anchor.lower() not in anchors(dest):
            bad.append(f"{name}: {target}: no heading with that anchor in {dest.relative_to(REPO).as_posix()}")
    for page_name in DOCS_PATH.findall(text):
        if not (REPO / "docs" / page_name).is_file():
            bad.append(f"{name}: docs/{page_name}: no such page")
    return bad


def test_no_tracked_file_mentions_the_outside_design_brief(tracked_files):
    offenders = []
    for rel in tracked_files:
        if rel in ALLOWED:
            continue
        path = REPO / rel
        if not path.is_file():  # deleted in the working tree, not yet committed
            continue
        data = path.read_bytes()
        if OUTSIDE_BRIEF in data:
            lines = [i + 1 for i, line in enumerate(data.split(b"\n")) if OUTSIDE_BRIEF in line]
            offenders.append(f"{rel}: lines {lines}")
    assert not offenders, ("these files mention DESIGN.md, which is not in the repository; cite "
                           "docs/design.md and its section instead:\n" + "\n".join(offenders))


def test_doc_links_point_to_existing_pages_and_headings():
    bad = [b for page in doc_pages() for b in broken_links(page)]
    assert not bad, "broken links in the docs:\n" + "\n".join(bad)


def test_design_page_is_linked_from_the_architecture_page():
    assert "(design.md)" in (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")


def test_checks_catch_what_they_should(tmp_path):
    """The helpers flag a missing page, a missing anchor and a missing docs path, and accept good
    ones (a page of its own in a temporary folder)."""
    (tmp_path / "docs").mkdir()
    other = tmp_path / "docs" / "other.md"
    other.write_text("# Other page\n\n## Co-players (population play)\n\n```\n# not a heading\n```\n"
                     "## Co-players (population play)\n", encoding="utf-8")
    assert anchors(other) == {"other-page", "co-players-population-play", "co-players-population-play-1"}
    assert slug("`EnvState` and [the step](design.md)") == "envstate-and-the-step"
    page = tmp_path / "docs" / "page.md"
    page.write_text("[ok](other.md#co-players-population-play) [web](https://example.org/x.md) "
                    "[gone](missing.md) [bad anchor](other.md#nowhere) see docs/also_missing.md\n",
                    encoding="utf-8")
    global REPO
    saved, REPO = REPO, tmp_path
    try:
        bad = broken_links(page)
    finally:
        REPO = saved
    assert len(bad) == 3, bad
    assert "missing.md: no such file" in bad[0]
    assert "other.md#nowhere: no heading" in bad[1]
    assert "docs/also_missing.md: no such page" in bad[2]
