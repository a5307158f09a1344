"""Traffic-signal states: the per-scenario signal arrays (:class:`SignalState`, the codes, lives in
:mod:`gpusim.enums` and is re-exported here).

A WOMD scenario logs, at each of its 91 steps, the state of the traffic signal controlling some
lanes: the lane's map-feature id, the signal state, and the *stop point* (where a vehicle on that
lane must stop; constant over the log in all data seen). Waymo's protos store them per step
(``Scenario.dynamic_map_states[t].lane_states``); GPUDrive's JSON stores them per lane
(``tl_states[lane_id] = {state: [...], x: [...], y: [...], z: [...], time_index: [...]}``, where
``state`` holds lower-case names such as ``"arrow_stop"``).

Both become the same :class:`RawSignals` (L signals, one per controlled lane, sorted by lane id):
positions and validity per step, with ``UNKNOWN`` where a lane has no state at a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpusim.data.errors import ScenarioError
from gpusim.enums import SignalState  # noqa: F401  (moved to the leaf module; re-exported here)


#: States at which a vehicle must stop (a stop, red arrow or flashing red). The simulator's
#: ``red_light_violation`` metric uses the narrower :data:`gpusim.enums.RED_SIGNAL_STATES` (no
#: flashing red, which acts as a stop sign; docs/signals.md).
STOP_STATES = (SignalState.STOP, SignalState.ARROW_STOP, SignalState.FLASHING_STOP)


@dataclass
class RawSignals:
    """The signals of one scenario in world coordinates (L signals, T steps).

    Attributes:
        lane: [L] int64 map-feature id of the controlled lane, ascending.
        pos: [L, 2] float64 stop point (m), from the first step the lane has a state.
        state: [T, L] int8 :class:`SignalState` code; ``UNKNOWN`` (0) where not valid.
        valid: [T, L] bool the log has a state for the lane at that step.
        moved: number of signals whose stop point moves by more than 0.5 m over the log (the
            first position is kept).
        unknown_names: count of state names not in :class:`SignalState` (stored as UNKNOWN).
    """

    lane: np.ndarray
    pos: np.ndarray
    state: np.ndarray
    valid: np.ndarray
    moved: int = 0
    unknown_names: int = 0

    @property
    def num_signals(self) -> int:
        """L."""
        return int(self.lane.shape[0])

    @classmethod
    def empty(cls, steps: int) -> "RawSignals":
        """No signal (L = 0)."""
        return cls(np.zeros(0, np.int64), np.zeros((0, 2)), np.zeros((steps, 0), np.int8), np.zeros((steps, 0), bool))


def signals_from_observations(obs: list[tuple[int, int, int, float, float]], steps: int) -> RawSignals:
    """Collect ``(t, lane, state_code, x, y)`` observations into :class:`RawSignals`.

    A later observation of the same lane and step replaces an earlier one. Codes outside
    :class:`SignalState` must have been mapped to 0 by the caller.
    """
    if not obs:
        return RawSignals.empty(steps)
    lanes = sorted({o[1] for o in obs})
    col = {lane: i for i, lane in enumerate(lanes)}
    L = len(lanes)
    state = np.zeros((steps, L), np.int8)
    valid = np.zeros((steps, L), bool)
    first = np.full((L, 2), np.nan)
    lo = np.full((L, 2), np.inf)
    hi = np.full((L, 2), -np.inf)
    for t, lane, code, x, y in sorted(obs, key=lambda o: o[0]):
        j = col[lane]
        state[t, j] = code
        valid[t, j] = True
        if np.isnan(first[j, 0]):
            first[j] = (x, y)
        lo[j] = np.minimum(lo[j], (x, y))
        hi[j] = np.maximum(hi[j], (x, y))
    moved = int((np.hypot(*(hi - lo).T) > 0.5).sum())
    return RawSignals(np.array(lanes, np.int64), first, state, valid, moved=moved)


def parse_json_signals(tl_states, file, steps: int) -> RawSignals:
    """Validate GPUDrive JSON ``tl_states`` and convert them.

    Args:
        tl_states: the ``tl_states`` value (a dict lane-id string → per-lane dict, or absent/None).
        file: path for error messages. steps: T.

    Raises:
        ScenarioError: naming ``tl_states.<lane>.<key>`` for a non-dict value, a lane id that is not
            an integer, missing ``state``/``x``/``y``/``time_index``, lists of different lengths,
            a time index outside [0, T), a non-string state or non-finite coordinates.
    """
    if tl_states is None:
        return RawSignals.empty(steps)
    if not isinstance(tl_states, dict):
        raise ScenarioError(file, "tl_states", f"expected an object, got {type(tl_states).__name__}")
    obs, unknown = [], 0
    for key, entry in tl_states.items():
        f = f"tl_states.{key}"
        if not isinstance(entry, dict):
            raise ScenarioError(file, f, f"expected an object, got {type(entry).__name__}")
        try:  # the key is the lane id (newer files repeat it per step in a `lane_id` list)
            lane = int(key)
        except (TypeError, ValueError):
            raise ScenarioError(file, f, "lane id (the key) is not an integer") from None
        cols = {}
        for k in ("state", "x", "y", "time_index"):
            if not isinstance(entry.get(k), list):
                raise ScenarioError(file, f"{f}.{k}", "missing or not a list")
            cols[k] = entry[k]
        n = len(cols["time_index"])
        for k in ("state", "x", "y"):
            if len(cols[k]) != n:
                raise ScenarioError(file, f"{f}.{k}", f"{len(cols[k])} entries, time_index has {n}")
        for i in range(n):
            t, name, x, y = cols["time_index"][i], cols["state"][i], cols["x"][i], cols["y"][i]
            if not (isinstance(t, int) and not isinstance(t, bool) and 0 <= t < steps):
                raise ScenarioError(file, f"{f}.time_index[{i}]", f"{t!r} is not a step in [0, {steps})")
            if not isinstance(name, str):
                raise ScenarioError(file, f"{f}.state[{i}]", f"expected a state name, got {name!r}")
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in (x, y)):
                raise ScenarioError(file, f"{f}.x[{i}]", "stop point is not a finite number pair")
            code = SignalState.from_name(name)
            if code is None:
                unknown += 1
                code = SignalState.UNKNOWN
            obs.append((t, lane, int(code), float(x), float(y)))
    sig = signals_from_observations(obs, steps)
    sig.unknown_names = unknown
    return sig


def lane_directions(pos: np.ndarray, lane: np.ndarray, road_xy: np.ndarray, road_start: np.ndarray,
                    road_id: np.ndarray) -> np.ndarray:
    """Unit direction of each signal's controlled lane at its stop point.

    For signal ``l``, the lane polyline whose map id is ``lane[l]`` is found and the direction of
    its segment nearest to ``pos[l]`` is returned, so the stop line is the line through the stop
    point perpendicular to it (the geometry the simulator's red-light test can use).

    Args:
        pos: [L, 2] float64 stop points; lane: [L] int64 lane ids; road_xy [Q, 2], road_start
            [P + 1], road_id [P] int64 (-1 unknown): the scenario's polylines.

    Returns:
        [L, 2] float64 unit vectors; (0, 0) where the lane is not in the map or has < 2 points.
    """
    out = np.zeros((len(lane), 2))
    index = {int(r): p for p, r in enumerate(road_id) if r >= 0}
    for l, lane_id in enumerate(lane):
        p = index.get(int(lane_id))
        if p is None:
            continue
        xy = road_xy[road_start[p]:road_start[p + 1]]
        if len(xy) < 2:
            continue
        a, b = xy[:-1], xy[1:]
        d = b - a
        len2 = (d * d).sum(axis=1)
        u = np.clip(((pos[l] - a) * d).sum(axis=1) / np.maximum(len2, 1e-12), 0.0, 1.0)
        dist = np.hypot(*(a + u[:, None] * d - pos[l]).T)
        dist[len2 < 1e-12] = np.inf
        k = int(np.argmin(dist))
        if np.isfinite(dist[k]):
            out[l] = d[k] / np.sqrt(len2[k])
    return out
