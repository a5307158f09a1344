"""Flags accepted where they would do nothing are refused with one line, and the messages name the
real cause: --memory trial without trials, --coplayer without its mode (a missing path named), a
co-player differing by reward conditioning, co-player paths holding '@', and a resumed run that
keeps its recorded --data."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from train.eval.styles import partner_styles
from train.evaluate import main as eval_main

from test_cli_errors import TINY

REPO = pathlib.Path(__file__).resolve().parents[1]
ONE = REPO / "data" / "womd_sample" / "db4edc9bd0c9d18c.json.xz"
DRIVER = REPO / "policies" / "driver.pt"   # trained without trials, without reward conditioning
STYLES = REPO / "policies" / "styles.pt"   # the same sizes, with reward conditioning
EVAL = ["--data", str(ONE), "--num-threads", "1", "--device", "cpu", "--quiet"]


def _error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1, err
    return err[0]


@pytest.fixture
def no_sweep(monkeypatch):
    import train.evaluate as evaluate

    def ran(*a, **k):
        raise AssertionError("the evaluation ran")

    monkeypatch.setattr(evaluate, "run_sweep", ran)


def test_memory_trial_without_trials_is_refused(capsys, no_sweep):
    assert eval_main(["--policy", str(DRIVER), "--memory", "trial"] + EVAL) == 2
    line = _error_line(capsys)
    assert "--memory trial: this evaluation runs no trials" in line and "pass --k-trials K" in line


def test_coplayer_without_its_mode_is_refused_and_a_missing_path_named(tmp_path, capsys, no_sweep):
    missing = tmp_path / "nope.pt"
    assert eval_main(["--policy", "constant_speed", "--coplayer", str(missing)] + EVAL) == 2
    assert _error_line(capsys).startswith(f"error: --coplayer {missing}: no such checkpoint file or run directory")
    assert eval_main(["--policy", "constant_speed", "--coplayer", str(DRIVER)] + EVAL) == 2
    assert "--coplayer is read by --mode coplayer only: add that mode, or drop the flag" in _error_line(capsys)
    assert eval_main(["--policy", "constant_speed", "--coplayer-sample"] + EVAL) == 2
    assert "--coplayer-sample is read by --mode coplayer only" in _error_line(capsys)


def test_coplayer_paths_may_hold_an_at_sign(tmp_path):
    run = tmp_path / "a@b"
    run.mkdir()
    shutil.copy(DRIVER, run / "checkpoint.pt")
    flat = tmp_path / "x@y.pt"
    shutil.copy(DRIVER, flat)
    assert partner_styles([str(run), str(flat)]) == ([str(run), str(flat)], None)
    paths, table = partner_styles([f"{flat}@cautious", str(run)])
    assert paths == [str(flat), str(run)] and len(table) == 2  # cautious, and default for the other
    with pytest.raises(Exception, match="unknown style 'fastest'"):
        partner_styles([f"{flat}@fastest"])


def test_coplayer_differing_by_reward_conditioning_is_named_as_such(capsys):
    assert eval_main(["--policy", str(DRIVER), "--mode", "coplayer", "--coplayer", str(STYLES)] + EVAL) == 2
    line = _error_line(capsys)
    assert f"--coplayer {STYLES}: the partner was trained with reward conditioning and this env runs without it" \
           in line
    assert "num-partners" not in line


def test_resume_without_data_keeps_the_recorded_data(tmp_path, capsys):
    from train.run import main

    data = tmp_path / "scenes"
    data.mkdir()
    (data / ONE.name).symlink_to(ONE)
    runs = tmp_path / "runs"
    assert main(["--data", str(data), "--log-dir", str(runs), "--run-name", "r", "--total-timesteps", "500"]
                + TINY) == 0
    ckpt = runs / "r" / "checkpoint.pt"
    assert main(["--resume", str(ckpt), "--total-timesteps", "2000"] + TINY) == 0
    assert json.loads((runs / "r" / "config.json").read_text())["data"] == str(data)
    shutil.rmtree(data)
    capsys.readouterr()
    assert main(["--resume", str(ckpt), "--total-timesteps", "4000"] + TINY) == 2
    assert _error_line(capsys).startswith(f"error: --resume: the run trained on --data {data}, which is not there")
