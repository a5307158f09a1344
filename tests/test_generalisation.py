"""The generalisation options (training randomisations) on the bundled sample scenarios: random
start (``EnvConfig.random_start_steps``) and goal resampling (``EnvConfig.goal_resample``), both off
by default with nothing drawn, and the evaluation rule that drops them
(``train.settings.evaluation_config``) for every checkpoint."""

from __future__ import annotations

import pytest
import torch

from gpusim import DriveEnv
from gpusim.config import WOMD_STEPS, EnvConfig
from gpusim.sim.goal_resample import goal_pool
from train.settings import evaluation_config
from train.packs import load_pack

CFG = dict(max_agents=64, max_controlled=8)
N = 10


@pytest.fixture(scope="module")
def pack(sample_dir):
    return load_pack(str(sample_dir), EnvConfig(**CFG))


def _env(pack, W=8, seed=5, **kw):
    return DriveEnv(pack, num_worlds=W, config=EnvConfig(**{**CFG, **kw}), seed=seed)


# ---------------------------------------------------------------- off: nothing drawn, log start, log goals
def test_off_draws_nothing_and_starts_at_the_log(pack):
    env = _env(pack)
    twin = torch.Generator().manual_seed(5)
    scen = torch.randint(pack.num_scenarios, (env.num_worlds,), generator=twin)
    assert torch.equal(env.state.scenario, scen)
    assert torch.equal(env.generator.get_state(), twin.get_state())  # the scenario draw only
    st = env.state
    assert int(st.start_offset.abs().sum()) == 0
    assert torch.equal(st.goal, pack.agent_goal[st.scenario])
    assert torch.equal(st.pos, pack.traj_pos[st.scenario, :, 0])
    assert env.config.scenario_length == WOMD_STEPS


# ---------------------------------------------------------------- random start
def test_random_start_poses_are_the_log_at_each_worlds_start_step(pack):
    env = _env(pack, W=16, random_start_steps=N)
    st = env.state
    u = st.start_offset.to(torch.int64)
    assert bool(((u >= 0) & (u <= N)).all()) and len(set(u.tolist())) > 3  # per world, varied
    s, a = st.scenario[:, None], torch.arange(st.num_agents)[None, :]
    i = u[:, None]
    valid = pack.traj_valid[s, a, i] & pack.agent_exists[st.scenario]
    assert torch.equal(st.present, valid)
    assert torch.equal(st.pos[valid], pack.traj_pos[s, a, i][valid])
    assert torch.equal(st.heading[valid], pack.traj_heading[s, a, i][valid])
    # controlled agents not valid at their start step are out of play (not controlled this episode)
    assert not bool((st.controlled & ~st.present).any())

def test_random_start_each_world_ends_with_its_log(pack):
    env = _env(pack, W=16, random_start_steps=N)
    assert env.horizon == WOMD_STEPS  # the horizon of the log start; worlds that start later end earlier
    u = env.state.start_offset.to(torch.int64)
    active = env.state.slot_active.clone()
    end_step = torch.full_like(active, -1, dtype=torch.int64)
    for t in range(1, env.horizon + 1):
        r = env.step(env.expert_actions())
        end_step = torch.where(r.terminal & (end_step < 0), t, end_step)
        if t < env.horizon:
            ended = env.state.world_done
            assert torch.equal(ended, t >= WOMD_STEPS - u)  # done exactly when the log has no next step
            assert not bool(r.loss_mask[ended & (t > WOMD_STEPS - u)].any())  # idle after its end
    # every active slot's episode ended at its world's log end (or earlier, at a goal stop)
    assert bool((end_step[active] >= 1).all())
    assert bool((end_step <= (WOMD_STEPS - u)[:, None])[active].all())
    # following the log from any start step, the logged goal is still reached in time
    assert env.metrics("mean")["goal_reached"] >= 0.9


def test_random_start_experts_replay_from_the_start_step(pack):
    env = _env(pack, W=16, random_start_steps=N)
    u = env.state.start_offset.to(torch.int64)
    k = 7
    for _ in range(k):
        env.step(env.expert_actions())
    st = env.state
    s, a, i = st.scenario[:, None], torch.arange(st.num_agents)[None, :], (u + k)[:, None]
    expert = ~st.controlled & pack.traj_valid[s, a, i] & pack.agent_exists[st.scenario]
    assert int(expert.sum()) > 50
    assert torch.equal(st.pos[expert], pack.traj_pos[s, a, i][expert])
    # controlled agents driven by the expert actions follow their log from their own start step
    ctrl = st.controlled & st.present & pack.traj_valid[s, a, i]
    err = (st.pos - pack.traj_pos[s, a, i]).norm(dim=-1)[ctrl]
    assert float(err.max()) < 1.0


def test_random_start_redrawn_each_episode_and_kept_across_trials(pack):
    env = _env(pack, W=16, random_start_steps=N, goal_behavior="trial", k_trials=2)
    first = env.state.start_offset.clone()
    pos0 = env.state.pos.clone()
    restarted = torch.zeros(env.num_worlds, dtype=torch.bool)
    for _ in range(env.horizon - 1):  # a world starting its second trial is back at its start step
        env.step(env.expert_actions())
        st = env.state
        now = (st.step == st.trial_start) & (st.trial_count == 1)
        assert torch.equal(st.start_offset, first)
        assert torch.equal(st.pos[now], pos0[now])
        restarted |= now
    assert int(restarted.sum()) >= 8
    env.step(env.expert_actions())  # the next episode draws new start steps
    assert not torch.equal(env.state.start_offset, first)


def test_random_start_bad_values_refused():
    with pytest.raises(ValueError, match="random_start_steps"):
        EnvConfig(random_start_steps=-1)
    with pytest.raises(ValueError, match="random_start_steps"):
        EnvConfig(random_start_steps=WOMD_STEPS)
    assert EnvConfig(random_start_steps=N).scenario_length == WOMD_STEPS
    # in trial mode the trials are shortened so that no world runs past the log
    trial = dict(random_start_steps=N, goal_behavior="trial")
    assert EnvConfig(**trial, scenario_length=WOMD_STEPS).scenario_length == WOMD_STEPS - N
    assert EnvConfig(**trial, scenario_length=30).scenario_length == 30
    assert EnvConfig(**trial, init_steps=10).scenario_length == WOMD_STEPS - 10 - N
    assert EnvConfig(**trial).replace(random_start_steps=0).scenario_length == WOMD_STEPS


# ---------------------------------------------------------------- goal resampling
def test_goal_resample_goals_are_pool_places_redrawn_each_episode(pack):
    env = _env(pack, W=16, goal_resample=True)
    places, count = goal_pool(pack, env.config)
    st = env.state
    C, act = env.num_slots, env.state.slot_active
    g = st.goal[:, :C]
    pool = places[st.scenario]  # [W, C, M, 2]
    listed = torch.arange(places.shape[2]) < count[st.scenario][..., None]
    member = ((pool - g[:, :, None]).norm(dim=-1) == 0) & listed
    assert bool(member.any(dim=-1)[act].all())
    logged = pack.agent_goal[st.scenario][:, :C]
    assert float(((g - logged).norm(dim=-1) > 5.0)[act].float().mean()) > 0.3  # often not the log's endpoint
    assert torch.equal(st.goal[:, C:], pack.agent_goal[st.scenario][:, C:])  # experts keep theirs
    # a driving-like distance ahead of the start
    rel = g - st.pos[:, :C]
    d = rel.norm(dim=-1)[act]
    ahead = (rel[..., 0] * torch.cos(st.heading[:, :C]) + rel[..., 1] * torch.sin(st.heading[:, :C]))[act]
    assert float(d.min()) >= 5.0 and float(d.max()) <= 120.0 and float((ahead > 0).float().mean()) > 0.9
    before = (st.scenario.clone(), g.clone())
    for _ in range(env.horizon):
        env.step(env.expert_actions())
    same = env.state.scenario == before[0]
    assert bool(same.any())
    changed = (env.state.goal[:, :C] != before[1]).any(dim=-1) & env.state.slot_active & same[:, None]
    assert bool(changed.any())  # the same scenario gets new goals in the next episode


def test_goal_resample_deterministic_per_seed(pack):
    a, b, c = (_env(pack, W=16, seed=s, goal_resample=True) for s in (9, 9, 10))
    assert torch.equal(a.state.goal, b.state.goal)
    a.reset(seed=4)
    b.reset(seed=4)
    assert torch.equal(a.state.goal, b.state.goal)
    assert not torch.equal(a.state.goal, c.state.goal)


def test_goal_resample_not_with_the_memory_task():
    with pytest.raises(ValueError, match="goal_resample does not work with goal_candidates"):
        EnvConfig(goal_resample=True, goal_candidates=2, goal_behavior="trial")


# ---------------------------------------------------------------- the evaluation rule
def test_evaluation_drops_training_randomisations_and_keeps_task_options():
    trained = EnvConfig(**CFG, random_start_steps=N, goal_resample=True, goal_behavior="trial", k_trials=3,
                        reward_conditioning=True)
    cfg, notes = evaluation_config(trained)
    assert (cfg.random_start_steps, cfg.goal_resample, cfg.scenario_length) == (0, False, WOMD_STEPS)
    assert (cfg.trial_mode, cfg.k_trials, cfg.reward_conditioning) == (True, 3, True)
    assert len(notes) == 1 and "random_start_steps=10" in notes[0] and "goal_resample=True" in notes[0]
    plain = EnvConfig(**CFG)
    assert evaluation_config(plain) == (plain, [])
    memory = EnvConfig(**CFG, goal_candidates=2, goal_behavior="trial", scenario_length=40, candidate_practice=0.5)
    cfg, notes = evaluation_config(memory)
    assert (cfg.goal_candidates, cfg.scenario_length, cfg.candidate_practice) == (2, 40, 0.0)
    assert "candidate_practice=0.5" in notes[0]


def test_checkpoint_trained_with_them_evaluates_at_log_start_with_log_goals(pack, sample_dir):
    from train.config import TrainConfig
    from train.eval.live import LiveEvaluator
    from train.evaluate import EvalConfig, base_env_config

    trained = EnvConfig(**CFG, random_start_steps=N, goal_resample=True)
    saved = TrainConfig(env=trained).to_dict()["env"]  # what a checkpoint records
    entry = {"kind": "checkpoint", "label": "run", "ckpt": {"env_config": saved}}
    cfg, notes = base_env_config([entry], EvalConfig(policy=("run",)))
    assert (cfg.random_start_steps, cfg.goal_resample, cfg.scenario_length) == (0, False, WOMD_STEPS)
    assert any("drops the training randomisations" in n for n in notes)
    live = LiveEvaluator(trained, str(sample_dir), ["self_play"], (), "cpu")
    env = live.items[0][1]
    assert (env.config.random_start_steps, env.config.goal_resample) == (0, False)
    st = env.state
    assert torch.equal(st.goal, env.pack.agent_goal[st.scenario])
    assert torch.equal(st.pos, env.pack.traj_pos[st.scenario, :, 0])


def test_goal_resample_keeps_the_logged_goal_of_an_agent_without_places(pack):
    """A scenario whose lanes are all gone (relabelled road edges) gives its agents no place: goal
    resampling warns with the count and the scenario, and those agents keep their logged goals while
    the other scenarios' agents are resampled (a real case: one agent of the pool's train split)."""
    import dataclasses

    from gpusim.enums import RoadType

    rt = pack.road_type.clone()
    rt[0][rt[0] == int(RoadType.LANE)] = int(RoadType.ROAD_EDGE)
    bare = dataclasses.replace(pack, road_type=rt)
    with pytest.warns(UserWarning, match=rf"{int(pack.num_controlled[0])} of \d+ controlled agents have no lane "
                                         rf"place to resample \(first in scenario {pack.scenario_ids[0]}\)"):
        places, count = goal_pool(bare, EnvConfig(**CFG, goal_resample=True))
    assert int(count[0].sum()) == 0 and bool((count[1:, 0] > 0).all())
    env = _env(bare, W=16, goal_resample=True)
    st = env.state
    C = env.num_slots
    mine = (st.scenario == 0)[:, None] & st.slot_active
    assert bool(mine.any())
    assert torch.equal(st.goal[:, :C][mine], pack.agent_goal[st.scenario][:, :C][mine])
