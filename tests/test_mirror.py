"""Mirror-image scenes (``gpusim/data/mirror.py``, ``EnvConfig.mirror``) on the bundled sample
scenarios: mirroring twice gives the scene back, the expert (the log through inverse dynamics)
drives the mirrored scenes with the same outcomes, every agent's motion is the reflection of its
original (yaw rates change sign), and the env option doubles the scenes for training only."""

from __future__ import annotations

import math

import pytest
import torch

from gpusim.config import EnvConfig
from gpusim.enums import SignalState
from gpusim.data import ScenarioPack
from gpusim.data.mirror import MIRROR_SUFFIX, mirror_heading, mirror_pack, training_pack, with_mirrored_copies
from gpusim.env import DriveEnv
from gpusim.kernels.dynamics import NUM_STEER, STEER_VALUES
from gpusim.kernels.trimath import wrap_angle_torch
from tests.synthetic import driver, lane, small_config, synthetic_pack
from train.settings import evaluation_config


@pytest.fixture(scope="module")
def pack(sample_dir):
    files = sorted(sample_dir.glob("*.json*"))
    if not files:
        pytest.fail("data/womd_sample/ is empty: the bundled scenarios are missing")
    return ScenarioPack.from_json(files, EnvConfig().data_config())


def test_mirroring_twice_is_the_identity(pack):
    twice = mirror_pack(mirror_pack(pack))
    for name, t in pack.compact().tensors().items():
        if name == "traj_heading":
            assert wrap_angle_torch(twice.traj_heading - t).abs().max() < 1e-6
        elif name == "grid_origin":  # float32 rounding of -(x0 + nx * cell) twice
            assert (twice.grid_origin - t).abs().max() < 1e-4
        else:
            assert torch.equal(getattr(twice, name), t), name
    assert twice.scenario_ids == pack.scenario_ids


def test_what_is_reflected(pack):
    m = mirror_pack(pack)
    assert torch.equal(m.traj_pos[..., 0], -pack.traj_pos[..., 0]) and torch.equal(m.traj_pos[..., 1], pack.traj_pos[..., 1])
    assert torch.equal(m.agent_goal[..., 0], -pack.agent_goal[..., 0])
    assert torch.equal(m.road_seg[..., 0::2], -pack.road_seg[..., 0::2])
    assert torch.equal(m.road_seg[..., 1::2], pack.road_seg[..., 1::2])
    assert torch.equal(m.traj_vel[..., 0], -pack.traj_vel[..., 0])
    assert torch.equal(m.signal_pos[..., 0], -pack.signal_pos[..., 0])
    assert torch.equal(m.signal_dir[..., 0], -pack.signal_dir[..., 0])
    assert torch.equal(m.signal_state, pack.signal_state) and torch.equal(m.road_type, pack.road_type)
    # heading pi - theta: the direction (cos, sin) -> (-cos, sin)
    h, hm = pack.traj_heading, m.traj_heading
    assert torch.allclose(torch.cos(hm), -torch.cos(h), atol=1e-6) and torch.allclose(torch.sin(hm), torch.sin(h), atol=1e-6)
    assert float(mirror_heading(torch.tensor(0.0))) == pytest.approx(math.pi)
    assert float(mirror_heading(torch.tensor(math.pi / 2))) == pytest.approx(math.pi / 2)
    assert float(mirror_heading(torch.tensor(-math.pi / 4))) == pytest.approx(-3 * math.pi / 4)
    m.validate()
    # the road grid: cell (ix, iy) of the mirror lists the segments of cell (nx - 1 - ix, iy)
    for name in ("grid_road", "grid_edge"):
        a, b = getattr(pack.padded(), name), getattr(m.padded(), name)
        for s in range(pack.num_scenarios):
            nx, ny = pack.grid_dims[s].tolist()
            cells = a[s, :nx * ny].view(ny, nx, -1)
            assert torch.equal(b[s, :nx * ny].view(ny, nx, -1), cells.flip(1)), (name, s)
    assert torch.allclose(m.grid_origin[:, 0] + pack.grid_origin[:, 0],
                          -pack.grid_dims[:, 0].float() * pack.cell_size, atol=1e-4)


def _expert_metrics(p: ScenarioPack, space: str) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """The env's plain means, the final positions [W, A, 2] and per world the sum over the episode
    of the observations' absolute values [W] (a reflection changes the sign of lateral features,
    never their size, and the road block lists the same segments in the same order)."""
    cfg = EnvConfig(action_space=space)
    env = DriveEnv(p, p.num_scenarios, cfg, seed=0)
    obs = env.reset(scenarios=torch.arange(p.num_scenarios))
    size = obs.abs().sum(dim=(1, 2), dtype=torch.float64)
    for _ in range(env.horizon):
        size += env.step(env.expert_actions()).obs.abs().sum(dim=(1, 2), dtype=torch.float64)
    return env.metrics("mean"), env.state.pos.clone(), size


@pytest.mark.parametrize("space", ["discrete", "continuous"])
def test_expert_reaches_the_goals_of_the_mirrored_scenes_alike(pack, space):
    """The log through inverse dynamics on the 10 sample scenes (43 agents): goal rate 1.0, and
    the same collision and offroad rates, mirrored or not (the steering grid is symmetric, so the
    discrete expert picks the mirrored steering index); every agent ends at the mirrored place."""
    orig, pos, size = _expert_metrics(pack, space)
    mirr, pos_m, size_m = _expert_metrics(mirror_pack(pack), space)
    assert orig["n"] == mirr["n"] == 43
    assert orig["goal_reached"] == 1.0 and mirr["goal_reached"] == 1.0
    for k in ("collided", "offroad", "collision_or_offroad", "episode_length"):
        assert mirr[k] == pytest.approx(orig[k], abs=1e-9), k
    assert orig["offroad"] > 0 and orig["collided"] > 0  # the comparison covers both contact tests
    ref = torch.stack([-pos[..., 0], pos[..., 1]], -1)
    assert (pos_m - ref).abs().max() < 1e-3
    assert torch.allclose(size_m, size, rtol=1e-5)  # a wrong road grid changes it by ~20%


def test_a_mirrored_red_light_is_still_run(tmp_path):
    """One car at 8 m/s along +x from x = -20 crossing the stop line of a red signal at x = 6
    (lane direction +x): mirrored (driving -x, lane direction -x) it runs the same red light at
    the same step; a signal whose lane direction were not reflected would point against the
    traffic and never count, one whose stop point were not would be crossed at another step."""
    cfg = small_config()
    pack = synthetic_pack([{"agents": [driver(-20.0, 0.0, 0.0, 8.0, (50.0, 0.0)),
                                       driver(-20.0, 40.0, 0.0, 0.0, (-20.0, 40.0))],
                            "num_controlled": 1, "roads": lane(-60, 100, 0.0) + lane(-60, 100, 40.0)}], cfg)
    T = pack.traj_pos.shape[2]
    pack.signal_lane = torch.tensor([[7]], dtype=torch.int32)
    pack.signal_pos = torch.tensor([[[6.0, 0.0]]])
    pack.signal_dir = torch.tensor([[[1.0, 0.0]]])
    pack.signal_state = torch.full((1, T, 1), int(SignalState.STOP), dtype=torch.int8)
    pack.signal_valid = torch.ones(1, T, 1, dtype=torch.bool)
    pack.num_signals = torch.ones(1, dtype=torch.int32)
    config = EnvConfig(max_agents=cfg.max_agents, max_controlled=cfg.max_controlled, num_roads=cfg.grid_k,
                       num_partners=2, scenario_length=40)
    steps = []
    for p in (pack, mirror_pack(pack)):
        env = DriveEnv(p, 1, config, seed=0)
        env.reset()
        reds = []
        for _ in range(config.horizon):
            env.step(env.expert_actions())
            reds.append(bool(env.state.red_light_now[0, 0]))
        steps.append([i for i, r in enumerate(reds) if r])
        assert env.metrics(kind="mean")["red_light_violation"] == 1.0
    assert steps[0] == steps[1] and len(steps[0]) == 1


def test_yaw_rate_changes_sign(pack):
    """Steering index j in a scene and NUM_STEER - 1 - j (the opposite angle) in its mirror, with
    the same acceleration: every controlled agent's heading change is the negative and its
    position the reflection of the original's."""
    assert all(STEER_VALUES[j] == -STEER_VALUES[NUM_STEER - 1 - j] for j in range(NUM_STEER))
    S = pack.num_scenarios
    envs = [DriveEnv(p, S, EnvConfig(collision_behavior="ignore", offroad_behavior="ignore"), seed=0)
            for p in (pack, mirror_pack(pack))]
    for e in envs:
        e.reset(scenarios=torch.arange(S))
    g = torch.Generator().manual_seed(0)
    C = envs[0].num_slots
    active = envs[0].state.slot_active
    turned = 0.0
    for _ in range(20):
        accel = torch.randint(0, 7, (S, C), generator=g)
        steer = torch.randint(0, NUM_STEER, (S, C), generator=g)
        h0 = envs[0].state.heading[:, :C].clone()
        hm0 = envs[1].state.heading[:, :C].clone()
        envs[0].step(accel * NUM_STEER + steer)
        envs[1].step(accel * NUM_STEER + (NUM_STEER - 1 - steer))
        d = wrap_angle_torch(envs[0].state.heading[:, :C] - h0)[active]
        dm = wrap_angle_torch(envs[1].state.heading[:, :C] - hm0)[active]
        assert torch.allclose(dm, -d, atol=1e-4)
        turned += float(d.abs().sum())
        p, pm = envs[0].state.pos[:, :C][active], envs[1].state.pos[:, :C][active]
        assert torch.allclose(pm[:, 0], -p[:, 0], atol=1e-3) and torch.allclose(pm[:, 1], p[:, 1], atol=1e-3)
    assert turned > 1.0  # the agents did turn


def test_env_option_doubles_the_scenes_for_training_only(pack):
    cfg = EnvConfig(mirror=True)
    env = DriveEnv(pack, 64, cfg, seed=0)
    S = pack.num_scenarios
    assert env.pack.num_scenarios == 2 * S
    assert env.pack.scenario_ids[S:] == [i + MIRROR_SUFFIX for i in pack.scenario_ids]
    drawn = env.state.scenario  # 64 worlds drew from both halves
    assert bool((drawn >= S).any()) and bool((drawn < S).any())
    assert training_pack(pack, EnvConfig()) is pack
    assert with_mirrored_copies(pack).num_scenarios == 2 * S
    ev, notes = evaluation_config(cfg)
    assert ev.mirror is False and "mirror=True" in notes[0]
    with pytest.raises(ValueError, match="EnvConfig.mirror"):
        EnvConfig(mirror="yes")


def test_streaming_pool_gets_mirrored_copies_at_every_swap(pack):
    """With a scenario pool (``--pool-size``) every pool the stream hands over is doubled too."""
    from gpusim.data.pool import ScenarioPool

    pool = ScenarioPool(pack, 4, replace_fraction=0.5, seed=0, resample_every=1, background=False)
    env = DriveEnv(pool, 4, EnvConfig(mirror=True, scenario_length=5), seed=0)
    env.reset()
    seen = []
    for _ in range(3 * env.horizon):  # three episode ends: three swaps
        env.step(env.expert_actions())
        ids = env.pack.scenario_ids
        seen.append(tuple(ids))
        assert len(ids) == 8 and ids[4:] == [i + MIRROR_SUFFIX for i in ids[:4]]
    assert len(set(seen)) > 1  # the pool did change


def test_behaviour_cloning_never_mirrors():
    """``train/bc.py`` clones the log as driven (on the right) whatever ``--env.mirror`` says."""
    from train.bc import BCConfig, make_bc_env
    from train.config import TrainConfig

    cfg = BCConfig(env=TrainConfig().env.replace(mirror=True), num_worlds=4, device="cpu")
    env, setting = make_bc_env(cfg, "data/womd_sample", say=lambda *_: None)
    assert not env.config.mirror
    assert not any(i.endswith(MIRROR_SUFFIX) for i in env.pack.scenario_ids)
