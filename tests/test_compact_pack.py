"""Compact packs: the int16, unpadded grid tables give the same simulation as the
format-2 layout ([S, NC, K] int32 padded to the largest grid), bit for bit, on the real bundled
scenarios, with the torch reference and with the Triton kernels (interpreter on CPU).

The padded pack is ``pack.padded()``: exactly the tables the packs held before (the kernels read
row ``s * NC + cell`` of it), so any difference in the compact path's gathers would show here.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gpusim.backend import interpreting, use_backend
from gpusim.config import EnvConfig
from gpusim.data import ScenarioPack
from gpusim.env import DriveEnv
from synthetic import KERNEL_DEVICE

BASE = dict(max_agents=24, max_controlled=4, num_partners=15, num_roads=32, init_steps=76, scenario_length=10,
            goal_radius=4.0, collision_box_scale=1.8, offroad_box_scale=1.5, goal_behavior="new_goal")


@pytest.fixture(scope="module")
def pack(sample_dir):
    return ScenarioPack.from_json(sorted(sample_dir.glob("*.json*")), EnvConfig(**BASE).data_config(grid_edge_k=16))


def test_compact_layout_is_smaller_and_round_trips(pack, tmp_path):
    padded = pack.padded()
    assert pack.is_compact and not padded.is_compact
    assert pack.grid_road.dtype == torch.int16 and padded.grid_road.dtype == torch.int32
    assert pack.grid_road.shape[0] == int(pack.num_cells.sum()) < padded.grid_road.shape[0] * padded.grid_road.shape[1]
    assert pack.nbytes() < padded.nbytes() / 2
    # padded -> compact gives the same tensors back; a saved pack loads compact and equal
    back = padded.compact()
    for k, v in pack.tensors().items():
        assert torch.equal(v, getattr(back, k)), k
    loaded = ScenarioPack.load(pack.save(tmp_path / "p.pt"))
    for k, v in pack.tensors().items():
        assert torch.equal(v, getattr(loaded, k)), k


def test_format2_file_loads_compact(pack, tmp_path):
    """A pack file of format 2 (padded int32 tables, before the compact layout) still loads, compacted."""
    padded = pack.padded()
    meta = {"format_version": 2, "scenario_ids": list(pack.scenario_ids), "source_files": list(pack.source_files),
            "config": dataclasses.asdict(pack.config), "stats": {}}
    tensors = {k: v for k, v in padded.tensors().items()}
    torch.save({"meta": meta, "tensors": tensors}, tmp_path / "old.pt")
    loaded = ScenarioPack.load(tmp_path / "old.pt")
    assert loaded.is_compact
    for k, v in pack.tensors().items():
        assert torch.equal(v, getattr(loaded, k)), k


def test_select_gathers_each_scenario(pack):
    sub = pack.select([4, 1, 4])
    sub.validate()
    assert sub.scenario_ids == [pack.scenario_ids[i] for i in (4, 1, 4)]
    big, small = pack.padded(), sub.padded()
    for j, i in enumerate((4, 1, 4)):
        n = int(pack.num_cells[i])
        assert torch.equal(small.grid_road[j, :n], big.grid_road[i, :n])
        assert torch.equal(small.grid_edge[j, :n], big.grid_edge[i, :n])
        assert torch.equal(sub.traj_pos[j], pack.traj_pos[i])
    with pytest.raises(IndexError):
        pack.select([pack.num_scenarios])


def _rollout(pack, steps=14, seed=3, device="cpu"):
    """Expert-action rollout across an auto-reset on ``device``; every StepResult tensor of every step."""
    env = DriveEnv(pack, num_worlds=3, config=EnvConfig(**BASE), seed=seed, device=device)
    out = [env.reset(seed=seed).clone()]
    for _ in range(steps):
        r = env.step(env.expert_actions())
        out += [r.obs.clone(), r.reward.clone(), r.terminal.clone(), r.loss_mask.clone(), env.state.goal.clone()]
    return out


def _assert_same(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), f"tensor {i} differs"


def test_compact_equals_padded_rollout_torch(pack):
    with use_backend("torch"):
        _assert_same(_rollout(pack), _rollout(pack.padded()))


@pytest.mark.skipif(not (torch.cuda.is_available() or interpreting()), reason="no CUDA and no Triton interpreter")
def test_compact_equals_padded_rollout_triton(pack):
    with use_backend("triton"):
        _assert_same(_rollout(pack, steps=6, device=KERNEL_DEVICE), _rollout(pack.padded(), steps=6, device=KERNEL_DEVICE))
