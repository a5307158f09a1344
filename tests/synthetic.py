"""Builder of small crafted :class:`~gpusim.data.ScenarioPack` objects for tests.

``synthetic_pack([scenario, ...], config)`` takes, per scenario, a list of agents and a list of
road segments and returns a valid pack whose grid tables are built by brute force (every segment's
distance to every cell centre), independently of the data pipeline's grid builder.

An agent is a dict with keys:

* ``pos``: ``[T, 2]`` track or ``(x, y)`` (constant); ``heading``: scalar or ``[T]`` (default: the
  direction of motion, else 0); ``vel``: ``[T, 2]`` (default: finite differences of ``pos`` / dt);
* ``valid``: ``[T]`` bool (default all True); ``length`` (4.5), ``width`` (2.0), ``goal`` (x, y)
  (default: last valid position), ``type`` (ObjectType, default vehicle).

A scenario is a dict ``{"agents": [...], "num_controlled": n, "roads": [(x0, y0, x1, y1, type)]}``;
the first ``num_controlled`` agents are the controlled ones.

Device of the Triton side of tests: :data:`KERNEL_DEVICE` is ``cuda`` when a GPU exists (Triton
kernels run compiled on CUDA tensors) and ``cpu`` otherwise (kernels run under Triton's interpreter,
``TRITON_INTERPRET=1`` set by ``conftest.py``). Tests keep drawing their inputs on the CPU with a
CPU ``torch.Generator`` (the same numbers on every machine), move them with :func:`to_kernel_device`
for the Triton call and bring results back with :func:`to_cpu` before comparing.
"""

from __future__ import annotations

import math

import torch

from gpusim.config import DT, WOMD_STEPS, DataConfig, ObjectType, RoadType
from gpusim.data.pack import ScenarioPack

T = WOMD_STEPS

KERNEL_DEVICE = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
"""Where tests run Triton kernels: ``cuda`` with a GPU, else ``cpu`` (Triton's interpreter)."""


def _move(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, dict):
        return {k: _move(v, device) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        moved = [_move(v, device) for v in x]
        return type(x)(*moved) if hasattr(x, "_fields") else type(x)(moved)
    return x


def to_kernel_device(x):
    """``x`` (a tensor, or a dict / tuple / list / namedtuple of them, nested; other values kept)
    moved to :data:`KERNEL_DEVICE`. A no-op copy-free move on a CPU-only machine."""
    return _move(x, KERNEL_DEVICE)


def to_cpu(x):
    """``x`` (as in :func:`to_kernel_device`) moved to the CPU, e.g. kernel outputs before they are
    compared with a CPU reference (``torch.equal`` of a CUDA and a CPU tensor raises)."""
    return _move(x, "cpu")


def torch_reference_config(config):
    """``config`` for a torch-backend reference env built on :data:`KERNEL_DEVICE` (compared with a
    Triton-backend env on the same device, so both draw the same env random numbers).

    On CUDA ``cpu_kernels`` is switched off: the env's stages pick the CPU C kernels from
    ``backend_for(...) == "torch"`` alone (gpusim/sim/observe.py, replay.py, contacts.py, motion.py,
    signals.py, rewards.py), so ``use_backend("torch")`` on CUDA tensors hands CUDA tensors to the
    C kernels ("tensors must be on the CPU"). The torch references they replace give the same
    results. On the CPU ``config`` is returned unchanged (the reference env runs as before)."""
    return config if KERNEL_DEVICE.type == "cpu" else config.replace(cpu_kernels=False)


def backend_device(backend: str) -> torch.device:
    """The device a test parametrised over ``backend`` builds its tensors on: :data:`KERNEL_DEVICE`
    for ``"triton"`` (forcing Triton on CPU tensors needs the interpreter) and ``"cupy"`` (CUDA
    tensors only: its tests are skipped without a GPU), ``cpu`` for ``"torch"`` and ``"c"``."""
    return KERNEL_DEVICE if backend in ("triton", "cupy") else torch.device("cpu")


def straight_track(x0: float, y0: float, heading: float, speed: float, steps: int = T, accel: float = 0.0):
    """[steps, 2] positions of constant-acceleration straight motion sampled every DT seconds
    (speed never negative)."""
    t = torch.arange(steps, dtype=torch.float64) * DT
    v = (speed + accel * t).clamp_min(0.0)
    # integrate the clamped speed exactly enough for tests (trapezoid on the DT grid)
    dist = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum((v[1:] + v[:-1]) * 0.5 * DT, 0)])
    pos = torch.stack([x0 + dist * math.cos(heading), y0 + dist * math.sin(heading)], -1)
    return pos.float()


def _agent_tensors(ag: dict, steps: int):
    pos = torch.as_tensor(ag["pos"], dtype=torch.float32)
    if pos.dim() == 1:
        pos = pos[None, :].expand(steps, 2).clone()
    assert pos.shape == (steps, 2), pos.shape
    valid = torch.as_tensor(ag.get("valid", [True] * steps), dtype=torch.bool)
    if "vel" in ag:
        vel = torch.as_tensor(ag["vel"], dtype=torch.float32)
    else:
        vel = torch.zeros(steps, 2)
        if steps > 1:
            d = (pos[1:] - pos[:-1]) / DT
            vel[1:] = d
            vel[0] = d[0]
    if "heading" in ag:
        h = torch.as_tensor(ag["heading"], dtype=torch.float32)
        heading = h.expand(steps).clone() if h.dim() == 0 else h
    else:
        heading = torch.atan2(vel[:, 1], vel[:, 0])
        heading = torch.where(vel.norm(dim=-1) > 1e-6, heading, torch.zeros_like(heading))
    if "goal" in ag:
        goal = torch.as_tensor(ag["goal"], dtype=torch.float32)
    else:
        last = int(torch.nonzero(valid)[-1])
        goal = pos[last].clone()
    return pos, heading, vel, valid, goal


def _seg_dist(p: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
    """Distances [N, R] from points [N, 2] to segments [R, 4] (float64)."""
    a, b = seg[None, :, :2], seg[None, :, 2:]
    ab = b - a
    t = (((p[:, None, :] - a) * ab).sum(-1) / (ab * ab).sum(-1).clamp_min(1e-12)).clamp(0, 1)
    q = a + t[..., None] * ab
    return (p[:, None, :] - q).norm(dim=-1)


def synthetic_pack(scenarios: list[dict], config: DataConfig = DataConfig(), steps: int = T) -> ScenarioPack:
    """A valid :class:`ScenarioPack` of the crafted ``scenarios`` (format in the module docstring).

    Raises:
        ValueError: if a scenario has more agents than ``config.max_agents``, more controlled agents
            than ``config.max_controlled``, or no agents.
    """
    S, A, K, KE = len(scenarios), config.max_agents, config.grid_k, config.grid_edge_k
    cs = config.grid_cell_size
    traj_pos = torch.zeros(S, A, steps, 2)
    traj_heading = torch.zeros(S, A, steps)
    traj_vel = torch.zeros(S, A, steps, 2)
    traj_valid = torch.zeros(S, A, steps, dtype=torch.bool)
    exists = torch.zeros(S, A, dtype=torch.bool)
    atype = torch.full((S, A), -1, dtype=torch.int8)
    length = torch.zeros(S, A)
    width = torch.zeros(S, A)
    goal = torch.zeros(S, A, 2)
    src = torch.full((S, A), -1, dtype=torch.int32)
    n_agents = torch.zeros(S, dtype=torch.int32)
    n_ctrl = torch.zeros(S, dtype=torch.int32)
    R = max(1, max(len(sc.get("roads", [])) for sc in scenarios))
    road_seg = torch.zeros(S, R, 4)
    road_type = torch.full((S, R), -1, dtype=torch.int8)
    n_seg = torch.zeros(S, dtype=torch.int32)
    origins, dims, grids = [], [], []
    for s, sc in enumerate(scenarios):
        agents = sc["agents"]
        nc = int(sc.get("num_controlled", 1))
        if not agents or len(agents) > A or nc > config.max_controlled or nc > len(agents):
            raise ValueError(f"scenario {s}: {len(agents)} agents / {nc} controlled do not fit {config}")
        pts = []
        for a, ag in enumerate(agents):
            p, h, v, val, g = _agent_tensors(ag, steps)
            traj_pos[s, a], traj_heading[s, a], traj_vel[s, a], traj_valid[s, a] = p, h, v, val
            goal[s, a] = g
            exists[s, a] = True
            atype[s, a] = int(ag.get("type", ObjectType.VEHICLE))
            length[s, a] = float(ag.get("length", 4.5))
            width[s, a] = float(ag.get("width", 2.0))
            src[s, a] = a
            pts.append(p[val])
            pts.append(g[None])
        n_agents[s], n_ctrl[s] = len(agents), nc
        roads = sc.get("roads", [])
        for r, seg in enumerate(roads):
            road_seg[s, r] = torch.tensor(seg[:4], dtype=torch.float32)
            road_type[s, r] = int(seg[4])
        n_seg[s] = len(roads)
        allp = torch.cat(pts)
        lo = allp.min(0).values - config.grid_margin
        hi = allp.max(0).values + config.grid_margin
        nx = max(1, int(math.ceil(float(hi[0] - lo[0]) / cs)))
        ny = max(1, int(math.ceil(float(hi[1] - lo[1]) / cs)))
        origins.append(lo)
        dims.append((nx, ny))
        iy, ix = torch.meshgrid(torch.arange(ny), torch.arange(nx), indexing="ij")
        centres = torch.stack([lo[0] + (ix.flatten() + 0.5) * cs, lo[1] + (iy.flatten() + 0.5) * cs], -1).double()
        g_road = torch.full((nx * ny, K), -1, dtype=torch.int32)
        g_edge = torch.full((nx * ny, KE), -1, dtype=torch.int32)
        if roads:
            d = _seg_dist(centres, road_seg[s, : len(roads)].double())
            order = torch.argsort(d, dim=1, stable=True)[:, :K]
            g_road[:, : order.shape[1]] = order.int()
            edge_ids = torch.nonzero(road_type[s, : len(roads)] == RoadType.ROAD_EDGE).flatten()
            if len(edge_ids):
                de = d[:, edge_ids]
                oe = torch.argsort(de, dim=1, stable=True)[:, :KE]
                g_edge[:, : oe.shape[1]] = edge_ids[oe].int()
        grids.append((g_road, g_edge))
    NC = max(g[0].shape[0] for g in grids)
    grid_road = torch.full((S, NC, K), -1, dtype=torch.int32)
    grid_edge = torch.full((S, NC, KE), -1, dtype=torch.int32)
    for s, (gr, ge) in enumerate(grids):
        grid_road[s, : gr.shape[0]] = gr
        grid_edge[s, : ge.shape[0]] = ge
    pack = ScenarioPack(
        scenario_ids=[f"synthetic_{s}" for s in range(S)],
        source_files=["<synthetic>"] * S,
        config=config,
        offset=torch.zeros(S, 2, dtype=torch.float64),
        traj_pos=traj_pos, traj_heading=traj_heading, traj_vel=traj_vel, traj_valid=traj_valid,
        agent_exists=exists, agent_type=atype, agent_length=length, agent_width=width, agent_goal=goal,
        agent_source_index=src, num_agents=n_agents, num_controlled=n_ctrl,
        sdc_index=torch.zeros(S, dtype=torch.int32),
        road_seg=road_seg, road_type=road_type, num_segments=n_seg,
        grid_origin=torch.stack(origins).float(), grid_dims=torch.tensor(dims, dtype=torch.int32),
        grid_road=grid_road, grid_edge=grid_edge,
    )
    pack.validate()
    return pack


def small_config(**kw) -> DataConfig:
    """A small DataConfig for synthetic tests (8 agents, 4 controlled, 16 road slots)."""
    base = dict(max_agents=8, max_controlled=4, grid_k=16, grid_edge_k=8, grid_margin=20.0)
    base.update(kw)
    return DataConfig(**base)


def lane(x0=-40.0, x1=200.0, y=0.0, step=5.0, rtype=RoadType.LANE) -> list[tuple]:
    """Road segments (x0, y0, x1, y1, type) of a straight road along +x at height ``y``, ``step`` m each."""
    n = int((x1 - x0) / step)
    return [(x0 + i * step, y, x0 + (i + 1) * step, y, int(rtype)) for i in range(n)]


def driver(x, y, heading, speed, goal, **kw) -> dict:
    """An agent spec for :func:`synthetic_pack` whose log is straight constant-speed motion."""
    return dict(pos=straight_track(x, y, heading, speed), heading=heading, goal=goal, **kw)


def parked(x, y, heading=0.0, **kw) -> dict:
    """An agent spec for :func:`synthetic_pack` standing still at (x, y) (goal = its position)."""
    return dict(pos=(x, y), heading=heading, vel=torch.zeros(WOMD_STEPS, 2), goal=(x, y), **kw)
