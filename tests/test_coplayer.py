"""Population play: roles, frozen partner policies, masking of co-player steps, ego/co-player
metrics, trial restarts with co-players. Crafted scenarios (tests/synthetic.py) on the torch backend."""

from __future__ import annotations

import pytest
import torch

from gpusim.config import EnvConfig
from gpusim.env import DriveEnv
from gpusim.sim.roles import ego_mask, num_egos
from policy.actor_critic import ActorCritic, PolicyConfig
from train.checkpoint import save_checkpoint
from train.coplayer import CoplayerPool, coplayer_env_config, load_partner, make_pool
from train.config import UserError
from train.ppo import PPOConfig, ppo_loss
from train.rollout import RolloutBatch, TrialLog, collect_rollout
from train.run import update_policy

from synthetic import driver, lane, parked, small_config, synthetic_pack
from test_trial import COAST, assert_trial_start, crafted_pack


def four_car_pack():
    """Two scenarios with 4 controlled cars (lanes 10 m apart) and 2 experts; scenario 1 has 3 cars."""
    cars = [driver(0, 10.0 * i, 0.0, 4.0 + i, (60.0, 10.0 * i)) for i in range(4)]
    return synthetic_pack([
        {"agents": cars + [driver(-30, -10, 0.0, 3.0, (100.0, -10.0)), parked(5, 50)], "num_controlled": 4,
         "roads": lane() + lane(y=30.0)},
        {"agents": cars[:3] + [parked(40, 40)], "num_controlled": 3, "roads": lane()},
    ], small_config())


def env_cfg(**kw):
    base = dict(max_agents=8, max_controlled=4, num_partners=7, num_roads=16, scenario_length=12)
    base.update(kw)
    return EnvConfig(**base)


def make_partner(tmp_path, env, name, d_model=16, seed=0):
    torch.manual_seed(seed)
    pol = ActorCritic(env.obs_layout, env.num_actions, False,
                      PolicyConfig(d_model=d_model, n_layers=1, n_heads=2, hidden=16, max_roads=8))
    path = tmp_path / name
    save_checkpoint(path, policy=pol, optimizer=torch.optim.Adam(pol.parameters()), global_step=7, update=1,
                    config={}, env_config={})
    return str(path)


def ego_policy(env):
    torch.manual_seed(1)
    return ActorCritic(env.obs_layout, env.num_actions, False, PolicyConfig(d_model=16, n_layers=1, n_heads=2,
                                                                           hidden=16, max_roads=8))


# ---------------------------------------------------------------------------- roles
def test_without_coplayers_every_active_slot_is_ego_and_nothing_is_drawn():
    """Default config: ego == slot_active at every step, through the auto-reset, and the env's
    generator holds exactly the draws of an env without roles (the scenario draws)."""
    env = DriveEnv(four_car_pack(), 3, env_cfg(), seed=5)
    g = torch.Generator().manual_seed(5)
    torch.randint(2, (3,), generator=g)  # construction draw
    env.reset(seed=9)
    g.manual_seed(9)
    torch.randint(2, (3,), generator=g)
    assert torch.equal(env.generator.get_state(), g.get_state())
    for _ in range(env.horizon + 3):
        assert torch.equal(env.state.ego, env.state.slot_active)
        env.step(torch.full((3, 4), COAST, dtype=torch.int64))
    assert env.metrics(role="coplayer") == {}
    assert env.metrics()["n"] == pytest.approx(float(env.sim.metrics.ema.has_data.sum()))


def test_role_rules():
    active = torch.tensor([[True, True, True, True], [True, True, True, False], [True, False, False, False],
                           [False] * 4])
    sdc = torch.tensor([2, -1, 0, -1])
    g = torch.Generator().manual_seed(0)
    one = ego_mask(env_cfg(ego_slots=1), active, sdc, g)
    assert one.sum(1).tolist() == [1, 1, 1, 0] and one[0, 2] and one[2, 0]
    assert not (one & ~active).any()
    first = ego_mask(env_cfg(ego_slots=2, ego_choice="first"), active, sdc, g)
    assert first.tolist()[0] == [True, True, False, False] and first.sum(1).tolist() == [2, 2, 1, 0]
    assert num_egos(env_cfg(ego_fraction=0.5), active.sum(1)).tolist() == [2, 2, 1, 0]
    draws = {tuple(ego_mask(env_cfg(ego_slots=1, ego_choice="random"), active, sdc, g)[0].tolist())
             for _ in range(40)}
    assert len(draws) == 4  # every slot of world 0 is drawn sometimes
    assert coplayer_env_config(env_cfg(), ("p.pt",)).ego_slots == 1
    assert coplayer_env_config(env_cfg(), ()).ego_slots == 0
    assert coplayer_env_config(env_cfg(ego_fraction=0.5), ("p.pt",)).ego_slots == 0
    with pytest.raises(ValueError, match="ego_choice"):
        env_cfg(ego_choice="best")


def test_roles_change_only_at_episode_boundaries_and_experts_can_leave():
    cfg = env_cfg(ego_slots=1, ego_choice="random", goal_behavior="trial", k_trials=2, scenario_length=6)
    env = DriveEnv(four_car_pack(), 4, cfg, seed=3)
    seen = []
    for _ in range(3):
        ego = env.state.ego.clone()
        seen.append(ego)
        assert (ego.sum(1) == 1).all()
        for t in range(env.horizon):
            assert torch.equal(env.state.ego, ego)
            env.step(torch.full((4, 4), COAST, dtype=torch.int64))
    assert any(not torch.equal(seen[0], s) for s in seen[1:])
    env = DriveEnv(four_car_pack(), 2, env_cfg(replay_experts=False))
    env.reset(scenarios=torch.tensor([0, 1]))
    expert = ~env.state.controlled & (env.state.agent_type >= 0)
    assert expert.any() and not (env.state.present & expert).any()
    env.step(torch.full((2, 4), COAST, dtype=torch.int64))
    assert not (env.state.present & expert).any()


# ---------------------------------------------------------------------------- partners
def test_load_partner_freezes_and_rejects_other_observations(tmp_path):
    env = DriveEnv(four_car_pack(), 2, env_cfg(ego_slots=1))
    p = load_partner(make_partner(tmp_path, env, "a.pt"), env.obs_layout, env.num_actions, False, "cpu")
    assert not p.policy.training and not any(q.requires_grad for q in p.policy.parameters())
    assert p.label.endswith("a.pt@7")
    other = DriveEnv(four_car_pack(), 2, env_cfg(ego_slots=1, num_partners=3))
    with pytest.raises(UserError, match="observations"):
        load_partner(make_partner(tmp_path, other, "b.pt"), env.obs_layout, env.num_actions, False, "cpu")
    with pytest.raises(UserError, match="no such"):
        make_pool([str(tmp_path / "nothing.pt")], env, "cpu", 0)
    with pytest.raises(UserError, match="ego-slots"):
        make_pool([str(tmp_path / "a.pt")], DriveEnv(four_car_pack(), 2, env_cfg()), "cpu", 0)


def test_batched_coplayer_actions_equal_per_world_partner_forward(tmp_path):
    """One forward_eval per partner over all its slots = each world's slots run alone (float32)."""
    W = 5
    env = DriveEnv(four_car_pack(), W, env_cfg(ego_slots=1))
    paths = [make_partner(tmp_path, env, "a.pt", 16, 0), make_partner(tmp_path, env, "b.pt", 32, 1)]
    pool = make_pool(paths, env, "cpu", seed=2)
    obs = env.reset(seed=4)
    pool.begin(env)
    assert set(pool.partner_of.tolist()) == {0, 1}
    C, R = env.num_slots, W * env.num_slots
    cop = (env.state.slot_active & ~env.state.ego)
    ref_caches = {w: pool.partners[int(pool.partner_of[w])].policy.init_cache(int(cop[w].sum()), env.horizon)
                  for w in range(W)}
    removed = torch.zeros(W, C, dtype=torch.bool)
    for _ in range(6):
        ego_actions = torch.full((R,), COAST, dtype=torch.int64)
        merged = pool.act(obs.reshape(R, -1), ego_actions)
        for w in range(W):
            pol = pool.partners[int(pool.partner_of[w])].policy
            logits, _, _ = pol.forward_eval(obs[w][cop[w]], ref_caches[w], removed[w][cop[w]])
            got = merged.view(W, C)[w][cop[w]]
            assert torch.equal(got, logits.argmax(-1))
            p = int(pool.partner_of[w])
            idx = torch.nonzero(cop.reshape(-1) & (pool.partner_of[:, None].expand(W, C).reshape(-1) == p)).flatten()
            rows = (idx // C == w)
            torch.testing.assert_close(pool.last_logits[p][rows], logits, rtol=1e-5, atol=1e-5)
        assert torch.equal(merged.view(W, C)[env.state.ego], torch.full_like(merged.view(W, C)[env.state.ego], COAST))
        res = env.step(merged.view(W, C))
        pool.observe(res)
        removed = res.removed
        obs = res.obs.clone()


def _rollout(env, tmp_path, policy):
    pool = make_pool([make_partner(tmp_path, env, "a.pt")], env, "cpu", seed=0)
    R, H = env.num_worlds * env.num_slots, env.horizon
    buf = RolloutBatch.empty(R, H, env.obs_dim, False, 1, "cpu")
    cache = policy.init_cache(R, H)
    obs = env.reset(seed=0)
    ego = env.state.ego.reshape(R).clone()
    collect_rollout(env, policy, obs, buf, cache, coplayers=pool)
    return pool, buf, ego


def test_coplayer_steps_never_train_and_partners_stay_frozen(tmp_path):
    env = DriveEnv(four_car_pack(), 3, env_cfg(ego_slots=1))
    policy = ego_policy(env)
    pool, buf, ego = _rollout(env, tmp_path, policy)
    before = {k: v.clone() for k, v in pool.partners[0].policy.state_dict().items()}
    assert not buf.loss_mask[~ego].any() and buf.loss_mask[ego].any()
    assert torch.equal(buf.slot_active, ego)
    # garbage in the co-player rows changes neither the loss nor its gradient
    mb = {k: getattr(buf, k) for k in ("obs", "actions", "logprobs", "values", "rewards", "terminal", "removed",
                                       "loss_mask")}
    mb["bootstrap_stop"] = buf.bootstrap_stop()
    bad = dict(mb)
    for k in ("obs", "values", "rewards", "logprobs"):
        bad[k] = torch.where(ego.view(-1, *[1] * (mb[k].dim() - 1)), mb[k], torch.randn_like(mb[k]) * 100)
    bad["actions"] = torch.where(ego[:, None], mb["actions"], torch.randint(0, 91, mb["actions"].shape))
    grads = []
    for batch in (mb, bad):
        policy.zero_grad()
        loss, _ = ppo_loss(policy, batch, PPOConfig())
        loss.backward()
        grads.append([p.grad.clone() for p in policy.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    # a full update: the optimizer-step count only sees ego steps; partner weights bit-identical
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    _, counts = update_policy(policy, opt, buf, None, PPOConfig(update_epochs=1, num_minibatches=1))
    assert counts["nominal_steps"] == int(buf.loss_mask.sum()) and counts["active_slots"] == int(ego.sum())
    after = pool.partners[0].policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_ego_metrics_ignore_coplayer_goals():
    """Crafted scenario 1: car 0 (the SDC, ego) reaches its goal, car 1 never does."""
    def run(config):
        env = DriveEnv(crafted_pack(), 2, config)
        env.reset(scenarios=torch.tensor([1, 1]))
        for _ in range(env.horizon):
            env.step(torch.full((2, 4), COAST, dtype=torch.int64))
        return env
    base = dict(max_agents=8, max_controlled=4, num_partners=7, num_roads=16, scenario_length=20)
    mixed = run(EnvConfig(**base)).metrics("mean")
    assert mixed["goal_reached"] == pytest.approx(0.5) and mixed["n"] == 4
    env = run(EnvConfig(**base, ego_slots=1))
    ego, cop = env.metrics("mean"), env.metrics("mean", role="coplayer")
    assert ego["goal_reached"] == pytest.approx(1.0) and ego["n"] == 2
    assert cop["goal_reached"] == pytest.approx(0.0) and cop["n"] == 2
    with pytest.raises(ValueError, match="role"):
        env.metrics(role="partner")


def test_trial_restart_with_coplayers_and_stationary_partners(tmp_path):
    """Trial 2 starts bit-for-bit like trial 1 with co-players present, and a deterministic partner
    acts identically in both trials when the ego replays the same actions (its memory is cleared
    at the trial start)."""
    config = EnvConfig(max_agents=8, max_controlled=4, num_partners=7, num_roads=16, scenario_length=20,
                       goal_behavior="trial", k_trials=2, ego_slots=1)
    env = DriveEnv(crafted_pack(), 2, config)
    pool = make_pool([make_partner(tmp_path, env, "a.pt")], env, "cpu", seed=0)
    obs = env.reset(scenarios=torch.tensor([1, 1]))
    start = env.state.clone()
    pool.begin(env)
    assert pool._actors[0].num_slots == 2
    acted, log = [], TrialLog(2, 20, "cpu")
    for t in range(env.horizon):
        merged = pool.act(obs.reshape(8, -1), torch.full((8,), COAST, dtype=torch.int64))
        acted.append((merged.view(2, 4) & (env.state.slot_active & ~env.state.ego)).clone())
        before = env.state
        res = env.step(merged.view(2, 4))
        pool.observe(res)
        log.step(before, res.info["trial_end"])
        obs = res.obs.clone()
        if t == 19:
            assert res.truncation[:, :2].all()
            assert_trial_start(env.state, start)
    assert all(torch.equal(acted[t], acted[t + 20]) for t in range(20))
    rep = log.report()
    assert rep["trial_log/completed"] == 4 and rep["trial_log/ended_by_timeout"] == 4
    assert rep["trial_log/mean_length"] == pytest.approx(20.0)
    m = env.metrics("mean")
    assert m["trial_0_score"] == pytest.approx(1.0) and m["trial_1_score"] == pytest.approx(1.0)
    assert "trial_1_clean_score" in m and m["ada_delta_trial_1_minus_0"] == pytest.approx(0.0)


def test_pool_needs_a_partner():
    with pytest.raises(ValueError, match="at least one"):
        CoplayerPool([], 1, 1, 1, "cpu")


def test_evaluate_modes_side_by_side_with_roles(tmp_path, capsys):
    """``evaluate --mode self_play coplayer --coplayer P`` on a saved crafted pack: the coplayer run
    reports one ego per world-episode, records carry the role, a missing --coplayer exits 2."""
    import json

    from train.config import TrainConfig
    from train.evaluate import EvalConfig, evaluate, main, write_records

    pack_file = four_car_pack().save(tmp_path / "four.pt")
    config = env_cfg(goal_behavior="trial", k_trials=2, scenario_length=10)
    env = DriveEnv(four_car_pack(), 1, config)
    pol = ego_policy(env)
    env_dict = TrainConfig(env=config).to_dict()["env"]
    ck = save_checkpoint(tmp_path / "ego.pt", policy=pol, optimizer=torch.optim.Adam(pol.parameters()),
                         global_step=0, update=0, config={"env": env_dict}, env_config=env_dict)
    partner = make_partner(tmp_path, env, "p.pt")
    out = evaluate(EvalConfig(policy=(str(ck),), data=str(pack_file), mode=("self_play", "coplayer"),
                              coplayer=(partner,), device="cpu", num_worlds=2, quiet=True))
    self_play, cop = out["runs"]
    assert self_play["summary"]["goal_reached"].n == 7  # 4 + 3 controlled cars, all egos
    assert cop["summary"]["goal_reached"].n == 2 and cop["partners"][0].endswith("p.pt@7")
    assert "ada_delta_trial_1_minus_0" in cop["summary"] and "trials_per_episode" in cop["summary"]
    n = write_records(out, tmp_path / "rec.jsonl")
    rows = [json.loads(line) for line in open(tmp_path / "rec.jsonl")]
    assert n == len(rows) == 14
    roles = [(r["mode"], r["role"]) for r in rows]
    assert roles.count(("coplayer", "ego")) == 2 and roles.count(("coplayer", "coplayer")) == 5
    assert all("trial_1_goal_step" in r for r in rows)
    assert main(["--policy", str(ck), "--data", str(pack_file), "--mode", "coplayer", "--device", "cpu"]) == 2
    assert "--coplayer PATH" in capsys.readouterr().err


def test_render_colours_coplayers_and_names_the_partner():
    pytest.importorskip("matplotlib")
    from gpusim.render.draw import render_frame
    from gpusim.render.frame import frame_from_env

    env = DriveEnv(four_car_pack(), 1, env_cfg(ego_slots=1))
    env.reset(scenarios=torch.tensor([0]))
    f = frame_from_env(env, 0, partner="runs/p/checkpoint.pt@7")
    assert f.coplayer[:4].tolist() == [False, True, True, True] and not f.coplayer[4:].any()
    assert "co-players 3" in f.title and "runs/p/checkpoint.pt@7" in f.title
    img = render_frame(env, 0, partner="p", figsize=2.0, dpi=40)
    assert img.ndim == 3
    plain = DriveEnv(four_car_pack(), 1, env_cfg())
    assert frame_from_env(plain, 0).coplayer is None


def test_train_run_with_coplayers_logs_roles_and_keeps_partners(tmp_path, monkeypatch):
    """``train.run.train`` with ``coplayer``: reports carry ego/*, coplayer/* and trial logs; the
    in-memory partner's weights are bit-identical to its file after two updates."""
    import train.run as run_module
    from train.config import TrainConfig
    from train.extras import RunExtras
    from train.run import train

    made = []

    class Spy(RunExtras):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(run_module, "RunExtras", Spy)
    config = env_cfg(ego_slots=1, goal_behavior="trial", k_trials=2, scenario_length=6)
    env = DriveEnv(four_car_pack(), 2, config)
    partner = make_partner(tmp_path, env, "p.pt")
    cfg = TrainConfig(env=config, policy=PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16, max_roads=8),
                      num_worlds=2, total_timesteps=2 * 12 * 2, report_interval=1, log_dir=str(tmp_path),
                      run_name="r", quiet=True, device="cpu", coplayer=(partner,),
                      ppo=PPOConfig(update_epochs=1, num_minibatches=1))
    out = train(cfg, env=env)
    rec = out["reports"][-1]
    assert out["update"] == 2 and out["global_step"] == 2 * 2 * 12  # 2 egos x horizon 12 per update
    assert "ego/goal_reached" in rec and "coplayer/n" in rec and rec["ego/n"] <= 2
    assert rec["trial_log/completed"] >= 2
    from train.checkpoint import load_checkpoint

    saved = load_checkpoint(partner)["model"]
    live = made[0].pool.partners[0].policy.state_dict()
    assert all(torch.equal(saved[k], live[k]) for k in saved)


def test_trial_score_is_goal_reached_and_clean_score_excludes_contacts():
    """A car that drives through a parked car (collisions ignored) and then reaches its goal:
    trial_0_score 1 (goal reached in the trial, docs/design.md section 9), trial_0_clean_score 0."""
    pack = synthetic_pack([{"agents": [driver(0, 0, 0.0, 5.0, (30.0, 0.0)), parked(15, 0)], "num_controlled": 1,
                            "roads": lane()}], small_config())
    env = DriveEnv(pack, 1, env_cfg(goal_behavior="trial", k_trials=1, scenario_length=70))
    collided = False
    for _ in range(env.horizon):
        res = env.step(torch.full((1, 4), COAST, dtype=torch.int64))
        collided |= bool(res.info["collided"].any())
    m = env.metrics("mean")
    assert collided and m["goal_reached"] == 1.0 and m["collided"] == 1.0
    assert m["trial_0_score"] == 1.0 and m["trial_0_clean_score"] == 0.0


def test_periodic_evaluation_logs_eval_mode_keys(tmp_path):
    """``--eval-interval 2 --eval-mode self_play coplayer``: evaluation at updates 2 and at the end,
    ``eval/<mode>/*`` ego means in the next report, nothing in between."""
    import types

    from train.extras import RunExtras

    pack_file = four_car_pack().save(tmp_path / "four.pt")
    config = env_cfg(ego_slots=1, scenario_length=5)
    env = DriveEnv(four_car_pack(), 2, config)
    partner = make_partner(tmp_path, env, "p.pt")
    cfg = types.SimpleNamespace(coplayer=(partner,), coplayer_sample=False, seed=0, eval_interval=2,
                                eval_mode=("self_play", "coplayer"), eval_data=str(pack_file), data="unused",
                                eval_episodes=1)
    extras = RunExtras(cfg, env, "cpu", say=lambda line: None)
    policy = ego_policy(env)
    extras.after_update(1, False, policy)
    assert not any(k.startswith("eval/") for k in extras.report())
    extras.after_update(2, False, policy)
    rec = extras.report()
    assert rec["eval/self_play/n"] == 7 and rec["eval/coplayer/n"] == 2
    assert 0.0 <= rec["eval/coplayer/goal_reached"] <= 1.0
    extras.after_update(3, True, policy)
    assert "eval/coplayer/score" in extras.report()
