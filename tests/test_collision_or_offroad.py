"""The ``collision_or_offroad`` metric: the union per agent-episode of the collision and offroad
flags (``gpusim.metrics.collision_or_offroad``), in the env's metric log and in the evaluator's
records, summaries, tables and JSON. Hand-computed on four crafted scenes where one agent both
collides and goes offroad (the sum ``collision + offroad`` counts it twice, the union once)."""

from __future__ import annotations

import json

import pytest
import torch

from gpusim.config import EnvConfig, RoadType
from gpusim.metrics import METRIC_NAMES, EpisodeMetrics, collision_or_offroad, episode_values
from tests.synthetic import driver, lane, parked, small_config, synthetic_pack
from train.baselines import constant_speed
from train.eval.report import summarise, summary_table
from train.eval.sweep import CallableDriver, make_sweep_env, run_sweep, sweep_plan
from train.evaluate import main

LENGTH = 40  # steps (4 s): constant_speed drives 40 m along +x


def scenes() -> list[dict]:
    """One agent per scene at 10 m/s along +x, goal out of reach (200 m ahead):

    0. a parked car 15 m ahead and a road edge across the road 25 m ahead: collision and offroad;
    1. the parked car only: collision; 2. the edge only: offroad; 3. neither.
    """
    road = lane(-60.0, 100.0)
    ego = driver(0.0, 0.0, 0.0, 10.0, goal=(200.0, 0.0))
    edge = [(25.0, -15.0, 25.0, 15.0, int(RoadType.ROAD_EDGE))]
    car = parked(15.0, 0.0)
    return [
        {"agents": [ego, car], "num_controlled": 1, "roads": road + edge},
        {"agents": [ego, car], "num_controlled": 1, "roads": road},
        {"agents": [ego], "num_controlled": 1, "roads": road + edge},
        {"agents": [ego], "num_controlled": 1, "roads": road},
    ]


#: (collided, offroad, collision_or_offroad) per scene, by hand from the scene layout
KNOWN = [(1.0, 1.0, 1.0), (1.0, 0.0, 1.0), (0.0, 1.0, 1.0), (0.0, 0.0, 0.0)]


def _config() -> EnvConfig:
    # contacts neither stop nor remove the agent: it drives on through the car and over the edge
    return EnvConfig(max_agents=32, max_controlled=4, num_roads=16, scenario_length=LENGTH,
                     collision_behavior="ignore", offroad_behavior="ignore")


@pytest.fixture(scope="module")
def pack():
    return synthetic_pack(scenes(), small_config(max_agents=32))


def test_union_flag_counts_an_agent_that_does_both_once():
    c = torch.tensor([True, True, False, False])
    o = torch.tensor([True, False, True, False])
    assert collision_or_offroad(c, o).tolist() == [True, True, True, False]
    em = EpisodeMetrics(1, 4)
    z = torch.zeros(1, 4, dtype=torch.bool)
    em.add(episode_values(torch.zeros(1, 4), torch.ones(1, 4, dtype=torch.int64), z, c[None], o[None]),
           torch.ones(1, 4, dtype=torch.bool))
    m = em.report("mean")
    assert METRIC_NAMES[-1] == "collision_or_offroad"
    assert (m["collided"], m["offroad"], m["collision_or_offroad"]) == pytest.approx((0.5, 0.5, 0.75))


def test_env_and_evaluator_agree_on_crafted_scenes(pack):
    """The sweep's records, its summary and the env's own log give the hand-computed union."""
    env = make_sweep_env(pack, 4, _config(), "cpu", seed=0)
    agents, _ = run_sweep(env, CallableDriver(constant_speed), sweep_plan(pack.num_scenarios, 1, 4))
    order = agents["scenario"].argsort()
    got = torch.stack([agents[k][order] for k in ("collided", "offroad", "collision_or_offroad")], 1)
    assert got.tolist() == [list(row) for row in KNOWN]
    s = summarise(agents)
    assert (s["collided"].mean, s["offroad"].mean, s["collision_or_offroad"].mean) == (0.5, 0.5, 0.75)
    assert s["collision_or_offroad"].n == 4
    m = env.metrics(kind="mean")
    assert m["n"] == 4 and m["collision_or_offroad"] == pytest.approx(0.75)
    assert m["collided"] + m["offroad"] == pytest.approx(1.0)  # the sum double-counts scene 0
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(summary_table([{"label": "constant_speed", "summary": s}], "t"))
    assert "collision or offroad" in console.export_text()


def test_cli_table_and_json_have_the_column(pack, tmp_path, capsys):
    """``train/evaluate.py`` (training env defaults: a contact removes the agent, so in scene 0 the
    collision ends the episode before the edge; the union per scene stays 1, 1, 1, 0)."""
    pack_file = pack.save(tmp_path / "crafted.pt")
    out = tmp_path / "eval.json"
    rc = main(["--policy", "constant_speed", "--data", str(pack_file), "--json", str(out), "--num-threads", "1",
               "--device", "cpu"])
    if rc != 0:
        pytest.fail(capsys.readouterr().err)
    run = json.loads(out.read_text())["runs"][0]
    assert run["summary"]["collision_or_offroad"]["mean"] == 0.75
    assert [r["collision_or_offroad"] for r in run["per_scenario"]] == [k[2] for k in KNOWN]
    assert "collision or offroad" in capsys.readouterr().out
