"""DriveEnv on crafted synthetic scenarios: goals, contacts, STOP masking, early truncation,
REMOVE, auto-reset, determinism, action validation, metrics."""

import math

import pytest
import torch

from gpusim.config import EnvConfig, ObjectType, RoadType
from gpusim.env import DriveEnv
from gpusim.kernels.dynamics import NUM_STEER

from synthetic import (KERNEL_DEVICE, driver, lane, parked, small_config, straight_track, synthetic_pack,
                       torch_reference_config)

COAST = 3 * NUM_STEER + 6  # accel 0, steer 0: constant speed, straight on


def cfg(**kw):
    base = dict(max_agents=8, max_controlled=4, num_partners=7, num_roads=16, scenario_length=30)
    base.update(kw)
    return EnvConfig(**base)


def pack_for(scenarios):
    return synthetic_pack(scenarios, small_config())


def coast(env):
    return torch.full((env.num_worlds, env.num_slots), COAST, dtype=torch.int64)


def run(env, n, actions=None):
    out = []
    for _ in range(n):
        out.append(env.step(coast(env) if actions is None else actions))
    return out


# ---------------------------------------------------------------- goals
def test_goal_stop_reward_then_invalid_steps():
    # 5 m/s along +x, goal at x = 10.3 (radius 2): reached at the step where x >= 8.3 (step 17, x = 8.5).
    pack = pack_for([{"agents": [driver(0, 0, 0.0, 5.0, (10.3, 0.0)), parked(0, 30)], "num_controlled": 1}])
    env = DriveEnv(pack, 3, cfg(goal_behavior="stop"))
    env.reset(seed=0)
    res = run(env, 20)
    reward = torch.stack([r.reward[:, 0] for r in res])  # [20, W]
    loss = torch.stack([r.loss_mask[:, 0] for r in res])
    assert reward[16].tolist() == [1.0] * 3 and (reward[:16] == 0).all() and (reward[17:] == 0).all()
    assert loss[:17].all() and not loss[17:].any()
    assert res[16].stopped[:, 0].all() and not res[15].stopped[:, 0].any()
    assert (env.state.speed[:, 0] == 0).all()
    x_after_goal = env.state.pos[:, 0, 0].clone()
    run(env, 3)
    assert torch.equal(env.state.pos[:, 0, 0], x_after_goal)  # a stopped agent does not move
    assert not any(r.terminal.any() for r in res)  # terminal only at H


def test_goal_respawn_returns_to_initial_pose_and_keeps_goal():
    pack = pack_for([{"agents": [driver(0, 0, 0.0, 5.0, (10.3, 0.0))], "num_controlled": 1}])
    env = DriveEnv(pack, 2, cfg(goal_behavior="respawn"))
    env.reset()
    res = run(env, 29)
    rewards = torch.stack([r.reward[0, 0] for r in res])
    goal_steps = torch.nonzero(rewards == 1.0).flatten().tolist()
    assert goal_steps == [16]  # after respawn at x = 0 it needs 17 more steps (> 29 total)
    assert all(r.loss_mask[:, 0].all() for r in res)
    # right after the goal step the agent is back at its initial pose with its goal unchanged
    env2 = DriveEnv(pack, 1, cfg(goal_behavior="respawn"))
    env2.reset()
    run(env2, 17)
    assert torch.allclose(env2.state.pos[0, 0], torch.tensor([0.0, 0.0]))
    assert torch.allclose(env2.state.speed[0, 0], torch.tensor(5.0))
    assert torch.allclose(env2.state.goal[0, 0], torch.tensor([10.3, 0.0]))
    assert not env2.state.stopped[0, 0]


def test_goal_new_goal_on_lane_ahead():
    pack = pack_for([{"agents": [driver(0, 0, 0.0, 5.0, (10.3, 0.0))], "num_controlled": 1, "roads": lane()}])
    env = DriveEnv(pack, 5, cfg(goal_behavior="new_goal"), seed=3)
    env.reset()
    res = run(env, 17)
    assert (res[16].reward[:, 0] == 1.0).all()
    x = env.state.pos[:, 0, 0]
    g = env.state.goal[:, 0]
    assert torch.allclose(g[:, 1], torch.zeros(5))  # on the lane (y = 0)
    ahead = g[:, 0] - x
    assert ((ahead >= 10.0) & (ahead <= 40.0)).all(), ahead
    assert len(set(g[:, 0].tolist())) > 1  # drawn at random per world
    assert not env.state.stopped[:, 0].any()


def test_goal_new_goal_fallback_without_lanes():
    edge_far = [(-40.0, 50.0, 200.0, 50.0, int(RoadType.ROAD_EDGE))]
    pack = pack_for([{"agents": [driver(0, 0, 0.5, 5.0, (10.3 * math.cos(0.5), 10.3 * math.sin(0.5)))],
                      "num_controlled": 1, "roads": edge_far}])
    env = DriveEnv(pack, 1, cfg(goal_behavior="new_goal"))
    env.reset()
    run(env, 17)
    p, h = env.state.pos[0, 0], env.state.heading[0, 0]
    expect = p + 20.0 * torch.stack([torch.cos(h), torch.sin(h)])
    assert torch.allclose(env.state.goal[0, 0], expect, atol=1e-4)


# ---------------------------------------------------------------- contacts
def head_on(extra=(), n_ctrl=2):
    # two controlled cars closing at 10 m/s from 20 m apart; boxes 4.5 m x 2 m
    agents = [driver(0, 0, 0.0, 5.0, (100.0, 0.0)), driver(20, 0, math.pi, 5.0, (-100.0, 0.0))] + list(extra)
    return pack_for([{"agents": agents, "num_controlled": n_ctrl}])


def first_contact_step(res):
    hits = [i for i, r in enumerate(res) if r.info["collided"][0, 0]]
    return hits[0] if hits else None


def test_collision_ignore_penalises_every_contact_step():
    env = DriveEnv(head_on(), 1, cfg(collision_behavior="ignore"))
    env.reset()
    res = run(env, 25)
    k = first_contact_step(res)
    # scale 0.7: contact when the gap between centres < 0.7 * 4.5 = 3.15 m, i.e. after 17 steps
    assert k == 16
    for r in res[k:]:
        if r.info["collided"][0, 0]:
            assert r.reward[0, :2].tolist() == [-0.5, -0.5]
    assert sum(bool(r.info["collided"][0, 0]) for r in res) >= 2  # they drive through each other
    assert all(r.loss_mask[0, :2].all() for r in res)


def test_collision_stop_masks_later_steps_and_truncates_world():
    far = driver(0, 60, 0.0, 5.0, (200.0, 60.0))  # third controlled agent, never in contact
    env = DriveEnv(head_on([far], n_ctrl=3), 1, cfg(collision_behavior="stop"))
    env.reset()
    res = run(env, 25)
    k = first_contact_step(res)
    assert k == 16
    r = res[k]
    assert r.reward[0, :3].tolist() == [-0.5, -0.5, 0.0]
    assert r.loss_mask[0, :3].all()  # the contact step is a normal step
    # 2 of 3 controlled agents contact-stopped >= 0.5: the world's episode ends now for all three
    assert r.terminal[0].tolist() == [True, True, True, False]
    assert r.info["truncated"][0]
    for later in res[k + 1:]:
        assert not later.loss_mask.any() and not later.terminal.any() and (later.reward == 0).all()
    assert (env.state.speed[0, :2] == 0).all() and env.state.stopped[0, :2].all()
    m = env.metrics()
    assert m["n"] == 3 and m["collided"] == pytest.approx(2 / 3)
    assert m["episode_length"] == pytest.approx(17.0)


def test_collision_stop_below_truncation_fraction_keeps_world_running():
    # 4 controlled agents; only agent 0 hits a parked expert: 1/4 < 0.5
    agents = [driver(0, 0, 0.0, 5.0, (100.0, 0.0)), driver(0, 20, 0.0, 5.0, (100.0, 20.0)),
              driver(0, 40, 0.0, 5.0, (100.0, 40.0)), driver(0, 60, 0.0, 5.0, (100.0, 60.0)), parked(10, 0)]
    env = DriveEnv(pack_for([{"agents": agents, "num_controlled": 4}]), 1, cfg(collision_behavior="stop"))
    env.reset()
    res = run(env, 15)
    k = first_contact_step(res)
    assert k is not None
    assert not any(r.terminal.any() for r in res)
    assert not res[k + 1].loss_mask[0, 0] and res[k + 1].loss_mask[0, 1:].all()
    assert env.state.contact_stopped[0, 0] and not env.state.world_done[0]


def test_collision_remove_removes_both_agents():
    agents = [driver(0, 0, 0.0, 5.0, (100.0, 0.0)), driver(0, 30, 0.0, 5.0, (100.0, 30.0)), parked(10, 0),
              parked(-30, 30)]
    env = DriveEnv(pack_for([{"agents": agents, "num_controlled": 2}]), 1, cfg(collision_behavior="remove"))
    env.reset()
    lay = env.obs_layout
    res = run(env, 20)
    k = first_contact_step(res)
    assert k is not None and res[k].reward[0, 0] == -0.5 and res[k].loss_mask[0, 0]
    st = env.state
    assert st.removed[0, 0] and st.removed[0, 2]  # the agent and the expert it hit
    assert not st.present[0, 0] and not st.present[0, 2]
    assert not st.removed[0, 1] and st.present[0, 3]  # others stay
    assert res[k].removed[0, 0]
    for later in res[k + 1:]:
        assert not later.loss_mask[0, 0] and later.loss_mask[0, 1]
        assert later.removed[0, 0]
    # agent 1 observes agent 3 only (agent 0 and the expert are gone); partner valid flags
    partners = res[-1].obs[0, 1, lay.partners].view(lay.num_partners, lay.partner_dim)
    assert int(partners[:, -1].sum()) == 1
    assert not res[-1].obs[0, 0].any()  # a removed slot's observation is all zero


def test_offroad_stop_when_box_crosses_road_edge():
    edge = [(12.0, -10.0, 12.0, 10.0, int(RoadType.ROAD_EDGE))]
    agents = [driver(0, 0, 0.0, 5.0, (100.0, 0.0)), driver(0, 40, 0.0, 5.0, (100.0, 40.0)),
              driver(0, 80, 0.0, 5.0, (100.0, 80.0))]
    env = DriveEnv(pack_for([{"agents": agents, "num_controlled": 3, "roads": edge}]), 1,
                   cfg(offroad_behavior="stop"))
    env.reset()
    res = run(env, 25)
    off = [i for i, r in enumerate(res) if r.info["offroad"][0, 0]]
    # full box (4.5 m): the front reaches x = 12 when the centre passes 9.75 m, after 20 steps
    assert off and off[0] == 19
    assert res[19].reward[0, 0] == -0.5 and not res[20].loss_mask[0, 0]
    assert not any(r.info["offroad"][0, 1:].any() for r in res)
    assert not any(r.terminal.any() for r in res)  # 1 of 3 stopped: no truncation


# ---------------------------------------------------------------- episodes
def mixed_pack():
    return pack_for([
        {"agents": [driver(0, 0, 0.0, 5.0, (10.3, 0.0)), parked(5, 20)], "num_controlled": 1, "roads": lane()},
        {"agents": [driver(0, 0, 0.0, 3.0, (50.0, 0.0)), driver(0, 10, 0.0, 4.0, (60.0, 10.0)),
                    driver(0, -10, 0.0, 2.0, (70.0, -10.0)), parked(30, 30)], "num_controlled": 3,
         "roads": lane() + lane(y=6.0, rtype=RoadType.ROAD_EDGE)},
    ])


def random_actions(env, g):
    return torch.randint(0, env.num_actions, (env.num_worlds, env.num_slots), generator=g)


def test_auto_reset_terminal_once_per_active_slot():
    env = DriveEnv(mixed_pack(), 6, cfg(scenario_length=12, collision_behavior="stop"), seed=1)
    env.reset()
    g = torch.Generator().manual_seed(0)
    draws = []
    for episode in range(3):
        active = env.state.slot_active.clone()
        draws.append(env.state.scenario.clone())
        terms = torch.zeros_like(active, dtype=torch.int64)
        for t in range(12):
            r = env.step(random_actions(env, g))
            terms += r.terminal.long()
            assert not (r.loss_mask & ~active).any()
            if t < 11:
                assert bool(r.info["episode_end"]) is False
        assert torch.equal(terms, active.long())
        assert bool(r.info["episode_end"])
        assert (env.state.step == 0).all() and env.episode_step == 0
        assert torch.equal(r.obs, env.observe())
        assert torch.equal(r.slot_active, env.state.slot_active)
    # new scenarios are drawn at each reset
    draws = torch.stack(draws)
    assert not all(torch.equal(draws[0], d) for d in draws[1:])
    m = env.metrics()
    assert m["n"] > 0 and env.metrics() == m  # per-agent EMA report: never resets


def test_inactive_slots_and_obs_shape():
    env = DriveEnv(mixed_pack(), 4, cfg(), seed=2)
    obs = env.reset()
    assert obs.shape == (4, 4, env.obs_dim) and obs.dtype == torch.float32
    n = env.pack.num_controlled[env.state.scenario]
    expect = torch.arange(4)[None] < n[:, None]
    assert torch.equal(env.state.slot_active, expect)
    assert not obs[~expect].any()
    r = env.step(coast(env))
    assert torch.equal(r.loss_mask, expect)
    assert (r.reward[~expect] == 0).all()
    env.state.validate()


def test_determinism_same_seed_same_tensors():
    def rollout(seed):
        env = DriveEnv(mixed_pack(), 5, cfg(scenario_length=10, goal_behavior="new_goal",
                                            collision_behavior="remove"), seed=seed)
        env.reset()
        g = torch.Generator().manual_seed(7)
        outs = []
        for _ in range(20):
            r = env.step(random_actions(env, g))
            outs.append(torch.cat([r.obs.flatten(), r.reward.flatten(), r.terminal.flatten().float(),
                                   env.state.pos.flatten(), env.state.goal.flatten()]))
        return torch.stack(outs), env.state.scenario
    a, sa = rollout(11)
    b, sb = rollout(11)
    assert torch.equal(a, b) and torch.equal(sa, sb)
    c, _ = rollout(12)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("space,bad,match", [
    ("discrete", torch.zeros(3, 4, dtype=torch.int64), "shape"),
    ("discrete", torch.zeros(2, 4, dtype=torch.float32), "integer"),
    ("discrete", torch.full((2, 4), 91, dtype=torch.int64), r"\[0, 91\)"),
    ("discrete", torch.full((2, 4), -1, dtype=torch.int32), r"\[0, 91\)"),
    ("continuous", torch.zeros(2, 4), "shape"),
    ("continuous", torch.zeros(2, 4, 2, dtype=torch.int64), "float"),
    ("continuous", torch.tensor(float("nan")).expand(2, 4, 2).clone(), "NaN"),
    ("continuous", torch.full((2, 4, 2), 1.5), r"\[-1, 1\]"),
    ("continuous", torch.full((2, 4, 2), float("inf")), r"\[-1, 1\]"),
])
def test_bad_actions_raise_and_leave_state_unchanged(space, bad, match):
    env = DriveEnv(mixed_pack(), 2, cfg(action_space=space), seed=4)
    env.reset()
    good = coast(env) if space == "discrete" else torch.zeros(2, 4, 2)
    env.step(good)
    before = env.state.clone()
    t_before = env.episode_step
    with pytest.raises(ValueError, match=match):
        env.step(bad)
    assert env.state.equal(before) and env.episode_step == t_before
    env.step(good)  # still usable


def test_config_mismatch_is_reported():
    pack = mixed_pack()
    with pytest.raises(ValueError, match="max_agents"):
        DriveEnv(pack, 1, cfg(max_agents=16, num_partners=7))
    with pytest.raises(ValueError, match="num_roads"):
        DriveEnv(pack, 1, cfg(num_roads=32))
    with pytest.raises(ValueError, match="init_steps"):
        DriveEnv(pack, 1, cfg(init_steps=10))


def test_experts_replay_log_and_leave_after_log_end():
    valid = torch.ones(91, dtype=torch.bool)
    valid[8:] = False
    expert = dict(pos=straight_track(0, 20, 0.0, 3.0), heading=0.0, valid=valid, type=ObjectType.CYCLIST)
    late = dict(pos=straight_track(0, -20, 0.0, 3.0), heading=0.0, valid=torch.arange(91) >= 5)
    pack = pack_for([{"agents": [driver(0, 0, 0.0, 5.0, (100.0, 0.0)), expert, late], "num_controlled": 1}])
    env = DriveEnv(pack, 2, cfg())
    env.reset()
    assert env.state.present[0, 1] and not env.state.present[0, 2]
    for t in range(1, 10):
        env.step(coast(env))
        assert bool(env.state.present[0, 1]) == (t < 8)
        assert bool(env.state.present[0, 2]) == (t >= 5)
        if t < 8:
            assert torch.allclose(env.state.pos[0, 1], pack.traj_pos[0, 1, t])
            assert torch.allclose(env.state.speed[0, 1], torch.tensor(3.0), atol=1e-4)


def test_metrics_values():
    pack = pack_for([{"agents": [driver(0, 0, 0.0, 5.0, (10.3, 0.0)), driver(0, 30, 0.0, 5.0, (90.0, 30.0))],
                      "num_controlled": 2}])
    env = DriveEnv(pack, 3, cfg(goal_behavior="stop", scenario_length=20))
    env.reset()
    assert env.metrics() == {}
    run(env, 19)
    assert env.metrics() == {}  # nothing finished yet
    run(env, 1)
    m = env.metrics()
    assert m["n"] == 6
    assert m["goal_reached"] == 0.5 and m["score"] == 0.5 and m["collided"] == 0 and m["offroad"] == 0
    assert m["episode_return"] == 0.5
    assert m["episode_length"] == pytest.approx((17 + 20) / 2)


def test_reset_seed_reproduces_scenarios_and_obs():
    env = DriveEnv(mixed_pack(), 16, cfg(), seed=0)
    o1 = env.reset(seed=3).clone()
    s1 = env.state.scenario.clone()
    env.step(coast(env))
    o2 = env.reset(seed=3)
    assert torch.equal(o1, o2) and torch.equal(s1, env.state.scenario)
    assert len(set(s1.tolist())) == 2  # both scenarios drawn among 16 worlds


def test_state_validate_and_clone():
    env = DriveEnv(mixed_pack(), 3, cfg())
    env.reset()
    st = env.state
    st.validate()
    c = st.clone()
    c.pos += 1.0
    assert not torch.equal(c.pos, st.pos) and not c.equal(st)
    bad = st.clone()
    bad.speed = bad.speed.double()
    with pytest.raises(ValueError, match="speed"):
        bad.validate()
    bad = st.clone()
    bad.pos[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="pos"):
        bad.validate()
    bad = st.clone()
    bad.removed[0, 0] = True  # removed but still present
    with pytest.raises(ValueError, match="present and removed"):
        bad.validate()
    bad = st.clone()
    bad.goal = bad.goal[:, :3]
    with pytest.raises(ValueError, match="goal"):
        bad.validate()


def test_triton_backend_matches_torch():
    """The whole step through the Triton kernels (interpreter on CPU) equals the torch reference."""
    from gpusim.backend import use_backend

    config = cfg(collision_behavior="remove", offroad_behavior="stop", goal_behavior="respawn", scenario_length=8)
    # both on KERNEL_DEVICE (the same env random numbers); the reference forces the torch backend
    env_t = DriveEnv(mixed_pack(), 3, config, seed=1, device=KERNEL_DEVICE)
    env_r = DriveEnv(mixed_pack(), 3, torch_reference_config(config), seed=1, device=KERNEL_DEVICE)
    with use_backend("triton"):
        o_t = env_t.reset()
    with use_backend("torch"):
        o_r = env_r.reset()
    assert torch.allclose(o_t, o_r, atol=1e-5)
    g = torch.Generator().manual_seed(0)
    for _ in range(10):  # crosses the auto-reset at step 8
        a = torch.randint(0, 91, (3, 4), generator=g).to(KERNEL_DEVICE)
        with use_backend("triton"):
            rt = env_t.step(a)
        with use_backend("torch"):
            rr = env_r.step(a)
        for name in ("terminal", "loss_mask", "removed", "stopped"):
            assert torch.equal(getattr(rt, name), getattr(rr, name)), name
        assert torch.allclose(rt.reward, rr.reward)
        assert torch.allclose(env_t.state.pos, env_r.state.pos, atol=1e-4)
        assert torch.allclose(rt.obs, rr.obs, atol=1e-4)
