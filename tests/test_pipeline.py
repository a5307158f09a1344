"""The step as a pipeline of stages (gpusim/sim/, docs/architecture.md): state declarations, the
dynamics registry (a toy model plugged in), adding a stage, device normalisation and the
asynchronous action check."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gpusim.config import Dynamics, EnvConfig
from gpusim.env import DriveEnv
from gpusim.sim import DYNAMICS, PIPELINE, DynamicsModel, Stage
from gpusim.sim.actions import NOOP_DISCRETE
from gpusim.state import STATE_FIELDS, TRIAL_KEEP, EnvState
from synthetic import driver, lane, parked, small_config, synthetic_pack


def _pack():
    return synthetic_pack([
        {"agents": [driver(0, 0, 0.0, 5.0, (150.0, 0.0)), driver(-20, 4, 0.0, 3.0, (80.0, 4.0)), parked(25, 30)],
         "num_controlled": 2, "roads": lane()},
        {"agents": [driver(0, 0, 0.3, 4.0, (200.0, 60.0)), parked(30, 30)], "num_controlled": 1, "roads": lane()},
    ], small_config())


def _config(**kw) -> EnvConfig:
    dc = small_config()
    base = dict(max_agents=dc.max_agents, max_controlled=dc.max_controlled, num_roads=dc.grid_k, num_partners=3,
                scenario_length=8)
    base.update(kw)
    return EnvConfig(**base)


def _coast(env):
    return torch.full((env.num_worlds, env.num_slots), NOOP_DISCRETE, dtype=torch.int64)


# ---------------------------------------------------------------------------- state declarations
def test_state_is_declared_once_and_everything_derives_from_it():
    names = [f.name for f in dataclasses.fields(EnvState)]
    assert list(STATE_FIELDS) == names
    assert set(TRIAL_KEEP) == {"scenario", "step", "trial_count", "trial_start", "slot_done", "ep_return",
                               "ep_length", "goal_reached", "ever_collided", "ever_offroad", "trial_clean",
                               "ego", "trial_reached", "ever_red_light", "style", "goal_cand", "cand_true",
                               "partner_type"}
    st = EnvState.build({"W": 2, "A": 5, "C": 3, "K": 4}, "cpu", pos=torch.ones(2, 5, 2))
    st.validate()
    assert torch.equal(st.pos, torch.ones(2, 5, 2)) and st.trial_clean.shape == (2, 3, 4)
    assert st.slot_active.shape == (2, 3) and not st.slot_active.any()
    with pytest.raises(TypeError, match="unknown fields"):
        EnvState.build({"W": 2, "A": 5, "C": 3, "K": 4}, "cpu", nope=torch.zeros(1))
    with pytest.raises(ValueError, match="EnvState.speed has dtype"):
        st.replace(speed=torch.zeros(2, 5, dtype=torch.float64)).validate()


def test_every_stage_changes_only_declared_fields_and_the_hook_sees_them_in_order():
    env = DriveEnv(_pack(), 2, _config(goal_behavior="trial", k_trials=2, scenario_length=3))
    env.reset()
    seen = []

    def hook(name, call):
        changes = call()
        seen.append(name)
        assert set(changes) <= set(STATE_FIELDS), name
        return changes

    env.stage_hook = hook
    env.step(_coast(env))
    assert seen == [s.name for s in PIPELINE]


def test_a_new_stage_is_one_entry_in_the_pipeline():
    """A stage inserted between two others (as traffic signals will be) runs in order and its
    changes reach the state seen by the later stages."""
    env = DriveEnv(_pack(), 2, _config())
    env.reset(scenarios=torch.tensor([0, 1]))

    def freeze_world_1(ctx, state, step):
        speed = state.speed.clone()
        speed[1] = 0.0
        return {"speed": speed}

    i = [s.name for s in PIPELINE].index("contacts")
    env.pipeline = PIPELINE[:i] + (Stage("freeze", freeze_world_1),) + PIPELINE[i:]
    env.step(_coast(env))
    assert (env.state.speed[1] == 0).all() and (env.state.speed[0, :2] > 0).all()


# ---------------------------------------------------------------------------- dynamics registry
def delta_forward(pos, heading, speed, length, accel, steer, moving, dt, backend=None):
    """Toy "delta" model: constant velocity along the heading; controls are ignored (and the
    step's backend: it has torch ops only)."""
    step = torch.stack([torch.cos(heading), torch.sin(heading)], dim=-1) * (speed * dt)[..., None]
    return torch.where(moving[..., None], pos + step, pos), heading.clone(), speed.clone()


def delta_inverse(pos, heading, speed, length, target_pos, target_heading, target_speed, target_valid, dt):
    """Toy inverse: no control ever helps, so zero acceleration and steering."""
    return torch.zeros_like(speed), torch.zeros_like(speed)


def test_toy_dynamics_model_through_the_registry(monkeypatch):
    """A new model = one registry entry (+ its kernel module): the env drives with it."""
    monkeypatch.setitem(DYNAMICS, Dynamics.CLASSIC, DynamicsModel(forward=delta_forward, inverse=delta_inverse))
    env = DriveEnv(_pack(), 2, _config())
    env.reset(scenarios=torch.tensor([0, 1]))
    p0, h0, v0 = env.state.pos.clone(), env.state.heading.clone(), env.state.speed.clone()
    a = env.expert_actions()
    assert torch.equal(a, _coast(env))  # zero controls, encoded
    rng = torch.randint(0, env.num_actions, (2, env.num_slots), generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        env.step(rng)  # controls are ignored by the toy model
    ctrl = env.state.controlled & env.state.present
    expect = p0 + 3 * 0.1 * v0[..., None] * torch.stack([torch.cos(h0), torch.sin(h0)], -1)
    assert torch.allclose(env.state.pos[ctrl], expect[ctrl], atol=1e-4)
    assert torch.equal(env.state.speed[ctrl], v0[ctrl])


def test_unregistered_dynamics_is_a_clear_error(monkeypatch):
    monkeypatch.delitem(DYNAMICS, Dynamics.CLASSIC)
    with pytest.raises(ValueError, match="unsupported dynamics"):
        DriveEnv(_pack(), 1, _config())


# ---------------------------------------------------------------------------- devices and actions
def test_device_is_normalised_once():
    env = DriveEnv(_pack(), 2, _config(), device="cpu:0")
    assert env.device == torch.device("cpu")
    env.reset()
    r = env.step(_coast(env))  # actions on "cpu" are accepted
    assert r.obs.device == env.device and env.state.device == env.device


def test_check_actions_modes():
    assert DriveEnv(_pack(), 1, _config()).check_actions == "sync"  # auto on the CPU
    assert DriveEnv(_pack(), 1, _config(check_actions="async")).check_actions == "async"
    with pytest.raises(ValueError, match="check_actions"):
        _config(check_actions="later")


@pytest.mark.parametrize("space", ["discrete", "continuous"])
def test_async_bad_action_is_a_noop_and_raised_at_the_next_read(space):
    cfg = _config(check_actions="async", action_space=space)
    envs = [DriveEnv(_pack(), 2, cfg, seed=5) for _ in range(2)]
    for e in envs:
        e.reset()
    good = _coast(envs[0]) if space == "discrete" else torch.full((2, envs[0].num_slots, 2), 0.5)
    noop = good.clone()
    bad = good.clone()
    if space == "discrete":
        noop[1, 0] = NOOP_DISCRETE
        bad[1, 0] = 500
    else:
        noop[1, 0] = 0.0
        bad[1, 0, 1] = float("nan")
    for e in envs:
        e.step(good)
    envs[0].step(bad)  # no error yet
    envs[1].step(noop)
    assert envs[0].state.equal(envs[1].state)  # the bad slot coasted, nothing else changed
    with pytest.raises(ValueError, match=r"env step 2, world 1, slot 0"):
        envs[0].metrics()
    envs[0].check_errors()  # reported once
    envs[0].step(good)
    assert envs[0].metrics() == {}  # usable afterwards


def test_sync_bad_action_still_raises_at_once():
    env = DriveEnv(_pack(), 2, _config(check_actions="sync"))
    env.reset()
    bad = _coast(env)
    bad[0, 1] = -1
    with pytest.raises(ValueError, match=r"must be in \[0, 91\)"):
        env.step(bad)
