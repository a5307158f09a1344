"""Evaluation by driving style (``train/evaluate.py --style``, ``--coplayer PATH@STYLE``): one run
per style labelled by it, the style columns (mean speed, min gap) and hand-computed returns on a
crafted scene, and the one-line refusals."""

from __future__ import annotations

import pytest
import torch

from gpusim.config import EnvConfig
from gpusim.kernels.observations import obs_layout
from policy.actor_critic import ActorCritic, PolicyConfig
from tests.synthetic import driver, lane, small_config, synthetic_pack
from train.checkpoint import save_checkpoint
from train.config import TrainConfig
from train.eval.styles import partner_styles
from train.evaluate import EvalConfig, evaluate, main

LENGTH = 40


def _env_config(**kw) -> EnvConfig:
    base = dict(max_agents=32, max_controlled=4, num_roads=16, scenario_length=LENGTH,
                collision_behavior="remove", offroad_behavior="remove")
    base.update(kw)
    return EnvConfig(**base)


@pytest.fixture(scope="module")
def pack_file(tmp_path_factory):
    # one agent at 10 m/s along +x whose goal is behind it: never reached, nothing near
    scene = {"agents": [driver(0.0, 0.0, 0.0, 10.0, goal=(-20.0, 0.0))], "num_controlled": 1,
             "roads": lane(-60.0, 500.0)}
    pack = synthetic_pack([scene], small_config(max_agents=32))
    return pack.save(tmp_path_factory.mktemp("pack") / "one.pt")


def _checkpoint(path, env_config):
    lay = obs_layout(env_config.num_partners, env_config.num_roads, env_config.num_signals,
                     styles=env_config.reward_conditioning)
    torch.manual_seed(0)
    pol = ActorCritic(lay, 91, False, PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16))
    env_dict = TrainConfig(env=env_config).to_dict()["env"]
    return save_checkpoint(path, policy=pol, optimizer=torch.optim.Adam(pol.parameters()), global_step=3, update=1,
                           config={"env": env_dict}, env_config=env_dict)


def test_runs_per_style_with_hand_computed_returns(pack_file, tmp_path):
    ck = _checkpoint(tmp_path / "styled" / "checkpoint.pt", _env_config(reward_conditioning=True))
    cfg = EvalConfig(policy=(str(ck), "constant_speed"), data=str(pack_file), device="cpu", num_threads=1,
                     style=("cautious", "aggressive"))
    res = evaluate(cfg)
    labels = [r["label"] for r in res["runs"]]
    assert labels == ["styled/checkpoint.pt [cautious]", "constant_speed [cautious]",
                      "styled/checkpoint.pt [aggressive]", "constant_speed [aggressive]"]
    by = {r["label"]: r for r in res["runs"]}
    for style, per_step in (("cautious", -0.02 * (10.0 - 6.0)), ("aggressive", -0.005)):
        rec = by[f"constant_speed [{style}]"]["records"]
        # 40 steps at 10 m/s straight: cautious pays overspeed above 6 m/s, aggressive its time cost
        assert rec["episode_return"].tolist() == pytest.approx([LENGTH * per_step], abs=1e-4)
        assert rec["mean_speed"].tolist() == pytest.approx([10.0], abs=1e-4)
        assert rec["min_gap"].tolist() == [50.0]  # nobody within partner_radius
        summary = by[f"constant_speed [{style}]"]["summary"]
        assert {"mean_speed", "min_gap", "goal_reached", "collided", "offroad"} <= set(summary)
    # a conditioned checkpoint without --style runs under "default"
    res = evaluate(EvalConfig(policy=(str(ck),), data=str(pack_file), device="cpu", num_threads=1))
    assert [r["label"] for r in res["runs"]] == ["styled/checkpoint.pt [default]"]


def test_unconditioned_has_no_style_columns(pack_file, tmp_path):
    ck = _checkpoint(tmp_path / "plain" / "checkpoint.pt", _env_config())
    res = evaluate(EvalConfig(policy=(str(ck),), data=str(pack_file), device="cpu", num_threads=1))
    assert res["runs"][0]["label"] == "plain/checkpoint.pt" and "mean_speed" not in res["runs"][0]["summary"]


@pytest.mark.parametrize("which, extra, message", [
    ("plain", ["--style", "cautious"], "is not reward-conditioned"),
    ("styled", ["--style", "reckless"], "unknown style 'reckless'; named styles: cautious, default, aggressive"),
    ("styled", ["--style", "nan,-0.5,-0.5,0,0,0,0,0,10"], "goal = nan is outside the allowed range [0.5, 1.5]"),
    ("styled", ["--mode", "coplayer", "--coplayer", "PARTNER@wild"], "unknown style 'wild'"),
])
def test_bad_style_input_one_line_exit_2(pack_file, tmp_path, capsys, which, extra, message):
    ck = _checkpoint(tmp_path / which / "checkpoint.pt", _env_config(reward_conditioning=which == "styled"))
    extra = [e.replace("PARTNER", str(ck)) for e in extra]
    rc = main(["--policy", str(ck), "--data", str(pack_file), "--device", "cpu", "--quiet", "--num-threads", "1",
               *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0]


def test_coplayer_style_specs():
    paths, table = partner_styles(["a.pt@cautious", "a.pt@aggressive", "b.pt"])
    assert paths == ["a.pt", "b.pt"] and len(table) == 3 and table[2][-1] == 12.5  # b.pt: default
    assert partner_styles(["a.pt"]) == (["a.pt"], None)


def test_render_style_title_name_and_refusal():
    from gpusim.styles import STYLES, style_name
    from train.render import _with_style

    assert style_name(STYLES["aggressive"]) == "aggressive" and style_name(None) == "drawn"
    assert style_name((1.0,) * 9) == "custom"
    cfg = _with_style(_env_config(reward_conditioning=True), None)
    assert cfg.style == STYLES["default"]
    with pytest.raises(ValueError, match="not reward-conditioned"):
        _with_style(_env_config(), "cautious")


def test_training_coplayer_styles_set_the_partner_table():
    from train.config import UserError
    from train.coplayer import coplayer_env_config

    cfg = coplayer_env_config(_env_config(reward_conditioning=True), ["p.pt@cautious", "p.pt@aggressive"])
    assert cfg.ego_slots == 1 and len(cfg.partner_styles) == 2
    with pytest.raises(UserError, match="needs --env.reward-conditioning"):
        coplayer_env_config(_env_config(), ["p.pt@cautious"])


def test_periodic_evaluation_drives_the_default_style(pack_file):
    from gpusim.styles import STYLES
    from train.eval.live import LiveEvaluator

    live = LiveEvaluator(_env_config(reward_conditioning=True), str(pack_file), ["self_play"], (), "cpu")
    assert live.items[0][1].config.style == STYLES["default"]
    live = LiveEvaluator(_env_config(), str(pack_file), ["self_play"], (), "cpu")
    assert live.items[0][1].config.style is None


def test_time_to_goal_on_a_crafted_scene(tmp_path):
    from train.evaluate import write_records

    # 10 m/s straight at a goal 20 m ahead (radius 2 m): reached after 18 m, 1.8 s; a second agent's goal is behind
    scene = {"agents": [driver(0.0, 0.0, 0.0, 10.0, goal=(20.0, 0.0)), driver(0.0, 20.0, 0.0, 10.0, goal=(-20.0, 20.0))],
             "num_controlled": 2, "roads": lane(-60.0, 500.0) + lane(-60.0, 500.0, y=20.0)}
    pack_path = synthetic_pack([scene], small_config(max_agents=32)).save(tmp_path / "goal.pt")
    ck = _checkpoint(tmp_path / "styled" / "checkpoint.pt", _env_config(reward_conditioning=True))
    res = evaluate(EvalConfig(policy=(str(ck), "constant_speed"), data=str(pack_path), device="cpu", num_threads=1))
    run = res["runs"][1]
    assert run["records"]["time_to_goal"][0].item() == pytest.approx(1.8, abs=0.11)
    assert torch.isnan(run["records"]["time_to_goal"][1])
    iv = run["summary"]["time_to_goal"]
    assert iv.n == 1 and iv.mean == pytest.approx(run["records"]["time_to_goal"][0].item())
    assert write_records(res, tmp_path / "rec.jsonl") == 4
    assert '"time_to_goal": null' in (tmp_path / "rec.jsonl").read_text()
