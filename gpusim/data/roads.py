"""Road polylines → simplified segments.

Simplification follows Visvalingam & Whyatt (1993, "Line generalisation by repeated elimination of
points"): a point's importance is the area of the triangle it forms with its two neighbours; points
whose area is below a threshold are removed, neighbours' areas are recomputed, until every
remaining interior point has an area >= the threshold. Polyline endpoints are always kept.

Implementation (vectorised over all polylines of a scenario at once): the points form doubly
linked lists; each round removes, among the interior points whose current triangle area is below
the threshold, those that are a local minimum of (area, tie-break key) against both current
neighbours, then relinks. No two removed points are adjacent within a round, so each removal uses
exactly the triangle the sequential algorithm would see; the order among independent removals can
differ from the strictly sequential "smallest first" rule, which only matters for points whose
areas straddle the threshold after a neighbour's removal. Rounds repeat until nothing changes
(typically 10-25 rounds). Ties (e.g. runs of exactly collinear points, area 0) are broken by a
fixed hash of the point index so that every round removes about a third of such a run.
"""

from __future__ import annotations

import numpy as np


def _tie_key(n: int) -> np.ndarray:
    """A fixed pseudo-random permutation-like key per point (Knuth multiplicative hash)."""
    return (np.arange(n, dtype=np.uint64) * np.uint64(2654435761)) % np.uint64(4294967291)


def simplify_polylines(xy: np.ndarray, start: np.ndarray, area: float) -> np.ndarray:
    """Visvalingam simplification of many polylines at once.

    Args:
        xy: [Q, 2] float64 points of all polylines, concatenated (m).
        start: [P + 1] int64 offsets: polyline ``p`` is ``xy[start[p]:start[p + 1]]``.
        area: triangle-area threshold (m^2); interior points whose triangle (with their current
            neighbours) is smaller are removed. ``area <= 0`` keeps every point.

    Returns:
        [Q] bool mask of the points kept. The first and last point of every polyline are kept.

    Raises:
        ValueError: if ``start`` is not a non-decreasing sequence from 0 to Q.
    """
    xy = np.asarray(xy, dtype=np.float64)
    start = np.asarray(start, dtype=np.int64)
    q = xy.shape[0]
    if start.ndim != 1 or start.size < 1 or start[0] != 0 or start[-1] != q or np.any(np.diff(start) < 0):
        raise ValueError("simplify_polylines: start must be non-decreasing offsets from 0 to len(xy)")
    keep = np.ones(q, dtype=bool)
    if q == 0 or area <= 0:
        return keep
    lengths = np.diff(start)
    poly = np.repeat(np.arange(lengths.size), lengths)
    first = start[:-1][poly]
    last = start[1:][poly] - 1
    idx = np.arange(q)
    interior = (idx != first) & (idx != last)
    prev = np.where(interior, idx - 1, idx)
    nxt = np.where(interior, idx + 1, idx)
    tie = _tie_key(q)
    active = np.flatnonzero(interior)  # interior points still present
    x, y = xy[:, 0], xy[:, 1]
    while active.size:
        p, n = prev[active], nxt[active]
        a = 0.5 * np.abs((x[p] - x[active]) * (y[n] - y[active]) - (x[n] - x[active]) * (y[p] - y[active]))
        cand = a < area
        if not cand.any():
            break
        # Current area of every point (endpoints and non-candidates act as +inf barriers).
        cur = np.full(q, np.inf)
        cur[active[cand]] = a[cand]
        ai, ti = cur[active], tie[active]
        ap, tp = cur[p], tie[p]
        an, tn = cur[n], tie[n]
        less_p = (ai < ap) | ((ai == ap) & (ti < tp))
        less_n = (ai < an) | ((ai == an) & (ti < tn))
        rm = cand & less_p & less_n
        r = active[rm]
        keep[r] = False
        rp, rn = prev[r], nxt[r]
        nxt[rp] = rn
        prev[rn] = rp
        # Areas change only for the neighbours of removed points; points already at or above
        # the threshold whose neighbours did not change stay there, so drop them from the work list.
        revisit = np.zeros(q, dtype=bool)
        revisit[active[cand & ~rm]] = True
        revisit[rp] = True
        revisit[rn] = True
        active = np.flatnonzero(revisit & interior & keep)
    return keep


def polylines_to_segments(
    xy: np.ndarray, start: np.ndarray, road_type: np.ndarray, area: float
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Simplify polylines and turn consecutive kept points into segments.

    Args:
        xy: [Q, 2] float64 points (m), ``start``: [P + 1] int64 offsets, ``road_type``: [P] int8
            :class:`~gpusim.config.RoadType` codes, ``area``: Visvalingam threshold (m^2).

    Returns:
        ``(seg, seg_type, stats)``: seg [R, 4] float64 ``(x0, y0, x1, y1)`` in polyline order,
        seg_type [R] int8, and counters ``road_points_in``, ``road_points_kept``,
        ``single_point_polylines`` (polylines with one point: no segment, e.g. stop signs) and
        ``zero_length_segments`` (consecutive kept points closer than 1e-6 m, dropped).
    """
    xy = np.asarray(xy, dtype=np.float64)
    start = np.asarray(start, dtype=np.int64)
    road_type = np.asarray(road_type, dtype=np.int8)
    keep = simplify_polylines(xy, start, area)
    lengths = np.diff(start)
    poly = np.repeat(np.arange(lengths.size), lengths)
    kidx = np.flatnonzero(keep)
    kpoly = poly[kidx]
    same = kpoly[:-1] == kpoly[1:]
    a, b = kidx[:-1][same], kidx[1:][same]
    seg = np.concatenate([xy[a], xy[b]], axis=1) if a.size else np.zeros((0, 4))
    seg_type = road_type[kpoly[:-1][same]] if a.size else np.zeros((0,), dtype=np.int8)
    seglen = np.hypot(seg[:, 2] - seg[:, 0], seg[:, 3] - seg[:, 1])
    nonzero = seglen > 1e-6
    stats = {
        "road_points_in": int(xy.shape[0]),
        "road_points_kept": int(keep.sum()),
        "single_point_polylines": int((lengths == 1).sum()),
        "zero_length_segments": int((~nonzero).sum()),
    }
    return seg[nonzero], seg_type[nonzero].astype(np.int8), stats
