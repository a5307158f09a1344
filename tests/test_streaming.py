"""Streaming scenario pool: a pool smaller than the dataset visits every scenario of a
sharded pack (counted), the same seed gives the same sequence, a corrupt shard is named and
skipped with the rest still used, and DriveEnv swaps pools at episode boundaries."""

from __future__ import annotations

import collections
import warnings

import pytest
import torch

from gpusim.backend import use_backend
from gpusim.config import EnvConfig
from gpusim.data.pool import ScenarioPool
from gpusim.data.shards import convert_sharded
from gpusim.env import DriveEnv

ENV = dict(max_agents=16, max_controlled=4, num_partners=7, num_roads=16, init_steps=86, scenario_length=2)


@pytest.fixture(scope="module")
def sharded(sample_dir, tmp_path_factory):
    files = sorted(sample_dir.glob("*.json*"))[:7]
    cfg = EnvConfig(**ENV).data_config(grid_edge_k=8, grid_cell_size=10.0)
    sp, _ = convert_sharded(files, tmp_path_factory.mktemp("sh") / "sh", cfg, shard_size=2)
    return sp  # 6 scenarios (one sample has no controllable vehicle at step 86) in 3 shards


def entered(pool: ScenarioPool) -> list[int]:
    """Global ids in the order they entered the pool (first pool, then each refresh's newcomers)."""
    out = list(pool.history[0])
    for prev, cur in zip(pool.history, pool.history[1:]):
        out += [g for g in cur if g not in prev]
    return out


def test_every_scenario_visited_with_small_pool(sharded):
    N, P = sharded.num_scenarios, 3
    pool = ScenarioPool(sharded, P, replace_fraction=1 / 3, seed=1)
    for _ in range(N - P):  # one newcomer per refresh
        pool.swap()
    pool.close()
    seq = entered(pool)
    counts = collections.Counter(seq)
    assert sorted(counts) == list(range(N)) and set(counts.values()) == {1}  # each exactly once this epoch
    assert all(len(h) == P for h in pool.history)
    assert pool.current.num_scenarios == P and pool.current.road_seg.shape[1] == sharded.max_segments


def test_same_seed_same_sequence(sharded):
    def run(seed, background):
        pool = ScenarioPool(sharded, 3, replace_fraction=0.5, seed=seed, background=background)
        for _ in range(6):
            pool.swap()
        pool.close()
        return pool.history, [pool.current.scenario_ids]

    a = run(5, True)
    assert a == run(5, False) == run(5, True)
    assert a != run(6, True)


def test_corrupt_shard_named_and_skipped(sharded, tmp_path):
    import shutil

    d = tmp_path / "copy"
    shutil.copytree(sharded.path, d)
    (d / "shard-00001.pt").write_bytes(b"corrupt")
    bad = set(sharded.shard_scenarios(1))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        pool = ScenarioPool(d, 2, replace_fraction=0.5, seed=0, background=False)
        for _ in range(10):
            pool.swap()
    msgs = [str(x.message) for x in w if "scenario pool" in str(x.message)]
    assert len(msgs) == 1 and "shard-00001.pt" in msgs[0]
    seen = set(entered(pool))
    assert seen == set(range(sharded.num_scenarios)) - bad


def test_env_draws_from_swapped_pools(sharded):
    pool = ScenarioPool(sharded, 3, replace_fraction=1 / 3, seed=2, resample_every=2)
    with use_backend("torch"):
        env = DriveEnv(pool, num_worlds=4, config=EnvConfig(**ENV), seed=0)
        drawn, pools_seen = set(), 0
        for ep in range(8):
            ids = env.pack.scenario_ids
            assert set(ids) <= set(sharded.scenario_ids) and len(ids) == 3
            drawn |= {ids[int(s)] for s in env.state.scenario}
            for _ in range(env.horizon):
                env.step(env.expert_actions())
        assert pool.stats["swaps"] == 4  # 8 episodes, every 2
        assert len(drawn) > 3  # scenarios from more than one pool were run
    pool.close()
    with pytest.raises(ValueError, match="pool_size"):
        ScenarioPool(sharded, 0)
    with pytest.raises(ValueError, match="resample_every"):
        ScenarioPool(sharded, 2, resample_every=0)


def test_streaming_evaluation_runs_every_scenario_once(sharded):
    from train.eval.streaming import chunks, streaming_sweep
    from train.eval.sweep import CallableDriver

    assert chunks(sharded, 3) == [[0], [1], [2]] and chunks(sharded, 4) == [[0, 1], [2]]
    with use_backend("torch"):
        env = DriveEnv(sharded.load_shard(0), num_worlds=3, config=EnvConfig(**ENV), seed=0)
        agents, _, ids = streaming_sweep(env, CallableDriver(lambda e: e.expert_actions()), sharded, chunk_size=4)
    assert ids == list(range(sharded.num_scenarios))
    per_scenario = collections.Counter(agents["scenario"].tolist())
    assert sorted(per_scenario) == ids  # every scenario ran
    want = {g: m["controlled"] for g, m in enumerate(sharded.scenarios)}
    assert per_scenario == {g: min(want[g], ENV["max_controlled"]) for g in ids}  # ... exactly once


def test_evaluate_streams_sharded_data_like_in_memory(sample_dir, tmp_path, monkeypatch):
    """``train/evaluate.py --data <sharded dir>`` streams chunks of <= --chunk-size scenarios, runs
    every scenario exactly N times and reports what the in-memory evaluation of the same data does."""
    from train.config import TrainConfig
    from train.evaluate import EvalConfig, evaluate

    N, chunk = 2, 4
    files = sorted(sample_dir.glob("*.json*"))
    convert_sharded(files, tmp_path / "sh", TrainConfig().env.data_config(), shard_size=3)
    on_device = []
    use_pack = DriveEnv.use_pack
    monkeypatch.setattr(DriveEnv, "use_pack", lambda env, pack: (on_device.append(pack.num_scenarios),
                                                                 use_pack(env, pack))[1])
    common = dict(policy=("steer_to_goal",), episodes_per_scenario=N, device="cpu", num_threads=1)
    streamed = evaluate(EvalConfig(data=str(tmp_path / "sh"), chunk_size=chunk, **common))["runs"][0]
    assert len(on_device) > 1 and max(on_device) <= chunk  # several chunks, each at most --chunk-size
    memory = evaluate(EvalConfig(data=str(sample_dir), **common))["runs"][0]
    assert on_device and sum(on_device) == len(memory["scenarios"])  # in-memory path: no use_pack

    assert sorted(streamed["scenarios"]) == sorted(memory["scenarios"]) and len(set(streamed["scenarios"])) == 10
    rec = streamed["records"]
    keys = collections.Counter(zip(rec["scenario"].tolist(), rec["repetition"].tolist(), rec["slot"].tolist()))
    assert set(keys.values()) == {1}  # no agent-episode twice
    reps = collections.Counter((s, r) for s, r, _ in keys)
    assert {s for s, _ in reps} == set(range(10)) and {r for _, r in reps} == set(range(N))
    per_memory = {memory["scenarios"][r["index"]]: r for r in memory["per_scenario"]}
    for row in streamed["per_scenario"]:
        sid = streamed["scenarios"][row["index"]]
        assert row["episodes"] == N and row == {**per_memory[sid], "index": row["index"]}
    assert streamed["summary"].keys() == memory["summary"].keys()
    for name, iv in streamed["summary"].items():
        want = memory["summary"][name]
        assert iv.n == want.n and [iv.mean, iv.lo, iv.hi] == pytest.approx([want.mean, want.lo, want.hi], rel=1e-9)
