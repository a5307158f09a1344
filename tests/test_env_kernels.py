"""Replay and events kernels: Triton (interpreter) against the torch reference, and the rules."""

import pytest
import torch

from gpusim.backend import use_backend
from gpusim.config import ContactBehavior, GoalBehavior
from gpusim.kernels.collision import hit_by
from gpusim.kernels.events import events, events_reference
from gpusim.kernels.replay import replay, replay_reference
from synthetic import to_cpu, to_kernel_device


def _replay_inputs(W, A, S, T, seed):
    g = torch.Generator().manual_seed(seed)
    return dict(
        pos=torch.randn(W, A, 2, generator=g), heading=torch.randn(W, A, generator=g),
        speed=torch.rand(W, A, generator=g), present=torch.rand(W, A, generator=g) > 0.5,
        replayed=torch.rand(W, A, generator=g) > 0.3,
        scenario=torch.randint(S, (W,), generator=g),
        log_index=torch.randint(-2, T + 3, (W,), generator=g),
        traj_pos=torch.randn(S, A, T, 2, generator=g), traj_heading=torch.randn(S, A, T, generator=g),
        traj_vel=torch.randn(S, A, T, 2, generator=g), traj_valid=torch.rand(S, A, T, generator=g) > 0.2,
    )


@pytest.mark.parametrize("W,A,S,T", [(7, 5, 3, 11), (33, 13, 2, 91)])
def test_replay_triton_matches_reference(W, A, S, T):
    inp = _replay_inputs(W, A, S, T, seed=W)
    ref = replay_reference(**inp)
    with use_backend("triton"):
        out = to_cpu(replay(**to_kernel_device(inp)))
    for r, o in zip(ref, out):
        assert r.dtype == o.dtype and r.shape == o.shape
        assert torch.equal(r, o) if r.dtype == torch.bool else torch.allclose(r, o, atol=1e-6)


def test_replay_semantics():
    inp = _replay_inputs(9, 6, 2, 20, seed=3)
    inp["log_index"][0] = 25  # past the end of the log: replayed agents leave
    inp["log_index"][1] = 4
    pos, heading, speed, present = replay_reference(**inp)
    rep = inp["replayed"]
    assert not present[0][rep[0]].any()
    assert torch.equal(pos[0], inp["pos"][0])  # pose kept (finite) when leaving
    s = int(inp["scenario"][1])
    valid = inp["traj_valid"][s, :, 4]
    take = rep[1] & valid
    assert torch.equal(present[1][rep[1]], valid[rep[1]])
    assert torch.equal(pos[1][take], inp["traj_pos"][s, take, 4])
    assert torch.allclose(speed[1][take], inp["traj_vel"][s, take, 4].norm(dim=-1))
    # not replayed: unchanged
    assert torch.equal(present[~rep], inp["present"][~rep])
    assert torch.equal(speed[~rep], inp["speed"][~rep])


def test_replay_rejects_bad_input():
    inp = _replay_inputs(4, 3, 2, 5, seed=1)
    inp["traj_pos"] = inp["traj_pos"].double()
    with use_backend("triton"), pytest.raises(ValueError, match="traj_pos"):
        replay(**to_kernel_device(inp))


def _events_inputs(W, A, C, seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.rand(*s, generator=g)  # noqa: E731
    n_ctrl = torch.randint(0, C + 1, (W,), generator=g)
    controlled = torch.arange(A)[None] < n_ctrl[:, None]
    stopped = (r(W, A) > 0.8) & controlled
    goal = torch.randn(W, A, 2, generator=g) * 3
    return dict(
        pos=goal + torch.randn(W, A, 2, generator=g) * 2, goal=goal, speed=r(W, A) * 10,
        controlled=controlled, in_play=controlled & ~stopped & (r(W, A) > 0.1), present=r(W, A) > 0.1,
        collided=r(W, A) > 0.6, offroad=r(W, A) > 0.7, hit=r(W, A) > 0.8,
        stopped=stopped, contact_stopped=stopped & (r(W, A) > 0.5), removed=torch.zeros(W, A, dtype=torch.bool),
        world_done=r(W) > 0.8, episode_end=r(W) > 0.7, slot_active=controlled[:, :C].clone(),
        slot_done=(r(W, C) > 0.9) & controlled[:, :C],
    )


@pytest.mark.parametrize("goal_b", list(GoalBehavior)[:3])
@pytest.mark.parametrize("col_b,off_b", [(0, 0), (1, 2), (2, 1), (1, 1)])
def test_events_triton_matches_reference(goal_b, col_b, off_b):
    W, A, C = 37, 11, 5
    inp = _events_inputs(W, A, C, seed=int(goal_b) * 7 + col_b * 3 + off_b)
    params = (2.0, 1.0, -0.5, -0.25, int(goal_b), col_b, off_b, 0.5)
    ref = events_reference(*inp.values(), *params)
    with use_backend("triton"):
        out = to_cpu(events(*to_kernel_device(list(inp.values())), *params))
    for name, r, o in zip(ref._fields, ref, out):
        assert r.shape == o.shape and r.dtype == o.dtype, name
        assert torch.equal(r, o), name


@pytest.mark.parametrize("backend", ["torch", "triton", "c"])  # every backend of the op
def test_events_rules(backend):
    W, A, C = 64, 9, 6
    inp = _events_inputs(W, A, C, seed=5)
    args = (2.0, 1.0, -0.5, -0.25, int(GoalBehavior.STOP), int(ContactBehavior.STOP), int(ContactBehavior.REMOVE), 0.5)
    if backend == "triton":
        out = to_cpu(events(*to_kernel_device(tuple(inp.values())), *args, backend="triton"))
    else:
        out = events(*inp.values(), *args, backend=backend)
    play = inp["in_play"]
    d = (inp["pos"] - inp["goal"]).norm(dim=-1)
    assert torch.equal(out.goal_now, play & (d <= 2.0))
    exp_r = (out.goal_now.float() * 1.0 + (play & inp["collided"]).float() * -0.5
             + (play & inp["offroad"]).float() * -0.25)[:, :C]
    assert torch.allclose(out.reward, exp_r)
    assert (out.reward[~play[:, :C]] == 0).all()
    # offroad REMOVE wins over collision STOP
    assert torch.equal(out.removed, play & inp["offroad"])
    assert not (out.present & out.removed).any()
    assert not (out.contact_stopped & out.removed).any()
    newly = out.stopped & ~inp["stopped"]
    assert (out.speed[newly] == 0).all()
    # each active slot gets at most one terminal, never when already done
    assert not (out.terminal & inp["slot_done"]).any()
    assert torch.equal(out.slot_done, inp["slot_done"] | out.terminal)
    ended = out.truncated | inp["episode_end"]
    assert torch.equal(out.terminal, ended[:, None] & inp["slot_active"] & ~inp["slot_done"])
    # truncation count
    n = inp["controlled"].sum(1).float()
    ncs = (out.contact_stopped & inp["controlled"]).sum(1).float()
    assert torch.equal(out.truncated, ~inp["world_done"] & (n > 0) & (ncs >= 0.5 * n))


def test_hit_by_boxes():
    # agent 0 at origin heading +x (4 x 2 box); agent 1 rotated 90 deg 2.4 m ahead (touches),
    # agent 2 5 m to the side (no), agent 3 overlapping agent 2 only.
    pos = torch.tensor([[[0.0, 0.0], [2.4, 0.0], [0.0, 5.0], [0.5, 5.5]]])
    heading = torch.tensor([[0.0, 1.5708, 0.0, 0.3]])
    length = torch.full((1, 4), 4.0)
    width = torch.full((1, 4), 2.0)
    present = torch.ones(1, 4, dtype=torch.bool)
    src = torch.tensor([[True, False]])
    hit = hit_by(pos, heading, length, width, present, src, 1.0)
    assert hit.tolist() == [[False, True, False, False]]
    # with a smaller box the near miss disappears: 2.4 > 0.5 * 0.5 * (4 + 2)
    assert not hit_by(pos, heading, length, width, present, src, 0.5).any()


def test_synthetic_pack_grid_tables():
    from gpusim.config import RoadType
    from gpusim.kernels.grid import cell_index

    from synthetic import small_config, straight_track, synthetic_pack

    roads = [(0.0, -5.0, 50.0, -5.0, int(RoadType.ROAD_EDGE)), (0.0, 0.0, 50.0, 0.0, int(RoadType.LANE)),
             (0.0, 5.0, 50.0, 5.0, int(RoadType.ROAD_EDGE)), (20.0, -30.0, 20.0, 30.0, int(RoadType.LANE))]
    pack = synthetic_pack([{"agents": [dict(pos=straight_track(0, 0, 0.0, 5.0))], "num_controlled": 1,
                            "roads": roads}], small_config(grid_k=3, grid_edge_k=1))
    # the agent's start cell (centre near (0, 0)): nearest segments lane y=0, then the two edges
    cell = cell_index(torch.tensor([[[0.5, 0.5]]]), torch.tensor([0]), pack.grid_origin, pack.grid_dims,
                      pack.cell_size)[0, 0]
    assert pack.grid_road[0, cell].tolist()[0] == 1
    assert sorted(pack.grid_road[0, cell].tolist()) == [0, 1, 2]
    assert pack.grid_edge[0, cell].tolist()[0] in (0, 2)
    nx, ny = pack.grid_dims[0].tolist()
    assert pack.grid_road.shape[1] == nx * ny
    assert (pack.grid_edge[0, : nx * ny] >= 0).all()
