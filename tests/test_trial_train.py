"""Trainer side of trial mode on the real DriveEnv: GAE cut at trial boundaries and removed steps,
KV cache kept across a trial boundary and cleared at the episode end, per-trial metrics from the
right trials, and ``train/evaluate.py --k-trials/--human-replay``."""

import pytest
import torch

from gpusim.env import DriveEnv
from gpusim.kernels.advantage import advantage
from policy.actor_critic import ActorCritic, PolicyConfig
from train.rollout import RolloutBatch, collect_rollout
from train.run import _env_metrics

from test_trial import BRAKE, COAST, cfg, crafted_pack


def small_policy(env):
    torch.manual_seed(0)
    return ActorCritic(env.obs_layout, env.num_actions, False, PolicyConfig(d_model=16, n_layers=2, n_heads=2, hidden=16))


def scripted(policy, env, fn):
    """Make ``policy`` act by ``fn(env) -> [W, C]`` actions (logits, values and the cache stay the
    policy's own, so the rollout exercises the real memory path)."""
    policy.sample = lambda logits, deterministic=False, temperature=1.0: fn(env).reshape(-1)
    return policy


def pinned_env(worlds, config):
    env = DriveEnv(crafted_pack(), len(worlds), config)
    obs = env.reset(scenarios=torch.tensor(worlds)).clone()
    return env, obs


def coast(env):
    return torch.full((env.num_worlds, env.num_slots), COAST, dtype=torch.int64)


def rollout(env, obs, policy):
    R, H = env.num_worlds * env.num_slots, env.horizon
    buf = RolloutBatch.empty(R, H, env.obs_dim, False, 1, "cpu")
    cache = policy.init_cache(R, H)
    nxt, batch = collect_rollout(env, policy, obs, buf, cache)
    return batch, cache


def test_gae_cut_at_trial_boundaries_and_removed_steps():
    # world 0 runs scenario 1: car 0 reaches its goal at step 16 (removed until the timeout at
    # step 19 = trial boundary), car 1 drives on; k = 2 trials of 20 steps.
    env, obs = pinned_env([1], cfg(k_trials=2, scenario_length=20))
    pol = scripted(small_policy(env), env, coast)
    batch, _ = rollout(env, obs, pol)
    trunc_cols = torch.nonzero(batch.truncation[0]).flatten().tolist()
    assert trunc_cols == [19] and torch.nonzero(batch.truncation[1]).flatten().tolist() == [19]
    assert batch.removed[0, 17:20].all() and not batch.removed[0, :17].any() and not batch.removed[0, 20:37].any()
    assert not batch.removed[1].any()
    stop = batch.bootstrap_stop()
    assert stop[0, 16:20].all() and stop[1, 19] and not stop[1, 18] and not stop[1, 20]
    g, lam = 0.99, 0.95
    adv, _ = advantage(batch.rewards, batch.values, stop, torch.zeros(batch.rows), g, lam)
    # perturbing the values of the next trial's first step and of removed steps changes no
    # advantage of an earlier step of the previous trial / of the step before the removal
    v2 = batch.values.clone()
    v2[:, 20] += 100.0
    v2[0, 17:20] += 100.0
    adv2, _ = advantage(batch.rewards, v2, stop, torch.zeros(batch.rows), g, lam)
    torch.testing.assert_close(adv2[:, :17], adv[:, :17], rtol=0, atol=0)
    torch.testing.assert_close(adv2[1, :20], adv[1, :20], rtol=0, atol=0)
    assert (adv2[:, 20] - adv[:, 20]).abs().min() > 1.0  # the perturbed step itself does change


def test_kv_cache_kept_across_trial_boundary_cleared_at_episode_end():
    env, obs = pinned_env([1, 0], cfg(k_trials=2, scenario_length=20))
    pol = scripted(small_policy(env), env, coast)
    batch, cache = rollout(env, obs, pol)
    C = env.num_slots
    active = batch.slot_active
    # the rollout's step-by-step values equal the whole-row forward (episode mask over both trials)
    with torch.no_grad():
        _, values = pol.forward(batch.obs, batch.terminal, batch.removed)
    keep = ~batch.removed & active[:, None]
    torch.testing.assert_close(values[keep], batch.values[keep], atol=1e-5, rtol=1e-5)
    # memory kept over the truncation: the first step of trial 2 differs from a fresh-memory step
    row = 0 * C + 1  # world 0 (scenario 1), car 1: never removed, boundary at column 19
    assert batch.truncation[row, 19] and not batch.terminal[row, :39].any()
    with torch.no_grad():
        _, v_fresh, _ = pol.forward_eval(batch.obs[row:row + 1, 20], pol.init_cache(1, env.horizon))
    assert (v_fresh[0] - batch.values[row, 20]).abs() > 1e-4
    # cleared at the episode end: every active slot got its terminal, its memory was cleared there
    # (world 1's single car ends its 2 trials at column 33, then idles: 6 more hidden tokens)
    assert torch.equal(batch.terminal.sum(1), active.long())
    H = env.horizon
    term_col = batch.terminal.long().argmax(1)
    assert term_col[C].item() == 33 and (term_col[:C][active[:C]] == H - 1).all()
    assert torch.equal(cache.position[active], (H - 1 - term_col)[active])
    assert (cache.position[~active] == H).all()  # inactive rows: never a terminal


def test_per_trial_metrics_from_the_right_trials():
    """Scenario 1 (car 0 reaches its goal when coasting, car 1 never does), k = 3 trials of 20
    steps: coast, brake (car 0 misses), coast. Per-agent trial scores: car 0 (1, 0, 1), car 1
    (0, 0, 0) -> trial scores 0.5, 0, 0.5; ada_delta 1-0: -0.5, 2-0: 0."""
    env, obs = pinned_env([1], cfg(k_trials=3, scenario_length=20))

    def plan(e):
        a = coast(e)
        if int(e.state.trial_count[0]) == 1:
            a[0, 0] = BRAKE
        return a

    pol = scripted(small_policy(env), env, plan)
    batch, _ = rollout(env, obs, pol)
    goal_cols = torch.nonzero(batch.rewards[0] == 1.0).flatten().tolist()
    assert goal_cols == [16, 56]  # trial 0 and trial 2 (trial 2 starts at column 40)
    m = _env_metrics(env)  # what train/run.py logs (first episode: EMA = the values)
    assert m["n"] == 2
    assert m["trial_0_score"] == pytest.approx(0.5) and m["trial_1_score"] == pytest.approx(0.0)
    assert m["trial_2_score"] == pytest.approx(0.5)
    assert m["ada_delta_trial_1_minus_0"] == pytest.approx(-0.5)
    assert m["ada_delta_trial_2_minus_0"] == pytest.approx(0.0)
    assert m["goal_reached"] == pytest.approx(0.5) and m["episode_return"] == pytest.approx(1.0)


def test_evaluate_k_trials_human_replay(tmp_path, sample_dir):
    """``train/evaluate.py --k-trials 2 --human-replay`` on the sample scenarios: one controlled
    agent per world (the others log-replayed), two trials, per-trial scores in the output."""
    from gpusim.config import EnvConfig
    from train.checkpoint import save_checkpoint
    from train.config import TrainConfig
    from train.evaluate import EvalConfig, evaluate, main

    if not sorted(sample_dir.glob("*.json*")):
        pytest.fail("data/womd_sample/ is empty: the bundled scenarios are missing")
    env_config = EnvConfig(max_controlled=8, num_roads=32)  # trained without trials
    from gpusim.kernels.observations import obs_layout

    torch.manual_seed(0)
    pol = ActorCritic(obs_layout(env_config.num_partners, env_config.num_roads, env_config.num_signals), 91, False,
                      PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16))
    env_dict = TrainConfig(env=env_config).to_dict()["env"]
    ck = save_checkpoint(tmp_path / "ck.pt", policy=pol, optimizer=torch.optim.Adam(pol.parameters()),
                         global_step=0, update=0, config={"env": env_dict}, env_config=env_dict)
    out = evaluate(EvalConfig(checkpoint=str(ck), data=str(sample_dir), num_worlds=3, device="cpu",
                              k_trials=2, human_replay=True))
    run = out["runs"][0]
    s = run["summary"]
    assert out["k_trials"] == 2 and run["mode"] == "human_replay"
    assert s["goal_reached"].n == len(run["scenarios"])  # one controlled agent per world, one episode per scenario
    for k in ("trial_0_score", "trial_1_score", "ada_delta_trial_1_minus_0"):
        assert k in s
    assert s["ada_delta_trial_1_minus_0"].mean == pytest.approx(s["trial_1_score"].mean - s["trial_0_score"].mean)
    assert main(["--checkpoint", str(ck), "--k-trials", "-1", "--device", "cpu"]) == 2
