"""Evaluation (``train/evaluate.py``, ``train/eval/``, ``train/baselines.py``): the deterministic
sweep, known tables on crafted scenes, intervals, trial scores, thread setting and CLI errors."""

from __future__ import annotations

import dataclasses
import pathlib
import json
import math

import pytest
import torch

from gpusim.config import EnvConfig, RoadType
from tests.synthetic import driver, lane, parked, small_config, synthetic_pack
from train.baselines import BASELINES, RandomActions, SteerToGoal, constant_speed, make_baseline
from train.eval.report import per_scenario, summarise
from train.eval.stats import mean_interval
from train.eval.sweep import CallableDriver, make_sweep_env, run_sweep, sweep_plan
from train.config import UserError
from train.evaluate import EvalConfig, apply_num_threads, evaluate, main

LENGTH = 40  # steps per episode in the crafted scenes (4 s)


def crafted_scenes() -> list[dict]:
    """Four one-agent scenes whose outcome under ``constant_speed`` (10 m/s straight along +x) is known:

    0. goal 20 m ahead: goal reached at t = 2 s;
    1. goal 20 m behind: never reached, nothing hit;
    2. a parked (log-replayed) car 20 m ahead, goal 30 m ahead: collision;
    3. a road edge across the road 12 m ahead, goal 30 m ahead: offroad.
    """
    road = lane(-60.0, 100.0)
    ego = lambda goal: driver(0.0, 0.0, 0.0, 10.0, goal=goal)  # noqa: E731
    edge = [(12.0, -15.0, 12.0, 15.0, int(RoadType.ROAD_EDGE))]
    return [
        {"agents": [ego((20.0, 0.0))], "num_controlled": 1, "roads": road},
        {"agents": [ego((-20.0, 0.0))], "num_controlled": 1, "roads": road},
        {"agents": [ego((30.0, 0.0)), parked(20.0, 0.0)], "num_controlled": 1, "roads": road},
        {"agents": [ego((30.0, 0.0))], "num_controlled": 1, "roads": road + edge},
    ]


#: constant_speed on crafted_scenes(): (goal, collided, offroad, return) per scenario
KNOWN = [(1.0, 0.0, 0.0, 1.0), (0.0, 0.0, 0.0, 0.0), (0.0, 1.0, 0.0, -0.5), (0.0, 0.0, 1.0, -0.5)]


def _env_config(**kw) -> EnvConfig:
    base = dict(max_agents=32, max_controlled=4, num_roads=16, scenario_length=LENGTH,
                collision_behavior="remove", offroad_behavior="remove")
    base.update(kw)
    return EnvConfig(**base)


@pytest.fixture(scope="module")
def pack():
    return synthetic_pack(crafted_scenes(), small_config(max_agents=32))  # 32: room for the 31 partner slots


@pytest.fixture(scope="module")
def pack_file(pack, tmp_path_factory):
    return pack.save(tmp_path_factory.mktemp("pack") / "crafted.pt")


def _sweep(pack, act, episodes=1, worlds=4, config=None):
    cfg = config or _env_config()
    env = make_sweep_env(pack, worlds, cfg, "cpu", seed=0)
    return env, run_sweep(env, CallableDriver(act), sweep_plan(pack.num_scenarios, episodes, worlds))


# ------------------------------------------------------------------------------------- the sweep
def test_sweep_plan_runs_each_scenario_exactly_n_times_in_order():
    plan = sweep_plan(num_scenarios=5, episodes=3, num_worlds=4)
    scen = torch.cat(plan.scenarios)
    rep = torch.cat(plan.repetition)
    real = torch.cat(plan.real)
    assert plan.num_worlds == 4 and len(plan.scenarios) == 4  # 15 world-episodes in 4 batches of 4
    assert real.sum() == 15 and not real[15:].any() and real[:15].all()  # padding at the end only
    assert scen[:15].tolist() == [0, 1, 2, 3, 4] * 3  # repetition-major, fixed order
    assert rep[:15].tolist() == [0] * 5 + [1] * 5 + [2] * 5
    assert torch.bincount(scen[real], minlength=5).tolist() == [3] * 5
    with pytest.raises(ValueError):
        sweep_plan(0, 1, 1)


def test_sweep_covers_each_scenario_n_times(pack):
    """3 episodes of 4 scenarios in batches of 5 worlds (the last batch padded): every scenario's
    agent-episode appears exactly 3 times, once per repetition, whatever the batch."""
    _, (agents, _) = _sweep(pack, constant_speed, episodes=3, worlds=5)
    assert torch.bincount(agents["scenario"].long(), minlength=4).tolist() == [3, 3, 3, 3]
    for s in range(4):
        assert sorted(agents["repetition"][agents["scenario"] == s].tolist()) == [0, 1, 2]
    rows = per_scenario(agents, 4)
    assert [r["episodes"] for r in rows] == [3] * 4 and [r["agent_episodes"] for r in rows] == [3] * 4


def test_reset_with_scenarios_sets_each_world(pack):
    env = make_sweep_env(pack, 3, _env_config(), "cpu", seed=0)
    env.reset(scenarios=torch.tensor([3, 0, 2]))
    assert env.state.scenario.tolist() == [3, 0, 2]
    with pytest.raises(ValueError, match="scenarios"):
        env.reset(scenarios=torch.tensor([0, 1, 4]))
    with pytest.raises(ValueError, match="scenarios"):
        env.reset(scenarios=torch.tensor([0, 1]))


# ------------------------------------------------------------------------------------- known tables
def test_known_policy_gives_known_table(pack):
    _, (agents, _) = _sweep(pack, constant_speed)
    order = agents["scenario"].argsort()
    got = torch.stack([agents[k][order] for k in ("goal_reached", "collided", "offroad", "episode_return")], 1)
    assert got.tolist() == [list(row) for row in KNOWN]
    s = summarise(agents)
    assert s["goal_reached"].mean == 0.25 and s["collided"].mean == 0.25 and s["offroad"].mean == 0.25
    assert s["score"].mean == 0.25 and s["episode_return"].mean == 0.0
    half = 1.959964 * 0.5 / 2.0  # z * s / sqrt(n) with s = 0.5 for (1, 0, 0, 0)
    assert s["goal_reached"].lo == 0.0 and s["goal_reached"].hi == pytest.approx(0.25 + half, abs=1e-5)
    assert s["goal_reached"].n == 4


def test_cli_known_table_json(pack_file, tmp_path, capsys):
    """The CLI on the saved crafted pack: env settings adopted from the pack, the known table in the
    JSON, both printed tables, baselines side by side."""
    out = tmp_path / "eval.json"
    rc = main(["--policy", "constant_speed", "expert", "--data", str(pack_file), "--json", str(out),
               "--records", str(tmp_path / "records.jsonl"), "--num-threads", "1", "--device", "cpu"])
    assert rc == 0
    res = json.loads(out.read_text())
    runs = {r["label"]: r for r in res["runs"]}
    assert set(runs) == {"constant_speed", "expert"}
    cs = runs["constant_speed"]
    assert cs["scenarios"] == [f"synthetic_{s}" for s in range(4)]
    assert cs["summary"]["goal_reached"]["mean"] == 0.25 and cs["summary"]["goal_reached"]["n"] == 4
    assert [r["goal_reached"] for r in cs["per_scenario"]] == [k[0] for k in KNOWN]
    assert [r["collided"] for r in cs["per_scenario"]] == [k[1] for k in KNOWN]
    assert runs["expert"]["summary"]["goal_reached"]["n"] == 4
    assert res["num_threads"] == 1 and res["episodes_per_scenario"] == 1
    recs = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 8  # 2 policies x 4 agent-episodes
    r2 = next(r for r in recs if r["policy"] == "constant_speed" and r["scenario"] == "synthetic_2")
    assert (r2["collided"], r2["goal_reached"], r2["slot"], r2["role"], r2["mode"]) == (1.0, 0.0, 0, "ego", "self_play")
    captured = capsys.readouterr()
    text = captured.out
    assert "world-episodes" in captured.err  # progress (rich) on stderr
    assert "synthetic_3" in text and "constant_speed" in text and "0.250 [0.000, 0.740]" in text


def test_recorded_episodes_match_env_metrics(pack):
    """The evaluator's per agent-episode records agree with the env's own plain means."""
    env, (agents, _) = _sweep(pack, RandomActions(seed=3), episodes=2, worlds=4)
    m = env.metrics(kind="mean")
    assert m["n"] == agents["goal_reached"].numel() == 8
    for k in ("goal_reached", "collided", "offroad", "score", "episode_return", "episode_length"):
        assert float(agents[k].double().mean()) == pytest.approx(m[k], abs=1e-6), k


def test_trial_scores_and_ada_delta(pack):
    """Trial mode with a driver that brakes in trial 0 and drives on in trial 1: per-trial scores,
    the clean score (goal without contact), paired ada_delta and the trial logs are as scripted."""
    brake = torch.tensor(0 * 13 + 6)  # -4 m/s^2, straight

    def act(env):
        a = constant_speed(env)
        first = (env.state.trial_count == 0)[:, None]
        return torch.where(first, brake, a)

    cfg = _env_config(goal_behavior="trial", k_trials=2, offroad_behavior="ignore")
    _, (agents, worlds) = _sweep(pack, act, config=cfg)
    order = agents["scenario"].argsort()
    t0, t1 = agents["trial_0_score"][order].tolist(), agents["trial_1_score"][order].tolist()
    assert t0 == [0, 0, 0, 0]
    # scene 3 with offroad IGNORE: the agent crosses the edge and still reaches its goal at 30 m
    assert t1 == [1, 0, 0, 1]
    assert agents["trial_1_clean_score"][order].tolist() == [1, 0, 0, 0]
    s = summarise(agents, worlds)
    assert s["ada_delta_trial_1_minus_0"].mean == 0.5
    assert s["trial_1_score"].mean == 0.5 and s["trial_1_clean_score"].mean == 0.25
    assert worlds["trials"].tolist() == [2, 2, 2, 2]
    # trial 0 always times out; trial 1 ends early (goal: agent removed) in scenes 0, 2 (collision) and 3
    assert s["trials_ended_early"].mean == pytest.approx(3 / 8)


def test_trial_log_counts_per_world():
    """The one trial count (``train.rollout.TrialLog``) behind the trainer's trial log and the
    evaluator's world columns, on a hand-computed case: timeout 4, three worlds, two steps."""
    from types import SimpleNamespace

    from train.rollout import TrialLog

    def state(step, start):
        return SimpleNamespace(step=torch.tensor(step, dtype=torch.int32), trial_start=torch.tensor(start, dtype=torch.int32))

    log = TrialLog(3, 4, "cpu")
    # trial lengths (step + 1 - trial_start) 4, 2, 1: world 0 times out, world 1 ends early, world 2 runs on
    log.step(state([3, 1, 0], [0, 0, 0]), torch.tensor([True, True, False]))
    # lengths 2, 3, 3: worlds 1 and 2 end early
    log.step(state([5, 4, 2], [4, 2, 0]), torch.tensor([False, True, True]))
    assert log.trials.tolist() == [1, 2, 1] and log.ended_early.tolist() == [0, 2, 1]
    assert log.steps.tolist() == [4, 5, 3]
    assert log.report() == {"trial_log/completed": 4.0, "trial_log/ended_early": 3.0,
                            "trial_log/ended_by_timeout": 1.0, "trial_log/mean_length": 3.0}
    assert log.trials.tolist() == [0, 0, 0] and log.report() == {}


# ------------------------------------------------------------------------------------- intervals
def test_intervals():
    iv = mean_interval([1.0, 0.0, 0.0, 0.0])
    assert iv.mean == 0.25 and iv.n == 4
    half = 1.959964 * 0.5 / 2.0
    assert iv.lo == pytest.approx(0.25 - half, abs=1e-5) and iv.hi == pytest.approx(0.25 + half, abs=1e-5)
    assert mean_interval([1.0, 0.0, 0.0, 0.0], bounds=(0.0, 1.0)).lo == 0.0
    z90 = 1.644854
    assert mean_interval([1.0, 0.0], level=0.9).hi == pytest.approx(0.5 + z90 * math.sqrt(0.5) / math.sqrt(2), abs=1e-5)
    same = mean_interval(torch.ones(10), method="bootstrap")
    assert (same.lo, same.hi) == (1.0, 1.0)
    x = (torch.arange(400) % 2).float()  # 200 ones, 200 zeros: normal half-width 1.96 * 0.5006 / 20
    boot, norm = mean_interval(x, method="bootstrap", seed=1), mean_interval(x)
    assert boot.lo == pytest.approx(norm.lo, abs=0.01) and boot.hi == pytest.approx(norm.hi, abs=0.01)
    assert mean_interval(x, method="bootstrap", seed=1) == boot  # seeded
    one = mean_interval([0.5])
    assert one.mean == 0.5 and math.isnan(one.lo) and math.isnan(mean_interval([]).mean)
    with pytest.raises(ValueError, match="method"):
        mean_interval([1.0], method="wilson")
    with pytest.raises(ValueError, match="level"):
        mean_interval([1.0], level=1.0)


def test_ada_delta_interval_is_paired():
    """ada_delta's interval is that of the per-agent differences (not of two independent means)."""
    t0 = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    agents = {"trial_0_score": t0, "trial_1_score": t0.clone(), "trial_0_clean_score": t0,
              "trial_1_clean_score": t0, **{k: t0 for k in ("goal_reached", "collided", "offroad", "score",
                                                              "episode_return")}}
    d = summarise(agents)["ada_delta_trial_1_minus_0"]
    assert (d.mean, d.lo, d.hi) == (0.0, 0.0, 0.0)


# ------------------------------------------------------------------------------------- baselines
def test_baselines_actions_and_behaviour(pack):
    env = make_sweep_env(pack, 4, _env_config(), "cpu", seed=0)
    env.reset(scenarios=torch.arange(4))
    for name in BASELINES:
        a = make_baseline(name, seed=0)(env)
        assert a.shape == (4, 4) and a.dtype == torch.int64 and 0 <= int(a.min()) and int(a.max()) < 91, name
    assert constant_speed(env).unique().tolist() == [3 * 13 + 6]  # (0 m/s^2, 0 rad)
    r1, r2 = RandomActions(5)(env), RandomActions(5)(env)
    assert torch.equal(r1, r2)
    with pytest.raises(ValueError, match="steer_to_goal"):
        make_baseline("nope")
    cont = make_sweep_env(pack, 4, _env_config(action_space="continuous"), "cpu", seed=0)
    cont.reset(scenarios=torch.arange(4))
    for name in BASELINES:
        a = make_baseline(name, seed=0)(cont)
        assert a.shape == (4, 4, 2) and a.dtype == torch.float32 and float(a.abs().max()) <= 1.0, name
    # steer_to_goal: straight at a goal ahead; full lock and braking (to turn_speed) for one behind
    accel, steer = SteerToGoal().controls(env)
    assert float(steer[0, 0]) == 0.0 and float(steer[1, 0]) == 1.0 and float(accel[1, 0]) == -4.0
    _, (agents, _) = _sweep(pack, SteerToGoal())
    assert agents["goal_reached"][agents["scenario"] == 0].tolist() == [1.0]


# ------------------------------------------------------------------------------------- CLI
def test_num_threads_applied(pack_file, monkeypatch, tmp_path):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert main(["--policy", "constant_speed", "--data", str(pack_file), "--num-threads", "1", "--quiet",
                     "--device", "cpu"]) == 0
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        monkeypatch.setattr("train.evaluate.available_cores", lambda: 1)
        assert apply_num_threads(0) == 1 and torch.get_num_threads() == 1  # default capped at the cores
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("argv, message", [
    ([], "nothing to evaluate"),
    (["--policy", "missing.pt"], "no such checkpoint"),
    (["--policy", "random", "--mode", "coplayer"], "coplayer"),
    (["--policy", "random", "--episodes-per-scenario", "0"], "--episodes-per-scenario"),
    (["--policy", "random", "--num-threads", "-1"], "--num-threads"),
    (["--policy", "random", "--chunk-size", "0"], "--chunk-size"),
    (["--policy", "random", "--data", "no/such/dir"], "no such file"),
])
def test_cli_user_errors_exit_2(argv, message, capsys):
    assert main(argv + ["--device", "cpu", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0]


def test_policy_checkpoint_is_deterministic(pack_file, tmp_path):
    """A trained-policy checkpoint evaluates with argmax actions: the same numbers twice; its env
    settings (from the checkpoint) are used for the baselines beside it."""
    from gpusim.kernels.observations import obs_layout
    from policy.actor_critic import ActorCritic, PolicyConfig
    from train.checkpoint import save_checkpoint
    from train.config import TrainConfig

    env_config = _env_config()
    torch.manual_seed(0)
    pol = ActorCritic(obs_layout(env_config.num_partners, env_config.num_roads, env_config.num_signals), 91, False,
                      PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16))
    env_dict = TrainConfig(env=env_config).to_dict()["env"]
    ck = save_checkpoint(tmp_path / "run" / "checkpoint.pt", policy=pol, optimizer=torch.optim.Adam(pol.parameters()),
                         global_step=7, update=1, config={"env": env_dict}, env_config=env_dict)
    cfg = EvalConfig(policy=(str(ck), "constant_speed"), data=str(pack_file), device="cpu", num_threads=1)
    a, b = evaluate(cfg), evaluate(dataclasses.replace(cfg, policy=(str(ck.parent),)))  # a run dir works too
    assert [r["label"] for r in a["runs"]] == ["run/checkpoint.pt", "constant_speed"]
    assert a["runs"][0]["global_step"] == 7 and a["env"]["scenario_length"] == LENGTH
    for k in ("goal_reached", "collided", "episode_return"):
        assert a["runs"][0]["summary"][k] == b["runs"][0]["summary"][k]


def test_ensemble_spec_mixes_checkpoints(pack_file, tmp_path, capsys):
    """``--policy A+B``: one policy, labelled by its members. A checkpoint mixed with itself acts
    exactly as it does alone; with a different second member the figures are its own run; a
    missing member is one line naming it (exit 2)."""
    from gpusim.kernels.observations import obs_layout
    from policy.actor_critic import ActorCritic, PolicyConfig
    from train.checkpoint import save_checkpoint
    from train.config import TrainConfig

    env_config = _env_config()
    env_dict = TrainConfig(env=env_config).to_dict()["env"]
    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        pol = ActorCritic(obs_layout(env_config.num_partners, env_config.num_roads, env_config.num_signals), 91, False,
                          PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16))
        with torch.no_grad():  # members far from uniform, so that mixing them matters
            pol.actor.bias.copy_(torch.randn(91, generator=torch.Generator().manual_seed(seed)) * 3)
        paths.append(str(save_checkpoint(tmp_path / f"m{seed}" / "checkpoint.pt", policy=pol, global_step=1,
                                         update=1, optimizer=torch.optim.Adam(pol.parameters()),
                                         config={"env": env_dict}, env_config=env_dict)))
    a, b = paths
    cfg = EvalConfig(policy=(a, f"{a}+{a}", f"{a}+{b}", b), data=str(pack_file), device="cpu", num_threads=1,
                     decode="mean")
    runs = evaluate(cfg)["runs"]
    assert [r["label"] for r in runs] == ["m0/checkpoint.pt", "m0/checkpoint.pt+m0/checkpoint.pt",
                                          "m0/checkpoint.pt+m1/checkpoint.pt", "m1/checkpoint.pt"]
    summary = [r["summary"] for r in runs]
    assert summary[0] == summary[1]
    assert summary[2] not in (summary[0], summary[3])
    assert main(["--policy", f"{a}+{tmp_path / 'nope.pt'}", "--data", str(pack_file), "--device", "cpu",
                 "--quiet", "--num-threads", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"(member {tmp_path / 'nope.pt'}): no such checkpoint file" in err[0]
    # a folder whose name holds "+" is one checkpoint, not an ensemble
    plus = tmp_path / "lr1e-3+wide"
    plus.mkdir()
    (plus / "checkpoint.pt").write_bytes(pathlib.Path(a).read_bytes())
    one = evaluate(dataclasses.replace(cfg, policy=(str(plus),)))["runs"][0]
    assert one["label"] == f"{tmp_path.name}/lr1e-3+wide" and one["summary"] == summary[0]
    # one member per agent: a checkpoint drawn against itself is the checkpoint, recorded in the JSON
    res = evaluate(dataclasses.replace(cfg, policy=(f"{a}+{a}",), ensemble_draw="agent"))
    assert res["runs"][0]["summary"] == summary[0] and res["ensemble_draw"] == "agent"
    assert main(["--policy", a, "--ensemble-draw", "agent", "--data", str(pack_file), "--device", "cpu",
                 "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--ensemble-draw agent: no ensemble to draw from" in err[0]


def test_checkpoint_for_other_observations_is_one_line(pack_file, tmp_path, capsys):
    """A second checkpoint that reads fewer road points than the first one's env gives: exit 2 with
    one line naming it and both observation layouts (the first one's settings are used)."""
    from gpusim.kernels.observations import obs_layout
    from policy.actor_critic import ActorCritic, PolicyConfig
    from train.checkpoint import save_checkpoint
    from train.config import TrainConfig

    paths = []
    for name, roads in (("a", 16), ("b", 8)):
        env_config = _env_config(num_roads=roads)
        pol = ActorCritic(obs_layout(env_config.num_partners, roads, env_config.num_signals), 91, False,
                          PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16))
        env_dict = TrainConfig(env=env_config).to_dict()["env"]
        paths.append(str(save_checkpoint(tmp_path / name / "checkpoint.pt", policy=pol, global_step=1, update=1,
                                         optimizer=torch.optim.Adam(pol.parameters()), config={"env": env_dict},
                                         env_config=env_dict)))
    assert main(["--policy", *paths, "--data", str(pack_file), "--device", "cpu", "--quiet", "--num-threads", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --policy {paths[1]}: the policy reads observations")
    assert "first checkpoint" in err[0]


def test_skipped_files_listed_with_reasons(tmp_path, sample_dir, capsys):
    """A data directory with one bad file: the evaluation runs on the good one and lists the bad
    one with its reason (console and JSON)."""
    import shutil

    good = min(sample_dir.glob("*.json*"), key=lambda p: p.stat().st_size)
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(good, data / good.name)
    (data / "broken.json").write_text("{not json")
    out = tmp_path / "e.json"
    assert main(["--policy", "constant_speed", "--data", str(data), "--json", str(out), "--num-threads", "1",
                 "--device", "cpu", "--no-per-scenario"]) == 0
    res = json.loads(out.read_text())
    assert [s["file"].endswith("broken.json") for s in res["skipped"]] == [True]
    assert res["skipped"][0]["reason"]
    assert len(res["runs"][0]["scenarios"]) == 1
    text = capsys.readouterr().out
    assert "1 of 2 file(s) skipped" in text and "broken.json" in text and "scenarios run" in text


def test_progress_counts_world_episodes(pack_file):
    class Progress:  # the part of rich.progress.Progress that evaluate() uses
        def __init__(self):
            self.tasks = {}

        def add_task(self, description, total):
            self.tasks[description] = [total, 0]
            return description

        def advance(self, task, n):
            self.tasks[task][1] += n

    progress = Progress()
    evaluate(EvalConfig(policy=("constant_speed", "random"), data=str(pack_file), episodes_per_scenario=2,
                        num_worlds=8, device="cpu", num_threads=1), progress)
    assert progress.tasks == {"constant_speed (self_play)": [8, 8], "random (self_play)": [8, 8]}


def test_other_checkpoint_settings_noted():
    """Policies side by side share the first checkpoint's env settings; a checkpoint trained with
    other settings gets a note naming them."""
    from train.config import TrainConfig
    from train.evaluate import base_env_config

    def entry(label, **env):
        return {"label": label, "kind": "checkpoint",
                "ckpt": {"env_config": TrainConfig(env=_env_config(**env)).to_dict()["env"]}}

    cfg, notes = base_env_config([entry("a"), entry("b", collision_behavior="stop"),
                                   {"label": "random", "kind": "baseline"}], EvalConfig(policy=("x",), k_trials=3))
    assert str(cfg.collision_behavior) == "remove" and cfg.trial_mode and cfg.k_trials == 3
    assert len(notes) == 3 and "b was trained with collision_behavior=stop" in notes[0]
    # neither was trained in trial mode: their trial-clock weights are untrained, and each is named
    assert [n.split(" was trained outside trial mode")[0] for n in notes[1:]] == ["note: a", "note: b"]
    _, notes = base_env_config([entry("t", goal_behavior="trial", k_trials=2)], EvalConfig(policy=("x",)))
    assert notes == []
    # an ensemble: a member trained with other settings is named, by its place in the ensemble
    a, b = entry("a")["ckpt"], entry("b", collision_behavior="stop")["ckpt"]
    ens = {"label": "a+b", "kind": "checkpoint", "ckpt": a, "members": [a, b]}
    _, notes = base_env_config([ens], EvalConfig(policy=("x",)))
    assert notes == ["note: a+b (member 2) was trained with collision_behavior=stop; evaluated with a+b's env "
                     "settings like every policy here"]


def test_bad_checkpoint_and_device_exit_2(tmp_path, capsys):
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"\x80\x02random bytes, not a checkpoint")
    for argv, message in ((["--policy", str(empty)], "empty"), (["--policy", str(junk)], "junk.pt")):
        assert main(argv + ["--device", "cpu", "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0]
    if not torch.cuda.is_available():
        assert main(["--policy", "random", "--device", "cuda", "--quiet"]) == 2
        assert "no CUDA device" in capsys.readouterr().err


def test_a_registered_mode_is_run_through_its_hooks(pack_file, monkeypatch, capsys):
    """A new evaluation mode is one ``register_mode`` entry: its env changes, check, prepare, driver,
    describe, episodes and summarise hooks are what the evaluator runs (here the mode hands the egos
    to ``constant_speed``, so ``random`` scores constant_speed's known table, runs every scenario
    twice and adds a metric), with no name test in ``evaluate``; its check refuses bad options with
    one line (exit 2); names are unique."""
    import train.eval.modes as modes

    monkeypatch.setattr(modes, "MODES", dict(modes.MODES))
    seen = []

    def check(opts):
        if opts.seed < 0:
            raise UserError(f"{opts.flag} autopilot needs --seed >= 0")

    modes.register_mode(modes.EvalMode(
        "autopilot", "constant speed drives the egos", env_changes=(("max_controlled", 4),), check=check,
        prepare=lambda env, opts: seen.append(env.config.max_controlled) or "cs",
        drive=lambda driver, context, opts: CallableDriver(make_baseline("constant_speed", seed=opts.seed)),
        describe=lambda context: {"driven_by": context}, episodes=lambda opts: 2,
        summarise=lambda egos, worlds, n, context, opts: {
            "summary": {**modes.outcome_summary(egos, worlds, n, context, opts)["summary"],
                        "goal_again": mean_interval(egos["goal_reached"])},
            "per_scenario": modes.outcome_summary(egos, worlds, n, context, opts)["per_scenario"]}))
    with pytest.raises(ValueError, match="already registered"):
        modes.register_mode(modes.EvalMode("autopilot", "again"))
    res = evaluate(EvalConfig(policy=("random",), data=str(pack_file), mode=("self_play", "autopilot"), device="cpu",
                              num_threads=1))
    runs = {r["mode"]: r for r in res["runs"]}
    assert seen == [4] and runs["autopilot"]["driven_by"] == "cs" and "driven_by" not in runs["self_play"]
    assert [r["goal_reached"] for r in runs["autopilot"]["per_scenario"]] == [k[0] for k in KNOWN]
    assert [r["episodes"] for r in runs["autopilot"]["per_scenario"]] == [2] * 4
    assert [r["episodes"] for r in runs["self_play"]["per_scenario"]] == [1] * 4
    summary = runs["autopilot"]["summary"]
    assert summary["goal_again"].mean == summary["goal_reached"].mean == 0.25 and summary["goal_again"].n == 8
    assert [r["collided"] for r in runs["autopilot"]["per_scenario"]] == [k[1] for k in KNOWN]
    assert main(["--policy", "random", "--data", str(pack_file), "--mode", "autopilot", "--seed", "-1",
                 "--device", "cpu", "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("error: --mode autopilot needs --seed >= 0")
