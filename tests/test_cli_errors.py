"""User-facing behaviour of `train/run.py`: packs built with
other settings are adopted or named, skipped data files are listed, unreadable checkpoints and
packs give one line naming the file, user errors exit 2 without a traceback, invalid env configs
are refused with the reason, and `--config FILE` replays a saved run."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import pickle
import sys

import pytest
import torch

from gpusim.config import EnvConfig
from policy import PolicyConfig
from train.checkpoint import CheckpointError, load_checkpoint
from train.config import TrainConfig, UserError, parse_args
from train.packs import adapt_env_config
from train.run import main, train
from train.setup import make_env

from test_train_run import FakeEnv

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "womd_sample"
ONE = SAMPLE / "db4edc9bd0c9d18c.json.xz"
TINY = ["--num-worlds", "2", "--quiet", "--num-threads", "1", "--policy.d-model", "16", "--policy.n-layers", "1",
        "--policy.max-roads", "8", "--env.scenario-length", "10", "--device", "cpu"]


def _fake_cfg(tmp_path, **kw):
    base = dict(num_worlds=2, total_timesteps=200, device="cpu", seed=3, log_dir=str(tmp_path / "runs"),
                run_name="r", quiet=True, num_threads=1, report_interval=1,
                policy=PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16, max_roads=2))
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ck")
    torch.set_num_threads(1)
    return pathlib.Path(train(_fake_cfg(tmp), env=FakeEnv(num_worlds=2))["checkpoint"])


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    return err[0]


# ------------------------------------------------------------------ item 4: checkpoints and packs
@pytest.mark.parametrize("kind", ["empty", "truncated", "random", "unsafe_pickle", "not_a_checkpoint"])
def test_bad_checkpoint_is_one_line_naming_the_file(tmp_path, checkpoint, capsys, kind):
    bad = tmp_path / f"{kind}.pt"
    data = checkpoint.read_bytes()
    if kind == "empty":
        bad.write_bytes(b"")
    elif kind == "truncated":
        bad.write_bytes(data[: len(data) // 2])
    elif kind == "random":
        bad.write_bytes(os.urandom(4096))
    elif kind == "unsafe_pickle":  # an arbitrary object: must be refused, never executed
        torch.save({"version": 1, "model": {}, "obj": pathlib.PurePosixPath("x")}, bad)
    else:
        torch.save({"hello": torch.zeros(2)}, bad)
    with pytest.raises(CheckpointError, match=str(bad).replace(".", r"\.")) as exc:
        load_checkpoint(bad)
    assert "\n" not in str(exc.value) and "weights_only=False" not in str(exc.value)
    assert main(["--resume", str(bad), "--data", str(ONE)] + TINY) == 2
    line = _one_error_line(capsys)
    assert str(bad) in line and "weights_only=False" not in line


def test_bad_pack_file_is_one_line_naming_it(tmp_path, capsys):
    for name, content in (("empty", b""), ("random", os.urandom(2048))):
        d = tmp_path / name
        d.mkdir()
        (d / "pack.pt").write_bytes(content)
        assert main(["--data", str(d), "--log-dir", str(tmp_path / "runs")] + TINY) == 2
        line = _one_error_line(capsys)
        assert str(d / "pack.pt") in line and "weights_only=False" not in line
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------ item 5: user errors
def test_user_errors_exit_2_with_one_line(tmp_path, capsys, monkeypatch):
    runs = tmp_path / "runs"
    assert main(["--data", str(tmp_path / "nope"), "--log-dir", str(runs)] + TINY) == 2
    assert "--data" in _one_error_line(capsys)
    if not torch.cuda.is_available():
        assert main(["--device", "cuda", "--log-dir", str(runs)] + TINY[:-2]) == 2
        assert "--device cuda" in _one_error_line(capsys)
    assert main(["--device", "tpu9", "--log-dir", str(runs)] + TINY[:-2]) == 2
    assert "--device tpu9" in _one_error_line(capsys)
    with pytest.raises(FileNotFoundError):  # --debug: the traceback
        main(["--data", str(tmp_path / "nope"), "--debug"] + TINY)
    assert not runs.exists()


def test_missing_wandb_is_one_line_and_leaves_no_files(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    assert main(["--wandb", "--data", str(ONE), "--log-dir", str(tmp_path / "runs")] + TINY) == 2
    assert "pip install 'gpusim[wandb]'" in _one_error_line(capsys)
    assert not (tmp_path / "runs").exists()


def test_failed_wandb_start_leaves_no_empty_metrics_file(tmp_path, monkeypatch):
    """The Logger starts wandb before it creates metrics.jsonl (formerly an empty file was left)."""
    import sys
    import types

    from train.logger import Logger

    def boom(**kw):
        raise RuntimeError("network unreachable")

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=boom))
    with pytest.raises(UserError, match="wandb.init failed.*network unreachable"):
        Logger(tmp_path / "runs" / "x", {}, 10, quiet=True, wandb=True)
    assert not (tmp_path / "runs" / "x").exists()


def test_existing_run_directory_is_not_overwritten(tmp_path):
    train(_fake_cfg(tmp_path), env=FakeEnv(num_worlds=2))
    with pytest.raises(UserError, match="already holds a run.*--run-name.*--resume"):
        train(_fake_cfg(tmp_path), env=FakeEnv(num_worlds=2))


# ------------------------------------------------------------------ item 6: invalid env configs
def test_scenario_length_past_the_log_is_rejected_with_the_reason(capsys):
    with pytest.raises(ValueError, match="scenario_length=200 .*91-step log.*at most 91"):
        EnvConfig(scenario_length=200)
    with pytest.raises(ValueError, match="at most 81"):
        EnvConfig(init_steps=10, scenario_length=82)
    assert EnvConfig(init_steps=10, scenario_length=81).horizon == 81
    assert EnvConfig(init_steps=10).scenario_length == 81
    with pytest.raises(SystemExit) as e:
        parse_args(["--env.scenario-length", "200"])
    assert e.value.code == 2
    assert "91-step log" in " ".join(capsys.readouterr().err.split())


# ------------------------------------------------------------------ items 1 and 2: data
@pytest.fixture(scope="module")
def pack32():
    from gpusim.data import ScenarioPack

    return ScenarioPack.from_json([ONE], EnvConfig().data_config())  # convert's defaults: 32 controlled


def test_pack_settings_are_adopted_or_the_flag_is_named(pack32):
    """Formerly: a traceback about EnvConfig.max_controlled for a pack made by `convert`."""
    cfg = TrainConfig().env  # max_controlled 8, not set by the user
    adapted, notes = adapt_env_config(cfg, pack32, user_set=set())
    assert adapted.max_controlled == 32 and any("--env.max-controlled 32" in n for n in notes)
    from gpusim.env import DriveEnv

    env = DriveEnv(pack32, 1, config=adapted.replace(scenario_length=5))
    assert env.num_slots == 32
    with pytest.raises(UserError, match=r"--env\.max-controlled 4 .*max_controlled=32.*--max-controlled 4"):
        adapt_env_config(cfg.replace(max_controlled=4), pack32, user_set={"max_controlled"})
    with pytest.raises(UserError, match=r"the checkpoint was trained with max_controlled=8 .*--max-controlled 8"):
        adapt_env_config(cfg, pack32, user_set={"max_controlled"}, resuming=True)


def test_skipped_data_files_are_listed_and_counted(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.json.xz").write_bytes(ONE.read_bytes())
    (data / "broken.json").write_text("{not json")
    (data / "empty.json").write_text("")
    cfg = TrainConfig(data=str(data), num_worlds=1, device="cpu", env=TrainConfig().env.replace(scenario_length=5))
    lines = []
    make_env(cfg, cfg.env, say=lines.append)
    assert lines[0].startswith("data: 2 of 3 file(s) skipped, training on 1 scenario(s)")
    assert any("broken.json" in x for x in lines[1:]) and any("empty.json" in x for x in lines[1:])
    assert all(": " in x.split("skipped ", 1)[1] for x in lines[1:])  # each with its reason
    # on the command line: listed on stderr before the first report
    assert main(["--data", str(data), "--total-timesteps", "1", "--log-dir", str(tmp_path / "runs")] + TINY) == 0
    err = capsys.readouterr().err
    assert "2 of 3 file(s) skipped" in err and "broken.json" in err and "empty.json" in err


# ------------------------------------------------------------------ item 7: --config
def test_saved_config_replays_the_run_exactly_and_flags_override(tmp_path):
    out = train(_fake_cfg(tmp_path), env=FakeEnv(num_worlds=2, seed=4))
    saved = pathlib.Path(out["run_dir"]) / "config.json"
    cfg = parse_args(["--config", str(saved), "--run-name", "replay"])
    assert dataclasses.replace(cfg, run_name="r", config=None) == _fake_cfg(tmp_path)
    out2 = train(cfg, env=FakeEnv(num_worlds=2, seed=4))
    timing = {"time", "sps", "rollout_s", "update_s"}
    strip = lambda recs: [{k: v for k, v in r.items() if k not in timing} for r in recs]  # noqa: E731
    assert strip(out2["reports"]) == strip(out["reports"]) and len(out["reports"]) >= 2
    # flags override the file; YAML works the same
    yml = tmp_path / "run.yaml"
    yml.write_text("num_worlds: 5\nseed: 9\nenv:\n  goal_behavior: trial\n  k_trials: 3\nppo:\n  ent_coef: 0.02\n")
    c = parse_args(["--config", str(yml), "--seed", "11", "--env.k-trials", "4"])
    assert (c.num_worlds, c.seed, str(c.env.goal_behavior), c.env.k_trials, c.ppo.ent_coef) == (5, 11, "trial", 4, 0.02)
    assert c.env.max_controlled == TrainConfig().env.max_controlled  # unspecified: the trainer defaults


def test_bad_config_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "run.json"
    bad.write_text(json.dumps({"num_wrlds": 3}))
    assert main(["--config", str(bad)]) == 2
    assert "num_wrlds" in _one_error_line(capsys)
    bad.write_text("{")
    assert main(["--config", str(bad)]) == 2
    assert "not valid JSON" in _one_error_line(capsys)
    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in _one_error_line(capsys)


def test_warnings_print_as_one_line_without_source(monkeypatch, capsys):
    """``one_line_warnings``: a library warning reaches the user as ``warning: <message>``, one line,
    without the ``file:line`` prefix and the line of source; ``--debug`` keeps the default format."""
    import warnings

    from train.config import one_line_warnings

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # restored after the test
    default = warnings.formatwarning
    one_line_warnings(debug=True)
    assert warnings.formatwarning is default
    one_line_warnings()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        # pytest records warnings; print them the way Python does outside pytest
        warnings.showwarning = lambda m, c, f, n, file=None, line=None: sys.stderr.write(
            warnings.formatwarning(m, c, f, n, line))
        warnings.warn("EnvConfig.goal_resample: 2 agents keep their logged goals", UserWarning)
    err = capsys.readouterr().err
    assert err == "warning: EnvConfig.goal_resample: 2 agents keep their logged goals\n"
