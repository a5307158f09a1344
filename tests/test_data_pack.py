"""ScenarioPack.from_json on the shipped real scenarios: contract properties, grid tables against
brute force, save/load round trips, and batches mixing good and bad files."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from gpusim.config import DataConfig, ObjectType, RoadType
from gpusim.data import ScenarioError, ScenarioPack
from gpusim.data.grid_tables import _sort_keys, cell_centres, point_segment_distance
from gpusim.kernels.grid import cell_index


@pytest.fixture(scope="module")
def pack(sample_dir):
    return ScenarioPack.from_json(sample_dir)


def test_sample_dir_content(sample_dir):
    files = sorted(sample_dir.glob("*.json.xz"))
    assert 8 <= len(files) <= 12
    assert sum(f.stat().st_size for f in files) < 2.5e6
    assert (sample_dir / "README.md").exists()


def test_pack_contract(pack, sample_dir):
    S = len(list(sample_dir.glob("*.json.xz")))
    assert pack.num_scenarios == S and pack.stats["converted"] == S
    assert pack.stats["errors"] == [] and pack.stats["skipped"] == []
    pack.validate()
    A, T = pack.max_agents, pack.num_steps
    assert (A, T) == (64, 91)
    slots = torch.arange(A)
    # Slot order: existing agents are a prefix, controlled agents a prefix of those.
    assert torch.equal(pack.agent_exists, slots[None] < pack.num_agents[:, None])
    assert bool((pack.num_controlled >= 2).all()) and bool((pack.num_controlled <= pack.num_agents).all())
    ctrl = pack.controlled
    # Controlled agents obey the control rule.
    assert bool((pack.agent_type[ctrl] == int(ObjectType.VEHICLE)).all())
    assert bool(pack.traj_valid[:, :, 0][ctrl].all())
    gd = torch.linalg.vector_norm(pack.agent_goal - pack.traj_pos[:, :, 0], dim=-1)
    assert bool((gd[ctrl] > 2.0).all())
    # Padding.
    pad = ~pack.agent_exists
    assert bool((pack.agent_type[pad] == -1).all()) and not bool(pack.traj_valid[pad].any())
    assert bool((pack.agent_source_index[pad] == -1).all()) and bool((pack.agent_length[pad] == 0).all())
    # Every packed agent is valid at least once, has a positive box.
    assert bool(pack.traj_valid.any(dim=2)[pack.agent_exists].all())
    assert bool((pack.agent_length[pack.agent_exists] > 0).all())
    # At least 3 scenarios have pedestrians or cyclists among their agents.
    vru = ((pack.agent_type == 1) | (pack.agent_type == 2)).any(dim=1)
    assert int(vru.sum()) >= 3
    # Centring: the mean valid position of each scenario is ~0, and coordinates are local.
    for s in range(pack.num_scenarios):
        p = pack.traj_pos[s][pack.traj_valid[s]].double()
        assert p.mean(0).abs().max() < 1e-3
        assert p.abs().max() < 2000
    assert bool(torch.isfinite(pack.traj_pos).all()) and bool(torch.isfinite(pack.road_seg).all())
    # Roads: segments prefix, nonzero length, known types.
    segs = torch.arange(pack.road_seg.shape[1])[None] < pack.num_segments[:, None]
    assert torch.equal(pack.road_type >= 0, segs)
    seg = pack.road_seg[segs]
    assert bool((torch.hypot(seg[:, 2] - seg[:, 0], seg[:, 3] - seg[:, 1]) > 0).all())
    assert bool((pack.road_type[segs] < len(RoadType)).all())
    assert int((pack.road_type == int(RoadType.ROAD_EDGE)).sum()) > 100
    assert pack.stats["road_points_kept"] < pack.stats["road_points_in"]


def test_grid_covers_agents_and_goals_with_margin(pack):
    cfg = pack.config
    for s in range(pack.num_scenarios):
        pts = torch.cat([pack.traj_pos[s][pack.traj_valid[s]], pack.agent_goal[s][pack.agent_exists[s]]])
        lo = pack.grid_origin[s]
        hi = lo + pack.grid_dims[s].float() * pack.cell_size
        assert bool((pts.min(0).values - lo >= cfg.grid_margin - 1e-3).all())
        assert bool((hi - pts.max(0).values >= cfg.grid_margin - 1e-3).all())
        assert (hi - lo - (pts.max(0).values - pts.min(0).values) - 2 * cfg.grid_margin).max() < pack.cell_size + 1e-3


@pytest.mark.parametrize("s", [0, 3, 7])
def test_grid_tables_equal_brute_force(pack, s):
    pack = pack.padded()  # the tables of scenario s as [NC, K] rows
    nc = int(pack.grid_dims[s].prod())
    R = int(pack.num_segments[s])
    centres = cell_centres(pack.grid_origin[s], pack.grid_dims[s], pack.cell_size)
    # The centres agree with the shared cell lookup.
    ids = cell_index(centres[None], torch.tensor([s]), pack.grid_origin, pack.grid_dims, pack.cell_size)[0]
    assert torch.equal(ids, torch.arange(nc))
    g = torch.Generator().manual_seed(s)
    cells = torch.randperm(nc, generator=g)[:300]
    seg = pack.road_seg[s, :R]
    d2 = point_segment_distance(centres[cells], seg, squared=True)
    order = torch.sort(_sort_keys(d2, torch.arange(R).expand_as(d2)), dim=1).values & 0xFFFFFFFF
    K = pack.grid_road.shape[2]
    assert torch.equal(pack.grid_road[s, cells], order[:, :K].to(torch.int32))
    # Independent check of the meaning: true distances of the stored segments are sorted and no
    # other segment is nearer than the last stored one.
    d = torch.sqrt(d2)
    got = torch.gather(d, 1, pack.grid_road[s, cells].long())
    assert bool((got[:, 1:] >= got[:, :-1]).all())
    mask = torch.ones_like(d, dtype=torch.bool)
    mask.scatter_(1, pack.grid_road[s, cells].long(), False)
    assert bool((d.masked_fill(~mask, float("inf")).min(1).values >= got[:, -1] - 1e-5).all())
    # Road-edge table: only road edges, nearest first.
    edges = torch.nonzero(pack.road_type[s, :R] == int(RoadType.ROAD_EDGE)).flatten()
    ke = min(pack.grid_edge.shape[2], edges.numel())
    de = d2[:, edges]
    eorder = torch.sort(_sort_keys(de, edges.expand_as(de)), dim=1).values & 0xFFFFFFFF
    assert torch.equal(pack.grid_edge[s, cells, :ke], eorder[:, :ke].to(torch.int32))
    assert bool((pack.grid_edge[s, cells, ke:] == -1).all())
    assert bool((pack.grid_road[s, nc:] == -1).all()) and bool((pack.grid_edge[s, nc:] == -1).all())


def test_grid_pads_when_few_segments(tmp_path):
    from test_data_parse import obj, scenario, write  # noqa: PLC0415  (tests dir is on sys.path)

    roads = [{"geometry": [{"x": -20.0, "y": 0.0}, {"x": 0.0, "y": 0.0}, {"x": 0.0, "y": 20.0}], "type": "road_edge"},
             {"geometry": [{"x": -20.0, "y": 5.0}, {"x": 20.0, "y": 5.0}], "type": "lane"}]
    path = write(tmp_path / "few.json", scenario([obj(0, 0, vx=2.0)], roads=roads))
    p = ScenarioPack.from_json(path, DataConfig(grid_k=8, grid_edge_k=4)).padded()
    assert int(p.num_segments[0]) == 3
    assert bool((p.grid_road[0, :, 3:] == -1).all()) and bool((p.grid_road[0, :, :3] >= 0).all())
    assert bool((p.grid_edge[0, :, 2:] == -1).all())
    edge_types = p.road_type[0][p.grid_edge[0, :, :2].long()]
    assert bool((edge_types == int(RoadType.ROAD_EDGE)).all())


@pytest.mark.parametrize("target", ["dir", "file.pt"])
def test_save_load_round_trip(pack, tmp_path, target):
    out = pack.save(tmp_path / target)
    back = ScenarioPack.load(out)
    for name, t in pack.tensors().items():
        u = getattr(back, name)
        assert u.dtype == t.dtype and torch.equal(u, t), name
    assert back.scenario_ids == pack.scenario_ids and back.source_files == pack.source_files
    assert back.config == pack.config
    assert json.loads(json.dumps(pack.stats)) == back.stats


def test_batch_with_bad_files_converts_the_good_ones(sample_dir, tmp_path):
    good = sorted(sample_dir.glob("*.json.xz"))[:2]
    for f in good:
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "truncated.json").write_text('{"objects": [{"position": [')
    doc = json.loads(json.dumps({"objects": [], "roads": []}))
    (tmp_path / "empty.json").write_text(json.dumps(doc))
    from test_data_parse import obj, scenario  # noqa: PLC0415

    bad = scenario([obj(0, 0, vx=3.0)])
    bad["objects"][0]["heading"] = bad["objects"][0]["heading"][:50]
    (tmp_path / "short.json").write_text(json.dumps(bad))
    with pytest.warns(UserWarning, match="empty.json"):
        p = ScenarioPack.from_json([tmp_path, tmp_path / "missing.json"])
    assert p.num_scenarios == 2
    assert sorted(p.scenario_ids) == sorted(f.name.split(".")[0] for f in good)
    errs = {e["file"].rsplit("/", 1)[-1]: e["reason"] for e in p.stats["errors"]}
    assert set(errs) == {"truncated.json", "short.json", "missing.json"}
    assert "objects[0].heading" in errs["short.json"] and "50 entries" in errs["short.json"]
    assert "JSON" in errs["truncated.json"]
    assert [s["file"].rsplit("/", 1)[-1] for s in p.stats["skipped"]] == ["empty.json"]
    with pytest.raises(ScenarioError, match="empty.json"):  # the first bad file in sorted order
        ScenarioPack.from_json(tmp_path, on_error="raise")
    (tmp_path / "empty.json").unlink()
    with pytest.raises(ScenarioError, match="short.json: objects.0..heading"):
        ScenarioPack.from_json(tmp_path, on_error="raise")


def test_nothing_usable_raises(tmp_path):
    (tmp_path / "a.json").write_text("not json")
    with pytest.raises(ScenarioError, match="no usable scenario.*a.json"):
        ScenarioPack.from_json(tmp_path)
    with pytest.raises(ScenarioError, match="no usable scenario"):
        ScenarioPack.from_json(tmp_path / "nothing-here-*.json")


def test_max_agents_cap_on_real_data(sample_dir):
    f = sample_dir / "tfrecord-00080-of-01000_386.json.xz"  # 141 objects
    p = ScenarioPack.from_json(f, DataConfig(max_agents=16, max_controlled=2, grid_k=4, grid_edge_k=2))
    assert int(p.num_agents[0]) == 16 and int(p.num_controlled[0]) == 2
    assert p.stats["dropped_over_max_agents"] == 141 - 16 - p.stats["never_valid_objects"]
    # Kept experts valid at init are the nearest to the controlled centroid.
    c = p.traj_pos[0, :2, 0].mean(0)
    kept = p.traj_valid[0, 2:16, 0]
    dk = torch.linalg.vector_norm(p.traj_pos[0, 2:16, 0][kept] - c, dim=-1)
    full = ScenarioPack.from_json(f, DataConfig(max_agents=64, max_controlled=2, grid_k=4, grid_edge_k=2))
    fv = full.traj_valid[0, 2:, 0] & full.agent_exists[0, 2:]
    off = (full.offset[0] - p.offset[0]).float()
    dall = torch.linalg.vector_norm(full.traj_pos[0, 2:, 0][fv] + off - c, dim=-1)
    assert dk.max() <= torch.sort(dall).values[13] + 1e-3
