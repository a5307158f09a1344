"""`--resume`: same run directory and JSONL without duplicated or missing
updates, continued `time` and metric state (EMA slots), conflicting flags refused, nothing-to-do
said, stale temporary files cleaned; and a SIGKILL-at-random-moments run (slow)."""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from policy import PolicyConfig
from train.checkpoint import load_checkpoint
from train.config import TrainConfig, UserError
from train.run import main, train

from test_train_run import FakeEnv

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "womd_sample"
FILES = ["db4edc9bd0c9d18c.json.xz", "b5f53fa2db40a6b4.json.xz", "1c365f15b70ebdbf.json.xz"]
ENV = dict(max_controlled=8, scenario_length=10, collision_behavior="remove", offroad_behavior="remove")


@pytest.fixture(scope="module")
def small_pack(tmp_path_factory):
    """Three real sample scenarios converted once and saved as a pack directory."""
    from gpusim.config import EnvConfig
    from gpusim.data import ScenarioPack

    pack = ScenarioPack.from_json([SAMPLE / f for f in FILES], EnvConfig(**ENV).data_config())
    return pack.save(tmp_path_factory.mktemp("pack") / "p")


def _cfg(tmp_path, **kw):
    from gpusim.config import EnvConfig

    base = dict(num_worlds=2, total_timesteps=1, learning_rate=1e-3, device="cpu", seed=0,
                log_dir=str(tmp_path / "runs"), run_name="r", quiet=True, num_threads=1, report_interval=1,
                env=EnvConfig(**ENV), policy=PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16, max_roads=8))
    base.update(kw)
    return TrainConfig(**base)


FAKE_POLICY = PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16, max_roads=2)


def _fcfg(tmp_path, **kw):
    """Config for the FakeEnv of test_train_run (3 road slots)."""
    return _cfg(tmp_path, **dict(dict(policy=FAKE_POLICY), **kw))


def _records(run_dir) -> list[dict]:
    return [json.loads(x) for x in (pathlib.Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def test_resume_continues_jsonl_time_and_metric_state(tmp_path, small_pack):
    """Formerly: a new run directory, EMAs restarted from zero (n 24 -> 12) and `time` from 0."""
    out = train(_cfg(tmp_path, data=str(small_pack), total_timesteps=300))
    first = _records(out["run_dir"])
    ck = load_checkpoint(out["checkpoint"])
    assert ck["extra"]["env_metrics"]["has_data"].any() and ck["extra"]["elapsed"] > 0
    out2 = train(_cfg(tmp_path, data=str(small_pack), total_timesteps=600, resume=out["checkpoint"]))
    assert out2["run_dir"] == out["run_dir"]
    recs = _records(out["run_dir"])
    assert recs[:len(first)] == first
    ups = [r["update"] for r in recs]
    assert ups == list(range(1, len(recs) + 1)), ups  # no duplicate, no gap
    a, b = first[-1], recs[len(first)]
    assert b["time"] > a["time"]
    assert b["n"] >= a["n"], (a["n"], b["n"])  # EMA slots with data kept, not restarted
    assert b["global_step"] > a["global_step"]


def test_resume_of_a_copied_checkpoint_continues_beside_the_copy_and_keeps_its_shaping(tmp_path, small_pack):
    """Formerly: resuming a copy appended to (and truncated) the original run's metrics.jsonl, and a
    run trained with ``--experience identity`` continued with the default ``progress`` shaping."""
    import shutil

    from train.resume import prepare_run

    out = train(_cfg(tmp_path, data=str(small_pack), total_timesteps=300, experience="identity"))
    original = (pathlib.Path(out["run_dir"]) / "metrics.jsonl").read_text()
    fork = tmp_path / "fork"
    fork.mkdir()
    shutil.copy(out["checkpoint"], fork / "checkpoint.pt")
    cfg, _, _, run_dir = prepare_run(_cfg(tmp_path, data=str(small_pack), total_timesteps=600,
                                          resume=str(fork / "checkpoint.pt")))
    assert run_dir == fork and cfg.experience == "identity"
    out2 = train(_cfg(tmp_path, data=str(small_pack), total_timesteps=600, resume=str(fork / "checkpoint.pt")))
    assert pathlib.Path(out2["run_dir"]) == fork and (fork / "metrics.jsonl").is_file()
    assert (pathlib.Path(out["run_dir"]) / "metrics.jsonl").read_text() == original
    # the checkpoint where its run wrote it continues that run, and a hook named on the command line wins
    cfg, _, _, run_dir = prepare_run(_cfg(tmp_path, data=str(small_pack), total_timesteps=900,
                                          resume=out["checkpoint"], experience="goal_bonus"))
    assert run_dir == pathlib.Path(out["run_dir"]) and cfg.experience == "goal_bonus"


def test_restored_metric_state_reports_what_was_saved(tmp_path, small_pack):
    from gpusim.config import EnvConfig
    from gpusim.data import ScenarioPack
    from gpusim.env import DriveEnv
    from train.setup import find_metric_log

    out = train(_cfg(tmp_path, data=str(small_pack), total_timesteps=200))
    ck = load_checkpoint(out["checkpoint"])
    env = DriveEnv(ScenarioPack.load(small_pack), 2, config=EnvConfig(**ENV))
    assert env.metrics() == {}
    find_metric_log(env).load_state_dict(ck["extra"]["env_metrics"])
    last = out["reports"][-1]
    got = env.metrics()
    assert got and all(abs(got[k] - last[k]) < 1e-9 for k in got)


def test_resume_refuses_conflicting_env_and_policy_flags(tmp_path):
    out = train(_fcfg(tmp_path, total_timesteps=100), env=FakeEnv(num_worlds=2))
    from gpusim.config import EnvConfig

    bad = _fcfg(tmp_path, total_timesteps=1000, resume=out["checkpoint"], env=EnvConfig(**dict(ENV, k_trials=3)),
               policy=PolicyConfig(d_model=32, n_layers=1, n_heads=2, hidden=16, max_roads=2))
    with pytest.raises(UserError, match=r"--env\.k-trials 3 \(checkpoint: 2\).*--policy\.d-model 32 \(checkpoint: 16\)"):
        train(bad, env=FakeEnv(num_worlds=2))
    # the flags equal to the checkpoint's (or left at their defaults) are fine
    ok = train(_fcfg(tmp_path, total_timesteps=200, resume=out["checkpoint"]), env=FakeEnv(num_worlds=2))
    assert ok["update"] > out["update"]


def test_resume_says_when_there_is_nothing_to_do(tmp_path, capsys):
    out = train(_fcfg(tmp_path, total_timesteps=100), env=FakeEnv(num_worlds=2))
    before = (pathlib.Path(out["run_dir"]) / "metrics.jsonl").read_text()
    capsys.readouterr()
    again = train(_fcfg(tmp_path, total_timesteps=100, resume=out["checkpoint"]), env=FakeEnv(num_worlds=2))
    assert again["nothing_to_do"] and again["update"] == out["update"]
    assert "nothing to do" in capsys.readouterr().out
    assert (pathlib.Path(out["run_dir"]) / "metrics.jsonl").read_text() == before


def test_kill_during_checkpoint_write_leaves_no_duplicate_on_resume(tmp_path, monkeypatch):
    """A crash inside the checkpoint write of update 3 (after its JSONL record was written) leaves a
    stale .tmp; resume removes it and writes update 3 once (formerly twice)."""
    import train.run as run

    real = run.save_checkpoint

    def dying(path, **kw):
        if kw["update"] == 3:
            pathlib.Path(str(path) + ".x1y2.tmp").write_bytes(b"")  # what a kill mid-write leaves
            raise KeyboardInterrupt
        return real(path, **kw)

    monkeypatch.setattr(run, "save_checkpoint", dying)
    cfg = _fcfg(tmp_path, total_timesteps=6 * 2 * 4 * 12, checkpoint_interval=1)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, env=FakeEnv(num_worlds=2))
    run_dir = tmp_path / "runs" / "r"
    assert [r["update"] for r in _records(run_dir)] == [1, 2, 3]
    assert list(run_dir.glob("*.tmp"))
    monkeypatch.setattr(run, "save_checkpoint", real)
    out = train(dataclasses_replace(cfg, resume=str(run_dir / "checkpoint.pt")), env=FakeEnv(num_worlds=2))
    assert not list(run_dir.glob("*.tmp"))
    ups = [r["update"] for r in _records(run_dir)]
    assert ups == list(range(1, out["update"] + 1)) and out["update"] >= 5


def dataclasses_replace(cfg, **kw):
    import dataclasses

    return dataclasses.replace(cfg, **kw)


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume(tmp_path, small_pack):
    """SIGKILL `train/run.py` (checkpoint every update) at random moments three times, resuming
    each time, then let it finish: the checkpoint loads, the JSONL holds every update exactly once,
    and step, time and the EMA count `n` never go back."""
    rng = random.Random(17)
    env = dict(os.environ, GPUSIM_BACKEND="torch", OMP_NUM_THREADS="1")
    env.pop("TRITON_INTERPRET", None)
    run_dir = tmp_path / "runs" / "k"
    ck = run_dir / "checkpoint.pt"
    base = [sys.executable, str(REPO / "train" / "run.py"), "--data", str(small_pack), "--num-worlds", "2",
            "--total-timesteps", "2500", "--checkpoint-interval", "1", "--report-interval", "1", "--quiet",
            "--num-threads", "1", "--policy.d-model", "16", "--policy.n-layers", "1", "--policy.max-roads", "8",
            "--env.scenario-length", "10", "--device", "cpu"]
    first = base + ["--log-dir", str(tmp_path / "runs"), "--run-name", "k"]
    kills = 0
    for attempt in range(3):
        cmd = first if attempt == 0 else base + ["--resume", str(ck)]
        p = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        n0 = len(_records(run_dir)) if (run_dir / "metrics.jsonl").exists() else 0
        t_end = time.time() + 120
        while time.time() < t_end and p.poll() is None:  # wait for training to be under way
            if ck.exists() and len((run_dir / "metrics.jsonl").read_text().splitlines()) > n0:
                break
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.0))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            kills += 1
        p.communicate(timeout=60)
        assert ck.exists()
    assert kills >= 2
    r = subprocess.run(base + ["--resume", str(ck)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not list(run_dir.glob("*.tmp"))
    final = load_checkpoint(ck)
    recs = _records(run_dir)
    assert [x["update"] for x in recs] == list(range(1, final["update"] + 1))
    assert recs[-1]["global_step"] == final["global_step"] >= 2500
    for a, b in zip(recs, recs[1:]):
        assert b["global_step"] > a["global_step"] and b["time"] >= a["time"]
        if "n" in a:
            assert b.get("n", 0) >= a["n"]
    assert main(["--resume", str(ck), "--total-timesteps", "2500", "--quiet"]) == 0  # nothing to do
