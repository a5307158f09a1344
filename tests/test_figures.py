"""The figures that several files quote agree: ``docs/figures.json`` names each figure, its exact
text and the files that quote it (README, cards, docs); a file that no longer holds the text fails.

Change a figure in every file that quotes it, then its entry; no file is generated from the list
(the README is written by hand)."""

from __future__ import annotations

import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures.json"


def load_figures(path: pathlib.Path) -> dict:
    """``{name: {"text": str, "files": [str, ...]}}`` of a figures file (keys starting with ``_``
    are comments and left out).

    Raises:
        ValueError: an entry without a non-empty ``text`` string or a non-empty ``files`` list of
            strings (named).
    """
    raw = json.loads(path.read_text(encoding="utf-8"))
    out = {}
    for name, entry in raw.items():
        if name.startswith("_"):
            continue
        text, files = (entry or {}).get("text"), (entry or {}).get("files")
        if not (isinstance(text, str) and text.strip()):
            raise ValueError(f"{path.name}: {name}: 'text' must be a non-empty string")
        if not (isinstance(files, list) and files and all(isinstance(f, str) and f for f in files)):
            raise ValueError(f"{path.name}: {name}: 'files' must be a non-empty list of paths")
        out[name] = {"text": text, "files": files}
    return out


def disagreements(figures: dict, root: pathlib.Path) -> list[str]:
    """One line per (figure, file) where the file is missing or does not contain the figure's
    exact text: ``"NAME: FILE does not contain 'TEXT'"`` (or ``"... is missing"``)."""
    out = []
    for name, entry in figures.items():
        for rel in entry["files"]:
            path = root / rel
            if not path.is_file():
                out.append(f"{name}: {rel} is missing")
            elif entry["text"] not in path.read_text(encoding="utf-8"):
                out.append(f"{name}: {rel} does not contain {entry['text']!r}")
    return out


def test_checker_by_hand(tmp_path):
    """A figure quoted by two files: both hold it (no line), one changed (one line), one gone."""
    (tmp_path / "a.md").write_text("goal 0.695 [0.627, 0.764] on 50 scenes")
    (tmp_path / "b.md").write_text("| driver | 0.695 [0.627, 0.764] |")
    spec = tmp_path / "figures.json"
    spec.write_text(json.dumps({"_about": "x", "goal": {"text": "0.695 [0.627, 0.764]", "files": ["a.md", "b.md"]}}))
    figures = load_figures(spec)
    assert list(figures) == ["goal"] and disagreements(figures, tmp_path) == []
    (tmp_path / "b.md").write_text("| driver | 0.693 [0.627, 0.764] |")
    assert disagreements(figures, tmp_path) == ["goal: b.md does not contain '0.695 [0.627, 0.764]'"]
    (tmp_path / "a.md").unlink()
    assert disagreements(figures, tmp_path)[0] == "goal: a.md is missing"
    spec.write_text(json.dumps({"goal": {"text": "", "files": ["a.md"]}}))
    with pytest.raises(ValueError, match="goal: 'text'"):
        load_figures(spec)
    spec.write_text(json.dumps({"goal": {"text": "1", "files": []}}))
    with pytest.raises(ValueError, match="goal: 'files'"):
        load_figures(spec)


def test_shared_figures_agree():
    """Every file listed in docs/figures.json holds its figure's exact text."""
    figures = load_figures(FIGURES)
    assert figures, "docs/figures.json lists no figure"
    bad = disagreements(figures, ROOT)
    assert not bad, ("figures quoted in several files disagree (docs/figures.json; change every file, then the "
                     "entry):\n" + "\n".join(bad))
