"""The WOSAC metric features, batched over scenarios x rollouts on any torch device.

Definitions follow Waymo's sim-agents metrics (``waymo-open-dataset`` 1.6.7,
``wdl_limited/sim_agents_metrics``: ``trajectory_features``, ``interaction_features``,
``map_metric_features``, ``traffic_light_features``), re-derived here in torch, float32 as there:

* **kinematics** (evaluated objects): central differences over 0.1 s steps. Speed = |(p[t+1] -
  p[t-1]) / 2| / dt in 3D (m/s); acceleration = central difference of speed / dt (m/s^2);
  angular speed = wrap(h[t+1] - h[t-1]) / 2 / dt (rad/s); angular acceleration = wrap of the
  central difference of the per-step heading change / dt^2 (rad/s^2). The first and last steps
  are NaN.
* **distance to the nearest object** (m): signed 2D distance between boxes with rounded corners
  (radius ``0.35 min(length, width)``): the boxes shrunk by the radius, their signed distance
  (origin to the Minkowski difference, negative when overlapping) minus both radii; only pairs
  valid at the step; 1e10 when there is none. A collision is a distance < 0.
* **time to collision** (s): the nearest object ahead that the evaluated object "follows" (ahead
  of its front, heading within 75 deg, lateral overlap, and either > 0.5 m overlap or heading
  within 10 deg), distance / closing speed (2D central-difference speeds), capped at 5 s.
* **distance to road edge** (m): per box corner (full box, bottom face), the 2D distance to the
  road-edge segment nearest in 3D with z stretched x3, signed by which side of the polyline the
  corner is on (left = road, negative); the box's value is the largest corner value, -1e10 when
  the object is invalid. Off-road is a value > 0.
* **traffic-light violation**: the object's lane (nearest surface-street lane segment by the
  official rule) is controlled by a signal in a stop state, and between the previous step and
  this one the object moved from behind to ahead of the stop point along the lane segment
  nearest the stop point.

Every function takes full 91-step trajectories ``[S, R, N, 91]`` (history included) and returns
values for the 80 simulated steps (``CURRENT_TIME_INDEX + 1 ..``). Large pairwise tensors are
computed in chunks of rollouts / query points (``chunk`` elements at most); no loop over agents
or steps.
"""

from __future__ import annotations

import math

import torch

from gpusim.wosac import config as C
from gpusim.wosac.scene import WosacBatch

_FUT = slice(C.CURRENT_TIME_INDEX + 1, C.TOTAL_STEPS)
BIG = C.EXTREMELY_LARGE_DISTANCE


def _wrap(a: torch.Tensor) -> torch.Tensor:
    return torch.remainder(a + math.pi, 2 * math.pi) - math.pi


def _central(t: torch.Tensor) -> torch.Tensor:
    """(t[i+1] - t[i-1]) / 2 along the last axis, NaN at both ends (same shape)."""
    pad = torch.full_like(t[..., :1], float("nan"))
    return torch.cat([pad, (t[..., 2:] - t[..., :-2]) / 2, pad], dim=-1)


def kinematics(x, y, z, heading, dt: float = C.STEP_SECONDS):
    """Linear speed (m/s), linear acceleration (m/s^2), angular speed (rad/s) and angular
    acceleration (rad/s^2), each the shape of ``x`` (``[..., T]`` float32, NaN at both ends,
    accelerations at two steps each end)."""
    d = torch.stack([_central(x), _central(y), _central(z)], dim=0)
    speed = torch.linalg.vector_norm(d, dim=0) / dt
    accel = _central(speed) / dt
    dh = _wrap(_central(heading) * 2) / 2
    d2h = _wrap(_central(dh) * 2) / 2
    return speed, accel, dh / dt, d2h / (dt * dt)


def kinematic_validity(valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Validity of speeds (both neighbours valid) and accelerations (applied twice), ``[..., T]``."""
    def step(v):
        pad = torch.zeros_like(v[..., :1])
        return torch.cat([pad, v[..., 2:] & v[..., :-2], pad], dim=-1)

    s = step(valid)
    return s, step(s)


def _corners(x, y, heading, length, width):
    """Box corners ``[..., 4, 2]``, counter-clockwise from (+l/2, +w/2) (the official order)."""
    c, s = torch.cos(heading), torch.sin(heading)
    sx = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=x.dtype, device=x.device)
    sy = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=x.dtype, device=x.device)
    lx = (length / 2)[..., None] * sx
    wy = (width / 2)[..., None] * sy
    cx = x[..., None] + c[..., None] * lx - s[..., None] * wy
    cy = y[..., None] + s[..., None] * lx + c[..., None] * wy
    return torch.stack([cx, cy], dim=-1)


def _downmost(box):
    """Index of the lowest corner (first on ties) and the unit direction of the edge leaving it."""
    i = torch.argmin(box[..., 1], dim=-1, keepdim=True)
    a = torch.take_along_dim(box, i[..., None], dim=-2)
    b = torch.take_along_dim(box, ((i + 1) % 4)[..., None], dim=-2)
    d = b - a
    return i, d / torch.linalg.vector_norm(d, dim=-1, keepdim=True)


_ORDER1 = (0, 0, 1, 1, 2, 2, 3, 3)
_ORDER2 = (0, 1, 1, 2, 2, 3, 3, 0)


def _box_box_signed_distance(a, b):
    """Signed distance between convex boxes ``a`` and ``b`` (``[..., 4, 2]`` counter-clockwise,
    broadcastable): the signed distance of the origin to the Minkowski sum of ``a`` and ``-b``
    (positive apart, minus the penetration depth when overlapping)."""
    nb = -b
    ia, da = _downmost(a)
    ib, db = _downmost(nb)
    cond = (da[..., 0, 0] * db[..., 0, 1] - da[..., 0, 1] * db[..., 0, 0]) >= 0
    o1 = torch.tensor(_ORDER1, device=a.device)
    o2 = torch.tensor(_ORDER2, device=a.device)
    cond = cond[..., None]
    oa = (torch.where(cond, o2, o1) + ia) % 4
    ob = (torch.where(cond, o1, o2) + ib) % 4
    poly = torch.take_along_dim(a, oa[..., None], dim=-2) + torch.take_along_dim(nb, ob[..., None], dim=-2)
    edge = torch.roll(poly, -1, dims=-2) - poly
    length = torch.linalg.vector_norm(edge, dim=-1)
    tan = edge / length[..., None]
    perp = tan[..., 0] * poly[..., 1] - tan[..., 1] * poly[..., 0]  # normal . (vertex - origin)
    inside = (perp <= 0).all(dim=-1)
    proj = -(tan * poly).sum(-1) / length
    edge_d = torch.where((proj >= 0) & (proj <= 1), perp.abs(), torch.full_like(perp, float("inf")))
    d = torch.minimum(edge_d.min(dim=-1).values, torch.linalg.vector_norm(poly, dim=-1).min(dim=-1).values)
    return torch.where(inside, -d, d)


def _gather_eval(t: torch.Tensor, batch: WosacBatch) -> torch.Tensor:
    """``t`` [S, R, N, ...] -> the evaluated objects [S, R, E, ...]."""
    idx = batch.eval_index[:, None, :]
    idx = idx.reshape(*idx.shape, *([1] * (t.dim() - 3))).expand(t.shape[0], t.shape[1], -1, *t.shape[3:])
    return torch.gather(t, 2, idx)


def _rollout_chunks(r: int, per_rollout: int, chunk: int):
    step = max(1, chunk // max(per_rollout, 1))
    return [slice(i, min(i + step, r)) for i in range(0, r, step)]


def distance_to_nearest_object(batch: WosacBatch, x, y, heading, valid, *, chunk: int = 1 << 22):
    """Signed distance (m) of each evaluated object to its nearest valid object.

    Args:
        x, y, heading: [S, R, N, 91] float32; valid: [S, R|1, N, 91] bool.

    Returns:
        [S, R, E, 80] float32 (1e10 where no valid pair).
    """
    S, R, N, _ = x.shape
    L, W = batch.length[:, None, :, None], batch.width[:, None, :, None]
    shrink = torch.minimum(L, W) * C.CORNER_ROUNDING_FACTOR / 2
    xs, ys, hs = x[..., _FUT], y[..., _FUT], heading[..., _FUT]
    box = _corners(xs, ys, hs, (L - 2 * shrink).expand_as(xs), (W - 2 * shrink).expand_as(xs))  # [S,R,N,T,4,2]
    v = (valid[..., _FUT] & batch.present[:, None, :, None]).expand(S, R, N, xs.shape[-1])
    ev_box, ev_v = _gather_eval(box, batch), _gather_eval(v, batch)
    ev_shrink = torch.gather(shrink[..., 0], 2, batch.eval_index[:, None, :])  # [S,1,E]
    E = ev_box.shape[2]
    self_mask = batch.eval_index[:, :, None] == torch.arange(N, device=x.device)  # [S,E,N]
    out = []
    for sl in _rollout_chunks(R, S * E * N * xs.shape[-1] * 8, chunk):
        d = _box_box_signed_distance(ev_box[:, sl, :, None], box[:, sl, None])  # [S,r,E,N,T]
        d = d - ev_shrink[:, :, :, None, None] - shrink[:, :, None, :, :]
        d = d + self_mask[:, None, :, :, None] * BIG
        ok = ev_v[:, sl, :, None] & v[:, sl, None]
        out.append(torch.where(ok, d, torch.full_like(d, BIG)).min(dim=3).values)
    return torch.cat(out, dim=1)


def time_to_collision(batch: WosacBatch, x, y, heading, valid, dt: float = C.STEP_SECONDS, *, chunk: int = 1 << 22):
    """Time (s) until each evaluated object reaches the object it follows at constant speeds.

    Args:
        x, y, heading: [S, R, N, 91] float32; valid: [S, R|1, N, 91] bool.

    Returns:
        [S, R, E, 80] float32 in [0, 5] (5 when following nothing or not closing in).
    """
    S, R, N, _ = x.shape
    speed = torch.linalg.vector_norm(torch.stack([_central(x), _central(y)]), dim=0)[..., _FUT] / dt
    xs, ys, hs = x[..., _FUT], y[..., _FUT], heading[..., _FUT]
    T = xs.shape[-1]
    v = (valid[..., _FUT] & batch.present[:, None, :, None]).expand(S, R, N, T)
    L, W = batch.length[:, None, :, None].expand(S, R, N, T), batch.width[:, None, :, None].expand(S, R, N, T)
    ex, ey, eh, es, eL, eW = (_gather_eval(t, batch) for t in (xs, ys, hs, speed, L, W))
    out = []
    for sl in _rollout_chunks(R, S * ex.shape[2] * N * T * 4, chunk):
        yaw_diff = (hs[:, sl, None] - eh[:, sl, :, None]).abs()  # not wrapped, as in the official code
        c, s = torch.cos(yaw_diff).abs(), torch.sin(yaw_diff).abs()
        long_off = L[:, sl, None] / 2 * c + W[:, sl, None] / 2 * s
        lat_off = L[:, sl, None] / 2 * s + W[:, sl, None] / 2 * c
        dx, dy = xs[:, sl, None] - ex[:, sl, :, None], ys[:, sl, None] - ey[:, sl, :, None]
        ce, se = torch.cos(eh[:, sl, :, None]), torch.sin(eh[:, sl, :, None])
        rx, ry = ce * dx + se * dy, -se * dx + ce * dy
        long_d = rx - eL[:, sl, :, None] / 2 - long_off
        lat = ry.abs() - eW[:, sl, :, None] / 2 - lat_off
        follow = (long_d > 0) & (yaw_diff <= C.MAX_HEADING_DIFF) & (lat < 0)
        follow &= (lat < -C.SMALL_OVERLAP_THRESHOLD) | (yaw_diff <= C.MAX_HEADING_DIFF_FOR_SMALL_OVERLAP)
        follow &= v[:, sl, None]
        masked = torch.where(follow, long_d, torch.full_like(long_d, float("inf")))
        dist, j = masked.min(dim=3)
        ahead = torch.gather(speed[:, sl, None].expand_as(long_d), 3, j[:, :, :, None]).squeeze(3)
        rel = es[:, sl] - ahead
        ttc = torch.where(rel > 0, torch.clamp(dist / rel, max=C.MAXIMUM_TIME_TO_COLLISION),
                          torch.full_like(rel, C.MAXIMUM_TIME_TO_COLLISION))
        out.append(torch.where(follow.any(dim=3), ttc, torch.full_like(ttc, C.MAXIMUM_TIME_TO_COLLISION)))
    return torch.cat(out, dim=1)


def _nearest_edge_signed(batch: WosacBatch, q: torch.Tensor) -> torch.Tensor:
    """Signed 2D distance of query points ``q`` [S, Q, 3] to the road edge (official sign rule)."""
    st, vec = batch.edge_start[:, None], batch.edge_vec[:, None]  # [S,1,G,3]
    px = q[:, :, None, 0] - st[..., 0]  # [S,Q,G], start -> point
    py = q[:, :, None, 1] - st[..., 1]
    pz = q[:, :, None, 2] - st[..., 2]
    vx, vy, vz = vec[..., 0], vec[..., 1], vec[..., 2]
    den = vx * vx + vy * vy
    num = px * vx + py * vy
    rel = torch.where(den != 0, num / torch.where(den != 0, den, torch.ones_like(den)), torch.zeros_like(num))
    tc = rel.clamp(0, 1)
    ex, ey, ez = px - vx * tc, py - vy * tc, (pz - vz * tc) * C.Z_STRETCH
    d3 = ex * ex + ey * ey + ez * ez  # squared: same argmin (first index on ties)
    d3 = torch.where(batch.edge_valid[:, None], d3, torch.full_like(d3, BIG))
    g = d3.argmin(dim=-1, keepdim=True)  # [S,Q,1]
    pick = lambda t: torch.gather(t, 2, g).squeeze(2)  # noqa: E731
    d2 = torch.hypot(pick(ex), pick(ey))
    r = pick(rel)

    def side(seg):  # sign of cross(start -> point, start -> end) for segment ``seg`` [S,Q]
        s = torch.gather(batch.edge_start, 1, seg[..., None].expand(-1, -1, 3))
        e = torch.gather(batch.edge_vec, 1, seg[..., None].expand(-1, -1, 3))
        p = q - s
        return torch.sign(p[..., 0] * e[..., 1] - p[..., 1] * e[..., 0])

    seg = g.squeeze(2)
    at = lambda t: torch.gather(t, 1, seg)  # noqa: E731
    n, n_prior, n_next = side(seg), side(at(batch.edge_prior)), side(at(batch.edge_next))
    before = torch.where(at(batch.edge_convex_before), torch.maximum(n, n_prior), torch.minimum(n, n_prior))
    after = torch.where(at(batch.edge_convex_after), torch.maximum(n, n_next), torch.minimum(n, n_next))
    sign = torch.where((r < 0) & at(batch.edge_prior_valid), before,
                       torch.where((r > 1) & at(batch.edge_next_valid), after, n))
    return sign * d2


def distance_to_road_edge(batch: WosacBatch, x, y, z, heading, valid, *, chunk: int = 1 << 24):
    """Signed distance (m) of each evaluated box to the road edge (> 0 off-road).

    Args:
        x, y, z, heading: [S, R, N, 91] float32; valid: [S, R|1, N, 91] bool.

    Returns:
        [S, R, E, 80] float32 (-1e10 where the object is invalid).
    """
    S, R = x.shape[:2]
    ex, ey, ez, eh = (_gather_eval(t[..., _FUT], batch) for t in (x, y, z, heading))
    E, T = ex.shape[2], ex.shape[3]
    L = torch.gather(batch.length, 1, batch.eval_index)[:, None, :, None].expand_as(ex)
    W = torch.gather(batch.width, 1, batch.eval_index)[:, None, :, None].expand_as(ex)
    H = torch.gather(batch.height, 1, batch.eval_index)[:, None, :, None].expand_as(ex)
    xy = _corners(ex, ey, eh, L, W)  # [S,R,E,T,4,2]
    zc = (ez - H / 2)[..., None].expand(*xy.shape[:-1])
    q = torch.cat([xy, zc[..., None]], dim=-1).reshape(S, -1, 3)
    G = batch.edge_start.shape[1]
    step = max(1, chunk // max(S * G, 1))
    d = torch.cat([_nearest_edge_signed(batch, q[:, i:i + step]) for i in range(0, q.shape[1], step)], dim=1)
    d = d.reshape(S, R, E, T, 4).max(dim=-1).values
    v = _gather_eval(valid[..., _FUT].expand(S, R, -1, T), batch)
    return torch.where(v, d, torch.full_like(d, -BIG))


def _current_lane(batch: WosacBatch, xy: torch.Tensor, chunk: int) -> torch.Tensor:
    """Lane id [S, Q] of the nearest surface-street lane segment to ``xy`` [S, Q, 2], measured as
    the official scorer does (its point-to-segment "distance" adds the clipped projection)."""
    sx, sy = batch.lane_start[:, None, :, 0], batch.lane_start[:, None, :, 1]  # [S,1,H]
    vx, vy = batch.lane_vec[:, None, :, 0], batch.lane_vec[:, None, :, 1]
    den = vx * vx + vy * vy
    safe = torch.where(den != 0, den, torch.ones_like(den))
    real = (batch.lane_seg_lane_id != -2)[:, None]
    step = max(1, chunk // max(xy.shape[0] * sx.shape[2], 1))
    ids = []
    for i in range(0, xy.shape[1], step):
        px, py = xy[:, i:i + step, None, 0] - sx, xy[:, i:i + step, None, 1] - sy
        tc = torch.where(den != 0, (px * vx + py * vy) / safe, torch.zeros_like(px)).clamp(0, 1)
        ex, ey = px + vx * tc, py + vy * tc
        d = torch.where(real, ex * ex + ey * ey, torch.full_like(px, BIG))
        ids.append(torch.gather(batch.lane_seg_lane_id, 1, d.argmin(dim=-1)))
    return torch.cat(ids, dim=1)


def red_light_violation(batch: WosacBatch, x, y, valid, *, chunk: int = 1 << 24):
    """Per step, whether each evaluated object crosses the stop point of its lane's red signal.

    Args:
        x, y: [S, R, N, 91] float32; valid: [S, R|1, N, 91] bool.

    Returns:
        [S, R, E, 80] bool.
    """
    S, R = x.shape[:2]
    t0 = C.CURRENT_TIME_INDEX
    ex, ey = _gather_eval(x[..., t0:], batch), _gather_eval(y[..., t0:], batch)  # [S,R,E,81]
    E, T1 = ex.shape[2], ex.shape[3]
    if batch.lane_start.shape[1] == 0:  # no surface-street lane in any scenario: no violation
        return torch.zeros(S, R, E, T1 - 1, dtype=torch.bool, device=x.device)
    xy = torch.stack([ex, ey], dim=-1)
    lane = _current_lane(batch, xy.reshape(S, -1, 2), chunk).reshape(S, R, E, T1)
    start = batch.sig_seg_start[:, None, None, t0:]  # [S,1,1,81,K,2]
    vec = batch.sig_seg_vec[:, None, None, t0:]
    den = (vec * vec).sum(-1)
    num = ((xy[..., None, :] - start) * vec).sum(-1)  # [S,R,E,81,K]
    rel = torch.where(den != 0, num / torch.where(den != 0, den, torch.ones_like(den)), torch.zeros_like(num))
    stop_rel = batch.sig_stop_rel[:, None, None, t0:]
    crossed = (rel[..., :-1, :] < stop_rel[..., :-1, :]) & (rel[..., 1:, :] > stop_rel[..., 1:, :])
    match = lane[..., 1:, None] == batch.sig_lane[:, None, None, None, :]
    red = batch.sig_stop[:, None, None, t0 + 1:] & batch.sig_lane_valid[:, None, None, None, :]
    v = _gather_eval(valid[..., _FUT].expand(S, R, -1, T1 - 1), batch)
    out = (crossed & match & red).any(dim=-1) & v
    return out & batch.has_signals[:, None, None, None]
