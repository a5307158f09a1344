"""Sharded packs on disk: conversion round-trips, one shard loads without reading the
others, a corrupt shard is named and skipped, the CLI writes and describes them."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from gpusim.config import DataConfig
from gpusim.data import ScenarioPack
from gpusim.data.__main__ import main as cli
from gpusim.data.errors import PackFileError
from gpusim.data.shards import ShardedPack, concat_packs, convert_sharded, is_sharded, load_any

CFG = DataConfig(max_agents=16, max_controlled=4, grid_k=16, grid_edge_k=8, grid_cell_size=10.0)


@pytest.fixture(scope="module")
def files(sample_dir):
    return sorted(sample_dir.glob("*.json*"))[:5]


@pytest.fixture(scope="module")
def whole(files):
    return ScenarioPack.from_json(files, CFG)


@pytest.fixture()
def sharded(files, tmp_path):
    sp, stats = convert_sharded(files, tmp_path / "sh", CFG, shard_size=2)
    return sp


def test_round_trip_equals_one_pack(sharded, whole):
    assert is_sharded(sharded.path) and sharded.num_shards == 3 and sharded.num_scenarios == 5
    assert [s["scenarios"] for s in sharded.shards] == [2, 2, 1]
    assert sharded.scenario_ids == whole.scenario_ids
    back = load_any(sharded.path)
    for k, v in whole.tensors().items():
        assert torch.equal(v, getattr(back, k)), k
    # per-scenario metadata agrees with the tensors
    for g, m in enumerate(sharded.scenarios):
        assert m["segments"] == int(whole.num_segments[g]) and m["cells"] == int(whole.num_cells[g])
        assert m["controlled"] == int(whole.num_controlled[g])
    assert sharded.max_segments == int(whole.num_segments.max())


def test_one_shard_loads_without_the_others(sharded, whole):
    (sharded.path / sharded.shards[0]["file"]).write_bytes(b"not a pack")
    (sharded.path / sharded.shards[2]["file"]).unlink()
    one = sharded.load_shard(1)
    idx = sharded.shard_scenarios(1)
    assert one.scenario_ids == [whole.scenario_ids[i] for i in idx]
    assert torch.equal(one.traj_pos, whole.traj_pos[idx])
    with pytest.raises(PackFileError, match="shard-00000.pt"):
        sharded.load_shard(0)
    with pytest.raises(PackFileError, match="shard-00002.pt"):
        sharded.load_shard(2)


def test_corrupt_shard_named_and_skipped(sharded, whole):
    (sharded.path / sharded.shards[1]["file"]).write_bytes(b"\x00" * 100)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        p = sharded.load_all()
    assert any("shard-00001.pt" in str(x.message) for x in w)
    keep = sharded.shard_scenarios(0) + sharded.shard_scenarios(2)
    assert p.scenario_ids == [whole.scenario_ids[i] for i in keep]


def test_bad_index_and_shard_size(tmp_path, files):
    (tmp_path / "index.json").write_text("{not json")
    with pytest.raises(PackFileError, match="index.json"):
        ShardedPack.open(tmp_path)
    with pytest.raises(ValueError, match="shard_size"):
        convert_sharded(files, tmp_path / "x", CFG, shard_size=0)


def test_concat_pads_segments_and_signals(whole):
    a, b = whole.select([0, 1]), whole.select([2])
    c = concat_packs([b, a], min_segments=whole.road_seg.shape[1] + 3, min_signals=4)
    c.validate()
    assert c.road_seg.shape[1] == whole.road_seg.shape[1] + 3 and c.max_signals == 4
    assert torch.equal(c.select([1]).padded().grid_road[0], whole.select([0]).padded().grid_road[0])


def test_cli_convert_and_info(files, tmp_path, capsys):
    out = tmp_path / "cli"
    assert cli(["convert", *map(str, files[:3]), "--out", str(out), "--shard-size", "2", "--no-progress",
                "--max-agents", "16", "--max-controlled", "4", "--grid-k", "16", "--workers", "2"]) == 0
    idx = json.loads((out / "index.json").read_text())
    assert len(idx["shards"]) == 2 and len(idx["scenarios"]) == 3
    capsys.readouterr()
    assert cli(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "scenarios: 3 in 2 shard(s)" in text and "shard-00001.pt" in text
    assert cli(["convert", str(files[0]), "--out", str(tmp_path / "x.pt"), "--shard-size", "2"]) == 2
    assert cli(["convert", str(files[0]), "--out", str(tmp_path / "y"), "--shard-size", "0"]) == 2
