"""HR-PPO (train/human.py, train/ppo.py): the KL(pi || pi_BC) term by hand, in the PPO loss, the
refusal of a BC policy made for another observation layout, action space or dynamics, BC
initialisation with a value warm-up, the KL logged per update, and the BC file's SHA-256 on resume."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import pytest
import torch

from gpusim.config import EnvConfig
from gpusim.data import ScenarioPack
from gpusim.env import DriveEnv
from policy.actor_critic import ActorCritic, PolicyConfig
from policy.encoders import ObsDims
from train.config import TrainConfig, UserError
from train.ppo import PPOConfig, policy_kl, ppo_loss

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "womd_sample"
FILES = ["db4edc9bd0c9d18c.json.xz", "b5f53fa2db40a6b4.json.xz"]
ENV = dict(max_controlled=8, scenario_length=10, collision_behavior="remove", offroad_behavior="remove")
SMALL = PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16, max_roads=8)


@pytest.fixture(scope="module")
def pack_dir(tmp_path_factory):
    pack = ScenarioPack.from_json([SAMPLE / f for f in FILES], EnvConfig(**ENV).data_config())
    return pack.save(tmp_path_factory.mktemp("pack") / "p")


def _bc(pack_dir, out, epochs=1, **env):
    """Write a BC checkpoint (train/bc.py) of the small setting (``env``: EnvConfig changes) to ``out``."""
    from train.bc import BCConfig, train_bc

    train_bc(BCConfig(data=str(pack_dir), out=str(out), epochs=epochs, device="cpu", num_worlds=2, policy=SMALL,
                      env=EnvConfig(**{**ENV, **env}), quiet=True), say=lambda *_: None)
    return out


@pytest.fixture(scope="module")
def bc_file(pack_dir, tmp_path_factory):
    """A BC checkpoint (one epoch) of the small setting."""
    return _bc(pack_dir, tmp_path_factory.mktemp("bc") / "bc.pt")


def _env(pack_dir, **kw):
    return DriveEnv(ScenarioPack.load(pack_dir), 2, EnvConfig(**{**ENV, **kw}))


def _pair(env, continuous=False, seed=0):
    torch.manual_seed(seed)
    a = ActorCritic(ObsDims.from_layout(env.obs_layout), 2 if continuous else env.num_actions, continuous, SMALL)
    b = ActorCritic(ObsDims.from_layout(env.obs_layout), 2 if continuous else env.num_actions, continuous, SMALL)
    return a, b


def test_kl_by_hand_discrete_and_continuous(pack_dir):
    env = _env(pack_dir)
    p, q = _pair(env)
    # two actions with mass: p = (1/4, 3/4), q = (1/2, 1/2); every other logit -inf-like
    lp = torch.full((1, env.num_actions), -1e9)
    lq = lp.clone()
    lp[0, :2] = torch.tensor([0.0, math.log(3.0)])
    lq[0, :2] = 0.0
    want = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    assert policy_kl(p, lp, q, lq).item() == pytest.approx(want, abs=1e-6)
    assert policy_kl(p, lp, p, lp).item() == pytest.approx(0.0, abs=1e-7)
    # Gaussians: N(0, 1) against N(1, 2^2) on each of 2 dimensions: 2 * (ln 2 + (1 + 1) / 8 - 1/2)
    gp, gq = _pair(env, continuous=True)
    with torch.no_grad():
        gp.log_std.fill_(0.0)
        gq.log_std.fill_(math.log(2.0))
    kl = policy_kl(gp, torch.zeros(1, 2), gq, torch.ones(1, 2))
    assert kl.item() == pytest.approx(2 * (math.log(2.0) + 0.25 - 0.5), abs=1e-6)
    assert policy_kl(gp, torch.zeros(1, 2), gp, torch.zeros(1, 2)).item() == pytest.approx(0.0, abs=1e-7)


def _minibatch(env, policy):
    from train.rollout import RolloutBatch, collect_rollout

    buf = RolloutBatch.for_env(env, False)
    obs = env.reset(seed=0)
    collect_rollout(env, policy, obs, buf, policy.init_cache(env.num_worlds * env.num_slots, env.horizon))
    return {"obs": buf.obs, "actions": buf.actions, "logprobs": buf.logprobs, "values": buf.values,
            "rewards": buf.rewards, "terminal": buf.terminal, "removed": buf.removed, "loss_mask": buf.loss_mask,
            "bootstrap_stop": buf.bootstrap_stop()}


def test_kl_term_is_zero_for_the_same_policy_and_adds_coef_times_kl_otherwise(pack_dir):
    env = _env(pack_dir)
    pi, other = _pair(env, seed=1)
    with torch.no_grad():  # a BC policy that differs visibly from pi
        other.actor.weight.normal_(0.0, 0.5)
    mb = _minibatch(env, pi)
    cfg = PPOConfig(human_kl=0.3, human_policy="bc.pt")
    base, _ = ppo_loss(pi, mb, cfg)
    same, s_same = ppo_loss(pi, mb, cfg, human=pi)
    assert s_same["human_kl"].item() == pytest.approx(0.0, abs=1e-6)
    assert same.item() == pytest.approx(base.item(), abs=1e-6)
    diff, s_diff = ppo_loss(pi, mb, cfg, human=other)
    kl = s_diff["human_kl"].item()
    assert kl > 0.01
    assert diff.item() - base.item() == pytest.approx(0.3 * kl, rel=1e-4)
    # the gradient reaches the policy through the KL term
    pi.zero_grad()
    (diff - base.detach()).backward()
    assert pi.actor.weight.grad.abs().sum() > 0
    # value warm-up: the loss is the value term only
    vonly, s = ppo_loss(pi, mb, cfg, human=other, value_only=True)
    assert vonly.item() == pytest.approx(cfg.vf_coef * s["v_loss"].item(), rel=1e-6)


def test_config_refuses_a_coefficient_without_a_policy():
    with pytest.raises(ValueError, match="human_kl > 0 needs human_policy"):
        PPOConfig(human_kl=0.1)
    with pytest.raises(ValueError, match="must be >= 0"):
        PPOConfig(value_warmup=-1)


def test_a_human_policy_of_another_layout_action_space_or_dynamics_is_refused(pack_dir, bc_file, tmp_path):
    from train.checkpoint import load_checkpoint
    from train.human import load_frozen

    env = _env(pack_dir)
    policy, _, _ = load_frozen(str(bc_file), "--ppo.human-policy", env, env.config)  # the matching run: accepted
    assert not any(p.requires_grad for p in policy.parameters())
    # another observation layout (no signal block)
    no_sig = _env(pack_dir, num_signals=0)
    with pytest.raises(UserError) as e:
        load_frozen(str(bc_file), "--ppo.human-policy", no_sig, no_sig.config)
    msg = str(e.value)
    assert msg.startswith(f"--ppo.human-policy {bc_file}: the policy reads observations") and "\n" not in msg
    # another action space
    cont = _env(pack_dir, action_space="continuous")
    with pytest.raises(UserError, match="2 continuous"):
        load_frozen(str(bc_file), "--ppo.human-policy", cont, cont.config)
    # other dynamics settings (the time step): a BC policy cloned at dt 0.2
    other = tmp_path / "dt.pt"
    _bc(pack_dir, other, dt=0.2)
    with pytest.raises(UserError, match=r"trained with dt 0.2, this run uses 0.1"):
        load_frozen(str(other), "--ppo.human-policy", env, env.config)


def _tcfg(tmp_path, data, **kw):
    base = dict(data=str(data), num_worlds=2, total_timesteps=1, device="cpu", seed=0, log_dir=str(tmp_path / "runs"),
                run_name="hr", quiet=True, num_threads=1, report_interval=1, env=EnvConfig(**ENV), policy=SMALL)
    base.update(kw)
    return TrainConfig(**base)


def test_hr_ppo_from_bc_warms_the_value_head_logs_the_kl_and_guards_the_file(pack_dir, bc_file, tmp_path):
    import shutil

    from train.checkpoint import load_checkpoint
    from train.human import SHA_KEY, file_sha256
    from train.run import train

    bc = tmp_path / "bc.pt"
    shutil.copy(bc_file, bc)
    ppo = PPOConfig(ent_coef=0.001, human_kl=0.5, human_policy=str(bc), value_warmup=1)
    first = train(_tcfg(tmp_path, pack_dir, init_policy=str(bc), ppo=ppo, total_timesteps=1))
    ckpt, bc_ckpt = load_checkpoint(first["checkpoint"]), load_checkpoint(bc)
    assert ckpt["extra"][SHA_KEY] == file_sha256(bc)
    for name, w in bc_ckpt["model"].items():  # after the warm-up update only the value head moved
        assert torch.equal(ckpt["model"][name], w) != name.startswith("critic."), name
    rec = [json.loads(x) for x in (pathlib.Path(first["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert rec[0]["human_kl"] == 0.0 and rec[0]["human_kl_coef"] == 0.5 and rec[0]["value_warmup"] == 1.0
    # one more update, now of the policy too: the KL to the BC policy grows from 0
    more = train(_tcfg(tmp_path, pack_dir, ppo=ppo, resume=first["checkpoint"], total_timesteps=first["global_step"] + 1))
    rec = [json.loads(x) for x in (pathlib.Path(more["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert rec[-1]["value_warmup"] == 0.0 and rec[-1]["human_kl"] > 0.0
    # the BC file changes: a resume is refused with one line
    _bc(pack_dir, bc, epochs=2)
    with pytest.raises(UserError) as e:
        train(_tcfg(tmp_path, pack_dir, ppo=ppo, resume=more["checkpoint"], total_timesteps=more["global_step"] + 1))
    assert "the file changed since the run's checkpoint was written" in str(e.value) and "\n" not in str(e.value)
    # and a resume that leaves the BC policy out is refused too
    with pytest.raises(UserError, match="pass both again"):
        train(_tcfg(tmp_path, pack_dir, resume=more["checkpoint"], total_timesteps=more["global_step"] + 1))
