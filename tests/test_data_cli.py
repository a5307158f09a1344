"""`python -m gpusim.data convert|info`: exit codes (subprocess), per-file error lines, summary."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from gpusim.data import ScenarioPack
from gpusim.data.__main__ import main

SMALL = ["tfrecord-00068-of-01000_277.json.xz", "tfrecord-00001-of-01000_307.json.xz"]


@pytest.fixture()
def mixed_dir(sample_dir, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in SMALL:
        shutil.copy(sample_dir / name, src / name)
    (src / "broken.json").write_text('{"objects": [], "roads": [')
    (src / "noroads.json").write_text('{"objects": []}')
    return src


def _run(*args):
    return subprocess.run([sys.executable, "-m", "gpusim.data", *args], capture_output=True, text=True, timeout=120)


def test_cli_exit_codes_subprocess(mixed_dir, tmp_path):
    out = tmp_path / "pack"
    r = _run("convert", str(mixed_dir), "--out", str(out), "--max-agents", "32", "--cell-size", "8")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(l.startswith("error: ") and "broken.json" in l and "JSON" in l for l in lines)
    assert any(l.startswith("error: ") and "noroads.json" in l and "roads: missing" in l for l in lines)
    assert any(l.startswith("converted 2 of 4 file(s)") for l in lines)
    pack = ScenarioPack.load(out)
    assert pack.num_scenarios == 2 and pack.max_agents == 32 and pack.cell_size == 8.0
    assert len(pack.stats["errors"]) == 2

    bad_only = tmp_path / "bad"
    bad_only.mkdir()
    shutil.copy(mixed_dir / "broken.json", bad_only / "broken.json")
    r = _run("convert", str(bad_only), str(tmp_path / "missing.json.xz"), "--out", str(tmp_path / "none"))
    assert r.returncode == 1
    assert "broken.json" in r.stdout and "missing.json.xz" in r.stdout
    assert not (tmp_path / "none").exists()


def test_cli_convert_and_info_in_process(mixed_dir, tmp_path, capsys):
    out = tmp_path / "p.pt"
    assert main(["convert", str(mixed_dir / SMALL[0]), str(mixed_dir / SMALL[1]), "--out", str(out),
                 "--max-controlled", "2"]) == 0
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    pack = ScenarioPack.load(out)
    assert "scenarios: 2" in text
    n_ctrl = int(pack.num_controlled.sum())
    n_exp = int(pack.num_agents.sum()) - n_ctrl
    assert f"({n_ctrl} controlled, {n_exp} experts)" in text
    assert f"road segments: {int(pack.num_segments.sum())}" in text
    assert f"memory: {pack.nbytes()} bytes" in text
    for sid in pack.scenario_ids:
        assert sid in text
    # info also accepts JSON sources directly (converted in memory), and reports bad files.
    assert main(["info", str(mixed_dir)]) == 0
    text = capsys.readouterr().out
    assert "converted 2 of 4" in text and "scenarios: 2" in text and "broken.json" in text


def test_cli_bad_usage(tmp_path, capsys):
    assert main(["info", str(tmp_path / "nothing")]) == 1
    assert main(["convert", str(tmp_path), "--out", str(tmp_path / "o"), "--max-controlled", "0"]) == 2
    with pytest.raises(SystemExit):
        main(["convert", "--out", str(tmp_path / "o")])  # no source: argparse error
