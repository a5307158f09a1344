"""Offroad (box outline crossing a road edge): crafted roads and Triton kernel vs torch reference."""

import math

import pytest
import torch
import triton
import triton.language as tl

from gpusim.backend import use_backend
from gpusim.kernels.grid import cell_index_jit, cell_index_reference
from gpusim.kernels.offroad import offroad, offroad_reference
from synthetic import KERNEL_DEVICE, backend_device, to_cpu, to_kernel_device

BACKENDS = ["torch", "triton", "c"]  # every backend of the op (triton: the interpreter on CPU)
CELL = 5.0


def _map(segments, listed=None, KE=4, nx=20, ny=20):
    """One scenario: grid of nx x ny 5-m cells from (-50, -50); every cell lists ``listed``."""
    road = torch.tensor(segments, dtype=torch.float32)[None]
    listed = list(range(len(segments))) if listed is None else listed
    row = torch.full((KE,), -1, dtype=torch.int32)
    row[: len(listed)] = torch.tensor(listed, dtype=torch.int32)
    grid = row.repeat(1, nx * ny, 1).contiguous()
    origin = torch.tensor([[-50.0, -50.0]])
    dims = torch.tensor([[nx, ny]], dtype=torch.int32)
    return road, grid, origin, dims


def _agents(*boxes, present=None):
    t = torch.tensor(boxes, dtype=torch.float32)[None]
    pres = torch.ones(1, len(boxes), dtype=torch.bool) if present is None else torch.tensor([present])
    return t[..., :2].contiguous(), t[..., 2].contiguous(), t[..., 3].contiguous(), t[..., 4].contiguous(), pres


def _run(backend, agents, road_map, box_scale=1.0, scenario=None):
    scen = torch.zeros(agents[0].shape[0], dtype=torch.int64) if scenario is None else scenario
    dev = backend_device(backend)
    args = [x.to(dev) for x in (*agents, scen, *road_map)]
    with use_backend(backend):
        return offroad(*args, CELL, box_scale)


@pytest.mark.parametrize("backend", BACKENDS)
def test_crossing_vs_parallel(backend):
    road = _map([(-40.0, 3.0, 40.0, 3.0)])  # a straight road edge along y = 3
    agents = _agents(
        (0.0, 3.0, 0.0, 4.0, 2.0),  # straddles the edge: crosses
        (0.0, 0.0, 0.0, 4.0, 2.0),  # parallel, 2 m away: no
        (0.0, 2.0, 0.0, 4.0, 2.0),  # top side lies on the edge (collinear): not a proper crossing
        (10.0, 1.5, math.pi / 2, 4.0, 2.0),  # rotated 90 deg, spans y in [-0.5, 3.5]: crosses
        (20.0, 0.5, math.pi / 4, 4.0, 2.0),  # rotated 45 deg, top corner y = 0.5 + 2.12: no
        (30.0, 1.0, math.pi / 4, 4.0, 2.0),  # rotated 45 deg, top corner y = 3.12: crosses
    )
    assert _run(backend, agents, road).tolist() == [[True, False, False, True, False, True]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_segment_inside_box(backend):
    road = _map([(-0.5, 0.0, 0.5, 0.0), (-40.0, 1.8, 40.0, 1.8)])
    agents = _agents((0.0, 0.0, 0.0, 4.0, 2.0), (10.0, 0.0, 0.0, 4.0, 4.0))
    # agent 0: the short segment lies inside the box (no outline crossing); the long edge at
    # y = 1.8 is crossed by its 2-m-wide box (top at y = 1) only at full width 4 m (agent 1).
    assert _run(backend, agents, road).tolist() == [[False, True]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_box_scale_threshold(backend):
    road = _map([(-40.0, 1.8, 40.0, 1.8)])
    agents = _agents((0.0, 0.0, 0.0, 4.0, 4.0))  # half width 2 * scale; crosses iff 2 * scale > 1.8
    assert _run(backend, agents, road, box_scale=1.0).tolist() == [[True]]
    assert _run(backend, agents, road, box_scale=0.85).tolist() == [[False]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_padding_and_unlisted_segments_ignored(backend):
    # segment 1 crosses the box but no cell lists it; the list is [0, -1, -1, -1]
    road = _map([(-40.0, 30.0, 40.0, 30.0), (-40.0, 0.0, 40.0, 0.0)], listed=[0])
    agents = _agents((0.0, 0.0, 0.0, 4.0, 2.0), (0.0, 30.0, 0.0, 4.0, 2.0))
    assert _run(backend, agents, road).tolist() == [[False, True]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_absent_agents_never_offroad(backend):
    road = _map([(-40.0, 0.0, 40.0, 0.0)])
    agents = _agents((0.0, 0.0, 0.0, 4.0, 2.0), (5.0, 0.0, 0.0, 4.0, 2.0), present=[True, False])
    assert _run(backend, agents, road).tolist() == [[True, False]]


def _random_case(W, A, S, R, KE, seed):
    g = torch.Generator().manual_seed(seed)
    nx, ny = 9, 7
    road = (torch.rand(S, R, 4, generator=g) * 45).contiguous()
    grid = torch.randint(-1, R, (S, nx * ny, KE), generator=g, dtype=torch.int32)
    origin = torch.zeros(S, 2)
    dims = torch.tensor([[nx, ny]] * S, dtype=torch.int32)
    pos = torch.rand(W, A, 2, generator=g) * 50 - 2  # some outside the grid (clamped cells)
    heading = (torch.rand(W, A, generator=g) * 2 - 1) * math.pi
    length = 1 + torch.rand(W, A, generator=g) * 4
    width = 0.5 + torch.rand(W, A, generator=g) * 2
    present = torch.rand(W, A, generator=g) > 0.2
    scen = torch.randint(0, S, (W,), generator=g)
    return (pos, heading, length, width, present, scen, road, grid, origin, dims)


@pytest.mark.parametrize("W,A,S,R,KE", [(3, 37, 2, 50, 8), (2, 300, 3, 17, 5), (1, 1, 1, 3, 1)])
def test_kernel_matches_reference(W, A, S, R, KE):
    args = _random_case(W, A, S, R, KE, seed=W * A + R)
    ref = offroad_reference(*args, CELL, 0.9)
    if A > 1:
        assert ref.any() and not ref.all()
    with use_backend("triton"):
        out = to_cpu(offroad(*to_kernel_device(args), CELL, 0.9))
    assert out.dtype == torch.bool and torch.equal(out, ref)


def test_kernel_rejects_bad_input():
    args = list(_random_case(2, 5, 1, 4, 2, seed=0))
    args[5] = args[5].to(torch.int32)  # scenario must be int64
    args = to_kernel_device(args)
    with use_backend("triton"):
        with pytest.raises(ValueError, match="scenario"):
            offroad(*args, CELL, 1.0)


# ------------------------------------------------------------------------------ CPU fast path
def _dense_oracle(pos, heading, length, width, present, scen, road, grid, origin, dims, cell, box_scale):
    """Every listed segment against every box edge, no pre-check ([W, A, KE, 4] orientation test)."""
    from gpusim.kernels.grid import cell_index

    c = cell_index(pos, scen, origin, dims, cell)
    idx = grid[scen[:, None], c].long()
    seg = road[scen[:, None, None], idx.clamp_min(0)]
    qx1, qy1, qx2, qy2 = (seg[..., k, None] for k in range(4))
    a, b = 0.5 * box_scale * length, 0.5 * box_scale * width
    co, si = torch.cos(heading), torch.sin(heading)
    ux, uy, vx, vy = a * co, a * si, -b * si, b * co
    x, y = pos[..., 0], pos[..., 1]
    cx = torch.stack((x + ux + vx, x - ux + vx, x - ux - vx, x + ux - vx), -1)[:, :, None, :]
    cy = torch.stack((y + uy + vy, y - uy + vy, y - uy - vy, y + uy - vy), -1)[:, :, None, :]
    px2, py2 = torch.roll(cx, -1, -1), torch.roll(cy, -1, -1)
    ex, ey, fx, fy = px2 - cx, py2 - cy, qx2 - qx1, qy2 - qy1
    o1 = ex * (qy1 - cy) - ey * (qx1 - cx)
    o2 = ex * (qy2 - cy) - ey * (qx2 - cx)
    o3 = fx * (cy - qy1) - fy * (cx - qx1)
    o4 = fx * (py2 - qy1) - fy * (px2 - qx1)
    cross = (o1 * o2 < 0) & (o3 * o4 < 0)
    return (cross.any(-1) & (idx >= 0)).any(-1) & present


@pytest.mark.parametrize("W,A,S,R,KE,scale", [(3, 37, 2, 50, 8, 0.9), (2, 300, 3, 17, 5, 1.0), (4, 64, 2, 40, 32, 1.7)])
def test_reference_equals_dense_oracle(W, A, S, R, KE, scale):
    """Compaction + bounding-box pre-check give the answer of the exhaustive test."""
    args = _random_case(W, A, S, R, KE, seed=7 * W + A)
    want = _dense_oracle(*args, CELL, scale)
    assert want.any() and not want.all()
    assert torch.equal(offroad_reference(*args, CELL, scale), want)


# ------------------------------------------------------------- the shared grid-cell helper
@triton.jit
def _cell_probe_kernel(pos_ptr, scenario_ptr, origin_ptr, dims_ptr, out_ptr, n, A, cell_size, BLOCK: tl.constexpr):
    """Test-only kernel: ``cell_index_jit`` of every position (what the observation, offroad and
    NEW_GOAL kernels call)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(pos_ptr + 2 * offs, mask=m, other=0.0)
    y = tl.load(pos_ptr + 2 * offs + 1, mask=m, other=0.0)
    s = tl.load(scenario_ptr + offs // A, mask=m, other=0)
    tl.store(out_ptr + offs, cell_index_jit(x, y, s, origin_ptr, dims_ptr, cell_size, m), mask=m)


@pytest.mark.parametrize("W,A,S", [(1, 1, 1), (3, 7, 2), (5, 13, 3)])
def test_cell_index_jit_matches_reference(W, A, S):
    """The Triton cell lookup equals the torch one bit for bit: inside, on cell borders, outside the
    grid (clamped), at +-inf and NaN (cell 0 along that axis), on odd sizes with a NaN-prefilled output."""
    g = torch.Generator().manual_seed(W * 100 + A)
    origin = torch.randn(S, 2, generator=g) * 30
    dims = torch.randint(1, 9, (S, 2), generator=g, dtype=torch.int32)
    cell = 2.5
    scenario = torch.randint(0, S, (W,), generator=g)
    pos = origin[scenario][:, None, :] + (torch.rand(W, A, 2, generator=g) * 1.6 - 0.3) * dims[scenario][:, None, :] * cell
    special = torch.tensor([[float("nan"), 0.0], [float("inf"), -float("inf")], [1e30, -1e30], [0.0, float("nan")]])
    flat = pos.view(-1, 2)
    flat[: min(4, flat.shape[0])] = special[: min(4, flat.shape[0])]
    flat[-1] = origin[scenario[-1]] + cell  # exactly on a cell corner
    want = cell_index_reference(pos, scenario, origin, dims, cell)
    out = torch.full((W, A), -7, dtype=torch.int64, device=KERNEL_DEVICE)
    n = W * A
    k_pos, k_scenario, k_origin, k_dims = to_kernel_device((pos, scenario, origin, dims))
    _cell_probe_kernel[(triton.cdiv(n, 32),)](
        pos_ptr=k_pos, scenario_ptr=k_scenario, origin_ptr=k_origin, dims_ptr=k_dims, out_ptr=out, n=n, A=A,
        cell_size=cell, BLOCK=32,
    )
    assert torch.equal(out.cpu(), want)
    nx, ny = dims[scenario][:, None, 0].to(torch.int64), dims[scenario][:, None, 1].to(torch.int64)
    assert bool(((want >= 0) & (want < nx * ny)).all())
