"""Tests of the observation kernel: hand-made scenes, brute force on random worlds, Triton vs torch."""

import math

import pytest
import torch

from gpusim.backend import use_backend
from synthetic import backend_device, to_cpu, to_kernel_device
from gpusim.kernels.observations import (
    EGO_EXTRA,
    GOAL_SCALE,
    SIZE_SCALE,
    SPEED_SCALE,
    observations_triton,
    obs_layout,
    observations,
    observations_reference,
)


def scene(W=1, A=4, C=1, K=4, R=4, P=3, S=1, NC=1, pr=50.0, rr=50.0, cell=100.0):
    """A blank scene as a dict of keyword arguments: agents far apart, not present; one grid
    cell per scenario by default (origin (-50, -50), cell 100 m), all candidates -1."""
    return dict(
        pos=torch.zeros(W, A, 2),
        heading=torch.zeros(W, A),
        speed=torch.zeros(W, A),
        length=torch.full((W, A), 4.5),
        width=torch.full((W, A), 2.0),
        agent_type=torch.zeros(W, A, dtype=torch.int8),
        present=torch.zeros(W, A, dtype=torch.bool),
        goal=torch.zeros(W, C, 2),
        ego_extra=torch.zeros(W, C, len(EGO_EXTRA)),
        ego_active=torch.ones(W, C, dtype=torch.bool),
        scenario=torch.zeros(W, dtype=torch.int64),
        road_seg=torch.zeros(S, R, 4),
        road_type=torch.zeros(S, R, dtype=torch.int8),
        grid_road=torch.full((S, NC, K), -1, dtype=torch.int32),
        grid_origin=torch.full((S, 2), -50.0),
        grid_dims=torch.ones(S, 2, dtype=torch.int32),
        cell_size=cell,
        num_partners=P,
        partner_radius=pr,
        road_radius=rr,
    )


def split(obs, kw):
    lay = obs_layout(kw["num_partners"], kw["grid_road"].shape[2])
    W, C, _ = obs.shape
    return (
        lay,
        obs[..., lay.ego],
        obs[..., lay.partners].reshape(W, C, lay.num_partners, lay.partner_dim),
        obs[..., lay.roads].reshape(W, C, lay.num_roads, lay.road_dim),
    )


# ------------------------------------------------------------------------------------ layout
def test_layout_contract():
    lay = obs_layout(31, 128)
    assert lay.ego_dim == len(lay.ego_features) == 11
    assert lay.ego_features[-len(EGO_EXTRA):] == EGO_EXTRA
    assert lay.partner_dim == len(lay.partner_features) and lay.partner_features[-1] == "valid"
    assert lay.road_dim == len(lay.road_features) and lay.road_features[-1] == "valid"
    assert lay.obs_dim == lay.ego_dim + 31 * lay.partner_dim + 128 * lay.road_dim
    assert (lay.ego.start, lay.ego.stop, lay.partners.stop, lay.roads.stop) == (
        0, lay.ego_dim, lay.ego_dim + 31 * lay.partner_dim, lay.obs_dim)
    assert lay.partners.start == lay.ego.stop and lay.roads.start == lay.partners.stop
    assert sum(f.startswith("is_") for f in lay.road_features) == 4
    with pytest.raises(ValueError):
        obs_layout(0, 8)
    with pytest.raises(dataclasses_frozen_error()):
        lay.obs_dim = 3


def dataclasses_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


# ------------------------------------------------------------------------------------ ego
def test_ego_features_and_extras():
    kw = scene(A=2, C=1)
    kw["pos"][0, 0] = torch.tensor([3.0, 4.0])
    kw["heading"][0, 0] = math.pi / 2  # facing +y
    kw["speed"][0, 0] = -2.0
    kw["goal"][0, 0] = torch.tensor([3.0, 14.0])  # 10 m straight ahead
    kw["ego_extra"][0, 0] = torch.tensor([1.0, 0.0, 0.5, 0.25, -0.5])
    _, ego, _, _ = split(observations_reference(**kw), kw)
    want = [-2.0 / SPEED_SCALE, 4.5 / SIZE_SCALE, 2.0 / SIZE_SCALE, 10 / GOAL_SCALE, 0.0, 10 / GOAL_SCALE,
            1.0, 0.0, 0.5, 0.25, -0.5]
    torch.testing.assert_close(ego[0, 0], torch.tensor(want), atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------ partners
def test_partner_ahead_left_and_rotated_ego():
    kw = scene(W=2, A=3, C=1, P=2)
    kw["present"][:] = True
    # world 0: ego at origin facing +x; partner 1 straight ahead at 10 m, partner 2 left at 20 m
    kw["pos"][0, 1] = torch.tensor([10.0, 0.0])
    kw["pos"][0, 2] = torch.tensor([0.0, 20.0])
    kw["heading"][0, 1] = math.pi / 2
    kw["speed"][0, 1] = 5.0
    kw["agent_type"][0, 2] = 1  # pedestrian
    kw["length"][0, 2] = 0.5
    # world 1: ego at (1, 2) facing +y; partner 1 at (1, 12) is straight ahead, partner 2 on its right
    kw["pos"][1, 0] = torch.tensor([1.0, 2.0])
    kw["heading"][1, 0] = math.pi / 2
    kw["pos"][1, 1] = torch.tensor([1.0, 12.0])
    kw["heading"][1, 1] = math.pi  # facing -x = to the ego's left
    kw["pos"][1, 2] = torch.tensor([21.0, 2.0])
    _, _, part, _ = split(observations_reference(**kw), kw)
    r = 50.0
    p = part[0, 0]
    torch.testing.assert_close(p[0, :4], torch.tensor([10 / r, 0.0, 0.0, 1.0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(p[0, 4:], torch.tensor([5 / SPEED_SCALE, 0.9, 0.4, 1, 0, 0, 1]), atol=1e-6, rtol=0)
    torch.testing.assert_close(p[1, :4], torch.tensor([0.0, 20 / r, 1.0, 0.0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(p[1, 5:], torch.tensor([0.1, 0.4, 0, 1, 0, 1]), atol=1e-6, rtol=0)
    p = part[1, 0]
    torch.testing.assert_close(p[0, :4], torch.tensor([10 / r, 0.0, 0.0, 1.0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(p[1, :2], torch.tensor([0.0, -20 / r]), atol=1e-6, rtol=0)


def test_partner_filtering_self_absent_removed_radius():
    kw = scene(A=6, C=2, P=5, pr=30.0)
    kw["present"][:] = True
    kw["pos"][0] = torch.tensor([[0.0, 0], [5, 0], [10, 0], [29, 0], [31, 0], [3, 0]])
    kw["present"][0, 5] = False  # removed / absent agent: not observed although closest
    _, _, part, _ = split(observations_reference(**kw), kw)
    p = part[0, 0]
    # slot 0 sees agents 1 (5 m), 2 (10 m), 3 (29 m); agent 4 is beyond 30 m; never itself
    torch.testing.assert_close(p[:, -1], torch.tensor([1.0, 1, 1, 0, 0]))
    torch.testing.assert_close(p[:3, 0] * 30.0, torch.tensor([5.0, 10, 29]), atol=1e-5, rtol=0)
    assert torch.all(p[3:] == 0)
    # slot 1 (agent 1 at x=5) sees agent 0 and 2 at 5 m (tie -> lower agent index first), then 3 at 24 m
    # and 4 at 26 m (all within 30 m of it)
    q = part[0, 1]
    torch.testing.assert_close(q[:, 0] * 30.0, torch.tensor([-5.0, 5, 24, 26, 0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(q[:, -1], torch.tensor([1.0, 1, 1, 1, 0]))


def test_more_candidates_than_slots_keeps_nearest_sorted():
    g = torch.Generator().manual_seed(3)
    kw = scene(A=12, C=1, P=4)
    kw["present"][:] = True
    dist = torch.randperm(11, generator=g).to(torch.float32) * 3 + 2  # distinct 2..32 m
    ang = torch.rand(11, generator=g) * 2 * math.pi
    kw["pos"][0, 1:, 0] = dist * torch.cos(ang)
    kw["pos"][0, 1:, 1] = dist * torch.sin(ang)
    _, _, part, _ = split(observations_reference(**kw), kw)
    got = torch.hypot(part[0, 0, :, 0], part[0, 0, :, 1]) * 50
    torch.testing.assert_close(got, torch.sort(dist).values[:4], atol=1e-4, rtol=0)


# ------------------------------------------------------------------------------------ roads
def test_roads_sorted_by_true_distance_with_padding_and_types():
    kw = scene(A=1, C=1, K=6, R=5, rr=20.0)
    kw["heading"][0, 0] = math.pi / 2  # ego faces +y; ego frame x = world y, y = -world x
    kw["road_seg"][0] = torch.tensor(
        [
            [-100.0, 5, 100, 5],  # long lane: midpoint (0, 5) but nearest point 5 m away
            [3.0, 0, 3, 1],  # road edge 3 m to the right (world +x), midpoint distance ~3.04
            [8.0, 8, 8, 9],  # 8*sqrt2 ~ 11.3 m
            [30.0, 0, 31, 0],  # beyond road_radius (30 m)
            [0.0, -4, 0, -4],  # zero-length segment (a point) 4 m behind
        ]
    )
    kw["road_type"][0] = torch.tensor([0, 2, 1, 0, 6], dtype=torch.int8)
    kw["grid_road"][0, 0] = torch.tensor([2, -1, 3, 0, 4, 1], dtype=torch.int32)
    _, _, _, road = split(observations_reference(**kw), kw)
    rd = road[0, 0]
    torch.testing.assert_close(rd[:, -1], torch.tensor([1.0, 1, 1, 1, 0, 0]))
    assert torch.all(rd[4:] == 0)
    r = 20.0
    # order: edge (3 m), point (4 m), lane (5 m), road_line (11.3 m)
    torch.testing.assert_close(rd[0, :5], torch.tensor([0.5 / r, -3 / r, 1 / r, 1.0, 0.0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(rd[0, 5:9], torch.tensor([0.0, 0, 1, 0]))
    torch.testing.assert_close(rd[1, :5], torch.tensor([-4 / r, 0.0, 0.0, 0.0, -1.0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(rd[1, 5:9], torch.tensor([0.0, 0, 0, 1]))  # driveway -> "other"
    torch.testing.assert_close(rd[2, :5], torch.tensor([5 / r, 0.0, 200 / r, 0.0, -1.0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(rd[3, 5:9], torch.tensor([0.0, 1, 0, 0]))
    # segment endpoints are recoverable: mid +- length/2 * dir, in the ego frame
    end = (rd[3, :2] + 0.5 * rd[3, 2] * rd[3, 3:5]) * r
    torch.testing.assert_close(end, torch.tensor([9.0, -8.0]), atol=1e-5, rtol=0)


def tie_scene():
    """Three segments whose nearest point to the ego is one shared vertex V (exact tie in real
    arithmetic), a fourth farther away; grid order [seg2, seg0, seg1, -1, seg3]."""
    kw = scene(A=1, C=1, K=5, R=4, rr=40.0)
    vx, vy = 10.3, -7.1
    kw["road_seg"][0] = torch.tensor(
        [
            [vx, vy, vx + 5.0, vy],  # seg0 starts at V, length 5
            [vx + 2.4, vy + 3.2, vx, vy],  # seg1 ends at V, length 4
            [vx, vy, vx + 2.4, vy - 1.8],  # seg2 starts at V, length 3
            [vx + 9.0, vy + 9.0, vx + 9.0, vy + 11.0],  # seg3 farther
        ]
    )
    kw["grid_road"][0, 0] = torch.tensor([2, 0, 1, -1, 3], dtype=torch.int32)
    return kw, (vx - 6.0, vy - 2.0)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_exact_distance_ties_are_ordered_by_grid_position(backend):
    """Segments sharing the vertex nearest to the ego have bit-identical distances (computed from
    the exact vertex), so the sort key's index bits order them by grid position (seg2, seg0, seg1)
    for every ego position nearby, in both backends (their positions differ in the last bits)."""
    kw, (ex, ey) = tie_scene()
    g = torch.Generator().manual_seed(0)
    jitter = torch.randn(16, 2, generator=g, dtype=torch.float64) * 1e-3
    if backend == "torch":
        fn = observations_reference
    else:
        def fn(**k):
            return to_cpu(observations_triton(**to_kernel_device(k)))
    for j in jitter:
        kw["pos"][0, 0] = torch.tensor([ex + j[0].item(), ey + j[1].item()])
        kw["heading"][0, 0] = float(j[0]) * 100.0  # an arbitrary heading per trial
        _, _, _, road = split(fn(**kw), kw)
        lengths = road[0, 0, :, 2] * 40.0
        torch.testing.assert_close(lengths, torch.tensor([3.0, 5.0, 4.0, 2.0, 0.0]), atol=1e-5, rtol=0)
        # the three tied slots show the same distance to V: midpoint - half length * direction
        v = road[0, 0, :3, :2] - 0.5 * road[0, 0, :3, 2:3] * road[0, 0, :3, 3:5]  # seg2, seg0 start at V
        v[2] = road[0, 0, 2, :2] + 0.5 * road[0, 0, 2, 2] * road[0, 0, 2, 3:5]  # seg1 ends at V
        torch.testing.assert_close(v[1:], v[:1].expand(2, 2), atol=1e-6, rtol=0)


def test_road_cell_lookup_uses_ego_cell():
    kw = scene(A=2, C=2, K=2, R=2, NC=2, cell=10.0)
    kw["grid_origin"][0] = torch.tensor([0.0, 0.0])
    kw["grid_dims"][0] = torch.tensor([2, 1], dtype=torch.int32)
    kw["road_seg"][0] = torch.tensor([[1.0, 1, 2, 1], [15.0, 1, 16, 1]])
    kw["grid_road"][0] = torch.tensor([[0, -1], [1, -1]], dtype=torch.int32)
    kw["pos"][0] = torch.tensor([[5.0, 5], [12.0, 5]])  # cells 0 and 1
    _, _, _, road = split(observations_reference(**kw), kw)
    torch.testing.assert_close(road[0, 0, 0, 0] * 50, torch.tensor(-3.5), atol=1e-5, rtol=0)
    torch.testing.assert_close(road[0, 1, 0, 0] * 50, torch.tensor(3.5), atol=1e-5, rtol=0)


def test_inactive_slot_is_all_zero():
    kw = random_scene(seed=1)
    kw["ego_active"][0, 1] = False
    obs = observations_reference(**kw)
    assert torch.all(obs[0, 1] == 0)
    assert obs[0, 0].abs().sum() > 0
    # an inactive slot's agent may still be observed by others only if present: not the slot's concern
    assert torch.isfinite(obs).all()


# ------------------------------------------------------------------------------------ brute force
def random_scene(seed, W=2, A=7, C=3, K=6, R=9, S=2, P=4, nx=3, ny=2, cell=15.0):
    g = torch.Generator().manual_seed(seed)
    kw = scene(W=W, A=A, C=C, K=K, R=R, P=P, S=S, NC=nx * ny, pr=25.0, rr=20.0, cell=cell)
    kw["pos"] = torch.rand(W, A, 2, generator=g) * torch.tensor([nx * cell, ny * cell])
    kw["heading"] = (torch.rand(W, A, generator=g) - 0.5) * 2 * math.pi
    kw["speed"] = torch.randn(W, A, generator=g) * 5
    kw["length"] = torch.rand(W, A, generator=g) * 5 + 0.5
    kw["width"] = torch.rand(W, A, generator=g) * 2 + 0.5
    kw["agent_type"] = torch.randint(0, 3, (W, A), generator=g, dtype=torch.int8)
    kw["present"] = torch.rand(W, A, generator=g) < 0.8
    kw["goal"] = torch.rand(W, C, 2, generator=g) * 100 - 25
    kw["ego_extra"] = torch.rand(W, C, len(EGO_EXTRA), generator=g)
    kw["ego_active"] = torch.rand(W, C, generator=g) < 0.85
    kw["scenario"] = torch.randint(0, S, (W,), generator=g)
    p0 = torch.rand(S, R, 2, generator=g) * torch.tensor([nx * cell, ny * cell])
    kw["road_seg"] = torch.cat([p0, p0 + torch.randn(S, R, 2, generator=g) * 6], dim=-1)
    kw["road_type"] = torch.randint(0, 8, (S, R), generator=g, dtype=torch.int8)
    grid = torch.stack([torch.randperm(R, generator=g)[:K] for _ in range(S * nx * ny)]).to(torch.int32)
    grid[torch.rand(grid.shape, generator=g) < 0.2] = -1
    kw["grid_road"] = grid.reshape(S, nx * ny, K)
    kw["grid_origin"] = torch.zeros(S, 2)
    kw["grid_dims"] = torch.tensor([[nx, ny]] * S, dtype=torch.int32)
    return kw


def brute_force(kw):
    """Per-agent Python computation of the observation from the definitions (float64 math)."""
    W, A = kw["heading"].shape
    C = kw["goal"].shape[1]
    P, pr, rr, cs = kw["num_partners"], kw["partner_radius"], kw["road_radius"], kw["cell_size"]
    K = kw["grid_road"].shape[2]
    lay = obs_layout(P, K)
    out = torch.zeros(W, C, lay.obs_dim, dtype=torch.float64)
    for w in range(W):
        s = int(kw["scenario"][w])
        for c in range(C):
            if not kw["ego_active"][w, c]:
                continue
            ex, ey = kw["pos"][w, c].tolist()
            h = float(kw["heading"][w, c])
            co, si = math.cos(h), math.sin(h)

            def frame(x, y):
                return (x - ex) * co + (y - ey) * si, -(x - ex) * si + (y - ey) * co

            gx, gy = frame(*kw["goal"][w, c].tolist())
            feats = [float(kw["speed"][w, c]) / SPEED_SCALE, float(kw["length"][w, c]) / SIZE_SCALE,
                     float(kw["width"][w, c]) / SIZE_SCALE, gx / GOAL_SCALE, gy / GOAL_SCALE,
                     math.hypot(gx, gy) / GOAL_SCALE] + kw["ego_extra"][w, c].tolist()
            out[w, c, lay.ego] = torch.tensor(feats, dtype=torch.float64)
            cands = []
            for j in range(A):
                if j == c or not kw["present"][w, j]:
                    continue
                x, y = kw["pos"][w, j].tolist()
                d = math.hypot(x - ex, y - ey)
                if d <= pr:
                    cands.append((d, j))
            for q, (d, j) in enumerate(sorted(cands)[:P]):
                x, y = kw["pos"][w, j].tolist()
                rx, ry = frame(x, y)
                dh = float(kw["heading"][w, j]) - h
                t = int(kw["agent_type"][w, j])
                row = [rx / pr, ry / pr, math.cos(dh), math.sin(dh), float(kw["speed"][w, j]) / SPEED_SCALE,
                       float(kw["length"][w, j]) / SIZE_SCALE, float(kw["width"][w, j]) / SIZE_SCALE,
                       t == 0, t == 1, t == 2, 1.0]
                o = lay.partners.start + q * lay.partner_dim
                out[w, c, o:o + lay.partner_dim] = torch.tensor(row, dtype=torch.float64)
            nx, ny = kw["grid_dims"][s].tolist()
            ox, oy = kw["grid_origin"][s].tolist()
            ix = min(max(math.floor((ex - ox) / cs), 0), nx - 1)
            iy = min(max(math.floor((ey - oy) / cs), 0), ny - 1)
            roads = []
            for k, i in enumerate(kw["grid_road"][s, iy * nx + ix].tolist()):
                if i < 0:
                    continue
                x0, y0, x1, y1 = kw["road_seg"][s, i].tolist()
                dx, dy = x1 - x0, y1 - y0
                L2 = dx * dx + dy * dy
                t = 0.0 if L2 == 0 else min(max(((ex - x0) * dx + (ey - y0) * dy) / L2, 0.0), 1.0)
                d = math.hypot(x0 + t * dx - ex, y0 + t * dy - ey)
                if d <= rr:
                    roads.append((d, k, i))
            for q, (d, _, i) in enumerate(sorted(roads)):
                x0, y0, x1, y1 = kw["road_seg"][s, i].tolist()
                mx, my = frame((x0 + x1) / 2, (y0 + y1) / 2)
                L = math.hypot(x1 - x0, y1 - y0)
                ang = math.atan2(y1 - y0, x1 - x0) - h if L > 0 else -h
                t = int(kw["road_type"][s, i])
                grp = t if 0 <= t < 3 else 3
                row = [mx / rr, my / rr, L / rr, math.cos(ang), math.sin(ang)] + [grp == m for m in range(4)] + [1.0]
                o = lay.roads.start + q * lay.road_dim
                out[w, c, o:o + lay.road_dim] = torch.tensor(row, dtype=torch.float64)
    return out.to(torch.float32)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_reference_matches_brute_force(seed):
    kw = random_scene(seed)
    got = observations_reference(**kw)
    want = brute_force(kw)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    _, _, part, road = split(got, kw)
    assert part[..., -1].sum() > 0 and road[..., -1].sum() > 0  # the scenes exercise both blocks


def test_more_partner_slots_than_agents_pads():
    kw = random_scene(seed=5, A=4, C=2, P=6)
    kw["present"][:] = True
    got = observations_reference(**kw)
    torch.testing.assert_close(got, brute_force(kw), atol=2e-5, rtol=1e-5)
    _, _, part, _ = split(got, kw)
    assert torch.all(part[..., 3:, :] == 0)  # at most A - 1 = 3 partners


def test_out_buffer_is_fully_written_and_public_dispatch():
    kw = random_scene(seed=7)
    want = observations_reference(**kw)
    out = torch.full_like(want, float("nan"))
    with use_backend("torch"):
        got = observations(**kw, out=out)
    assert got is out
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_bad_input_raises():
    kw = random_scene(seed=0)
    bad = dict(kw, heading=kw["heading"].double())
    with pytest.raises(ValueError, match="heading"):
        observations_reference(**bad)
    bad = dict(kw, goal=torch.zeros(2, 8, 2), ego_extra=torch.zeros(2, 8, 5), ego_active=torch.ones(2, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="exceeds A"):
        observations_reference(**bad)
    with pytest.raises(ValueError, match="grid_road"):
        observations_reference(**dict(kw, grid_road=kw["grid_road"].long()))
    with pytest.raises(ValueError, match="contiguous"):
        observations_reference(**dict(kw, pos=kw["pos"].transpose(0, 1).contiguous().transpose(0, 1)))
    with pytest.raises(ValueError, match="out"):
        observations_reference(**kw, out=torch.zeros(2, 3, 5))
    with pytest.raises(ValueError, match="radius"):
        observations_reference(**dict(kw, road_radius=0.0))


# ------------------------------------------------------------------------------------ Triton
@pytest.mark.parametrize(
    "sizes",
    [
        dict(W=2, A=9, C=3, K=13, R=17, P=4, nx=3, ny=2),
        dict(W=1, A=5, C=5, K=7, R=8, P=6, nx=1, ny=3),  # more partner slots than agents
    ],
)
def test_triton_matches_reference(sizes):
    kw = random_scene(seed=11, **sizes)
    kw["ego_active"][0, 0] = False
    want = observations_reference(**kw)
    kkw = to_kernel_device(kw)
    out = to_kernel_device(torch.full_like(want, float("nan")))
    got = observations_triton(**kkw, out=out).cpu()
    assert not torch.isnan(got).any(), "kernel left elements unwritten"
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with use_backend("triton"):
        torch.testing.assert_close(observations(**kkw).cpu(), want, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------ rows (compaction)
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_rows_write_only_listed_slots(backend):
    kw = random_scene(seed=13, W=3, A=9, C=4, K=13, R=17, P=4)
    kw["ego_active"][1, 2] = False
    want = observations_reference(**kw)
    rows = torch.tensor([6, 0, 11, 5], dtype=torch.int64)  # any order; slot 6 = (1, 2) is inactive
    dev = backend_device(backend)
    out = torch.full_like(want, float("nan"), device=dev)
    with use_backend(backend):
        got = observations(**{k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kw.items()},
                           out=out, rows=rows.to(dev))
    assert got is out
    flat, ref = got.cpu().view(12, -1), want.view(12, -1)
    torch.testing.assert_close(flat[rows], ref[rows], atol=1e-5, rtol=1e-5)
    assert torch.all(flat[6] == 0)
    others = torch.ones(12, dtype=torch.bool)
    others[rows] = False
    assert torch.isnan(flat[others]).all()  # not listed: left as they were


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("W,C,extra", [(3, 4, 0), (5, 3, 7), (1, 1, 3)])
def test_written_skips_empty_zero_slots_and_out_may_be_a_column_slice(backend, W, C, extra):
    """``written`` (the GPU path's compaction): an active slot or a written one is computed (a
    written inactive slot is zeroed), a slot neither active nor written is left untouched (NaN
    here); ``out`` may be the first D columns of a wider buffer, whose other columns stay as
    they were. Odd sizes, NaN-prefilled output."""
    kw = random_scene(seed=17 + W, W=W, A=9, C=C, K=13, R=17, P=4)
    g = torch.Generator().manual_seed(W * 10 + C)
    active = torch.rand(W, C, generator=g) < 0.5
    active.view(-1)[0] = True
    kw["ego_active"] = active
    written = torch.rand(W * C, generator=g) < 0.5
    want = observations_reference(**kw).view(W * C, -1)
    D = want.shape[-1]
    dev = backend_device(backend)
    wide = torch.full((W, C, D + extra), float("nan"), device=dev)
    with use_backend(backend):
        got = observations(**{k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kw.items()},
                           out=wide[..., :D], written=written.to(dev))
    assert got.data_ptr() == wide.data_ptr()
    flat = wide.cpu().view(W * C, D + extra)
    todo = active.view(-1) | written
    torch.testing.assert_close(flat[todo, :D], want[todo], atol=1e-5, rtol=1e-5)
    assert torch.isnan(flat[~todo]).all()  # neither active nor written: untouched
    assert torch.isnan(flat[:, D:]).all()  # beyond the slice: untouched


def test_written_bad_input():
    kw = random_scene(seed=0)
    out = torch.zeros(2, 3, obs_layout(4, 6).obs_dim)
    with pytest.raises(ValueError, match="written needs out"):
        observations_reference(**kw, written=torch.zeros(6, dtype=torch.bool))
    with pytest.raises(ValueError, match="excludes rows"):
        observations_reference(**kw, out=out, rows=torch.tensor([0]), written=torch.zeros(6, dtype=torch.bool))
    with pytest.raises(ValueError, match="written must be"):
        observations_reference(**kw, out=out, written=torch.zeros(5, dtype=torch.bool))
    with pytest.raises(ValueError, match="column slice"):
        observations_reference(**kw, out=torch.zeros(2, 4, obs_layout(4, 6).obs_dim)[:, :3])


def test_rows_bad_input():
    kw = random_scene(seed=0)
    with pytest.raises(ValueError, match="rows needs out"):
        observations_reference(**kw, rows=torch.tensor([0]))
    out = torch.zeros(2, 3, obs_layout(4, 6).obs_dim)
    with pytest.raises(ValueError, match="int64"):
        observations_reference(**kw, out=out, rows=torch.tensor([0], dtype=torch.int32))


def test_road_table_cache_follows_in_place_edits():
    """The per-pack road table is cached; editing road_seg in place must not serve a stale table."""
    kw = random_scene(seed=2)
    a = observations_reference(**kw)
    kw["road_seg"] += 3.0  # in place: same tensor object, new version counter
    b = observations_reference(**kw)
    assert not torch.equal(a, b)
    torch.testing.assert_close(b, brute_force(kw), atol=2e-5, rtol=1e-5)


def test_env_compacted_observations_equal_full_reference(sample_dir):
    """DriveEnv's reused buffer (only in-play slots recomputed, slots leaving play zeroed once)
    equals a fresh full computation, on real scenarios where agents get removed."""
    from gpusim.config import EnvConfig
    from gpusim.data import ScenarioPack
    from gpusim.env import DriveEnv

    config = EnvConfig(max_controlled=8, collision_behavior="remove", offroad_behavior="remove",
                       scenario_length=12, cpu_kernels=False)  # the C kernel's env path: test_observations_c.py
    files = sorted(sample_dir.glob("*.json*"))[:4]
    env = DriveEnv(ScenarioPack.from_json(files, config.data_config()), 6, config, seed=3)
    obs = env.reset()
    g = torch.Generator().manual_seed(0)
    left_play = 0
    for t in range(14):  # crosses the auto-reset at step 12
        st, p, C = env.state, env.pack, env.num_slots
        active = st.slot_active & st.present[:, :C]
        want = observations_reference(
            st.pos, st.heading, st.speed, st.length, st.width, st.agent_type, st.present,
            st.goal[:, :C].contiguous(), obs[..., 6:11].contiguous(), active, st.scenario, p.road_seg,
            p.road_type, p.grid_road, p.grid_origin, p.grid_dims, p.cell_size, config.num_partners,
            config.partner_radius, config.road_radius, grid_start=p.grid_start)
        d0 = want.shape[-1]  # the env appends the signal block (none in the sample: all zero)
        assert torch.equal(obs[..., :d0], want) and not obs[..., d0:].any()
        res = env.step(torch.randint(0, 91, (6, C), generator=g))
        assert res.obs is obs  # the env's reused buffer
        left_play += int((active & ~(env.state.slot_active & env.state.present[:, :C])).sum())
    assert left_play > 0  # some slots left play, so the zeroing path ran
