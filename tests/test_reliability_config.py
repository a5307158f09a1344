"""Non-finite values are named wherever they come from: every float field of every config class
refuses NaN and infinity (constructor, command-line flag, config file), radii must be > 0 while
reward weights take any finite value, a non-finite loss stops training at its update with the last
good checkpoint kept, and NaN logits are an error of the env's action check (sync: at the step;
async: at the next host read) instead of an action."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import re
import typing

import pytest
import torch

from gpusim.config import DataConfig, EnvConfig
from policy import PolicyConfig
from train.checkpoint import load_checkpoint
from train.config import TrainConfig, hook_code, load_config_file, parse_args
from train.experience import HOOKS, ExperienceHook
from train.ppo import NonFiniteLoss, PPOConfig, check_losses
from train.run import main, train

from test_resume import ENV, _fcfg, small_pack  # noqa: F401  (small_pack: a fixture)
from test_train_run import FakeEnv

NAN, INF = float("nan"), float("inf")


def float_fields(cls) -> list[str]:
    """The fields of dataclass ``cls`` whose type admits a float (``float``, ``float | None``)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if t is float or float in typing.get_args(t):
            out.append(f.name)
    return out


CASES = [(cls, name) for cls in (EnvConfig, DataConfig, PPOConfig, PolicyConfig, TrainConfig)
         for name in float_fields(cls)]


def test_the_float_fields_are_found():
    """The parametrisation below covers the fields the issue named (so it cannot pass empty)."""
    names = {f"{c.__name__}.{n}" for c, n in CASES}
    assert {"EnvConfig.reward_goal", "EnvConfig.goal_radius", "EnvConfig.dt", "EnvConfig.partner_radius",
            "DataConfig.grid_margin", "PPOConfig.gamma", "PPOConfig.vf_clip_coef", "PolicyConfig.init_log_std",
            "TrainConfig.learning_rate"} <= names


@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("cls,name", CASES, ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_every_float_field_refuses_non_finite(cls, name, value):
    """Formerly EnvConfig(dt=nan), reward_goal nan, goal_radius nan ... were accepted."""
    with pytest.raises(ValueError, match=rf"^{cls.__name__}\.{name} must be a finite number, got {value}$"):
        cls(**{name: value})


def test_style_tuples_are_checked_too():
    with pytest.raises(ValueError, match=r"^EnvConfig\.reward_ranges\[8\]\[1\] must be a finite number, got nan$"):
        EnvConfig(reward_conditioning=True, reward_ranges=[(0.0, 1.0)] * 8 + [(1.0, NAN)])
    with pytest.raises(ValueError, match=r"^EnvConfig\.style\[0\] must be a finite number, got inf$"):
        EnvConfig(reward_conditioning=True, style=(INF,) + (1.0,) * 8)


def test_reward_weights_take_any_finite_value_radii_must_be_positive():
    cfg = EnvConfig(reward_goal=1e6, reward_collision=-1e6, reward_offroad=3.0, reward_red_light=7.5)
    assert (cfg.reward_goal, cfg.reward_collision) == (1e6, -1e6)
    for name in ("partner_radius", "road_radius", "goal_radius", "dt"):
        with pytest.raises(ValueError, match=rf"EnvConfig\.{name} must be > 0"):
            EnvConfig(**{name: 0.0})


def _plain(text: str) -> str:
    """tyro's boxed error text as one line of words."""
    return re.sub(r"[\s│╭╮╰╯─]+", " ", text)


@pytest.mark.parametrize("flag,owner", [("--env.reward-goal", "EnvConfig.reward_goal"),
                                        ("--env.goal-radius", "EnvConfig.goal_radius"),
                                        ("--ppo.gamma", "PPOConfig.gamma"),
                                        ("--learning-rate", "TrainConfig.learning_rate")])
def test_flags_refuse_non_finite(flag, owner, capsys):
    """Formerly `train/run.py --env.reward-goal nan` trained on NaN losses and exited 0."""
    with pytest.raises(SystemExit) as e:
        parse_args([flag, "nan", "--device", "cpu"])
    assert e.value.code == 2
    assert f"{owner} must be a finite number, got nan" in _plain(capsys.readouterr().err)


def test_partner_radius_zero_flag_is_named(capsys):
    """Formerly a ZeroDivisionError traceback."""
    with pytest.raises(SystemExit):
        parse_args(["--env.partner-radius", "0", "--device", "cpu"])
    assert "EnvConfig.partner_radius must be > 0 (m), got 0.0" in _plain(capsys.readouterr().err)


@pytest.mark.parametrize("data,owner", [({"env": {"reward_goal": NAN}}, "env: EnvConfig.reward_goal"),
                                        ({"ppo": {"ent_coef": INF}}, "ppo: PPOConfig.ent_coef"),
                                        ({"adam_eps": NAN}, "TrainConfig.adam_eps")])
def test_config_files_refuse_non_finite(tmp_path, data, owner):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))  # JSON's NaN / Infinity literals, as Python writes them
    with pytest.raises(ValueError, match=rf"^--config {re.escape(str(path))}: {re.escape(owner)} must be a finite"):
        load_config_file(path)


# ------------------------------------------------------------------------------ non-finite loss
class NanRewardsAt(ExperienceHook):
    """The identity hook, except that the rewards of the ``at``-th rollout (1-based) become NaN."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.calls = at, 0

    def preprocess_unroll_experience(self, batch):
        self.calls += 1
        if self.calls == self.at:
            batch = batch.replace(rewards=torch.full_like(batch.rewards, NAN))
        return batch, batch.loss_mask.sum()


def test_non_finite_loss_stops_at_its_update_and_keeps_the_last_checkpoint(tmp_path):
    """Formerly the NaN update trained on, saved all-NaN weights and the run exited 0."""
    cfg = _fcfg(tmp_path, total_timesteps=10_000, checkpoint_interval=1)
    with pytest.raises(NonFiniteLoss, match=r"^update 3: non-finite loss \(pg_loss nan, v_loss nan.*\); training "
                                            r"stopped before saving this update") as e:
        train(cfg, env=FakeEnv(num_worlds=2), hook=NanRewardsAt(3))
    assert "\n" not in str(e.value)
    ck = load_checkpoint(pathlib.Path(cfg.log_dir) / "r" / "checkpoint.pt")  # refuses NaN weights
    assert ck["update"] == 2
    assert all(torch.isfinite(t).all() for t in ck["model"].values())


def test_cli_non_finite_loss_is_one_line_exit_2(tmp_path, small_pack, capsys):  # noqa: F811
    """A NaN that no config holds (the relabel hook's scale) is caught by the loss check."""
    log = tmp_path / "runs"
    rc = main(["--data", str(small_pack), "--device", "cpu", "--num-worlds", "2", "--total-timesteps", "300",
               "--env.max-controlled", "8", "--env.scenario-length", "10", "--policy.d-model", "16",
               "--policy.n-layers", "1", "--policy.n-heads", "2", "--policy.hidden", "16", "--policy.max-roads", "8",
               "--experience", "relabel", "--experience-arg", "scale=nan", "--log-dir", str(log),
               "--run-name", "x", "--quiet", "--num-threads", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "update 1: non-finite loss" in err[0]
    assert not (log / "x" / "checkpoint.pt").exists()


def test_check_losses_names_every_bad_term():
    check_losses({"pg_loss": torch.tensor(0.5), "v_loss": torch.tensor(2.0)}, 4)
    with pytest.raises(NonFiniteLoss, match=r"^update 7: non-finite loss \(v_loss inf, grad_norm nan\)"):
        check_losses({"pg_loss": torch.tensor(0.5), "v_loss": torch.tensor(INF), "grad_norm": torch.tensor(NAN)}, 7)


# ----------------------------------------------------------------------------------- NaN logits
def _env(small_pack, continuous=False, mode="sync"):  # noqa: F811
    from gpusim import DriveEnv, ScenarioPack

    cfg = EnvConfig(**ENV, check_actions=mode, action_space="continuous" if continuous else "discrete")
    return DriveEnv(ScenarioPack.load(small_pack), 2, config=cfg, seed=0)


def _actor(env, poison: float, deterministic):
    from policy.actor import Actor
    from policy.actor_critic import ActorCritic

    torch.manual_seed(0)
    cont = env.config.action_space.name.lower() == "continuous"
    pol = ActorCritic(env.obs_layout, env.num_actions, cont,
                      PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16, max_roads=8)).eval()
    with torch.no_grad():
        pol.actor.bias[0] = poison  # one logit of every row: NaN or +inf
    return Actor(pol, env.num_worlds * env.num_slots, env.horizon, deterministic=deterministic)


@pytest.mark.parametrize("deterministic", [False, True, "mean"])
@pytest.mark.parametrize("poison", [NAN, INF], ids=["nan", "inf"])
def test_nan_logits_are_an_error_in_sync_mode(small_pack, deterministic, poison):  # noqa: F811
    """Formerly argmax over NaN logits picked an action and the episode went on."""
    env = _env(small_pack)
    actor = _actor(env, poison, deterministic)
    obs = env.reset(seed=0)
    act = actor.act(obs.reshape(-1, obs.shape[-1]))
    with pytest.raises(ValueError, match=r"logits are NaN or infinite, so it drew no action"):
        env.step(actor.env_action(act.action).reshape(env.num_worlds, env.num_slots))


def test_nan_logits_are_recorded_on_the_device_in_async_mode(small_pack):  # noqa: F811
    env = _env(small_pack, mode="async")
    actor = _actor(env, NAN, False)
    obs = env.reset(seed=0)
    for _ in range(2):  # no host read in the step: the error waits for the next one
        act = actor.act(obs.reshape(-1, obs.shape[-1]))
        obs = env.step(act.action.reshape(env.num_worlds, env.num_slots)).obs
    with pytest.raises(ValueError, match=r"bad action at env step 1, world 0, slot 0: the policy's logits are NaN"):
        env.check_errors()


def test_infinite_continuous_output_is_an_error(small_pack):  # noqa: F811
    """Formerly an infinite Gaussian mean was clamped to 1 and driven."""
    env = _env(small_pack, continuous=True)
    actor = _actor(env, INF, True)
    obs = env.reset(seed=0)
    act = actor.act(obs.reshape(-1, obs.shape[-1]))
    assert torch.isnan(act.action).all(dim=-1).all()
    with pytest.raises(ValueError, match=r"continuous actions contain NaN \(from a policy"):
        env.step(actor.env_action(act.action).reshape(env.num_worlds, env.num_slots, 2))


def test_finite_logits_sample_as_before():
    from policy.actor_critic import ActorCritic
    from policy.encoders import ObsDims

    pol = ActorCritic(ObsDims(4, 2, 3, 3, 4), 91, False, PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16))
    logits = torch.randn(5, 91)
    assert torch.equal(pol.sample(logits, True), logits.argmax(-1))
    logits[2, 7] = NAN
    got = pol.sample(logits, True)
    assert got[2].item() < 0 and torch.equal(got[[0, 1, 3, 4]], logits[[0, 1, 3, 4]].argmax(-1))
    assert math.isnan(pol.log_prob(logits, got)[2].item())  # the log-prob reads a valid index: no device error


def test_hook_code_names_what_would_be_imported():
    assert all(hook_code(name) is None for name in HOOKS)  # the shipped hooks import nothing
    assert hook_code("drop", ["rows=even"]) is None
    assert hook_code("os:system") == "os:system"
    assert hook_code("drop", ["rows=odd", "predicate=pkg.mod:fn"]) == "pkg.mod:fn"
