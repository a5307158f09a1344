"""Host-side description of one top-down frame: colours, :class:`FrameData`, :class:`TrailRecorder`,
and frames built from the log (:func:`frame_from_log`) or a running env (:func:`frame_from_env`).

Part of :mod:`gpusim.render` (see the package docstring); split out of the former single module
without behaviour change.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from gpusim.config import RoadType
from gpusim.kernels.signals import signal_state_at
from gpusim.styles import style_name


#: Colours (matplotlib colour strings) by role and status.
COLORS = {
    "background": "#ffffff",
    "road_edge": "#202020",
    "lane": "#b8c4d6",
    "road_line": "#c9a227",
    "other_road": "#d9d9d9",
    "controlled": "#1f77b4",
    "sdc": "#0b3d91",
    "coplayer": "#9467bd",
    "expert_vehicle": "#9e9e9e",
    "expert_pedestrian": "#2ca02c",
    "expert_cyclist": "#17becf",
    "collided": "#d62728",
    "offroad": "#ff7f0e",
    "goal": "#1f77b4",
    "candidate": "#7f7f7f",
    "goal_reached": "#2ca02c",
    "trail": "#555555",
    "highlight": "#e377c2",
    "signal_unknown": "#8c8c8c",
    "signal_stop": "#e41a1c",
    "signal_caution": "#ffb000",
    "signal_go": "#1a9e3a",
}

#: How roads are drawn: RoadType code -> (colour key, line width in points, line style, z-order).
ROAD_STYLE = {
    int(RoadType.LANE): ("lane", 0.6, "solid", 1),
    int(RoadType.ROAD_LINE): ("road_line", 0.8, (0, (4, 3)), 2),
    int(RoadType.ROAD_EDGE): ("road_edge", 1.4, "solid", 3),
}
#: Style of every road type not in :data:`ROAD_STYLE` (crosswalks, speed bumps, ...).
OTHER_ROAD_STYLE = ("other_road", 0.6, "solid", 0)


# ---------------------------------------------------------------------------------------------
# Host-side frame description
# ---------------------------------------------------------------------------------------------
@dataclass
class FrameData:
    """Everything one top-down frame shows, as host numpy arrays (A agent slots of one world).

    Attributes:
        pos: [A, 2] float32 agent centres (m, scenario-centred frame).
        heading: [A] float32 headings (rad, CCW from +x).
        length, width: [A] float32 box size (m).
        agent_type: [A] int ObjectType code (-1 padding).
        visible: [A] bool, the agent is in the scene and drawn as a filled box.
        controlled: [A] bool, the slot is driven by the policy.
        sdc: [A] bool, the self-driving car.
        stopped, removed, collided, offroad, goal_reached: [A] bool status flags.
        goal: [A, 2] float32 goal positions (drawn for controlled agents only).
        goal_radius: goal circle radius (m).
        road_seg: [R, 4] float32 segments (x0, y0, x1, y1); road_type: [R] int RoadType codes.
        extent: (xmin, xmax, ymin, ymax) of the view (m).
        title: text above the frame.
        trails: [L, A, 2] float32 past positions, oldest first (NaN where unknown), or None.
        ghost_pos, ghost_heading: last seen pose of removed agents ([A, 2], [A]; NaN if unknown).
        highlight: agent slot to outline in :data:`COLORS` ``highlight`` (e.g. the ego-view agent),
            or -1.
        ever_collided, ever_offroad: [A] bool, contact earlier in the episode (thick red / orange
            outline when not in contact now), or None.
        coplayer: [A] bool, the controlled slot is a co-player driven by a frozen partner policy
            (population play; drawn in :data:`COLORS` ``coplayer``), or None (every controlled
            agent is an ego).
        signal_pos, signal_dir: [L, 2] float32 stop points (m) and lane directions of the
            scenario's traffic signals; signal_state: [L] int ``SignalState`` codes at the frame's
            log step (unknown past the log); all None when not drawn (docs/signals.md).
        candidates: [C, G, 2] float32 candidate goals of the memory task (m; zeros for empty
            slots), drawn as grey dashed circles; None when the task is off (docs/trial.md).
    """

    pos: np.ndarray
    heading: np.ndarray
    length: np.ndarray
    width: np.ndarray
    agent_type: np.ndarray
    visible: np.ndarray
    controlled: np.ndarray
    sdc: np.ndarray
    stopped: np.ndarray
    removed: np.ndarray
    collided: np.ndarray
    offroad: np.ndarray
    goal_reached: np.ndarray
    goal: np.ndarray
    goal_radius: float
    road_seg: np.ndarray
    road_type: np.ndarray
    extent: tuple
    title: str = ""
    trails: np.ndarray | None = None
    ghost_pos: np.ndarray | None = None
    ghost_heading: np.ndarray | None = None
    highlight: int = -1
    ever_collided: np.ndarray | None = None
    ever_offroad: np.ndarray | None = None
    coplayer: np.ndarray | None = None
    signal_pos: np.ndarray | None = None
    signal_dir: np.ndarray | None = None
    signal_state: np.ndarray | None = None
    candidates: np.ndarray | None = None


class TrailRecorder:
    """Keeps the last ``length`` poses of every agent of one world, for trails and removed ghosts.

    Call :meth:`update` once per drawn frame (the ``render_*`` functions do it when given a
    recorder). A step counter that does not increase (a new episode, or the same step drawn twice)
    is handled: same step → ignored; smaller step → history cleared.

    Args:
        length: positions kept per agent (>= 2 for a visible trail).

    Raises:
        ValueError: if ``length < 1``.
    """

    def __init__(self, length: int = 10):
        if length < 1:
            raise ValueError(f"TrailRecorder length must be >= 1, got {length}")
        self.length = int(length)
        self._pos: deque = deque(maxlen=self.length)
        self._last_step: int | None = None
        self.last_pos: np.ndarray | None = None  # [A, 2] last pose seen while visible (NaN: never)
        self.last_heading: np.ndarray | None = None

    def clear(self) -> None:
        """Forget all history."""
        self._pos.clear()
        self._last_step = None
        self.last_pos = None
        self.last_heading = None

    def update(self, pos: np.ndarray, heading: np.ndarray, visible: np.ndarray, step: int | None = None) -> None:
        """Record one frame.

        Args:
            pos: [A, 2] positions (m). heading: [A] (rad). visible: [A] bool (others get NaN).
            step: the env/log step of this frame (optional; see the class docstring).
        """
        if step is not None and self._last_step is not None:
            if step == self._last_step:
                return
            if step < self._last_step:
                self.clear()
        self._last_step = step
        pos = np.asarray(pos, dtype=np.float32)
        heading = np.asarray(heading, dtype=np.float32)
        visible = np.asarray(visible, dtype=bool)
        if self.last_pos is None or self.last_pos.shape != pos.shape:
            self._pos.clear()
            self.last_pos = np.full(pos.shape, np.nan, np.float32)
            self.last_heading = np.full(heading.shape, np.nan, np.float32)
        self._pos.append(np.where(visible[:, None], pos, np.nan).astype(np.float32))
        self.last_pos[visible] = pos[visible]
        self.last_heading[visible] = heading[visible]

    def trails(self) -> np.ndarray | None:
        """[L, A, 2] recorded positions, oldest first (NaN where the agent was not visible)."""
        if not self._pos:
            return None
        return np.stack(list(self._pos))


# ---------------------------------------------------------------------------------------------
# Building frames from a pack (log) or from an env
# ---------------------------------------------------------------------------------------------
def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _road_arrays(pack, s: int) -> tuple[np.ndarray, np.ndarray]:
    n = int(pack.num_segments[s])
    return _np(pack.road_seg[s, :n]).astype(np.float32), _np(pack.road_type[s, :n]).astype(np.int64)


def _signal_arrays(pack, s: int, log_index: int) -> dict:
    """The ``signal_*`` fields of :class:`FrameData` for scenario ``s`` at log step ``log_index``."""
    n = int(pack.num_signals[s]) if getattr(pack, "num_signals", None) is not None else 0
    if n == 0:
        return {}
    code = signal_state_at(torch.tensor([s]), torch.tensor([int(log_index)]), pack.signal_state.cpu(),
                           pack.signal_valid.cpu())[0, :n]
    return {"signal_pos": _np(pack.signal_pos[s, :n]).astype(np.float32),
            "signal_dir": _np(pack.signal_dir[s, :n]).astype(np.float32), "signal_state": _np(code).astype(np.int64)}


def scene_extent(pack, scenario: int, margin: float = 25.0, min_size: float = 60.0) -> tuple:
    """A square view (xmin, xmax, ymin, ymax) in metres covering a scenario's agents of interest.

    It covers every valid logged position and the goal of the controlled agents (of all agents
    when the scenario has none), grown by ``margin`` and made square with side at least
    ``min_size``. Far-away parked experts and the long tails of the road map stay outside, so the
    agents the policy drives fill the picture; the extent does not change with time, so videos do
    not jitter.

    Args:
        pack: a :class:`gpusim.data.ScenarioPack`.
        scenario: scenario index in ``[0, pack.num_scenarios)``.
        margin, min_size: metres.

    Raises:
        IndexError: for a scenario index out of range.
    """
    if not 0 <= scenario < pack.num_scenarios:
        raise IndexError(f"scenario index {scenario} out of range [0, {pack.num_scenarios})")
    nc = int(pack.num_controlled[scenario])
    na = int(pack.num_agents[scenario])
    sel = slice(0, nc) if nc > 0 else slice(0, na)
    pos = _np(pack.traj_pos[scenario, sel])  # [n, T, 2]
    valid = _np(pack.traj_valid[scenario, sel])
    pts = [pos[valid].reshape(-1, 2), _np(pack.agent_goal[scenario, sel]).reshape(-1, 2)]
    pts = np.concatenate(pts, 0)
    pts = pts[np.isfinite(pts).all(1)]
    if len(pts) == 0:  # no agent at all: fall back to the road map
        seg, _ = _road_arrays(pack, scenario)
        pts = seg.reshape(-1, 2) if len(seg) else np.zeros((1, 2), np.float32)
    lo, hi = pts.min(0) - margin, pts.max(0) + margin
    centre = (lo + hi) / 2
    half = max(float((hi - lo).max()), min_size) / 2
    return (float(centre[0] - half), float(centre[0] + half), float(centre[1] - half), float(centre[1] + half))


def frame_from_log(pack, scenario: int, t: int, trail: TrailRecorder | None = None,
                   extent: tuple | None = None, goal_radius: float = 2.0) -> FrameData:
    """The logged scene of ``scenario`` at log step ``t`` as a :class:`FrameData`.

    Controlled agents (slots ``[0, num_controlled)``) are coloured as controlled; every agent
    valid at ``t`` is drawn. No status flags are set (the log has none).

    Raises:
        IndexError: for a scenario or step out of range.
    """
    if not 0 <= scenario < pack.num_scenarios:
        raise IndexError(f"scenario index {scenario} out of range [0, {pack.num_scenarios})")
    if not 0 <= t < pack.num_steps:
        raise IndexError(f"log step {t} out of range [0, {pack.num_steps})")
    A = pack.max_agents
    nc = int(pack.num_controlled[scenario])
    pos = _np(pack.traj_pos[scenario, :, t]).astype(np.float32)
    heading = _np(pack.traj_heading[scenario, :, t]).astype(np.float32)
    visible = _np(pack.traj_valid[scenario, :, t]) & _np(pack.agent_exists[scenario])
    controlled = np.arange(A) < nc
    sdc = np.zeros(A, bool)
    si = int(pack.sdc_index[scenario])
    if 0 <= si < A:
        sdc[si] = True
    if trail is not None:
        trail.update(pos, heading, visible, step=t)
    roads, rtype = _road_arrays(pack, scenario)
    false = np.zeros(A, bool)
    return FrameData(
        pos=pos, heading=heading,
        length=_np(pack.agent_length[scenario]).astype(np.float32),
        width=_np(pack.agent_width[scenario]).astype(np.float32),
        agent_type=_np(pack.agent_type[scenario]).astype(np.int64),
        visible=visible, controlled=controlled, sdc=sdc,
        stopped=false, removed=false.copy(), collided=false.copy(), offroad=false.copy(),
        goal_reached=false.copy(), goal=_np(pack.agent_goal[scenario]).astype(np.float32),
        goal_radius=goal_radius, road_seg=roads, road_type=rtype,
        extent=extent if extent is not None else scene_extent(pack, scenario),
        title=f"{pack.scenario_ids[scenario]}  log t={t}  ({nc} controlled)",
        trails=trail.trails() if trail is not None else None, **_signal_arrays(pack, scenario, t),
    )


def frame_from_env(env, world: int = 0, trail: TrailRecorder | None = None,
                   extent: tuple | None = None, partner: str = "") -> FrameData:
    """The current state of world ``world`` of a :class:`gpusim.env.DriveEnv` as a :class:`FrameData`.

    Reads (``.cpu()``) one world's rows of these :class:`gpusim.state.EnvState` fields:
    ``scenario, step, trial_count, trial_start, pos, heading, length, width, goal, controlled, present,
    stopped, removed, goal_reached, collided_now, offroad_now, ever_collided, ever_offroad``.
    Fill colour follows the *current* contact (``collided_now`` / ``offroad_now``); an agent that
    was in contact earlier in the episode keeps a thick red / orange outline (``ever_*``).
    With co-players (``EnvConfig.ego_slots`` / ``ego_fraction``; ``EnvState.ego``) the co-player
    agents get their own colour, the title counts egos and co-players and names ``partner`` (the
    label of the partner policy driving this world's co-players, e.g.
    ``train.coplayer.partner_name(pool, world)``).

    Raises:
        IndexError: for a world index out of range.
    """
    if not 0 <= world < env.num_worlds:
        raise IndexError(f"world index {world} out of range [0, {env.num_worlds})")
    st, pack, cfg = env.state, env.pack, env.config
    names = ("scenario", "step", "trial_count", "trial_start", "pos", "heading", "length", "width", "goal",
             "controlled", "present", "stopped", "removed", "goal_reached", "collided_now", "offroad_now",
             "ever_collided", "ever_offroad")
    row = {n: _np(getattr(st, n)[world]) for n in names}  # the only device -> host reads
    s = int(row["scenario"])
    t = int(row["step"])
    A = row["present"].shape[0]
    controlled = row["controlled"].astype(bool)
    pos = row["pos"].astype(np.float32)
    heading = row["heading"].astype(np.float32)
    removed = row["removed"].astype(bool)
    visible = row["present"].astype(bool) & ~removed & np.isfinite(pos).all(1)
    if trail is not None:
        trail.update(pos, heading, visible, step=t)
    sdc = np.zeros(A, bool)
    si = int(pack.sdc_index[s])
    if 0 <= si < A:
        sdc[si] = True
    stopped, goal_reached = row["stopped"].astype(bool), row["goal_reached"].astype(bool)
    ever_c, ever_o = row["ever_collided"].astype(bool), row["ever_offroad"].astype(bool)
    nc = int(controlled.sum())
    coplayer = None
    title = f"{pack.scenario_ids[s]}  world {world}  t={t}"
    if cfg.trial_mode:
        title += f"  trial {int(row['trial_count']) + 1}/{cfg.k_trials}"
    if getattr(cfg, "reward_conditioning", False):  # driving styles: the egos' style (docs/styles.md)
        title += f"  style {style_name(cfg.style)}"
    if getattr(cfg, "has_coplayers", False) and getattr(st, "ego", None) is not None:
        ego = _np(st.ego[world]).astype(bool)
        coplayer = np.zeros(A, bool)
        coplayer[: ego.shape[0]] = controlled[: ego.shape[0]] & ~ego
        title += f"\negos {int(ego.sum())}  co-players {int(coplayer.sum())}" + (f" ({partner})" if partner else "")
    title += (f"\ngoal {int((goal_reached & controlled).sum())}/{nc}  collided {int((ever_c & controlled).sum())}"
              f"  offroad {int((ever_o & controlled).sum())}  stopped {int((stopped & controlled).sum())}"
              f"  removed {int((removed & controlled).sum())}")
    roads, rtype = _road_arrays(pack, s)
    return FrameData(
        pos=pos, heading=heading, length=row["length"].astype(np.float32), width=row["width"].astype(np.float32),
        agent_type=_np(pack.agent_type[s]).astype(np.int64),
        visible=visible, controlled=controlled, sdc=sdc, stopped=stopped & visible,
        removed=removed & _np(pack.agent_exists[s]).astype(bool),
        collided=row["collided_now"].astype(bool) & visible, offroad=row["offroad_now"].astype(bool) & visible,
        goal_reached=goal_reached, goal=row["goal"].astype(np.float32), goal_radius=float(cfg.goal_radius),
        road_seg=roads, road_type=rtype, extent=extent if extent is not None else scene_extent(pack, s),
        title=title, trails=trail.trails() if trail is not None else None,
        ghost_pos=trail.last_pos if trail is not None else None,
        ghost_heading=trail.last_heading if trail is not None else None,
        ever_collided=ever_c, ever_offroad=ever_o, coplayer=coplayer,
        **_signal_arrays(pack, s, cfg.init_steps + t - int(row["trial_start"])),  # the replay's log clock
        candidates=_np(st.goal_cand[world]).astype(np.float32) if getattr(cfg, "goal_candidates", 0) >= 2 else None,
    )
