"""Trainer tests: rollout alignment and cache handling, resume, and a `train/run.py` smoke run.

``FakeEnv`` (also imported by test_ppo / test_experience) is a tiny env with the DriveEnv API and
the time alignment of docs/contracts.md: 1-D agents drive toward a goal, reaching it gives +1 and
(optionally) removes the agent, trial boundaries emit ``truncation``, one world can be truncated
early (``terminal`` before the horizon, then idle steps with ``loss_mask = 0``).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import types

import pytest
import torch

from policy import ActorCritic, PolicyConfig
from policy.encoders import ObsDims
from train.config import TrainConfig
from train.rollout import RolloutBatch, collect_rollout
from train.run import train

REPO = pathlib.Path(__file__).resolve().parents[1]


class FakeEnv:
    """W worlds x C slots; slot c of world w is active iff c < n_active[w].

    Obs per slot: ego [dist_to_goal/10, speed/10, t/H, 1], partners 2 x 3, roads 3 x 4 (random
    features, valid flags random). Action a in [0, 91): acceleration (a // 13 - 3) m/s^2.
    """

    def __init__(self, num_worlds=3, num_slots=4, horizon=12, trial_length=None, remove_on_goal=False,
                 early_truncate_world=None, early_truncate_step=None, seed=0, device="cpu", all_active=False):
        self.num_worlds, self.num_slots, self.horizon = num_worlds, num_slots, horizon
        self.device = torch.device(device)
        self.obs_layout = ObsDims(4, 2, 3, 3, 4)
        self.obs_dim = self.obs_layout.obs_dim
        self.num_actions = 91
        self.config = types.SimpleNamespace(action_space=0)
        self.trial_length = trial_length
        self.remove_on_goal = remove_on_goal
        self.early = (early_truncate_world, early_truncate_step)
        self.gen = torch.Generator().manual_seed(seed)
        self.all_active = all_active
        self.pack = types.SimpleNamespace(
            scenario_ids=["s0", "s1", "s2"],
            agent_type=torch.tensor([[0, 0, 1, 2], [0, 1, 0, 0], [2, 0, 0, 0]], dtype=torch.int8))
        self._episodes = []
        self._new_episode()

    def _new_episode(self):
        W, C = self.num_worlds, self.num_slots
        scen = torch.randint(3, (W,), generator=self.gen)
        n_active = torch.randint(1, C + 1, (W,), generator=self.gen)
        n_active[0] = C
        if self.all_active:
            n_active[:] = C
        active = torch.arange(C)[None, :] < n_active[:, None]
        self.state = types.SimpleNamespace(scenario=scen, slot_active=active)
        self.goal = 5.0 + 10.0 * torch.rand(W, C, generator=self.gen)
        self.x = torch.zeros(W, C)
        self.v = torch.zeros(W, C)
        self.t = 0
        self.removed = torch.zeros(W, C, dtype=torch.bool)
        self.stopped = torch.zeros(W, C, dtype=torch.bool)
        self.done = torch.zeros(W, C, dtype=torch.bool)
        self.reached = torch.zeros(W, C, dtype=torch.bool)
        self.ret = torch.zeros(W, C)

    def _obs(self):
        W, C = self.num_worlds, self.num_slots
        L = self.obs_layout
        ego = torch.stack([(self.goal - self.x) / 10, self.v / 10, torch.full((W, C), self.t / self.horizon),
                           torch.ones(W, C)], -1)
        part = torch.rand(W, C, L.num_partners, L.partner_dim, generator=self.gen)
        part[..., -1] = (part[..., -1] > 0.4).float()
        road = torch.rand(W, C, L.num_roads, L.road_dim, generator=self.gen)
        road[..., -1] = (road[..., -1] > 0.3).float()
        obs = torch.cat([ego, part.flatten(-2), road.flatten(-2)], -1)
        return torch.where(self.state.slot_active[..., None], obs, 0.0)

    def reset(self, seed=None):
        if seed is not None:
            self.gen.manual_seed(seed)
        self._new_episode()
        return self._obs()

    def step(self, actions):
        W, C = self.num_worlds, self.num_slots
        assert actions.shape == (W, C) and actions.dtype == torch.int64
        if (actions < 0).any() or (actions >= 91).any():
            raise ValueError("action out of range")
        act = self.state.slot_active
        in_play = act & ~self.removed & ~self.stopped & ~self.done
        accel = (actions // 13 - 3).float()
        self.v = torch.where(in_play, (self.v + accel * 0.5).clamp(-2, 5), self.v)
        self.x = torch.where(in_play, self.x + self.v * 0.5, self.x)
        goal_now = in_play & (self.x >= self.goal) & ~self.reached
        self.reached |= goal_now
        reward = goal_now.float()
        self.ret += reward
        self.t += 1
        truncation = torch.zeros(W, C, dtype=torch.bool)
        terminal = torch.zeros(W, C, dtype=torch.bool)
        if self.remove_on_goal:
            self.removed |= goal_now
        else:
            self.stopped |= goal_now
        if self.trial_length and self.t % self.trial_length == 0 and self.t < self.horizon:
            truncation = act & ~self.done
            self.removed[:] = False
            self.x = torch.zeros(W, C)
            self.v = torch.zeros(W, C)
            self.reached[:] = False
            self.stopped[:] = False
        ew, es = self.early
        if ew is not None and self.t == es:
            terminal[ew] = act[ew] & ~self.done[ew]
        end = self.t >= self.horizon
        if end:
            terminal |= act & ~self.done
        self.done |= terminal
        self._episodes.append((terminal, self.reached.clone()))
        res = types.SimpleNamespace(
            reward=reward, terminal=terminal, truncation=truncation, loss_mask=in_play,
            info={"goal_reached": goal_now},
        )
        if end:
            self._new_episode()
        res.obs = self._obs()
        res.removed = self.removed.clone()
        res.stopped = self.stopped.clone()
        res.slot_active = self.state.slot_active
        return res

    def metrics(self):
        n = sum(float(t.sum()) for t, _ in self._episodes)
        if n == 0:
            return {}
        g = sum(float((t & r).sum()) for t, r in self._episodes)
        self._episodes = []
        return {"goal_reached": g / n, "n": n}


def small_policy(env, **kw):
    torch.manual_seed(0)
    cfg = PolicyConfig(d_model=16, n_layers=2, n_heads=2, hidden=16, **kw)
    return ActorCritic(env.obs_layout, env.num_actions, False, cfg)


# ---------------------------------------------------------------------------------------- rollout
@pytest.mark.parametrize("trial_length,remove", [(None, False), (5, True)])
def test_rollout_alignment_and_cache_parity(trial_length, remove):
    """Values/logits collected step by step with the KV cache (cleared per terminal, kept on
    truncation) equal the whole-row forward at every non-removed step; removed[t] is the previous
    step's removed flag; the early-truncated world gets its terminal mid-row."""
    env = FakeEnv(num_worlds=3, num_slots=4, horizon=14, trial_length=trial_length, remove_on_goal=remove,
                  early_truncate_world=1, early_truncate_step=6)
    pol = small_policy(env)
    R, H = 12, 14
    buf = RolloutBatch.empty(R, H, env.obs_dim, False, 1, "cpu")
    cache = pol.init_cache(R, H)
    obs = env.reset(seed=3)
    # drive fast so goals happen inside the row: deterministic policy of max acceleration
    with torch.no_grad():
        pol.actor.bias[:] = -10.0
        pol.actor.bias[90] = 10.0
    obs, batch = collect_rollout(env, pol, obs, buf, cache)
    assert not batch.removed[:, 0].any()
    if remove:
        assert batch.removed.any(), "crafted scenario must contain removed steps"
        assert batch.truncation.any()
    # world 1 (rows 4..7) ended at step 6 (column 5); slot 0 is active there
    assert batch.terminal[4, 5] and batch.terminal[4].sum() == 1
    assert not batch.loss_mask[4, 6:].any()
    assert batch.terminal[0, H - 1]
    with torch.no_grad():
        logits, values = pol(batch.obs, batch.terminal, batch.removed)
        logp = pol.log_prob(logits, batch.actions)
    keep = ~batch.removed
    torch.testing.assert_close(values[keep], batch.values[keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logp[keep], batch.logprobs[keep], atol=1e-5, rtol=1e-5)
    stop = batch.bootstrap_stop()
    assert stop[:, -1].all()
    assert torch.equal(stop[:, :-1], (batch.terminal | batch.truncation | batch.removed)[:, :-1] | ~batch.loss_mask[:, 1:])


def test_rollout_memory_kept_on_truncation_cleared_on_terminal():
    """Mid-row truncation keeps the KV cache (the next step's value differs from a fresh-memory
    value); a terminal clears it (equals a fresh-memory value)."""
    env = FakeEnv(num_worlds=1, num_slots=2, horizon=10, trial_length=4, early_truncate_world=None)
    pol = small_policy(env)
    buf = RolloutBatch.empty(2, 10, env.obs_dim, False, 1, "cpu")
    cache = pol.init_cache(2, 10)
    _, batch = collect_rollout(env, pol, env.reset(seed=0), buf, cache)
    assert batch.truncation[:, 3].all()
    with torch.no_grad():
        fresh = pol.init_cache(2, 10)
        _, v_fresh, _ = pol.forward_eval(batch.obs[:, 4], fresh, batch.removed[:, 4])
    assert (v_fresh - batch.values[:, 4]).abs().max() > 1e-4  # memory kept across the trial boundary
    # terminal: the first step of the next rollout equals a fresh-cache step (cache cleared)
    obs = env.reset(seed=5)
    _, batch2 = collect_rollout(env, pol, obs, buf, cache)
    with torch.no_grad():
        _, v0, _ = pol.forward_eval(batch2.obs[:, 0], pol.init_cache(2, 10))
    torch.testing.assert_close(v0, batch2.values[:, 0])


# ---------------------------------------------------------------------------------------- resume
def _cfg(tmp_path, **kw):
    base = dict(
        num_worlds=3, total_timesteps=1, learning_rate=3e-3, device="cpu", seed=0, log_dir=str(tmp_path / "runs"),
        run_name="r", quiet=True, num_threads=1, policy=PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16),
    )
    base.update(kw)
    return TrainConfig(**base)


def test_train_resume_continues_from_saved_step_and_weights(tmp_path):
    env = FakeEnv(num_worlds=3, num_slots=4, horizon=12, all_active=True)
    out = train(_cfg(tmp_path, total_timesteps=2 * 12 * 12 - 1), env=env)
    assert out["update"] == 2 and out["checkpoint"]
    ck = torch.load(out["checkpoint"], weights_only=True)
    assert ck["update"] == 2 and ck["global_step"] == out["global_step"]
    saved = {k: v.clone() for k, v in ck["model"].items()}
    saved_adam_steps = [s["step"].item() for s in ck["optimizer"]["state"].values()]
    # resume for one more update with lr 0: weights must stay exactly the saved ones
    env2 = FakeEnv(num_worlds=3, num_slots=4, horizon=12, all_active=True)
    cfg2 = _cfg(tmp_path, total_timesteps=ck["global_step"] + 1, learning_rate=0.0, resume=out["checkpoint"],
                run_name="ignored")
    out2 = train(cfg2, env=env2)
    assert out2["update"] == 3 and out2["reports"][0]["update"] == 3
    assert out2["reports"][0]["global_step"] > ck["global_step"]
    ck2 = torch.load(out2["checkpoint"], weights_only=True)
    for k, v in saved.items():
        assert torch.equal(ck2["model"][k], v), k
    adam_steps = [s["step"].item() for s in ck2["optimizer"]["state"].values()]
    assert all(b > a for a, b in zip(saved_adam_steps, adam_steps))  # optimizer state continued
    # the same run directory and JSONL continue (formerly a new directory)
    assert out2["run_dir"] == out["run_dir"] and not (tmp_path / "runs" / "ignored").exists()
    lines = [json.loads(x) for x in (tmp_path / "runs" / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in lines] == [2, 3]
    assert lines[1]["time"] >= lines[0]["time"]


def test_train_learns_on_fake_env(tmp_path):
    """The trainer improves the goal rate of the toy task (real PPO signal end to end)."""
    env = FakeEnv(num_worlds=8, num_slots=4, horizon=12, seed=1)
    out = train(_cfg(tmp_path, num_worlds=8, total_timesteps=5_000, learning_rate=3e-3), env=env)
    goals = [r["goal_reached"] for r in out["reports"] if "goal_reached" in r]
    first, last = sum(goals[:3]) / 3, sum(goals[-3:]) / 3
    assert last > first + 0.15, goals


def test_train_uses_a_hook_object_passed_as_library(tmp_path):
    """`train(cfg, hook=obj)` runs the given hook once per rollout, on device tensors; dropping
    every step leaves the weights untouched (no optimizer step)."""
    from train.experience import ExperienceHook

    class DropAll(ExperienceHook):
        calls = 0

        def preprocess_unroll_experience(self, batch):
            DropAll.calls += 1
            assert batch.loss_mask.device.type == "cpu"
            batch.loss_mask.zero_()
            return batch, batch.loss_mask.sum()

    env = FakeEnv(num_worlds=3, num_slots=4, horizon=12, all_active=True)
    torch.manual_seed(0)
    out = train(_cfg(tmp_path, total_timesteps=2 * 12 * 12 - 1), env=env, hook=DropAll())
    assert DropAll.calls == 2 and out["update"] == 2
    ck = torch.load(out["checkpoint"], weights_only=True)
    assert ck["optimizer"]["state"] == {}  # Adam never stepped


def test_bad_resume_path_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        train(_cfg(tmp_path, resume=str(tmp_path / "missing.pt")), env=FakeEnv())


# ---------------------------------------------------------------------------------------- CLI smoke
@pytest.mark.slow
def test_run_py_smoke_subprocess(tmp_path):
    """`python train/run.py` end to end on the shipped real scenarios with a tiny budget, from a
    different cwd; then `train/evaluate.py` on its checkpoint."""
    if not any((REPO / "data" / "womd_sample").glob("*.json*")):
        pytest.fail("data/womd_sample is empty: the bundled scenarios are missing")
    env = dict(os.environ, GPUSIM_BACKEND="torch")
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, str(REPO / "train" / "run.py"), "--num-worlds", "2", "--total-timesteps", "300",
           "--log-dir", str(tmp_path / "runs"), "--run-name", "smoke", "--policy.d-model", "16",
           "--policy.n-layers", "1", "--env.scenario-length", "10", "--quiet"]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "runs" / "smoke" / "metrics.jsonl").read_text().splitlines()]
    assert lines and lines[-1]["global_step"] >= 300
    assert all(k in lines[-1] for k in ("sps", "pg_loss", "v_loss", "entropy"))
    ck = tmp_path / "runs" / "smoke" / "checkpoint.pt"
    assert ck.exists()
    r = subprocess.run([sys.executable, str(REPO / "train" / "evaluate.py"), "--policy", str(ck),
                        "--num-worlds", "2", "--json", str(tmp_path / "eval.json"), "--quiet"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "eval.json").read_text())["runs"][0]["summary"]
    assert 0.0 <= res["goal_reached"]["mean"] <= 1.0


def test_cli_parses_env_enums_by_name():
    from train.config import parse_args

    cfg = parse_args(["--env.goal-behavior", "respawn", "--num-worlds", "5", "--experience", "drop",
                      "--experience-arg", "rows=even"])
    assert str(cfg.env.goal_behavior) == "respawn" and cfg.num_worlds == 5
    assert cfg.experience_arg == ("rows=even",)
