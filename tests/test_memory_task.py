"""The memory task (EnvConfig.goal_candidates) and the memoryless control (PolicyConfig.memory) on
the bundled sample scenarios: candidates constant across the trials of an episode and redrawn with
the next one, only the true goal rewards, a decoy stops the agent (not a contact stop) and shows in
its observation, the control's cache is empty at each trial start, the task off is bit for bit
the env without it, and bad input gets one clear message."""

from __future__ import annotations

import pytest
import numpy as np
import torch

from gpusim import DriveEnv
from gpusim.config import EnvConfig
from gpusim.sim.candidates import REACH_SEPARATION, START_LATERAL, candidate_pool, lane_successors, reachable_places
from train.packs import load_pack

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]

CFG = dict(max_controlled=8, goal_behavior="trial", k_trials=2, reward_collision=0.0, reward_offroad=0.0)


@pytest.fixture(scope="module")
def pack(sample_dir):
    return load_pack(str(sample_dir), EnvConfig(**CFG))


def _env(pack, W=4, seed=3, **kw):
    return DriveEnv(pack, num_worlds=W, config=EnvConfig(**{**CFG, **kw}), seed=seed)


def _random_actions(env, gen):
    return torch.randint(0, env.num_actions, (env.num_worlds, env.num_slots), generator=gen)


def test_candidates_constant_across_trials_and_redrawn_next_episode(pack):
    env = _env(pack, goal_candidates=2)
    env.reset(seed=3)
    active = env.state.slot_active
    first = (env.state.goal_cand.clone(), env.state.cand_true.clone(), env.state.goal[:, :8].clone())
    assert bool((first[0][active].norm(dim=-1) > 0).all())
    # the true goal is one of the candidates, and the two candidates of a slot are apart
    picked = first[0].gather(2, first[1][..., None, None].expand(-1, -1, 1, 2))[:, :, 0]
    assert torch.equal(picked[active], first[2][active])
    assert bool(((first[0][:, :, 0] - first[0][:, :, 1]).norm(dim=-1)[active] >= REACH_SEPARATION).all())
    gen = torch.Generator().manual_seed(0)
    saw_trial_1 = False
    for _ in range(env.horizon - 1):
        env.step(_random_actions(env, gen))
        saw_trial_1 |= bool((env.state.trial_count == 1).any())
        assert torch.equal(env.state.goal_cand, first[0]) and torch.equal(env.state.cand_true, first[1])
        assert torch.equal(env.state.goal[:, :8], first[2])
    assert saw_trial_1
    env.step(_random_actions(env, gen))  # step H: the next episode draws again
    assert not torch.equal(env.state.goal_cand, first[0])


def test_only_the_true_goal_rewards_and_a_decoy_stops(pack):
    env = _env(pack, W=2, goal_candidates=2)
    env.reset(seed=5)
    st = env.state
    true = st.cand_true[0, 0]
    decoy_pos = st.goal_cand[0, 0, 1 - true]
    pos = st.pos.clone()
    pos[0, 0] = decoy_pos
    speed = st.speed.clone()
    speed[0, 0] = 0.0
    env.state = st.replace(pos=pos, speed=speed)
    res = env.step(torch.zeros(2, env.num_slots, dtype=torch.int64))
    assert float(res.reward[0, 0]) == 0.0 and bool(res.loss_mask[0, 0])
    assert bool(env.state.stopped[0, 0]) and not bool(env.state.contact_stopped[0, 0])
    assert bool(env.state.at_decoy[0, 0]) and bool(env.state.present[0, 0])
    lay = env.obs_layout
    assert float(res.obs[0, 0, lay.candidates][-1]) == 1.0  # "at a wrong candidate"
    res = env.step(torch.zeros(2, env.num_slots, dtype=torch.int64))
    assert not bool(res.loss_mask[0, 0])  # stopped for the rest of the trial: not trained on
    # the true goal rewards (and ends the slot's trial: removed)
    env.reset(seed=5)
    st = env.state
    pos = st.pos.clone()
    pos[0, 0] = st.goal_cand[0, 0, st.cand_true[0, 0]]
    speed = st.speed.clone()
    speed[0, 0] = 0.0
    env.state = st.replace(pos=pos, speed=speed)
    res = env.step(torch.zeros(2, env.num_slots, dtype=torch.int64))
    assert float(res.reward[0, 0]) == 1.0 and not bool(env.state.at_decoy[0, 0])


def test_observation_shows_candidates_alike_and_hides_the_goal(pack):
    env = _env(pack, W=2, goal_candidates=3)
    obs = env.reset(seed=1)
    lay = env.obs_layout
    assert lay.num_candidates == 3 and lay.candidate_dim == 10 and lay.obs_dim == obs.shape[-1]
    st = env.state
    block = obs[0, 0, lay.candidates]
    rel = st.goal_cand[0, 0] - st.pos[0, 0]
    assert torch.allclose(block[2:9:3], rel.norm(dim=-1) / 100.0, atol=1e-5)
    assert float(obs[0, 0, 3:6].abs().sum()) == 0.0  # goal_x, goal_y, goal_dist hidden
    assert float(block[-1]) == 0.0


def test_off_is_bit_identical(pack):
    gen_a, gen_b = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    a, b = _env(pack, goal_candidates=0), _env(pack, goal_candidates=1)
    oa, ob = a.reset(seed=2), b.reset(seed=2)
    assert torch.equal(oa, ob) and a.obs_dim == b.obs_dim == _env(pack).obs_dim
    for _ in range(30):
        ra, rb = a.step(_random_actions(a, gen_a)), b.step(_random_actions(b, gen_b))
        assert torch.equal(ra.obs, rb.obs) and torch.equal(ra.reward, rb.reward)
    assert a.state.equal(b.state)
    assert float(a.state.goal_cand.abs().sum()) == 0.0


def test_memoryless_control_cache_empty_at_each_trial_start(pack):
    from policy.actor import Actor
    from policy.actor_critic import ActorCritic, PolicyConfig
    from train.eval.sweep import PolicyDriver

    env = _env(pack, W=2, goal_candidates=2, scenario_length=6)
    small = dict(d_model=16, n_layers=1, n_heads=2, hidden=16, max_roads=8)
    torch.manual_seed(0)
    control = ActorCritic(env.obs_layout, env.num_actions, config=PolicyConfig(memory="trial", **small))
    with_memory = ActorCritic(env.obs_layout, env.num_actions, config=PolicyConfig(**small))
    assert Actor(control, 4, 8).reset_at_trial and not Actor(with_memory, 4, 8).reset_at_trial
    for policy, memory, cleared in ((control, None, True), (with_memory, None, False), (with_memory, "trial", True)):
        driver = PolicyDriver(policy, memory=memory)
        obs = env.reset(seed=4)
        driver.begin(env, obs)
        for t in range(env.horizon - 1):
            res = env.step(driver.act(env, obs))
            obs = res.obs
            driver.observe(env, res)
            trunc = res.truncation.reshape(-1)
            if bool(trunc.any()):
                pos = driver.actor.cache.position[trunc]
                assert bool((pos == 0).all()) == cleared, (memory, pos)


def test_ppo_forward_resets_memory_at_trials_for_the_control(monkeypatch):
    """The update's forward gets ``terminal | truncation`` as its memory reset for the control
    (as its actor acted), ``terminal`` alone otherwise."""
    import policy.actor_critic as ac
    from policy.encoders import ObsDims
    from train.ppo import PPOConfig, ppo_update
    from train.rollout import RolloutBatch

    seen = []
    orig = ac.ActorCritic.forward

    def spy(self, obs, terminal, removed, **kw):
        seen.append(terminal.clone())
        return orig(self, obs, terminal, removed, **kw)

    monkeypatch.setattr(ac.ActorCritic, "forward", spy)
    dims = ObsDims(ego_dim=4, num_partners=1, partner_dim=2, num_roads=1, road_dim=2)
    R, H = 2, 6
    for memory in ("episode", "trial"):
        seen.clear()
        pol = ac.ActorCritic(dims, 3, config=ac.PolicyConfig(d_model=8, n_layers=1, n_heads=1, hidden=8,
                                                                memory=memory, action_factors=()))
        b = RolloutBatch.empty(R, H, dims.obs_dim, False, 0, "cpu")
        trunc = torch.zeros(R, H, dtype=torch.bool)
        trunc[:, 2] = True
        b = b.replace(truncation=trunc, terminal=torch.zeros(R, H, dtype=torch.bool),
                      loss_mask=torch.ones(R, H, dtype=torch.bool), removed=torch.zeros(R, H, dtype=torch.bool),
                      obs=torch.zeros(R, H, dims.obs_dim), actions=torch.zeros(R, H, dtype=torch.int64),
                      logprobs=torch.zeros(R, H), values=torch.zeros(R, H), rewards=torch.zeros(R, H))
        ppo_update(pol, torch.optim.Adam(pol.parameters()), b, PPOConfig(), 1, R, torch.arange(R),
                   torch.Generator())
        assert bool(seen[0][:, 2].all()) == (memory == "trial")


def test_bad_input_one_line(pack):
    with pytest.raises(ValueError, match="goal_candidates must be an integer >= 0"):
        EnvConfig(**CFG, goal_candidates=-1)
    with pytest.raises(ValueError, match="new_goal"):
        EnvConfig(max_controlled=8, goal_behavior="new_goal", goal_candidates=2)
    with pytest.raises(ValueError, match=r"scenario \S+ has only \d+ candidate place\(s\) for its controlled agent "
                                         r"in slot \d+"):
        candidate_pool(pack, EnvConfig(**CFG, goal_candidates=40))
    from policy.actor_critic import PolicyConfig
    with pytest.raises(ValueError, match="PolicyConfig.memory must be one of episode, trial"):
        PolicyConfig(memory="forever")


def test_practice_agents_see_the_true_goal_in_every_candidate(pack):
    """``candidate_practice = p``: about a fraction p of the agents get every candidate at the true
    goal (and keep it across the trials), the others two distinct candidates; reaching the true
    goal rewards as always; p = 0 draws nothing more (the memory task's draw is unchanged)."""
    env = _env(pack, W=16, goal_candidates=2, candidate_practice=0.5)
    env.reset(seed=4)
    st, active = env.state, env.state.slot_active
    same = (st.goal_cand[:, :, 0] - st.goal_cand[:, :, 1]).norm(dim=-1) == 0
    assert bool((st.goal_cand[:, :, 0][same & active] == st.goal[:, :8][same & active]).all())
    frac = float(same[active].float().mean())
    assert 0.35 < frac < 0.65, frac  # binomial around 0.5 over > 200 agents
    assert bool(((st.goal_cand[:, :, 0] - st.goal_cand[:, :, 1]).norm(dim=-1)[active & ~same] >= REACH_SEPARATION).all())
    plain, practice = _env(pack, W=16, goal_candidates=2), _env(pack, W=16, goal_candidates=2, candidate_practice=0.5)
    plain.reset(seed=4), practice.reset(seed=4)
    assert torch.equal(plain.state.cand_true, practice.state.cand_true)  # the practice draw comes after
    with pytest.raises(ValueError, match="candidate_practice must be in"):
        EnvConfig(**CFG, goal_candidates=2, candidate_practice=1.0)
    with pytest.raises(ValueError, match="candidate_practice needs the memory task"):
        EnvConfig(**CFG, candidate_practice=0.2)


def test_candidates_lie_within_the_trial(pack):
    """The lane-graph places lie at the driving distance of the logged path over the steps a trial
    covers: with a 3-second trial they are the routes followed to that distance, nearer than the
    whole log's (the geometric fallback keeps the logged goal's distance)."""
    from gpusim.config import RoadType
    from gpusim.sim.candidates import _driving_distance

    full, _ = candidate_pool(pack, EnvConfig(**CFG, goal_candidates=2))
    short, count = candidate_pool(pack, EnvConfig(**CFG, goal_candidates=2, scenario_length=30))
    near, far, graph = [], [], 0
    for s in range(pack.num_scenarios):
        seg = pack.road_seg[s, pack.road_type[s] == int(RoadType.LANE)].numpy().astype(np.float64)
        succ = lane_successors(seg)
        for c in range(int(pack.num_controlled[s])):
            start, pos, ok = pack.traj_pos[s, c, 0].numpy(), pack.traj_pos[s, c].numpy(), pack.traj_valid[s, c].numpy()
            r = _driving_distance(pos[:31], ok[:31])  # log steps 0..30: the trial's
            reach = reachable_places(seg, succ, start, float(pack.traj_heading[s, c, 0]), r)
            if len(reach) >= 2:
                graph += 1
                assert np.allclose(short[s, c, : int(count[s, c])].numpy(), reach)
                near.append(float(np.linalg.norm(reach - start, axis=1).mean()))
                far.append(float((full[s, c, :2] - pack.traj_pos[s, c, 0]).norm(dim=-1).mean()))
    assert graph >= 10 and np.mean(near) < 0.8 * np.mean(far)


def test_cli_refusals(capsys):
    from train.config import UserError, parse_args
    cfg = parse_args(["--env.goal-candidates", "2", "--env.goal-behavior", "trial", "--device", "cpu"])
    assert cfg.experience == "candidate_progress"  # the default shaping is replaced, not refused
    with pytest.raises(UserError, match="--experience progress: the goal-progress shaping points at the true goal"):
        parse_args(["--env.goal-candidates", "2", "--experience", "progress", "--device", "cpu"])
    assert parse_args(["--device", "cpu"]).experience == "progress"
    from train.evaluate import main
    rc = main(["--policy", "steer_to_goal", "--memory", "trial", "--k-trials", "2"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--memory trial: steer_to_goal is a baseline without a KV-cache memory" in err


def test_candidate_shaping_reads_the_nearest_candidate(pack):
    from train.experience import hook_context, make_hook
    from train.rollout import RolloutBatch

    env = _env(pack, W=2, goal_candidates=2)
    obs = env.reset(seed=1)
    ctx = hook_context(env, 0.9)
    lay = env.obs_layout
    assert ctx["candidate_dist_columns"] == [lay.candidates.start + 2, lay.candidates.start + 5]
    hook = make_hook("candidate_progress", (), ctx)
    b = RolloutBatch.empty(1, 2, lay.obs_dim, False, 0, "cpu")
    o = torch.zeros(1, 2, lay.obs_dim)
    o[0, 0, ctx["candidate_dist_columns"]] = torch.tensor([0.5, 0.3])
    o[0, 1, ctx["candidate_dist_columns"]] = torch.tensor([0.1, 0.4])
    b = b.replace(obs=o, loss_mask=torch.ones(1, 2, dtype=torch.bool))
    f = hook.shaping(b)
    assert torch.allclose(f[0, 0], torch.tensor(3.0 * (0.3 - 0.9 * 0.1)))
    with pytest.raises(ValueError, match="needs the memory task"):
        make_hook("candidate_progress", (), hook_context(_env(pack, W=1), 0.9))
    # decoy_refund: the step that reaches a decoy gives back the shaping earned since its trial began
    assert ctx["decoy_column"] == lay.candidates.stop - 1
    from gpusim.kernels.obs_layout import EGO_FEATURES
    tcol, H = EGO_FEATURES.index("time_in_trial"), 9
    o = torch.zeros(1, H, lay.obs_dim)
    dist = torch.tensor([0.5, 0.4, 0.2, 0.05, 0.05, 0.6, 0.3, 0.05, 0.05])  # trial 0: steps 0-4, trial 1: 5-8
    o[0, :, ctx["candidate_dist_columns"][0]] = dist
    o[0, :, ctx["candidate_dist_columns"][1]] = 0.9
    o[0, :, tcol] = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 3]) / 10
    o[0, [4, 8], ctx["decoy_column"]] = 1.0  # the decoy reached in steps 3 and 7
    mask = torch.tensor([[1, 1, 1, 1, 0, 1, 1, 1, 0]], dtype=torch.bool)
    b = RolloutBatch.empty(1, H, lay.obs_dim, False, 0, "cpu").replace(obs=o, loss_mask=mask)
    plain = make_hook("candidate_progress", ("gamma=1",), ctx).shaping(b)[0]
    refund = make_hook("candidate_progress", ("gamma=1", "decoy_refund=1"), ctx).shaping(b)[0]
    want = 3 * torch.tensor([0.1, 0.2, 0.15, 0, 0, 0.3, 0.25, 0, 0])
    assert torch.allclose(plain, want)
    assert torch.allclose(refund, want + 3 * torch.tensor([0, 0, 0, 0.05 - 0.5, 0, 0, 0, 0.05 - 0.6, 0]))
    assert abs(float(refund[:5].sum())) < 1e-6 and abs(float(refund[5:].sum())) < 1e-6  # a decoy nets 0
    half = make_hook("candidate_progress", ("gamma=1", "decoy_refund=0.5"), ctx).shaping(b)[0]
    assert torch.allclose(half, (plain + refund) / 2)
    with pytest.raises(ValueError, match="decoy_refund must be in"):
        make_hook("candidate_progress", ("decoy_refund=2",), ctx)
    from gpusim.render import render_frame
    from gpusim.render.frame import frame_from_env
    fr = frame_from_env(env, 0)
    assert fr.candidates.shape == (env.num_slots, 2, 2)
    assert torch.equal(torch.from_numpy(fr.candidates), env.state.goal_cand[0])
    render_frame(env, 0)


def test_probe_card_table_rows(tmp_path):
    import json
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "profiling"))
    import memory_probe_card as card

    def ci(m, lo, hi, n=100):
        return {"mean": m, "lo": lo, "hi": hi, "n": n}

    summary = {"trial_0_score": ci(0.3, 0.2, 0.4), "trial_1_score": ci(0.4, 0.3, 0.5),
               "ada_delta_trial_1_minus_0": ci(0.1, 0.02, 0.18), "decoy_then_goal_trial_1": ci(0.5, 0.4, 0.6, 30),
               "decoy_then_decoy_trial_1": ci(0.25, 0.1, 0.4, 30)}
    p = tmp_path / "e.json"
    p.write_text(json.dumps({"memory": "trial", "deterministic": False, "runs": [{"summary": summary}]}))
    (row,) = card.table_rows([p])
    # s = 2 * 0.3 = 0.6, s^2 / 2 = 0.18
    assert row == ("| control (`--memory trial`), sampled | 0.300 [0.200, 0.400] | 0.400 [0.300, 0.500] | 0.600 | "
                   "0.180 | 0.100 [0.020, 0.180] | 0.50 [0.40, 0.60] | 0.25 [0.10, 0.40] (n 30) | 100 |")
    # the target: with memory ada >= max(s^2/4, 0.05) = 0.09 with its interval above 0; the control's holds 0
    assert "not as the target asks" in card.verdict([p])
    q = tmp_path / "m.json"
    q.write_text(json.dumps({"memory": "episode", "runs": [{"label": "ckpt", "summary": summary},
                                                             {"label": "steer_to_goal", "summary": summary}]}))
    assert card.verdict([q]) == "memory, deterministic: 0.100 against the target 0.090 with the interval above 0: met."
    assert "reaches it in 0.300 [0.200, 0.400] of the held-out trials (m.json)" in card.steer_to_goal_line([p, q])
    summary["ada_delta_trial_1_minus_0"] = ci(0.08, 0.01, 0.15)
    q.write_text(json.dumps({"memory": "episode", "runs": [{"label": "ckpt", "summary": summary}]}))
    assert card.verdict([q]).endswith("not met.")
    assert "docs/trial.md" in card.steer_to_goal_line([p, q])  # no JSON ran the baseline
    p.write_text(json.dumps({"memory": None, "runs": [{"summary": {"goal_reached": ci(0.5, 0.4, 0.6)}}]}))
    assert card.main(["--run", str(tmp_path), "--evals", str(p)]) == 2  # no checkpoint there: one line, exit 2


@pytest.mark.slow
def test_memory_task_triton_matches_torch(sample_dir):
    """The memory task on the Triton backend (interpreter on CPU) gives the torch backend's rewards,
    flags and observations (the candidate block and the hidden goal columns included). Slow: ~50 s
    under the interpreter."""
    from gpusim.backend import interpreting
    from gpusim.data import ScenarioPack

    if not (torch.cuda.is_available() or interpreting()):
        pytest.skip("no CUDA and no Triton interpreter")
    import test_backend_e2e as e2e

    config = EnvConfig(**e2e.BASE, goal_behavior="trial", k_trials=2, goal_candidates=2)
    pk = ScenarioPack.from_json(sorted(sample_dir.glob("*.json*")), config.data_config(grid_edge_k=e2e.GRID_EDGE_K))
    seen, _ = e2e.compare_rollout(pk, config, steps=20)  # one whole episode (2 trials of 10 steps)
    assert seen["terminal"] > 0


@pytest.mark.parametrize("memory", ["episode", "trial"])
def test_graphed_rollout_equals_eager_on_the_memory_task(pack, memory):
    """The trainer's CUDA-graph rollout (here with the fake capture that runs the same engine, audit
    included, on the CPU) equals the eager rollout on the memory task, for the policy with memory
    and for the memoryless control (whose cache clear at trial starts is part of the graph)."""
    from gpusim.cuda_graph import FakeGraphCapture
    from policy.actor_critic import ActorCritic, PolicyConfig
    from train.graphed_rollout import GraphedRollout
    from train.rollout import STEP_FIELDS, RolloutBatch, collect_rollout

    cfg = EnvConfig(**{**CFG, "scenario_length": 5}, goal_candidates=2, check_actions="async")

    def run(graphed):
        env = DriveEnv(pack, num_worlds=3, config=cfg, seed=3)
        torch.manual_seed(0)
        pol = ActorCritic(env.obs_layout, env.num_actions, config=PolicyConfig(
            d_model=16, n_layers=1, n_heads=2, hidden=16, max_roads=8, memory=memory)).eval()
        buf = RolloutBatch.for_env(env, False)
        cache = pol.init_cache(3 * env.num_slots, env.horizon, env.device)
        roll = GraphedRollout(env, pol, buf, cache, capture=FakeGraphCapture()) if graphed else None
        obs = env.reset(seed=5)
        out = []
        for i in range(2):
            torch.manual_seed(100 + i)
            obs, b = roll(obs) if graphed else collect_rollout(env, pol, obs, buf, cache, False)
            out.append({f: getattr(b, f).clone() for f in STEP_FIELDS})
            out[-1]["cache_position"] = cache.position.clone()
        return out, roll

    eager, _ = run(False)
    graphed, roll = run(True)
    assert roll.fallback_reason is None
    for a, b in zip(eager, graphed):
        for k in a:
            assert torch.equal(a[k], b[k]), k
    assert any(bool(r["truncation"].any()) for r in eager)


def _polyline(points, step=5.0):
    """[n, 4] segments of the polyline through ``points`` cut every ``step`` m."""
    out = []
    for (x0, y0), (x1, y1) in zip(points[:-1], points[1:]):
        n = max(1, int(round(np.hypot(x1 - x0, y1 - y0) / step)))
        for k in range(n):
            a, b = k / n, (k + 1) / n
            out.append((x0 + a * (x1 - x0), y0 + a * (y1 - y0), x0 + b * (x1 - x0), y0 + b * (y1 - y0)))
    return out


def test_reachable_places_follow_the_lane_graph():
    """Hand-built map: a lane east from (0, 0) that forks at x = 20 (straight on, or a 90-degree left
    turn up x = 20), a neighbouring eastbound lane at y = 3.7, an unconnected westbound lane at
    y = -3.7 and a lane that starts 3 m past the end of the first (not joined). From (0, 0) heading
    east at driving distance 30 m the places are (30, 0), (24, 14 - 4 sqrt 2) and (30, 3.7): one per route, the
    other direction and the gap never."""
    seg = np.array(_polyline([(0, 0), (20, 0)]) + _polyline([(20, 0), (60, 0)])
                   + _polyline([(20, 0), (24, 4), (24, 40)]) + _polyline([(0, 3.7), (60, 3.7)])
                   + _polyline([(60, -3.7), (0, -3.7)]) + _polyline([(0, 20), (20, 20)])
                   + _polyline([(23, 20), (60, 20)]), dtype=np.float64)
    succ = lane_successors(seg)
    got = reachable_places(seg, succ, np.array([0.0, 0.0]), 0.0, 30.0)
    want = np.array([[30.0, 0.0], [24.0, 14.0 - 32 ** 0.5], [30.0, 3.7]])
    assert len(got) == 3
    for w in want:
        assert np.min(np.linalg.norm(got - w, axis=1)) < 1e-4, (w, got)
    # from the unjoined lane: its own end is as far as a route goes (no place at 30 m)
    assert len(reachable_places(seg, succ, np.array([0.0, 20.0]), 0.0, 30.0)) == 0


def test_pool_prefers_reachable_places_on_real_scenarios(pack):
    """On the bundled sample an agent with >= 2 lane-graph places gets exactly those (between r/2
    and r <= 60 m (+ the start's distance from its lane) from its start in a straight line); every agent has >= 2 places."""
    from gpusim.config import RoadType
    from gpusim.sim.candidates import _driving_distance

    cfg = EnvConfig(**CFG, goal_candidates=2)
    places, count = candidate_pool(pack, cfg)
    used = 0
    for s in range(pack.num_scenarios):
        lane = pack.road_type[s] == int(RoadType.LANE)
        seg = pack.road_seg[s, lane].numpy().astype(np.float64)
        succ = lane_successors(seg)
        for c in range(int(pack.num_controlled[s])):
            start = pack.traj_pos[s, c, 0].numpy()
            r = _driving_distance(pack.traj_pos[s, c].numpy(), pack.traj_valid[s, c].numpy())
            reach = reachable_places(seg, succ, start, float(pack.traj_heading[s, c, 0]), r)
            assert int(count[s, c]) >= 2
            if len(reach) >= 2:
                used += 1
                assert np.allclose(places[s, c, : int(count[s, c])].numpy(), reach)
                dist = np.linalg.norm(reach - start, axis=1)
                assert (dist >= r / 2 - 1e-3).all() and (dist <= r + START_LATERAL).all()  # from the lane, not the start
    assert used >= 20  # most agents of the sample have a lane-graph choice


def test_memory_path_probe_records_whole_episodes(sample_dir, capsys):
    """profiling/memory_path_probe.py: one episode per world, trial 1 present and hidden from
    nothing, labels are the true candidates, and a bad --data is one line with exit code 2."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("memory_path_probe", ROOT / "profiling" / "memory_path_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    cfg = EnvConfig(**CFG, goal_candidates=2)
    pack = load_pack(str(sample_dir), cfg)
    d = probe.record(pack, cfg, 4, seed=1)
    R, H = d["terminal"].shape
    assert R == 4 * cfg.max_controlled and d["obs"].shape[:2] == (R, H)
    assert bool(d["trial1"].any()) and bool((~d["trial1"]).any())
    assert bool(d["terminal"].any()) and int(d["terminal"].sum(1).max()) == 1  # one episode per row, ended once
    assert set(d["label"].tolist()) <= {0, 1}
    assert probe.main(["--data", "no/such/dir"]) == 2
    assert "--data no/such/dir" in capsys.readouterr().err


def test_resume_keeps_the_memory_task_shaping(tmp_path):
    """A memory-task run resumed without flags keeps its shaping (``candidate_progress``) instead of
    the trainer's default ``progress``, which the task refuses."""
    from train.run import main

    common = ["--num-worlds", "2", "--num-threads", "1", "--log-dir", str(tmp_path), "--quiet"]
    assert main(["--env.goal-behavior", "trial", "--env.k-trials", "2", "--env.goal-candidates", "2",
                 "--total-timesteps", "500", "--run-name", "m", *common]) == 0
    ckpt = tmp_path / "m" / "checkpoint.pt"
    first = torch.load(ckpt, weights_only=False)["global_step"]
    assert main(["--resume", str(ckpt), "--total-timesteps", str(2 * first), *common]) == 0
    assert torch.load(ckpt, weights_only=False)["global_step"] > first
    # a checkpoint that recorded no hook gets the task's default, by the rule new runs follow
    from train.config import parse_args
    from train.resume import prepare_run

    old = torch.load(ckpt, weights_only=False)
    old["config"].pop("experience")
    old["config"].pop("experience_arg", None)
    old.pop("checksums", None)  # nor checksums: a checkpoint of that time
    torch.save(old, tmp_path / "old.pt")
    cfg = prepare_run(parse_args(["--resume", str(tmp_path / "old.pt"), *common]))[0]
    assert cfg.experience == "candidate_progress" and cfg.env.goal_candidates == 0  # the flags' env is kept


class _ToCandidate:
    """A test driver: at the first step of each trial it puts agent (0, 0) on a candidate, the
    decoy in trial 0 and the true goal in trial 1, standing still; every action brakes."""

    def begin(self, env, obs):
        self.placed = set()

    def act(self, env, obs):
        st = env.state
        k = int(st.trial_count[0])
        if k not in self.placed:
            self.placed.add(k)
            true = int(st.cand_true[0, 0])
            pos, speed = st.pos.clone(), st.speed.clone()
            pos[0, 0] = st.goal_cand[0, 0, 1 - true if k == 0 else true]
            speed[0, 0] = 0.0
            env.state = st.replace(pos=pos, speed=speed)
        return torch.zeros(env.num_worlds, env.num_slots, dtype=torch.int64)

    def observe(self, env, result):
        """Nothing to record: the test reads the evaluator's own columns."""


def test_evaluator_records_decoys_per_trial_and_what_follows_them(pack):
    from train.eval.report import summarise
    from train.eval.sweep import episode_records, run_episode

    env = _env(pack, W=2, goal_candidates=2)
    scen = torch.tensor([0, 1])
    ep = run_episode(env, _ToCandidate(), scen)
    assert ep["trial_decoy"][0, 0].tolist() == [True, False]
    assert ep["trial_goal"][0, 0].tolist() == [False, True]
    assert not (ep["trial_decoy"] & ep["trial_goal"]).any()  # a trial ends at one candidate at most
    agents, worlds = episode_records(ep, scen, torch.zeros(2, dtype=torch.int64), torch.ones(2, dtype=torch.bool))
    s = summarise(agents, worlds)
    n_decoy = int(agents["trial_0_decoy"].sum())
    assert n_decoy >= 1 and s["decoy_then_goal_trial_1"].n == n_decoy
    hand = float(agents["trial_1_score"][agents["trial_0_decoy"].bool()].mean())  # the braking agents reach nothing
    assert s["decoy_then_goal_trial_1"].mean == pytest.approx(hand) and hand > 0
    assert s["trial_0_decoy"].mean == pytest.approx(n_decoy / len(agents["trial_0_decoy"]))


def test_decoy_summaries_by_hand():
    from train.eval.report import summarise

    one = torch.ones(4)
    agents = {"goal_reached": one, "collided": 0 * one, "offroad": 0 * one, "score": one, "episode_return": one,
              "trial_0_score": torch.tensor([0., 0., 1., 0.]), "trial_1_score": torch.tensor([1., 0., 1., 0.]),
              "trial_0_clean_score": 0 * one, "trial_1_clean_score": 0 * one,
              "trial_0_decoy": torch.tensor([1., 1., 0., 1.]), "trial_1_decoy": torch.tensor([0., 1., 0., 0.])}
    s = summarise(agents)
    assert s["decoy_then_goal_trial_1"].mean == pytest.approx(1 / 3) and s["decoy_then_goal_trial_1"].n == 3
    assert s["decoy_then_decoy_trial_1"].mean == pytest.approx(1 / 3)
    assert s["trial_0_decoy"].mean == pytest.approx(0.75) and "decoy_then_goal_trial_0" not in s
