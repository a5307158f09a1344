"""Top-down pictures and videos of gpusim scenes, rollouts and observations (headless matplotlib).

What is drawn (all in the scenario-centred frame of the pack, metres, equal aspect):

* roads from ``pack.road_seg`` / ``pack.road_type``: road edges (black, thick), lane centre lines
  (light blue-grey), road lines (dark yellow, dashed) and other map features (crosswalks, speed
  bumps, driveways, stop signs: faint grey);
* agents as oriented boxes (logged length x width, centred on the position, rotated by the heading
  counter-clockwise from +x) with a short line from the centre to the front; the fill colour says
  the role, the status overrides it (see :data:`COLORS`): controlled (blue), SDC (dark blue when
  controlled), log-replayed expert vehicle / pedestrian / cyclist (grey / green / teal),
  collided (red), offroad (orange), collided and offroad (red with an orange outline), stopped
  (hatched, dark outline), removed (dashed outline only, drawn at the last pose the trail
  recorder saw, since a removed agent is off the map);
* goals of controlled agents: a dashed circle of ``goal_radius`` and a faint line from the agent;
  reached goals are drawn in green;
* short trails: the last few positions of every agent, kept by a :class:`TrailRecorder`
  (the env keeps no history).

Entry points: :func:`render_log_frame` (a logged scene, needs only a :class:`ScenarioPack`),
:func:`render_frame` (a world of a running :class:`gpusim.env.DriveEnv`), :func:`render_episode`
(GIF/MP4 of a rollout driven by a policy callable, the expert actions, random actions, or the log
itself), :func:`render_ego_view` (what one agent observes, drawn from its observation vector) and
the command line ``python -m gpusim.render`` (see :func:`main`).

Device tensors are read only when a frame is drawn (``.cpu()`` of the few rows needed).
Matplotlib is used through :class:`matplotlib.figure.Figure` with the Agg canvas directly, so the
module never touches pyplot's global backend and works without a display.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from gpusim.config import ObjectType, RoadType

__all__ = [
    "COLORS",
    "FrameData",
    "TrailRecorder",
    "SceneCanvas",
    "frame_from_log",
    "frame_from_env",
    "scene_extent",
    "render_log_frame",
    "render_frame",
    "render_episode",
    "render_log_episode",
    "render_ego_view",
    "decode_ego_observation",
    "write_video",
    "draw_frame",
    "figure_to_array",
    "select_scenario",
    "checkpoint_policy",
    "main",
]

#: Colours (matplotlib colour strings) by role and status.
COLORS = {
    "background": "#ffffff",
    "road_edge": "#202020",
    "lane": "#b8c4d6",
    "road_line": "#c9a227",
    "other_road": "#d9d9d9",
    "controlled": "#1f77b4",
    "sdc": "#0b3d91",
    "expert_vehicle": "#9e9e9e",
    "expert_pedestrian": "#2ca02c",
    "expert_cyclist": "#17becf",
    "collided": "#d62728",
    "offroad": "#ff7f0e",
    "goal": "#1f77b4",
    "goal_reached": "#2ca02c",
    "trail": "#555555",
    "highlight": "#e377c2",
}

_ROAD_STYLE = {  # RoadType code -> (colour key, line width in points, line style, z-order)
    int(RoadType.LANE): ("lane", 0.6, "solid", 1),
    int(RoadType.ROAD_LINE): ("road_line", 0.8, (0, (4, 3)), 2),
    int(RoadType.ROAD_EDGE): ("road_edge", 1.4, "solid", 3),
}
_OTHER_ROAD_STYLE = ("other_road", 0.6, "solid", 0)


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
        trails=trail.trails() if trail is not None else None,
    )


def frame_from_env(env, world: int = 0, trail: TrailRecorder | None = None,
                   extent: tuple | None = None) -> FrameData:
    """The current state of world ``world`` of a :class:`gpusim.env.DriveEnv` as a :class:`FrameData`.

    Reads (``.cpu()``) one world's rows of these :class:`gpusim.state.EnvState` fields:
    ``scenario, step, trial_count, pos, heading, length, width, goal, controlled, present,
    stopped, removed, goal_reached, collided_now, offroad_now, ever_collided, ever_offroad``.
    Fill colour follows the *current* contact (``collided_now`` / ``offroad_now``); an agent that
    was in contact earlier in the episode keeps a thick red / orange outline (``ever_*``).

    Raises:
        IndexError: for a world index out of range.
    """
    if not 0 <= world < env.num_worlds:
        raise IndexError(f"world index {world} out of range [0, {env.num_worlds})")
    st, pack, cfg = env.state, env.pack, env.config
    names = ("scenario", "step", "trial_count", "pos", "heading", "length", "width", "goal", "controlled",
             "present", "stopped", "removed", "goal_reached", "collided_now", "offroad_now", "ever_collided",
             "ever_offroad")
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
    title = f"{pack.scenario_ids[s]}  world {world}  t={t}"
    if cfg.trial_mode:
        title += f"  trial {int(row['trial_count']) + 1}/{cfg.k_trials}"
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
        ever_collided=ever_c, ever_offroad=ever_o,
    )


# ---------------------------------------------------------------------------------------------
# Drawing
# ---------------------------------------------------------------------------------------------
def _box_corners(pos: np.ndarray, heading: np.ndarray, length: np.ndarray, width: np.ndarray) -> np.ndarray:
    """[N, 4, 2] corners of oriented boxes (front-left, front-right, rear-right, rear-left)."""
    c, s = np.cos(heading), np.sin(heading)
    fx, fy = c * length / 2, s * length / 2  # half-length along the heading
    lx, ly = -s * width / 2, c * width / 2  # half-width to the left
    x, y = pos[:, 0], pos[:, 1]
    xs = np.stack([x + fx + lx, x + fx - lx, x - fx - lx, x - fx + lx], 1)
    ys = np.stack([y + fy + ly, y + fy - ly, y - fy - ly, y - fy + ly], 1)
    return np.stack([xs, ys], -1)


def _new_figure(figsize: float, dpi: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(figsize, figsize), dpi=dpi, facecolor=COLORS["background"])
    FigureCanvasAgg(fig)
    return fig


def figure_to_array(fig) -> np.ndarray:
    """Draw ``fig`` and return its pixels as an [H, W, 3] uint8 array."""
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def _chain_segments(seg: np.ndarray) -> list:
    """Join consecutive segments whose end is the next one's start into polylines.

    Drawing a polyline instead of many short segments keeps dash patterns continuous and avoids
    dark dots at the joints. seg: [N, 4]; returns a list of [n_i, 2] vertex arrays.
    """
    if len(seg) == 0:
        return []
    brk = np.ones(len(seg), bool)
    brk[1:] = np.abs(seg[1:, :2] - seg[:-1, 2:]).max(1) > 1e-4
    starts = np.nonzero(brk)[0]
    ends = np.append(starts[1:], len(seg))
    lines = []
    for a, b in zip(starts, ends):
        lines.append(np.concatenate([seg[a:b, :2], seg[b - 1:b, 2:]], 0))
    return lines


def _draw_roads(ax, road_seg: np.ndarray, road_type: np.ndarray, extent: tuple) -> None:
    from matplotlib.collections import LineCollection

    if len(road_seg) == 0:
        return
    xmin, xmax, ymin, ymax = extent
    pad = 5.0
    inside = ~((np.maximum(road_seg[:, 0], road_seg[:, 2]) < xmin - pad)
               | (np.minimum(road_seg[:, 0], road_seg[:, 2]) > xmax + pad)
               | (np.maximum(road_seg[:, 1], road_seg[:, 3]) < ymin - pad)
               | (np.minimum(road_seg[:, 1], road_seg[:, 3]) > ymax + pad))
    known = list(_ROAD_STYLE)
    groups = [(code, _ROAD_STYLE[code]) for code in known] + [(None, _OTHER_ROAD_STYLE)]
    for code, (ckey, lw, ls, z) in groups:
        sel = inside & (np.isin(road_type, known, invert=True) if code is None else road_type == code)
        if not sel.any():
            continue
        # Chain in pack order, broken where the selection skips a segment.
        idx = np.nonzero(sel)[0]
        lines = []
        for run in np.split(idx, np.nonzero(np.diff(idx) > 1)[0] + 1):
            lines.extend(_chain_segments(road_seg[run]))
        ax.add_collection(LineCollection(lines, colors=COLORS[ckey], linewidths=lw, linestyles=ls, zorder=z,
                                         capstyle="butt", joinstyle="round"))


def _agent_colors(f: FrameData) -> list:
    cols = []
    for a in range(len(f.pos)):
        if f.collided[a]:
            cols.append(COLORS["collided"])
        elif f.offroad[a]:
            cols.append(COLORS["offroad"])
        elif f.controlled[a]:
            cols.append(COLORS["sdc"] if f.sdc[a] else COLORS["controlled"])
        elif f.agent_type[a] == int(ObjectType.PEDESTRIAN):
            cols.append(COLORS["expert_pedestrian"])
        elif f.agent_type[a] == int(ObjectType.CYCLIST):
            cols.append(COLORS["expert_cyclist"])
        else:
            cols.append(COLORS["expert_vehicle"])
    return cols


def _draw_agents(ax, f: FrameData) -> None:
    from matplotlib.collections import LineCollection, PolyCollection
    from matplotlib.patches import Circle

    cols = np.array(_agent_colors(f), dtype=object)
    vis = f.visible.copy()
    # Trails.
    if f.trails is not None and len(f.trails) >= 2:
        tr = f.trails  # [L, A, 2]
        segs = np.stack([tr[:-1], tr[1:]], 2)  # [L-1, A, 2, 2]
        ok = np.isfinite(segs).all((2, 3))
        segs = segs[ok]
        if len(segs):
            tcols = np.broadcast_to(cols[None, :], ok.shape)[ok]
            ax.add_collection(LineCollection(segs, colors=list(tcols), linewidths=1.2, alpha=0.7, zorder=4))
    # Goals of controlled agents (drawn even when the agent was removed at its goal).
    gsel = f.controlled & (f.visible | f.removed | f.goal_reached) & np.isfinite(f.goal).all(1)
    for a in np.nonzero(gsel)[0]:
        col = COLORS["goal_reached"] if f.goal_reached[a] else COLORS["goal"]
        ax.add_patch(Circle(tuple(f.goal[a]), f.goal_radius, fill=False, edgecolor=col, linewidth=1.0,
                            linestyle=(0, (2, 1.5)), zorder=5))
        ax.plot([f.goal[a, 0]], [f.goal[a, 1]], marker="+", color=col, markersize=4, zorder=5)
        if f.visible[a]:
            ax.plot([f.pos[a, 0], f.goal[a, 0]], [f.pos[a, 1], f.goal[a, 1]], color=col, linewidth=0.5,
                    alpha=0.35, zorder=4)
    # Visible agents: filled boxes, stopped ones hatched.
    if vis.any():
        idx = np.nonzero(vis)[0]
        corners = _box_corners(f.pos[idx], f.heading[idx], f.length[idx], f.width[idx])
        ever_c = f.ever_collided if f.ever_collided is not None else np.zeros(len(f.pos), bool)
        ever_o = f.ever_offroad if f.ever_offroad is not None else np.zeros(len(f.pos), bool)
        edge, lws = [], []
        for a in idx:
            if f.collided[a] and f.offroad[a]:
                edge.append(COLORS["offroad"]); lws.append(1.6)
            elif f.stopped[a]:
                edge.append("#000000"); lws.append(1.6)
            elif ever_c[a] and not f.collided[a]:
                edge.append(COLORS["collided"]); lws.append(1.6)
            elif ever_o[a] and not f.offroad[a]:
                edge.append(COLORS["offroad"]); lws.append(1.6)
            else:
                edge.append("#303030"); lws.append(0.5)
        ax.add_collection(PolyCollection(corners, facecolors=list(cols[idx]), edgecolors=edge, linewidths=lws,
                                         zorder=6))
        st = [a for a in idx if f.stopped[a]]
        if st:
            ax.add_collection(PolyCollection(_box_corners(f.pos[st], f.heading[st], f.length[st], f.width[st]),
                                             facecolors="none", edgecolors="#ffffff", linewidths=0.0,
                                             hatch="///", zorder=7))
        # Heading ticks: centre -> front midpoint.
        c, s = np.cos(f.heading[idx]), np.sin(f.heading[idx])
        front = f.pos[idx] + np.stack([c, s], 1) * (f.length[idx] / 2)[:, None]
        ax.add_collection(LineCollection(np.stack([f.pos[idx], front], 1), colors="#000000", linewidths=0.6,
                                         zorder=8))
    # Removed agents: dashed outline at the last pose seen.
    if f.ghost_pos is not None:
        gh = f.removed & np.isfinite(f.ghost_pos).all(1)
        if gh.any():
            idx = np.nonzero(gh)[0]
            corners = _box_corners(f.ghost_pos[idx], f.ghost_heading[idx], f.length[idx], f.width[idx])
            ax.add_collection(PolyCollection(corners, facecolors="none", edgecolors=list(cols[idx]), linewidths=0.9,
                                             linestyles="dashed", zorder=6))
    if 0 <= f.highlight < len(f.pos) and (f.visible[f.highlight]):
        h = f.highlight
        corners = _box_corners(f.pos[[h]], f.heading[[h]], f.length[[h]] + 1.5, f.width[[h]] + 1.5)
        ax.add_collection(PolyCollection(corners, facecolors="none", edgecolors=COLORS["highlight"], linewidths=1.5,
                                         zorder=9))


def _draw_legend(ax) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    items = [Patch(color=COLORS[k], label=lab) for k, lab in (
        ("controlled", "controlled"), ("sdc", "SDC (controlled)"), ("expert_vehicle", "expert vehicle"),
        ("expert_pedestrian", "pedestrian"), ("expert_cyclist", "cyclist"), ("collided", "collided"),
        ("offroad", "offroad"))]
    items += [Patch(facecolor=COLORS["controlled"], edgecolor="#ffffff", hatch="///", label="stopped"),
              Patch(facecolor="none", edgecolor=COLORS["controlled"], linestyle="dashed", label="removed"),
              Line2D([], [], color=COLORS["goal"], marker="+", linestyle="none", label="goal"),
              Line2D([], [], color=COLORS["road_edge"], label="road edge"),
              Line2D([], [], color=COLORS["road_line"], linestyle=(0, (4, 3)), label="road line"),
              Line2D([], [], color=COLORS["lane"], label="lane centre")]
    ax.legend(handles=items, loc="lower left", fontsize=5, framealpha=0.85, ncol=2, handlelength=1.5)


def draw_frame(f: FrameData, ax, legend: bool = False) -> None:
    """Draw a :class:`FrameData` into a matplotlib ``Axes`` (cleared first); ``legend`` adds a key."""
    ax.clear()
    ax.set_facecolor(COLORS["background"])
    _draw_roads(ax, f.road_seg, f.road_type, f.extent)
    _draw_agents(ax, f)
    xmin, xmax, ymin, ymax = f.extent
    ax.set_xlim(xmin, xmax)
    ax.set_ylim(ymin, ymax)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xticks([])
    ax.set_yticks([])
    if f.title:
        ax.set_title(f.title, fontsize=7)
    if legend:
        _draw_legend(ax)


def _image_of(f: FrameData, ax, figsize: float, dpi: int, legend: bool = False) -> np.ndarray:
    if ax is None:
        fig = _new_figure(figsize, dpi)
        ax = fig.add_axes((0.01, 0.01, 0.98, 0.89))
    draw_frame(f, ax, legend)
    return figure_to_array(ax.figure)


def render_log_frame(pack, scenario: int = 0, t: int = 0, ax=None, trail: TrailRecorder | None = None,
                     extent: tuple | None = None, figsize: float = 6.0, dpi: int = 100,
                     legend: bool = False) -> np.ndarray:
    """Picture of the logged scene of ``scenario`` at log step ``t`` (no env needed).

    Args:
        pack: :class:`gpusim.data.ScenarioPack` (any device).
        scenario: scenario index. t: log step in ``[0, 91)``.
        ax: draw into this Axes (its whole figure is returned) instead of a new figure.
        trail: a :class:`TrailRecorder`, updated with this frame and drawn.
        extent: (xmin, xmax, ymin, ymax) in metres; default :func:`scene_extent`.
        figsize, dpi: size of a new figure (inches, dots per inch): the image is
            ``round(figsize * dpi)`` pixels square.
        legend: draw a colour key.

    Returns:
        [H, W, 3] uint8 RGB image.

    Raises:
        IndexError: for a scenario or step out of range.
    """
    return _image_of(frame_from_log(pack, scenario, t, trail=trail, extent=extent), ax, figsize, dpi, legend)


def render_frame(env, world: int = 0, ax=None, trail: TrailRecorder | None = None, extent: tuple | None = None,
                 highlight: int = -1, figsize: float = 6.0, dpi: int = 100, legend: bool = False) -> np.ndarray:
    """Top-down picture of one world of a running :class:`gpusim.env.DriveEnv`.

    Roads, agents as oriented boxes coloured by role and status (controlled / SDC / expert by type;
    collided, offroad, stopped, removed), goals of controlled agents, trails from ``trail``, and in
    the title the scenario id, step, trial (trial mode) and the counts of controlled agents at
    goal / collided / offroad / stopped / removed.

    Args:
        env: a ``DriveEnv`` (after ``reset``).
        world: world index.
        ax: draw into this Axes (its whole figure is returned) instead of a new figure.
        trail: a :class:`TrailRecorder` for this world (updated with the current poses, then drawn).
        extent: (xmin, xmax, ymin, ymax) in metres; default :func:`scene_extent` of the world's
            scenario.
        highlight: agent slot to outline (e.g. the agent of an ego view), -1 for none.
        figsize, dpi: size of a new figure (inches, dots per inch).
        legend: draw a colour key.

    Returns:
        [H, W, 3] uint8 RGB image.

    Raises:
        IndexError: for a world out of range.
    """
    f = frame_from_env(env, world, trail=trail, extent=extent)
    f.highlight = highlight
    return _image_of(f, ax, figsize, dpi, legend)


class SceneCanvas:
    """A reusable figure for videos: one or two panels (top-down, optionally the ego view).

    Args:
        ego: add a second panel for :func:`render_ego_view`.
        figsize: panel size in inches; dpi: dots per inch.
    """

    def __init__(self, ego: bool = False, figsize: float = 6.0, dpi: int = 100):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        n = 2 if ego else 1
        self.fig = Figure(figsize=(figsize * n, figsize), dpi=dpi, facecolor=COLORS["background"])
        FigureCanvasAgg(self.fig)
        w = 1.0 / n
        self.ax = self.fig.add_axes((0.01 * w, 0.01, 0.98 * w, 0.89))
        self.ego_ax = self.fig.add_axes((w + 0.01 * w, 0.01, 0.98 * w, 0.89)) if ego else None

    def image(self) -> np.ndarray:
        """[H, W, 3] uint8 pixels of the current drawing."""
        return figure_to_array(self.fig)


# ---------------------------------------------------------------------------------------------
# Episodes
# ---------------------------------------------------------------------------------------------
def _has_ffmpeg() -> bool:
    try:
        import imageio_ffmpeg  # noqa: F401
    except Exception:
        return False
    return True


def write_video(frames: list, out, fps: int = 10) -> pathlib.Path:
    """Write [H, W, 3] uint8 frames as an animated GIF, or MP4 when ``out`` ends in ``.mp4``.

    MP4 needs the ``imageio-ffmpeg`` package; without it the frames are written as a GIF next to
    the requested name (``.gif`` suffix) with a warning. GIF frame durations are ``1000 / fps`` ms
    (GIF stores 10 ms units, so 10 fps is exact). Returns the path written.

    Raises:
        ValueError: if there are no frames or ``fps <= 0``.
    """
    import imageio.v3 as iio

    if not frames:
        raise ValueError("write_video: no frames")
    if fps <= 0:
        raise ValueError(f"write_video: fps must be > 0, got {fps}")
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".mp4":
        if _has_ffmpeg():
            _write_mp4(out, frames, fps)
            return out
        warnings.warn("imageio-ffmpeg is not installed: writing a GIF instead of MP4 "
                      "(pip install imageio-ffmpeg for MP4)", stacklevel=2)
        out = out.with_suffix(".gif")
    iio.imwrite(out, np.stack(frames), extension=".gif", duration=1000.0 / fps, loop=0)
    return out


def _write_mp4(out: pathlib.Path, frames: list, fps: int) -> None:
    import imageio

    # libx264 wants even sizes; crop one pixel row/column if needed.
    h, w = frames[0].shape[:2]
    h2, w2 = h - h % 2, w - w % 2
    with imageio.get_writer(out, fps=fps, macro_block_size=1) as wr:
        for fr in frames:
            wr.append_data(np.ascontiguousarray(fr[:h2, :w2]))


def _random_actions(env, generator: torch.Generator | None) -> torch.Tensor:
    W, C = env.num_worlds, env.num_slots
    from gpusim.config import ActionSpace

    if env.config.action_space == ActionSpace.CONTINUOUS:
        return torch.rand((W, C, 2), generator=generator, device="cpu").mul(2).sub(1).to(env.device)
    return torch.randint(0, int(env.num_actions), (W, C), generator=generator, device="cpu").to(env.device)


def render_episode(env, policy: Callable | str = "expert", world: int = 0, steps: int | None = None,
                   out=None, fps: int = 10, seed: int | None = None, trail_length: int = 10,
                   ego_agent: int | None = None, figsize: float = 6.0,
                   dpi: int = 100) -> tuple[list, pathlib.Path | None]:
    """Reset an env, roll it forward and record world ``world`` as a GIF/MP4.

    Args:
        env: a ``DriveEnv``.
        policy: ``"expert"`` (``env.expert_actions()``), ``"random"`` (uniform actions, seeded by
            ``seed``), or a callable ``policy(obs [W, C, D]) -> actions`` ([W, C] int64 discrete
            indices or [W, C, 2] continuous). A stateful policy keeps its own memory; one call to
            ``render_episode`` stays within one episode, so no memory reset is needed in between.
        world: the world drawn (all worlds step).
        steps: env steps to take; default ``env.horizon - 1`` (the step that completes the
            episode auto-resets the env and would show the next episode). Frames written =
            ``steps + 1`` (the first state, then one per step).
        out: output path (``.gif``, or ``.mp4`` with imageio-ffmpeg; see :func:`write_video`);
            None keeps the frames in memory only.
        fps: frames per second of the video.
        seed: passed to ``env.reset`` and used for random actions.
        trail_length: trail positions kept per agent.
        ego_agent: also draw the ego view of this policy slot in a second panel (and outline the
            agent in the top-down view).
        figsize, dpi: panel size (inches, dots per inch).

    Returns:
        (frames, path): the [H, W, 3] uint8 frames and the path written (None without ``out``).

    Raises:
        ValueError: for an unknown policy name, ``steps`` outside ``[0, env.horizon - 1]`` or an
            ``ego_agent`` outside ``[0, env.num_slots)``.
    """
    if isinstance(policy, str) and policy not in ("expert", "random"):
        raise ValueError(f"render_episode: policy must be 'expert', 'random' or a callable, got {policy!r}")
    if steps is None:
        steps = env.horizon - 1
    if not 0 <= steps <= env.horizon - 1:
        raise ValueError(f"render_episode: steps must be in [0, horizon - 1 = {env.horizon - 1}], got {steps}")
    if ego_agent is not None and not 0 <= ego_agent < env.num_slots:
        raise ValueError(f"render_episode: ego_agent must be in [0, {env.num_slots}), got {ego_agent}")
    gen = torch.Generator().manual_seed(0 if seed is None else int(seed))
    obs = env.reset(seed=seed)
    s = int(env.state.scenario[world])
    extent = scene_extent(env.pack, s)
    trail = TrailRecorder(trail_length)
    canvas = SceneCanvas(ego=ego_agent is not None, figsize=figsize, dpi=dpi)
    layout = env.obs_layout if ego_agent is not None else None
    frames = []

    def snap(obs_now):
        f = frame_from_env(env, world, trail=trail, extent=extent)
        if ego_agent is not None:
            f.highlight = ego_agent
        draw_frame(f, canvas.ax)
        if ego_agent is not None:
            render_ego_view(obs_now[world, ego_agent], layout, ax=canvas.ego_ax,
                            title=f"ego view, slot {ego_agent}", partner_radius=env.config.partner_radius,
                            road_radius=env.config.road_radius)
        frames.append(canvas.image())

    snap(obs)
    for _ in range(steps):
        if policy == "expert":
            actions = env.expert_actions()
        elif policy == "random":
            actions = _random_actions(env, gen)
        else:
            actions = policy(obs)
        res = env.step(actions)
        obs = res.obs
        snap(obs)
    path = write_video(frames, out, fps) if out is not None else None
    return frames, path


def render_log_episode(pack, scenario: int = 0, steps: int | None = None, out=None, fps: int = 10,
                       trail_length: int = 10, figsize: float = 6.0, dpi: int = 100) -> tuple[list, pathlib.Path | None]:
    """Video of the logged scenario (every agent follows its log; no env needed).

    Args:
        pack: :class:`gpusim.data.ScenarioPack`. scenario: scenario index.
        steps: log steps after the first; default all (``num_steps - 1 - init_steps``). Frames
            written = ``steps + 1``, starting at log step ``pack.config.init_steps``.
        out, fps, trail_length, figsize, dpi: as :func:`render_episode`.

    Returns:
        (frames, path) as :func:`render_episode`.

    Raises:
        IndexError / ValueError: for a scenario or step count out of range.
    """
    t0 = int(pack.config.init_steps)
    max_steps = pack.num_steps - 1 - t0
    if steps is None:
        steps = max_steps
    if not 0 <= steps <= max_steps:
        raise ValueError(f"render_log_episode: steps must be in [0, {max_steps}], got {steps}")
    extent = scene_extent(pack, scenario)
    trail = TrailRecorder(trail_length)
    canvas = SceneCanvas(figsize=figsize, dpi=dpi)
    frames = []
    for t in range(t0, t0 + steps + 1):
        draw_frame(frame_from_log(pack, scenario, t, trail=trail, extent=extent), canvas.ax)
        frames.append(canvas.image())
    path = write_video(frames, out, fps) if out is not None else None
    return frames, path


# ---------------------------------------------------------------------------------------------
# Ego view
# ---------------------------------------------------------------------------------------------
#: Feature names :func:`decode_ego_observation` needs (base names, before any ``/divisor``).
EGO_NEEDS = ("speed", "length", "width", "goal_x", "goal_y")
PARTNER_NEEDS = ("rel_x", "rel_y", "rel_heading_cos", "rel_heading_sin", "length", "width")
ROAD_NEEDS = ("mid_x", "mid_y", "length", "dir_cos", "dir_sin")
_ROAD_ONEHOT = (("is_lane", int(RoadType.LANE)), ("is_road_line", int(RoadType.ROAD_LINE)),
                ("is_road_edge", int(RoadType.ROAD_EDGE)), ("is_other", int(RoadType.OTHER)))
_AGENT_ONEHOT = (("is_vehicle", int(ObjectType.VEHICLE)), ("is_pedestrian", int(ObjectType.PEDESTRIAN)),
                 ("is_cyclist", int(ObjectType.CYCLIST)))


def _feature_columns(names, block: str, scales: dict) -> dict:
    """Map base feature name -> (column, divisor) from names like ``"speed/20"`` or
    ``"rel_x/partner_radius"`` (symbolic divisors are looked up in ``scales``)."""
    cols = {}
    for i, full in enumerate(names):
        base, _, div = str(full).partition("/")
        if not div:
            d = 1.0
        else:
            try:
                d = float(div)
            except ValueError:
                if div not in scales:
                    raise ValueError(f"observation {block} feature {full!r}: divisor {div!r} is not a number and "
                                     f"not one of the given scales {sorted(scales)}") from None
                d = float(scales[div])
        cols[base] = (i, d)
    return cols


def _need(cols: dict, needed, block: str) -> None:
    missing = [n for n in needed if n not in cols]
    if missing:
        raise ValueError(f"render_ego_view: the ObsLayout's {block} features lack {missing} "
                         f"(have {sorted(cols)}); the renderer finds columns by these names")


def decode_ego_observation(obs: torch.Tensor, layout, partner_radius: float = 50.0,
                           road_radius: float = 50.0) -> dict:
    """Split one agent's observation vector into de-normalised parts in the ego frame (numpy).

    The columns are found by feature *name* in ``layout.ego_features``, ``partner_features`` and
    ``road_features`` (a name is ``"base"`` or ``"base/divisor"``; the divisor is a number or the
    symbol ``partner_radius`` / ``road_radius``, resolved with the arguments, which must match the
    env's ``EnvConfig`` values). Each value is multiplied back by its divisor. Assumptions
    (``gpusim.kernels.observations`` documents them): the ego frame has x ahead, y to the left;
    ``rel_x, rel_y`` are the partner's centre, ``rel_heading_cos/sin`` its heading relative to the
    ego's; a road slot is the segment ``mid +- length/2 * (dir_cos, dir_sin)``; the last feature
    of every partner and road slot is its valid flag.

    Args:
        obs: [D] float tensor (any device), one agent's observation.
        layout: ``ObsLayout`` (``env.obs_layout``).
        partner_radius, road_radius: metres (``EnvConfig.partner_radius`` / ``road_radius``).

    Returns:
        dict with ``ego`` (dict of floats by base name: speed m/s, length/width m, goal_x/goal_y m,
        and the other ego features de-normalised), ``partners`` (dict of [n] arrays for the valid
        slots: x, y (m), heading (rad), speed (m/s), length, width (m), type (ObjectType code or
        -1), slot), ``roads`` (``seg`` [m, 4] x0, y0, x1, y1 in m, ``type`` [m] RoadType code
        lane/road_line/road_edge/other, ``slot``).

    Raises:
        ValueError: if ``obs`` is not 1-D of length ``layout.obs_dim`` or a needed feature name is
            missing from the layout.
    """
    if not isinstance(obs, torch.Tensor) or obs.dim() != 1:
        raise ValueError(f"render_ego_view: obs must be a 1-D [D] tensor, got "
                         f"{tuple(obs.shape) if isinstance(obs, torch.Tensor) else type(obs).__name__}")
    D = layout.ego_dim + layout.num_partners * layout.partner_dim + layout.num_roads * layout.road_dim
    if obs.shape[0] != D:
        raise ValueError(f"render_ego_view: obs has {obs.shape[0]} features, the layout says D = {D}")
    scales = {"partner_radius": float(partner_radius), "road_radius": float(road_radius)}
    v = obs.detach().to("cpu", torch.float64).numpy()
    ego_c = _feature_columns(layout.ego_features, "ego", scales)
    par_c = _feature_columns(layout.partner_features, "partner", scales)
    road_c = _feature_columns(layout.road_features, "road", scales)
    _need(ego_c, EGO_NEEDS, "ego")
    _need(par_c, PARTNER_NEEDS, "partner")
    _need(road_c, ROAD_NEEDS, "road")
    e0 = layout.ego.start if hasattr(layout, "ego") else 0
    p0 = layout.partners.start if hasattr(layout, "partners") else layout.ego_dim
    r0 = layout.roads.start if hasattr(layout, "roads") else p0 + layout.num_partners * layout.partner_dim
    ego_v = v[e0:e0 + layout.ego_dim]
    ego = {name: float(ego_v[i] * d) for name, (i, d) in ego_c.items()}

    P = v[p0:p0 + layout.num_partners * layout.partner_dim].reshape(layout.num_partners, layout.partner_dim)
    pv = P[:, -1] > 0.5
    col = lambda M, cols, n: M[:, cols[n][0]] * cols[n][1]  # noqa: E731
    ptype = np.full(layout.num_partners, -1, np.int64)
    for n, code in _AGENT_ONEHOT:
        if n in par_c:
            ptype[P[:, par_c[n][0]] > 0.5] = code
    partners = {
        "x": col(P, par_c, "rel_x")[pv], "y": col(P, par_c, "rel_y")[pv],
        "heading": np.arctan2(col(P, par_c, "rel_heading_sin"), col(P, par_c, "rel_heading_cos"))[pv],
        "speed": (col(P, par_c, "speed") if "speed" in par_c else np.zeros(len(P)))[pv],
        "length": col(P, par_c, "length")[pv], "width": col(P, par_c, "width")[pv],
        "type": ptype[pv], "slot": np.nonzero(pv)[0],
    }

    Rm = v[r0:r0 + layout.num_roads * layout.road_dim].reshape(layout.num_roads, layout.road_dim)
    rv = Rm[:, -1] > 0.5
    mx, my = col(Rm, road_c, "mid_x"), col(Rm, road_c, "mid_y")
    half = col(Rm, road_c, "length") / 2
    dx, dy = col(Rm, road_c, "dir_cos"), col(Rm, road_c, "dir_sin")
    seg = np.stack([mx - half * dx, my - half * dy, mx + half * dx, my + half * dy], 1)
    rtype = np.full(layout.num_roads, int(RoadType.OTHER), np.int64)
    for n, code in _ROAD_ONEHOT:
        if n in road_c:
            rtype[Rm[:, road_c[n][0]] > 0.5] = code
    roads = {"seg": seg[rv], "type": rtype[rv], "slot": np.nonzero(rv)[0]}
    return {"ego": ego, "partners": partners, "roads": roads}


def _to_screen(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ego frame (x ahead, y left) -> picture coordinates (ahead = up, left = left)."""
    return -np.asarray(y), np.asarray(x)


def render_ego_view(obs: torch.Tensor, layout, ax=None, title: str = "ego view", partner_radius: float = 50.0,
                    road_radius: float = 50.0, figsize: float = 6.0, dpi: int = 100) -> np.ndarray:
    """Draw what one agent observes, from its observation vector alone, in its ego frame.

    The agent sits at the centre pointing **up** (ego +x is up, ego +y, its left, is left).
    Drawn: the observed road segments coloured by type (as in the top-down view), partner slots as
    oriented boxes coloured by type (vehicle grey, pedestrian green, cyclist teal) with their slot
    number, the goal (a blue "+" and dashed circle; an arrow on the border when it lies outside the
    view), a dashed circle of ``partner_radius``, and the ego speed and flags in the title.
    Decoding and its assumptions: :func:`decode_ego_observation` (columns found by feature name).

    Args:
        obs: [D] float tensor, one agent's observation (``obs[w, c]`` of ``env.step``).
        layout: ``ObsLayout`` (``env.obs_layout``).
        ax: draw into this Axes (its whole figure is returned) instead of a new figure.
        title: first title line.
        partner_radius, road_radius: metres, the env's ``EnvConfig`` values (undo the
            normalisation); the view spans ``+-max(partner_radius, road_radius)``.
        figsize, dpi: size of a new figure (inches, dots per inch).

    Returns:
        [H, W, 3] uint8 RGB image.

    Raises:
        ValueError: for a wrongly shaped ``obs`` or a layout without the needed feature names.
    """
    from matplotlib.collections import LineCollection, PolyCollection
    from matplotlib.patches import Circle

    dec = decode_ego_observation(obs, layout, partner_radius, road_radius)
    if ax is None:
        fig = _new_figure(figsize, dpi)
        ax = fig.add_axes((0.01, 0.01, 0.98, 0.89))
    ax.clear()
    ax.set_facecolor(COLORS["background"])
    span = max(float(partner_radius), float(road_radius)) * 1.05
    ego, par, rd = dec["ego"], dec["partners"], dec["roads"]

    # Roads.
    if len(rd["seg"]):
        x0, y0 = _to_screen(rd["seg"][:, 0], rd["seg"][:, 1])
        x1, y1 = _to_screen(rd["seg"][:, 2], rd["seg"][:, 3])
        segs = np.stack([np.stack([x0, y0], 1), np.stack([x1, y1], 1)], 1)
        for code, (ckey, lw, _ls, z) in list(_ROAD_STYLE.items()) + [(int(RoadType.OTHER), _OTHER_ROAD_STYLE)]:
            sel = rd["type"] == code
            if sel.any():
                ax.add_collection(LineCollection(segs[sel], colors=COLORS[ckey], linewidths=lw * 1.3, zorder=z))
    ax.add_patch(Circle((0, 0), partner_radius, fill=False, edgecolor="#bbbbbb", linestyle=(0, (3, 3)),
                        linewidth=0.7, zorder=0))

    # Partners: heading in the picture = ego-frame heading + 90 degrees.
    if len(par["x"]):
        sx, sy = _to_screen(par["x"], par["y"])
        corners = _box_corners(np.stack([sx, sy], 1), par["heading"] + np.pi / 2,
                               np.maximum(par["length"], 0.3), np.maximum(par["width"], 0.3))
        tcol = {int(ObjectType.VEHICLE): COLORS["expert_vehicle"], int(ObjectType.PEDESTRIAN): COLORS["expert_pedestrian"],
                int(ObjectType.CYCLIST): COLORS["expert_cyclist"]}
        cols = [tcol.get(int(t), COLORS["expert_vehicle"]) for t in par["type"]]
        ax.add_collection(PolyCollection(corners, facecolors=cols, edgecolors="#303030", linewidths=0.5, zorder=6))
        for k in range(len(sx)):
            ax.text(sx[k], sy[k] + 1.5 + par["length"][k] / 2, str(int(par["slot"][k])), fontsize=5, ha="center",
                    zorder=9, color="#303030")
        # Heading ticks.
        h = par["heading"] + np.pi / 2
        tips = np.stack([sx + np.cos(h) * par["length"] / 2, sy + np.sin(h) * par["length"] / 2], 1)
        ax.add_collection(LineCollection(np.stack([np.stack([sx, sy], 1), tips], 1), colors="#000000",
                                         linewidths=0.6, zorder=8))

    # Ego box at the origin, pointing up.
    L, Wd = max(ego["length"], 0.5), max(ego["width"], 0.3)
    ego_col = COLORS["collided"] if ego.get("collided", 0) > 0.5 else (
        COLORS["offroad"] if ego.get("offroad", 0) > 0.5 else COLORS["controlled"])
    ax.add_collection(PolyCollection(_box_corners(np.zeros((1, 2)), np.array([np.pi / 2]), np.array([L]),
                                                  np.array([Wd])), facecolors=ego_col, edgecolors="#000000",
                                     linewidths=0.8, zorder=7))
    ax.plot([0, 0], [0, L / 2], color="#000000", linewidth=0.8, zorder=8)

    # Goal.
    gx, gy = _to_screen(ego["goal_x"], ego["goal_y"])
    gx, gy = float(gx), float(gy)
    if max(abs(gx), abs(gy)) <= span:
        ax.add_patch(Circle((gx, gy), 2.0, fill=False, edgecolor=COLORS["goal"], linestyle=(0, (2, 1.5)), zorder=5))
        ax.plot([gx], [gy], marker="+", color=COLORS["goal"], markersize=7, zorder=5)
    else:  # arrow on the border, pointing at the goal
        scale = 0.9 * span / max(abs(gx), abs(gy))
        ax.annotate("", xy=(gx * scale, gy * scale), xytext=(gx * scale * 0.8, gy * scale * 0.8),
                    arrowprops=dict(arrowstyle="->", color=COLORS["goal"], linewidth=1.5), zorder=5)

    ax.set_xlim(-span, span)
    ax.set_ylim(-span, span)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xticks([])
    ax.set_yticks([])
    extra = [f"{k} {ego[k]:.2g}" for k in ("trial_index", "time_in_trial", "last_reward") if k in ego]
    flags = [k for k in ("collided", "offroad") if ego.get(k, 0) > 0.5]
    ax.set_title(f"{title}\nspeed {ego['speed']:.1f} m/s  goal ({ego['goal_x']:.0f}, {ego['goal_y']:.0f}) m  "
                 f"{len(par['x'])} partners  {len(rd['seg'])} roads" + (("  " + " ".join(flags)) if flags else "")
                 + (("\n" + "  ".join(extra)) if extra else ""), fontsize=7)
    return figure_to_array(ax.figure)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
def select_scenario(pack, scenario_id: str):
    """A one-scenario pack holding the scenario ``scenario_id`` of ``pack`` (so a 1-world env runs it).

    ``scenario_id`` matches a pack scenario id exactly, or the stem of its source file.

    Raises:
        KeyError: if no scenario matches; the message lists the ids available.
    """
    ids = list(pack.scenario_ids)
    stems = [pathlib.Path(f).name.split(".json")[0] for f in pack.source_files]
    if scenario_id in ids:
        i = ids.index(scenario_id)
    elif scenario_id in stems:
        i = stems.index(scenario_id)
    else:
        raise KeyError(f"scenario {scenario_id!r} is not in the data; available: {', '.join(ids)}")
    sl = slice(i, i + 1)
    return dataclasses.replace(pack, scenario_ids=[ids[i]], source_files=[pack.source_files[i]],
                               **{k: v[sl] for k, v in pack.tensors().items()})


def _load_data(data: str, scenario: str | None, data_config):
    """Pack for the CLI: a saved pack (``pack.pt`` directory / ``.pt`` file) or WOMD JSON (a file
    or a directory; when ``scenario`` names a file stem in the directory only that file is
    converted)."""
    from gpusim.data import ScenarioPack

    path = pathlib.Path(data)
    if not path.exists():
        raise FileNotFoundError(f"--data {data}: no such file or directory")
    if path.suffix == ".pt" or (path.is_dir() and (path / "pack.pt").exists()):
        pack = ScenarioPack.load(path)
    else:
        src = path
        if path.is_dir() and scenario is not None:
            hits = sorted(c for c in path.iterdir() if c.name.split(".json")[0] == scenario)
            if hits:
                src = hits[0]
        pack = ScenarioPack.from_json(src, data_config)
    if scenario is not None:
        pack = select_scenario(pack, scenario)
    return pack


def _parse_overrides(items) -> dict:
    out = {}
    for it in items or []:
        key, sep, val = it.partition("=")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {it!r}")
        v: object = val
        for conv in (int, float):
            try:
                v = conv(val)
                break
            except ValueError:
                pass
        if val.lower() in ("true", "false"):
            v = val.lower() == "true"
        if val.lower() == "none":
            v = None
        out[key.strip()] = v
    return out


def checkpoint_policy(path, env, deterministic: bool = True) -> Callable:
    """A ``policy(obs) -> actions`` callable driven by a training checkpoint (``train/checkpoint.py``).

    The actor-critic is rebuilt from the checkpoint's description and weights and run step by step
    with its KV cache (one slot per world and policy slot, ``env.horizon`` steps), passing the
    env's ``removed`` flags as in training; memory is cleared where a slot's episode ended.

    Args:
        path: checkpoint file. env: the env it will drive (its observation size and action count
            must match the checkpoint's). deterministic: argmax / mean actions instead of sampling.

    Raises:
        RuntimeError: if the trainer packages (``policy``, ``train.checkpoint``) are not importable.
        FileNotFoundError / ValueError: from ``train.checkpoint.load_checkpoint``; ValueError when the
            checkpoint's observation size or action count differ from the env's.
    """
    try:
        from policy.actor_critic import ActorCritic
        from train.checkpoint import load_checkpoint
    except ImportError as e:  # pragma: no cover - depends on the tree
        raise RuntimeError(f"--checkpoint needs the trainer packages policy/ and train/checkpoint.py: {e}") from e
    ck = load_checkpoint(path, map_location="cpu")
    pol = ActorCritic.from_description(ck["policy"])
    pol.load_state_dict(ck["model"])
    pol = pol.to(env.device).eval()
    D = getattr(pol.dims, "obs_dim", None)
    if D is not None and int(D) != env.obs_dim:
        raise ValueError(f"checkpoint {path}: policy expects {D} observation features, env gives {env.obs_dim}")
    if int(pol.num_actions) != int(env.num_actions):
        raise ValueError(f"checkpoint {path}: policy has {pol.num_actions} actions, env {env.num_actions}")
    W, C = env.num_worlds, env.num_slots
    cache = pol.init_cache(W * C, env.horizon, env.device)

    @torch.no_grad()
    def act(obs: torch.Tensor) -> torch.Tensor:
        nonlocal cache
        removed = env.state.removed[:, :C].reshape(-1)
        logits, _value, cache = pol.forward_eval(obs.reshape(W * C, -1), cache, removed)
        a = pol.sample(logits, deterministic)
        return a.reshape(W, C, *a.shape[1:])

    return act


def env_config_from_checkpoint(path):
    """The :class:`~gpusim.config.EnvConfig` saved in a training checkpoint (unknown keys ignored)."""
    from gpusim.config import EnvConfig

    try:
        from train.checkpoint import load_checkpoint
    except ImportError as e:  # pragma: no cover - depends on the tree
        raise RuntimeError(f"--checkpoint needs train/checkpoint.py: {e}") from e
    d = load_checkpoint(path, map_location="cpu")["env_config"]
    names = {f.name for f in dataclasses.fields(EnvConfig)}
    return EnvConfig(**{k: v for k, v in d.items() if k in names})


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m gpusim.render`` argument parser."""
    p = argparse.ArgumentParser(
        prog="python -m gpusim.render",
        description="Render a WOMD scenario top-down: the log, or a rollout driven by expert actions, "
                    "random actions or a trained checkpoint; optionally with one agent's ego view.")
    p.add_argument("--data", required=True, help="WOMD JSON file/directory, or a saved pack (dir with pack.pt / .pt)")
    p.add_argument("--scenario", default=None, help="scenario id or file stem (default: the first scenario)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--checkpoint", default=None, help="training checkpoint (train/checkpoint.py) driving the agents")
    mode.add_argument("--expert", action="store_true", help="drive controlled agents with env.expert_actions() (default)")
    mode.add_argument("--random", action="store_true", help="uniformly random actions")
    mode.add_argument("--log", action="store_true", help="replay the log itself (no env)")
    p.add_argument("--out", required=True, help="output: .gif, .mp4 (needs imageio-ffmpeg), or .png (one frame)")
    p.add_argument("--steps", type=int, default=None,
                   help="steps to run (video: default the whole episode; .png: the frame after N steps, default 0)")
    p.add_argument("--ego-view", action="store_true", help="add the ego view of agent --agent (env modes)")
    p.add_argument("--agent", type=int, default=0, help="policy slot for --ego-view (default 0)")
    p.add_argument("--fps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", type=float, default=6.0, help="panel size in inches (x dpi = pixels)")
    p.add_argument("--dpi", type=int, default=100)
    p.add_argument("--sample", action="store_true", help="--checkpoint: sample actions instead of argmax")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                   help="EnvConfig override, repeatable (e.g. --set goal_behavior=stop)")
    return p


def main(argv=None) -> int:
    """Command line: ``python -m gpusim.render --data DIR --scenario ID [--checkpoint C | --expert |
    --random | --log] --out FILE [--ego-view --agent K] [--steps N]``.

    Returns 0 on success; prints a one-line error and returns 2 for bad input (missing data or
    scenario, unusable checkpoint, bad arguments).
    """
    args = build_parser().parse_args(argv)
    from gpusim.config import EnvConfig

    out = pathlib.Path(args.out)
    still = out.suffix.lower() == ".png"
    try:
        if args.checkpoint:
            cfg = env_config_from_checkpoint(args.checkpoint)
            cfg = cfg.replace(**_parse_overrides(args.set)) if args.set else cfg
        else:
            cfg = EnvConfig(**_parse_overrides(args.set))
        pack = _load_data(args.data, args.scenario, cfg.data_config())
        if args.log:
            if args.ego_view:
                raise ValueError("--ego-view needs an env mode (--expert, --random or --checkpoint), not --log")
            if still:
                t = pack.config.init_steps + (args.steps or 0)
                img = render_log_frame(pack, 0, t, figsize=args.size, dpi=args.dpi)
                _write_png(out, img)
            else:
                _, out = render_log_episode(pack, 0, steps=args.steps, out=out, fps=args.fps, figsize=args.size,
                                            dpi=args.dpi)
            print(f"wrote {out}")
            return 0
        from gpusim.env import DriveEnv

        env = DriveEnv(pack, 1, config=cfg, device="cpu", seed=args.seed)
        if args.checkpoint:
            policy = checkpoint_policy(args.checkpoint, env, deterministic=not args.sample)
        else:
            policy = "random" if args.random else "expert"
        ego = args.agent if args.ego_view else None
        if still:
            frames, _ = render_episode(env, policy, steps=args.steps or 0, out=None, seed=args.seed, ego_agent=ego,
                                       figsize=args.size, dpi=args.dpi)
            _write_png(out, frames[-1])
        else:
            _, out = render_episode(env, policy, steps=args.steps, out=out, fps=args.fps, seed=args.seed,
                                    ego_agent=ego, figsize=args.size, dpi=args.dpi)
        print(f"wrote {out}")
        return 0
    except (FileNotFoundError, KeyError, ValueError, RuntimeError, IndexError, ImportError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"gpusim.render: error: {msg}", file=sys.stderr)
        return 2


def _write_png(out: pathlib.Path, img: np.ndarray) -> None:
    import imageio.v3 as iio

    out.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(out, img)


if __name__ == "__main__":
    sys.exit(main())
