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

#: The 80 scored (simulated) steps of a 91-step trajectory.
SCORED_STEPS = slice(C.CURRENT_TIME_INDEX + 1, C.TOTAL_STEPS)
_FUT = SCORED_STEPS
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


def gather_evaluated(t: torch.Tensor, batch: WosacBatch) -> torch.Tensor:
    """``t`` [S, R, N, ...] (any dtype) -> the evaluated objects' entries [S, R, E, ...], in the
    batch's evaluation order (ascending object id)."""
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
    ev_box, ev_v = gather_evaluated(box, batch), gather_evaluated(v, batch)
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
    ex, ey, eh, es, eL, eW = (gather_evaluated(t, batch) for t in (xs, ys, hs, speed, L, W))
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


#: Candidate segments per query point kept by the exact pruning of :func:`_candidates`.
CANDIDATES = 24
#: Safety margin (m) of the pruning test, far above the float32 error of the distances it compares.
_PRUNE_MARGIN = 0.5


def _candidates(q, start, vec, valid, k: int):
    """Exact pruning for a nearest-segment search: the ``k`` segments of smallest lower bound
    ``|q - midpoint| - length / 2`` (no point of a segment is closer), in ascending segment order,
    and the k-th smallest bound. Any segment outside the candidates is at least that bound away, so
    a candidate closer than it (minus a margin) is the true nearest. Coordinates are centred per
    scenario before ``cdist`` so float32 keeps centimetres.

    Args:
        q: [S, Q, D] points; start, vec: [S, G, D] segment starts and end - start; valid: [S, G].

    Returns:
        (candidate indices [S, Q, k] int64 ascending, bound [S, Q]).
    """
    mid = start + vec / 2
    origin = q.mean(dim=1, keepdim=True)
    d = torch.cdist(q - origin, mid - origin)  # [S,Q,G]
    half = torch.linalg.vector_norm(vec, dim=-1)[:, None] / 2
    lb = torch.where(valid[:, None], d - half, torch.full_like(d, float("inf")))
    bound, cand = lb.topk(k, dim=-1, largest=False)
    return cand.sort(dim=-1).values, bound[..., -1]


def _edge_terms(q, start, vec):
    """Per (point, segment): projection fraction, 2D offset from the segment and stretched 3D
    squared distance (official ``map_metric_features`` definitions). Shapes broadcast."""
    px, py, pz = q[..., 0] - start[..., 0], q[..., 1] - start[..., 1], q[..., 2] - start[..., 2]
    vx, vy, vz = vec[..., 0], vec[..., 1], vec[..., 2]
    den = vx * vx + vy * vy
    num = px * vx + py * vy
    rel = torch.where(den != 0, num / torch.where(den != 0, den, torch.ones_like(den)), torch.zeros_like(num))
    tc = rel.clamp(0, 1)
    ex, ey, ez = px - vx * tc, py - vy * tc, (pz - vz * tc) * C.Z_STRETCH
    return rel, ex, ey, ex * ex + ey * ey + ez * ez


def _nearest_edge(batch: WosacBatch, q: torch.Tensor):
    """Index [S, Q] of the road-edge segment nearest (3D, z stretched; first on ties) to ``q``
    [S, Q, 3], with the projection fraction and 2D distance to it. Candidates first
    (:func:`_candidates`); points whose candidates do not settle it are searched in full."""
    S, Q, G = q.shape[0], q.shape[1], batch.edge_start.shape[1]

    def full(qs, start, vec, ok):  # qs [S', Q', 3] against every segment
        rel, ex, ey, d3 = _edge_terms(qs[:, :, None], start[:, None], vec[:, None])
        j = torch.where(ok[:, None], d3, torch.full_like(d3, BIG)).argmin(dim=-1, keepdim=True)
        pick = lambda t: torch.gather(t, 2, j).squeeze(2)  # noqa: E731
        return j.squeeze(2), pick(rel), torch.hypot(pick(ex), pick(ey))

    if G <= 2 * CANDIDATES:
        return full(q, batch.edge_start, batch.edge_vec, batch.edge_valid)
    stretch = torch.tensor([1.0, 1.0, C.Z_STRETCH], dtype=q.dtype, device=q.device)
    cand, bound = _candidates(q * stretch, batch.edge_start * stretch, batch.edge_vec * stretch,
                              batch.edge_valid, CANDIDATES)
    take = lambda t: torch.gather(t[:, None].expand(-1, Q, -1, -1), 2,  # noqa: E731
                                  cand[..., None].expand(-1, -1, -1, t.shape[-1]))
    rel, ex, ey, d3 = _edge_terms(q[:, :, None], take(batch.edge_start), take(batch.edge_vec))
    d3 = torch.where(torch.gather(batch.edge_valid[:, None].expand(-1, Q, -1), 2, cand), d3, torch.full_like(d3, BIG))
    best = d3.min(dim=-1)
    j = best.indices[..., None]
    pick = lambda t: torch.gather(t, 2, j).squeeze(2)  # noqa: E731
    seg, r, d2 = pick(cand), pick(rel), torch.hypot(pick(ex), pick(ey))
    redo = torch.nonzero(~(best.values.sqrt() < bound - _PRUNE_MARGIN))  # [M, 2] (scenario, point)
    for i in range(0, redo.shape[0], 256):  # the unsettled points, in full, a few at a time
        si, qi = redo[i:i + 256, 0], redo[i:i + 256, 1]
        f = full(q[si, qi][:, None], batch.edge_start[si], batch.edge_vec[si], batch.edge_valid[si])
        seg[si, qi], r[si, qi], d2[si, qi] = (t[:, 0] for t in f)
    return seg, r, d2


def _nearest_edge_signed(batch: WosacBatch, q: torch.Tensor) -> torch.Tensor:
    """Signed 2D distance of query points ``q`` [S, Q, 3] to the road edge (official sign rule)."""
    seg, r, d2 = _nearest_edge(batch, q)

    def side(i):  # sign of cross(start -> point, start -> end) for segment ``i`` [S,Q]
        s = torch.gather(batch.edge_start, 1, i[..., None].expand(-1, -1, 3))
        e = torch.gather(batch.edge_vec, 1, i[..., None].expand(-1, -1, 3))
        p = q - s
        return torch.sign(p[..., 0] * e[..., 1] - p[..., 1] * e[..., 0])

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
    ex, ey, ez, eh = (gather_evaluated(t[..., _FUT], batch) for t in (x, y, z, heading))
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
    v = gather_evaluated(valid[..., _FUT].expand(S, R, -1, T), batch)
    return torch.where(v, d, torch.full_like(d, -BIG))


def _lane_distance(xy, start, vec):
    """The official scorer's point-to-lane-segment "distance" (squared): it adds the clipped
    projection instead of subtracting it, so it is the distance to a point of the segment mirrored
    through its start. Shapes broadcast (last dim 2)."""
    px, py = xy[..., 0] - start[..., 0], xy[..., 1] - start[..., 1]
    vx, vy = vec[..., 0], vec[..., 1]
    den = vx * vx + vy * vy
    safe = torch.where(den != 0, den, torch.ones_like(den))
    tc = torch.where(den != 0, (px * vx + py * vy) / safe, torch.zeros_like(px)).clamp(0, 1)
    ex, ey = px + vx * tc, py + vy * tc
    return ex * ex + ey * ey


def _current_lane(batch: WosacBatch, xy: torch.Tensor, chunk: int) -> torch.Tensor:
    """Lane id [S, Q] of the nearest surface-street lane segment to ``xy`` [S, Q, 2] by the
    official rule (:func:`_lane_distance`; first on ties). The long segments that run to the
    padding origin are measured in full; the others by candidates (exact bound of the mirrored
    segment, :func:`_candidates`), points the candidates do not settle searched in full."""
    S, H = xy.shape[0], batch.lane_start.shape[1]
    real = batch.lane_seg_lane_id != -2
    regular = real & ~batch.lane_seg_to_padding
    pad_idx = batch.lane_padding_index.clamp(min=0)  # [S, P]
    pad_ok = batch.lane_padding_index >= 0
    pad_start = torch.gather(batch.lane_start, 1, pad_idx[..., None].expand(-1, -1, 2))
    pad_vec = torch.gather(batch.lane_vec, 1, pad_idx[..., None].expand(-1, -1, 2))
    step = max(1, chunk // max(S * min(H, 4 * CANDIDATES + pad_idx.shape[1]), 1))
    ids = []
    for i in range(0, xy.shape[1], step):
        q = xy[:, i:i + step]
        Q = q.shape[1]
        if H <= 2 * CANDIDATES:
            d = torch.where(real[:, None], _lane_distance(q[:, :, None], batch.lane_start[:, None],
                                                          batch.lane_vec[:, None]), torch.full((), BIG))
            ids.append(torch.gather(batch.lane_seg_lane_id, 1, d.argmin(dim=-1)))
            continue
        cand, bound = _candidates(q, batch.lane_start, -batch.lane_vec, regular, CANDIDATES)
        take = lambda t: torch.gather(t[:, None].expand(-1, Q, -1, -1), 2,  # noqa: E731
                                      cand[..., None].expand(-1, -1, -1, 2))
        d = _lane_distance(q[:, :, None], take(batch.lane_start), take(batch.lane_vec))
        d = torch.where(torch.gather(regular[:, None].expand(-1, Q, -1), 2, cand), d, torch.full((), BIG))
        best = d.min(dim=-1)
        seg, val = torch.gather(cand, 2, best.indices[..., None]).squeeze(2), best.values
        redo = torch.nonzero(~(val.sqrt() < bound - _PRUNE_MARGIN))
        for k in range(0, redo.shape[0], 256):
            si, qi = redo[k:k + 256, 0], redo[k:k + 256, 1]
            df = _lane_distance(q[si, qi][:, None], batch.lane_start[si], batch.lane_vec[si])
            df = torch.where(regular[si], df, torch.full((), BIG))
            val[si, qi], seg[si, qi] = df.min(dim=-1)
        dp = torch.where(pad_ok[:, None], _lane_distance(q[:, :, None], pad_start[:, None], pad_vec[:, None]),
                         torch.full((), BIG))
        pbest = dp.min(dim=-1)
        pseg = torch.gather(pad_idx, 1, pbest.indices)
        use_pad = (pbest.values < val) | ((pbest.values == val) & (pseg < seg))
        ids.append(torch.gather(batch.lane_seg_lane_id, 1, torch.where(use_pad, pseg, seg)))
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
    ex, ey = gather_evaluated(x[..., t0:], batch), gather_evaluated(y[..., t0:], batch)  # [S,R,E,81]
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
    v = gather_evaluated(valid[..., _FUT].expand(S, R, -1, T1 - 1), batch)
    out = (crossed & match & red).any(dim=-1) & v
    return out & batch.has_signals[:, None, None, None]
