"""Driving styles (reward conditioning): per-agent weights drawn per episode and kept across
trials, the conditioned reward against a hand-computed sum on a crafted scene, the observation
block, off = unchanged, and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from synthetic import KERNEL_DEVICE, driver, lane, parked, small_config, synthetic_pack, torch_reference_config

from gpusim.config import EnvConfig
from gpusim.env import DriveEnv
from gpusim.kernels.dynamics import NUM_STEER
from gpusim.styles import DEFAULT_RANGES, NUM_STYLE_TERMS, STYLES, style_values

COAST = 3 * NUM_STEER + 6  # accel 0, steer 0
# fixed ego style inside the default ranges: goal 1, collision -0.5, offroad -0.5, red light 0,
# overspeed -0.02 per m/s, accel -0.004 per m/s^2, yaw rate -0.02 per rad/s, time -0.005, target 5 m/s
STYLE = (1.0, -0.5, -0.5, 0.0, -0.02, -0.004, -0.02, -0.005, 5.0)


def cfg(**kw):
    base = dict(max_agents=8, max_controlled=4, num_partners=7, num_roads=16, scenario_length=30,
                goal_behavior="stop", reward_conditioning=True)
    base.update(kw)
    return EnvConfig(**base)


def one_driver_pack():
    # 5 m/s along +x on a lane, goal at x = 10.3; a parked car far away
    return synthetic_pack([{"agents": [driver(0, 0, 0.0, 5.0, (10.3, 0.0)), parked(0, 30)], "num_controlled": 1,
                            "roads": lane()}], small_config())


def two_driver_pack():
    return synthetic_pack([{"agents": [driver(0, 0, 0.0, 5.0, (60.0, 0.0)), driver(0, 4, 0.0, 5.0, (60.0, 4.0)),
                                       driver(0, 8, 0.0, 5.0, (60.0, 8.0))], "num_controlled": 3,
                            "roads": lane()}], small_config())


@pytest.mark.parametrize("cpu_kernels", [True, False])
def test_reward_is_the_hand_computed_weighted_sum(cpu_kernels):
    env = DriveEnv(one_driver_pack(), 2, cfg(style=STYLE, cpu_kernels=cpu_kernels))
    env.reset(seed=0)
    # step 1: accel +4 m/s^2 (index 6), steer 0.5 rad (index 9): v' = 5.4 m/s
    r1 = env.step(torch.full((2, 4), 6 * NUM_STEER + 9, dtype=torch.int64))
    tan_d = math.tan(0.5)
    yaw = 5.4 * math.cos(math.atan(0.5 * tan_d)) * tan_d / 4.5  # kinematic bicycle, L = 4.5 m
    want = -0.02 * (5.4 - 5.0) - 0.004 * 4.0 - 0.02 * yaw - 0.005
    assert r1.reward[:, 0].tolist() == pytest.approx([want, want], abs=1e-6)
    assert (r1.reward[:, 1:] == 0).all()  # empty slots
    # coast to the goal: the step of arrival pays goal + overspeed + time (no accel, no yaw)
    env.reset(seed=0)
    res = [env.step(torch.full((2, 4), COAST, dtype=torch.int64)) for _ in range(18)]
    goal_step = next(i for i, r in enumerate(res) if r.reward[0, 0] > 0.5)
    assert goal_step == 16  # as without styles (test_env_behaviors: x >= 8.3 at step 17)
    assert res[goal_step].reward[0, 0].item() == pytest.approx(1.0 - 0.005, abs=1e-6)  # 5 m/s = target
    assert res[3].reward[0, 0].item() == pytest.approx(-0.005, abs=1e-6)  # time cost only
    assert res[17].reward[0, 0].item() == 0.0  # stopped at the goal: invalid step, no cost


def test_weights_drawn_per_agent_in_range_and_kept_across_trials():
    config = cfg(goal_behavior="trial", k_trials=2, scenario_length=6)
    env = DriveEnv(two_driver_pack(), 3, config, seed=5)
    env.reset(seed=5)
    s0 = env.state.style.clone()
    lo = torch.tensor([r[0] for r in DEFAULT_RANGES])
    hi = torch.tensor([r[1] for r in DEFAULT_RANGES])
    assert s0.shape == (3, 8, NUM_STYLE_TERMS)
    assert ((s0 >= lo) & (s0 <= hi)).all()
    assert not torch.equal(s0[0, 0], s0[0, 1]) and not torch.equal(s0[0, 0], s0[1, 0])  # per agent, per world
    for t in range(11):  # the second trial starts at step 6: the weights stay
        env.step(torch.full((3, 4), COAST, dtype=torch.int64))
        assert torch.equal(env.state.style, s0), t
    env.step(torch.full((3, 4), COAST, dtype=torch.int64))  # step 12 ends the episode: new draw
    assert not torch.equal(env.state.style, s0)


def test_observation_block_holds_own_normalised_weights():
    env = DriveEnv(two_driver_pack(), 2, cfg(), seed=1)
    obs = env.reset(seed=1)
    lay = env.obs_layout
    assert lay.style_dim == NUM_STYLE_TERMS and lay.style == slice(lay.obs_dim - NUM_STYLE_TERMS, lay.obs_dim)
    lo = torch.tensor([r[0] for r in DEFAULT_RANGES])
    hi = torch.tensor([r[1] for r in DEFAULT_RANGES])
    want = (env.state.style[:, :3] - lo) / (hi - lo)
    assert torch.allclose(obs[:, :3, lay.style], want, atol=1e-6)
    assert (obs[:, 3, lay.style] == 0).all()  # empty slot
    r = env.step(torch.full((2, 4), COAST, dtype=torch.int64))
    assert torch.allclose(r.obs[:, :3, lay.style], want, atol=1e-6)
    # a fixed ego style shows its normalised values, e.g. target speed 5 m/s -> 0, goal 1.0 -> 0.5
    env2 = DriveEnv(two_driver_pack(), 1, cfg(style=STYLE), seed=1)
    o2 = env2.reset(seed=1)
    assert o2[0, 0, lay.style][-1].item() == 0.0 and o2[0, 0, lay.style][0].item() == pytest.approx(0.5)


def test_partner_styles_table_applied_at_episode_start():
    cau, agg = STYLES["cautious"], STYLES["aggressive"]
    config = cfg(ego_slots=1, ego_choice="first", style=STYLES["default"], partner_styles=(cau, agg))
    env = DriveEnv(two_driver_pack(), 16, config, seed=2)
    env.reset(seed=2)
    s = env.state.style
    assert torch.equal(s[:, 0], torch.tensor(STYLES["default"]).expand(16, -1))
    rows = {tuple(s[w, 1].tolist()) for w in range(16)}
    assert rows == {tuple(torch.tensor(cau).tolist()), tuple(torch.tensor(agg).tolist())}  # both drawn
    assert torch.equal(s[:, 1], s[:, 2])  # one partner style per world


def test_off_draws_nothing_and_keeps_the_observation():
    base = dict(max_agents=8, max_controlled=4, num_partners=7, num_roads=16, scenario_length=30)
    env = DriveEnv(two_driver_pack(), 2, EnvConfig(**base), seed=3)
    on = DriveEnv(two_driver_pack(), 2, EnvConfig(**base, reward_conditioning=True), seed=3)
    o_off, o_on = env.reset(seed=3), on.reset(seed=3)
    assert (env.state.style == 0).all() and env.obs_layout.style_dim == 0
    assert o_on.shape[-1] == o_off.shape[-1] + NUM_STYLE_TERMS
    assert torch.equal(o_on[..., : o_off.shape[-1]], o_off)  # the other blocks are unchanged
    # conditioning on draws after the roles: the scenario draw (first) is the same
    assert torch.equal(env.state.scenario, on.state.scenario)


def test_triton_backend_matches_torch_with_styles():
    from gpusim.backend import use_backend

    config = cfg(scenario_length=5, num_signals=0)
    env_t = DriveEnv(two_driver_pack(), 2, config, seed=1, device=KERNEL_DEVICE)
    env_r = DriveEnv(two_driver_pack(), 2, torch_reference_config(config), seed=1, device=KERNEL_DEVICE)
    with use_backend("triton"):
        o_t = env_t.reset()
    with use_backend("torch"):
        o_r = env_r.reset()
    assert torch.allclose(o_t, o_r, atol=1e-5)
    g = torch.Generator().manual_seed(0)
    for _ in range(6):  # crosses the auto-reset (a new draw)
        a = torch.randint(0, 91, (2, 4), generator=g).to(KERNEL_DEVICE)
        with use_backend("triton"):
            rt = env_t.step(a)
        with use_backend("torch"):
            rr = env_r.step(a)
        assert torch.allclose(rt.reward, rr.reward, atol=1e-6)
        assert torch.allclose(rt.obs, rr.obs, atol=1e-4)


@pytest.mark.parametrize("kw, match", [
    (dict(style=(float("nan"),) + STYLE[1:]), r"EnvConfig\.style\[0\] must be a finite number, got nan"),
    (dict(style=STYLE[:-1] + (30.0,)), r"target_speed = 30.0 is outside"),
    (dict(style=STYLE[:3]), r"expected 9 numbers"),
    (dict(partner_styles=(STYLE[:-1] + (1.0,),)), r"partner_styles: target_speed = 1.0"),
    (dict(reward_ranges=((1.0, 0.0),) + DEFAULT_RANGES[1:]), r"goal range \(1.0, 0.0\)"),
    (dict(reward_conditioning=False, style=STYLE), r"needs reward_conditioning=True"),
])
def test_bad_style_config_one_clear_line(kw, match):
    with pytest.raises(ValueError, match=match) as err:
        cfg(**kw)
    assert "\n" not in str(err.value)


def test_style_names_and_explicit_values():
    assert style_values("cautious") == STYLES["cautious"]
    assert style_values("1,-0.5,-0.5,0,0,0,0,0,10") == (1.0, -0.5, -0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 10.0)
    with pytest.raises(ValueError, match="unknown style 'reckless'; named styles: cautious, default, aggressive"):
        style_values("reckless")
    for name in STYLES:  # every named style lies in the default ranges
        style_values(name)


def test_c_kernels_match_torch_reference_on_real_scenes(sample_dir):
    """Real scenes, conditioning on: the C path (observation kernel writing around the style block)
    and the torch reference give the same rewards and observations, across steps."""
    from gpusim.data import ScenarioPack

    files = sorted(sample_dir.glob("*.json*"))[:4]
    cfgs = [EnvConfig(max_controlled=8, reward_conditioning=True, cpu_kernels=ck) for ck in (True, False)]
    pack = ScenarioPack.from_json(files, cfgs[0].data_config())
    envs = [DriveEnv(pack, 3, c, seed=1) for c in cfgs]
    o = [e.reset(seed=1) for e in envs]
    assert torch.allclose(o[0], o[1], atol=1e-5)
    assert (o[0][..., envs[0].obs_layout.style] != 0).any()
    g = torch.Generator().manual_seed(0)
    for t in range(8):
        a = torch.randint(0, 91, (3, 8), generator=g)
        r = [e.step(a) for e in envs]
        assert torch.allclose(r[0].reward, r[1].reward, atol=1e-6), t
        assert torch.allclose(r[0].obs, r[1].obs, atol=1e-4), t
    assert (r[0].reward != 0).any()
