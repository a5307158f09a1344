"""One WOSAC scenario as arrays, read from a ``Scenario`` protocol buffer, and batches of them.

The arrays hold exactly what Waymo's scorer reads from the same proto (float32 values, invalid
states as stored), so gpusim and the official scorer score the same inputs:

* **sim agents** (N): the tracks valid at ``CURRENT_TIME_INDEX`` (every object type), in track
  order — the objects a submission must simulate (``submission_specs.get_sim_agent_ids``);
* **evaluated agents** (E <= N): the self-driving car and the ``tracks_to_predict``
  (``submission_specs.get_evaluation_sim_agent_ids``);
* road edges as a flat segment list with, per segment, its neighbours inside the polyline and the
  local convexity (the sign rule of ``map_metric_features``; see :func:`_road_edge_segments`);
* surface-street lanes as a flat segment list (for the lane an object is on) and, per step and
  signal, the stop-point segment of the controlled lane (``traffic_light_features``).

:func:`scene_from_proto` builds a :class:`WosacScene` (numpy, on the host, once per scenario);
:func:`stack_scenes` pads several into a :class:`WosacBatch` of torch tensors on any device, the
input of :mod:`gpusim.wosac.features`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from gpusim.wosac import config as C


class SceneSkipped(ValueError):
    """A scenario that cannot be scored; ``str(exc)`` is the one-line reason."""


@dataclass
class WosacScene:
    """One scenario (N sim agents, T = 91 steps; float32 world coordinates, metres/radians).

    Attributes:
        scenario_id: the proto's ``scenario_id``.
        object_id: [N] int64 track ids. track_index: [N] int64 index in ``Scenario.tracks``.
        object_type: [N] int64 ``Track.object_type`` (1 vehicle, 2 pedestrian, 3 cyclist, ...).
        x, y, z, heading: [N, T] float32 logged states, invalid steps as stored in the proto.
        vx, vy: [N, T] float32 logged velocity (m/s). valid: [N, T] bool.
        length, width, height: [N] float32 box at ``CURRENT_TIME_INDEX`` (the official scorer
            uses these for every simulated step).
        evaluated: [N] bool the object is scored.
        edge_start, edge_vec: [G, 3] float32 road-edge segment start and end - start.
        edge_valid, edge_prior_valid, edge_next_valid: [G] bool.
        edge_prior, edge_next: [G] int64 flat index of the neighbouring segment.
        edge_convex_before, edge_convex_after: [G] bool the polyline turns left into / out of
            the segment.
        lane_start, lane_vec: [H, 2] float32 lane segments (nearest-lane search);
            lane_seg_lane_id: [H] int64 the lane id of each segment.
            lane_seg_to_padding: [H] bool the segment runs from a lane's last point to the padding
            origin (the official layout's extra segment); lane_padding_index: [P] int64 their indices.
        has_signals: the scenario has surface-street lanes and signal steps (else no violation).
        sig_lane: [K] int64 controlled lane ids. sig_lane_valid: [K] bool lane found.
        sig_stop: [T, K] bool the signal is in a stop state at the step.
        sig_seg_start, sig_seg_vec: [T, K, 2] float32 the lane segment nearest the stop point.
        sig_stop_rel: [T, K] float32 position of the stop point along that segment (fraction).
    """

    scenario_id: str
    object_id: np.ndarray
    track_index: np.ndarray
    object_type: np.ndarray
    x: np.ndarray
    y: np.ndarray
    z: np.ndarray
    heading: np.ndarray
    vx: np.ndarray
    vy: np.ndarray
    valid: np.ndarray
    length: np.ndarray
    width: np.ndarray
    height: np.ndarray
    evaluated: np.ndarray
    edge_start: np.ndarray
    edge_vec: np.ndarray
    edge_valid: np.ndarray
    edge_prior: np.ndarray
    edge_next: np.ndarray
    edge_prior_valid: np.ndarray
    edge_next_valid: np.ndarray
    edge_convex_before: np.ndarray
    edge_convex_after: np.ndarray
    lane_start: np.ndarray
    lane_vec: np.ndarray
    lane_seg_lane_id: np.ndarray
    lane_seg_to_padding: np.ndarray
    lane_padding_index: np.ndarray
    has_signals: bool
    sig_lane: np.ndarray
    sig_lane_valid: np.ndarray
    sig_stop: np.ndarray
    sig_seg_start: np.ndarray
    sig_seg_vec: np.ndarray
    sig_stop_rel: np.ndarray

    @property
    def num_objects(self) -> int:
        """N."""
        return int(self.object_id.shape[0])


def _f32(v) -> np.ndarray:
    return np.asarray(v, dtype=np.float32)


def _polylines(polylines: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Pad ``[len_i, 3]`` polylines (those with >= 2 points) to ``[P, M, 3]`` + point validity."""
    keep = [p for p in polylines if len(p) >= 2]
    m = max((len(p) for p in keep), default=0)
    pts = np.zeros((len(keep), m, 3), np.float32)
    ok = np.zeros((len(keep), m), bool)
    for i, p in enumerate(keep):
        pts[i, : len(p)] = p
        ok[i, : len(p)] = True
    return pts, ok


def _cross(a, b):
    return a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]


def _road_edge_segments(polylines: list[np.ndarray]) -> dict:
    """Flat road-edge segments with the neighbour and convexity data of the official sign rule.

    The official scorer pads all polylines of a scenario to the longest one; a cyclic polyline
    (first and last points within 1 m) wraps its first segment's "prior" and its last segment's
    "next" to the other end through the *padded* last segment, so the wrap only takes effect for
    polylines as long as the longest one. That is reproduced here: ``edge_prior`` /
    ``edge_next`` point at the segment the official indexing reaches, validity included.
    """
    pts, ok = _polylines(polylines)
    p, m = pts.shape[:2]
    if p == 0:
        raise SceneSkipped("no road edge in the map (the official scorer refuses such a scenario)")
    g = m - 1
    lens = ok.sum(axis=1)
    first, last = pts[np.arange(p), 0], pts[np.arange(p), lens - 1]
    cyclic = ((first - last) ** 2).sum(axis=1) < C.CYCLIC_TOLERANCE_M2
    start, vec = pts[:, :-1], pts[:, 1:] - pts[:, :-1]
    seg_ok = ok[:, :-1] & ok[:, 1:]
    idx = np.broadcast_to(np.arange(g), (p, g))
    prior = np.where(idx == 0, np.where(cyclic[:, None], g - 1, 0), idx - 1)
    nxt = np.where(idx == g - 1, np.where(cyclic[:, None], 0, g - 1), idx + 1)
    rows = np.arange(p)[:, None]
    prior_ok, next_ok = seg_ok[rows, prior], seg_ok[rows, nxt]
    convex_before = _cross(vec[rows, prior][..., :2], vec[..., :2]) > 0
    convex_after = _cross(vec[..., :2], vec[rows, nxt][..., :2]) > 0
    # the padded segment of the official layout (its index g - 1) is the last real one only for
    # polylines of the full length; elsewhere it is padding (invalid, never used by the rule)
    # keep the real segments only (same order); a neighbour that is padding is never used
    # (its validity is false), so it is pointed at the segment itself
    keep = seg_ok.reshape(-1)
    new_index = np.cumsum(keep) - 1
    flat = lambda a: a.reshape(p * g, *a.shape[2:])[keep]  # noqa: E731
    base = (np.arange(p) * g)[:, None]
    own = new_index[keep]

    def remap(nb, nb_ok):
        return np.where(flat(nb_ok), new_index[flat(nb + base)], own).astype(np.int64)

    return dict(
        edge_start=flat(start), edge_vec=flat(vec), edge_valid=flat(seg_ok),
        edge_prior=remap(prior, prior_ok), edge_next=remap(nxt, next_ok),
        edge_prior_valid=flat(prior_ok), edge_next_valid=flat(next_ok),
        edge_convex_before=flat(convex_before), edge_convex_after=flat(convex_after),
    )


def _lane_segment_search(pts: np.ndarray, ok: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest lane segment to 2D points ``q`` [Q, 2] among ``pts`` [L, M, 3] as the official
    scorer measures it (its "distance" adds the clipped projection instead of subtracting it, and
    a segment counts when its start point is valid). Returns (lane row, segment column), [Q] each."""
    s, e = pts[None, :, :-1, :2], pts[None, :, 1:, :2]
    sp = q[:, None, None] - s
    se = e - s
    den = (se * se).sum(-1)
    num = (sp * se).sum(-1)
    t = np.clip(np.divide(num, den, out=np.zeros_like(num), where=den != 0), 0.0, 1.0)
    d = np.linalg.norm(sp + se * t[..., None], axis=-1)
    d = np.where(ok[None, :, :-1], d, C.EXTREMELY_LARGE_DISTANCE)
    flat = d.reshape(len(q), -1).argmin(axis=1)
    return flat // (pts.shape[1] - 1), flat % (pts.shape[1] - 1)


def _signals(dms: list, lane_ids: list[int], lane_pts: np.ndarray, lane_ok: np.ndarray) -> dict:
    """Per step and signal: stop state, controlled-lane validity and the stop-point segment."""
    lanes = sorted({int(ls.lane) for d in dms for ls in d.lane_states}) or [-1]
    col = {lane: i for i, lane in enumerate(lanes)}
    T, K = len(dms), len(lanes)
    state = np.zeros((T, K), np.int64)
    stop_xy = np.zeros((T, K, 2), np.float32)
    for t, d in enumerate(dms):
        for ls in d.lane_states:
            state[t, col[int(ls.lane)]] = ls.state
            stop_xy[t, col[int(ls.lane)]] = (ls.stop_point.x, ls.stop_point.y)
    ids = np.array(lane_ids, np.int64)
    match = ids[None, :] == np.array(lanes, np.int64)[:, None]  # [K, L]
    row = match.argmax(axis=1)
    seg_pts, seg_ok = lane_pts[row], lane_ok[row]  # [K, M, 3]
    # nearest segment of the controlled lane to each step's stop point (official distance rule)
    s, e = seg_pts[None, :, :-1, :2], seg_pts[None, :, 1:, :2]
    sp = stop_xy[:, :, None] - s
    se = np.broadcast_to(e - s, sp.shape)
    den, num = (se * se).sum(-1), (sp * se).sum(-1)
    t_ = np.clip(np.divide(num, den, out=np.zeros_like(num), where=den != 0), 0.0, 1.0)
    d = np.where(seg_ok[None, :, :-1], np.linalg.norm(sp + se * t_[..., None], axis=-1), C.EXTREMELY_LARGE_DISTANCE)
    j = d.argmin(axis=-1)  # [T, K]
    kk = np.arange(K)[None, :]
    start = seg_pts[kk, j, :2]
    vec = seg_pts[kk, j + 1, :2] - start
    den = (vec * vec).sum(-1)
    num = ((stop_xy - start) * vec).sum(-1)
    rel = np.divide(num, den, out=np.zeros_like(num), where=den != 0)
    return dict(
        sig_lane=np.array(lanes, np.int64), sig_lane_valid=match.any(axis=1),
        sig_stop=np.isin(state, C.STOP_SIGNAL_STATES), sig_seg_start=start.astype(np.float32),
        sig_seg_vec=vec.astype(np.float32), sig_stop_rel=rel.astype(np.float32),
    )


def _lanes_and_signals(msg) -> dict:
    lane_ids, lane_lines = [], []
    for f in msg.map_features:
        if f.HasField("lane") and f.lane.type == C.SURFACE_STREET_LANE_TYPE:
            lane_ids.append(int(f.id))
            lane_lines.append(_f32([(p.x, p.y, p.z) for p in f.lane.polyline]).reshape(-1, 3))
    dms = list(msg.dynamic_map_states)
    kept = [i for i, p in enumerate(lane_lines) if len(p) >= 2]
    lane_ids = [lane_ids[i] for i in kept]
    pts, ok = _polylines(lane_lines)
    # a segment counts when its start point is valid (so a padded polyline has one extra segment
    # from its last point to the zero padding, as in the official layout)
    seg_ok = ok[:, :-1]
    start, vec = pts[:, :-1, :2], pts[:, 1:, :2] - pts[:, :-1, :2]
    to_padding = (seg_ok & ~ok[:, 1:])[seg_ok]
    out = dict(lane_start=start[seg_ok], lane_vec=vec[seg_ok],
               lane_seg_lane_id=np.broadcast_to(np.array(lane_ids, np.int64)[:, None], seg_ok.shape)[seg_ok],
               lane_seg_to_padding=to_padding, lane_padding_index=np.flatnonzero(to_padding).astype(np.int64))
    has = bool(lane_ids) and bool(dms)
    if has and len(dms) != C.TOTAL_STEPS:
        raise SceneSkipped(f"{len(dms)} dynamic map states, expected {C.TOTAL_STEPS}")
    if has:
        out.update(_signals(dms, lane_ids, pts, ok))
    else:
        T = C.TOTAL_STEPS
        out.update(sig_lane=np.full(1, -1, np.int64), sig_lane_valid=np.zeros(1, bool), sig_stop=np.zeros((T, 1), bool),
                   sig_seg_start=np.zeros((T, 1, 2), np.float32), sig_seg_vec=np.zeros((T, 1, 2), np.float32),
                   sig_stop_rel=np.zeros((T, 1), np.float32))
    out["has_signals"] = has
    return out


def scene_from_proto(msg) -> WosacScene:
    """Build a :class:`WosacScene` from a decoded ``Scenario`` message.

    Works with gpusim's run-time schema (:func:`gpusim.data.womd_proto.messages`) or Waymo's own
    ``scenario_pb2.Scenario`` (same field names).

    Raises:
        SceneSkipped: a track without 91 states, no object valid at step 10, no
            ``tracks_to_predict``, an evaluated object (SDC or track to predict) not valid at step
            10, no road edge, or signal states for a number of steps other than 91.
    """
    T, cur = C.TOTAL_STEPS, C.CURRENT_TIME_INDEX
    tracks = list(msg.tracks)
    short = [j for j, tr in enumerate(tracks) if len(tr.states) != T]
    if short:
        raise SceneSkipped(f"track {short[0]} has {len(tracks[short[0]].states)} steps, expected {T}")
    sim = [j for j, tr in enumerate(tracks) if tr.states[cur].valid]
    if not sim:
        raise SceneSkipped(f"no object is valid at step {cur}")
    if len(msg.tracks_to_predict) == 0:
        raise SceneSkipped("no objects to predict (tracks_to_predict is empty)")
    sdc = int(msg.sdc_track_index)
    if not 0 <= sdc < len(tracks):
        raise SceneSkipped(f"sdc_track_index {sdc} is not a track index")
    eval_idx = {sdc} | {int(p.track_index) for p in msg.tracks_to_predict}
    missing = sorted(j for j in eval_idx if j not in set(sim))
    if missing:
        raise SceneSkipped(f"evaluated track {missing[0]} (id {tracks[missing[0]].id}) is not valid at step {cur}")
    st = np.array([[(s.center_x, s.center_y, s.center_z, s.heading, s.velocity_x, s.velocity_y, s.valid)
                    for s in tracks[j].states] for j in sim], dtype=np.float64)
    dims = _f32([(tracks[j].states[cur].length, tracks[j].states[cur].width, tracks[j].states[cur].height)
                 for j in sim])
    edges = [_f32([(p.x, p.y, p.z) for p in f.road_edge.polyline]).reshape(-1, 3)
             for f in msg.map_features if f.HasField("road_edge")]
    return WosacScene(
        scenario_id=str(msg.scenario_id), object_id=np.array([tracks[j].id for j in sim], np.int64),
        track_index=np.array(sim, np.int64), object_type=np.array([tracks[j].object_type for j in sim], np.int64),
        x=_f32(st[..., 0]), y=_f32(st[..., 1]), z=_f32(st[..., 2]), heading=_f32(st[..., 3]),
        vx=_f32(st[..., 4]), vy=_f32(st[..., 5]), valid=st[..., 6] > 0,
        length=dims[:, 0], width=dims[:, 1], height=dims[:, 2],
        evaluated=np.isin(np.array(sim), sorted(eval_idx)),
        **_road_edge_segments(edges), **_lanes_and_signals(msg),
    )


@dataclass
class WosacBatch:
    """:class:`WosacScene` s padded to common sizes and stacked (S scenarios), torch tensors.

    Same fields as :class:`WosacScene` with a leading ``[S]`` dimension (``scenario_id`` a list,
    ``has_signals`` a [S] bool tensor), plus ``present`` [S, N] bool (a real object, not padding)
    and ``eval_index`` [S, E] int64 / ``eval_present`` [S, E] bool: the evaluated objects' slots,
    in ascending object id (the official order). Padding objects are never valid, have 1 m boxes
    and are never evaluated; padding segments are invalid; padding signals match no lane.
    """

    scenario_id: list
    present: torch.Tensor
    eval_index: torch.Tensor
    eval_present: torch.Tensor
    tensors: dict

    def __getattr__(self, name):
        try:
            return self.__dict__["tensors"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def device(self) -> torch.device:
        """Device of the tensors."""
        return self.present.device


_PAD = {"length": 1.0, "width": 1.0, "height": 1.0, "lane_seg_lane_id": -2, "sig_lane": -3, "lane_padding_index": -1,
        "edge_prior": -1, "edge_next": -1}


def _pad_stack(arrays: list[np.ndarray], fill) -> np.ndarray:
    if arrays[0].ndim == 0:
        return np.array(arrays)
    shape = [max(a.shape[d] for a in arrays) for d in range(arrays[0].ndim)]
    out = np.full((len(arrays), *shape), fill, dtype=arrays[0].dtype)
    for i, a in enumerate(arrays):
        out[(i, *tuple(slice(0, n) for n in a.shape))] = a
    return out


def stack_scenes(scenes: list[WosacScene], device="cpu") -> WosacBatch:
    """Pad and stack scenes into a :class:`WosacBatch` on ``device``.

    Raises:
        ValueError: for an empty list.
    """
    if not scenes:
        raise ValueError("stack_scenes: no scene")
    tensors = {}
    for f in fields(WosacScene):
        if f.name == "scenario_id":
            continue
        arrs = [np.asarray(getattr(s, f.name)) for s in scenes]
        stacked = _pad_stack(arrs, _PAD.get(f.name, 0))
        if f.name in ("edge_prior", "edge_next"):  # flat indices stay inside their own scene
            stacked = np.where(stacked < 0, 0, stacked)
        tensors[f.name] = torch.as_tensor(stacked, device=device)
    n = max(s.num_objects for s in scenes)
    present = torch.zeros(len(scenes), n, dtype=torch.bool)
    ev = [np.flatnonzero(s.evaluated)[np.argsort(s.object_id[s.evaluated], kind="stable")] for s in scenes]
    e = max(len(v) for v in ev)
    eval_index = torch.zeros(len(scenes), e, dtype=torch.int64)
    eval_present = torch.zeros(len(scenes), e, dtype=torch.bool)
    for i, s in enumerate(scenes):
        present[i, : s.num_objects] = True
        eval_index[i, : len(ev[i])] = torch.as_tensor(ev[i])
        eval_present[i, : len(ev[i])] = True
    return WosacBatch([s.scenario_id for s in scenes], present.to(device), eval_index.to(device),
                      eval_present.to(device), tensors)
