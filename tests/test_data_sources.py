"""Source expansion of the converter: documentation files that sit next to the data (README.md,
LICENSE, notes) are left out quietly, whether the shell expanded a glob or the converter did."""

from __future__ import annotations

import pathlib

from gpusim.data.__main__ import main
from gpusim.data.convert import convert_sources, expand_sources, is_documentation_file

REPO = pathlib.Path(__file__).resolve().parents[1]
TFRECORD_DIR = REPO / "data" / "womd_tfrecord"


def test_documentation_names():
    for name in ("README.md", "readme", "README", "LICENSE", "licence_notes.txt", "index.rst", "notes.md"):
        assert is_documentation_file(name), name
    for name in ("a.json", "a.json.xz", "training.tfrecord-00000-of-01000", "x.tfrecord.gz", "scene.pb",
                 "readme.json", "license.tfrecord"):
        assert not is_documentation_file(name), name


def test_shell_expanded_folder_converts_without_error(capsys, tmp_path):
    """`convert data/womd_tfrecord/*` as the shell passes it: README.md and the TFRecord."""
    sources = sorted(str(p) for p in TFRECORD_DIR.iterdir())
    assert any(p.endswith("README.md") for p in sources)
    assert main(["convert", *sources, "--out", str(tmp_path / "p.pt"), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "error" not in text and "README" not in text
    assert "converted 1 scenario(s) from 1 file(s) (1 TFRecord record(s))" in text and "0 bad" in text


def test_glob_and_explicit_docs_are_listed_in_stats(tmp_path):
    _, stats = convert_sources(str(TFRECORD_DIR / "*"))
    assert stats["converted"] == 1 and stats["errors"] == [] and stats["files"] == 1
    assert [pathlib.Path(f).name for f in stats["ignored_files"]] == ["README.md"]
    # a directory source never listed documentation files
    files, errors = expand_sources(TFRECORD_DIR)
    assert [pathlib.Path(f).name for f in files] == ["motion_data_one_scenario.tfrecord.gz"] and not errors


def test_only_documentation_is_an_error(tmp_path):
    (tmp_path / "README.md").write_text("# notes\n")
    files, errors = expand_sources([tmp_path / "README.md"])
    assert files == [] and len(errors) == 1 and "documentation file" in errors[0]["reason"]
    files, errors = expand_sources(str(tmp_path / "*"))
    assert files == [] and errors == [{"file": str(tmp_path / "*"), "reason": "pattern matches no scenario file"}]
    # any other file named directly is still read (and reported when it is not a scenario)
    (tmp_path / "scene.dat").write_text("not json")
    files, errors = expand_sources([tmp_path / "scene.dat", tmp_path / "README.md"])
    assert [pathlib.Path(f).name for f in files] == ["scene.dat"] and not errors
