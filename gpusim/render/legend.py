"""The in-image legend of top-down frames: :func:`legend_entries` (what a frame shows) and
:func:`draw_legend` (a matplotlib legend of those entries in the frame's corner).

Only the entries present in the frame are listed (an ego, a co-player, each expert type, goals,
reached goals, memory-task candidates, each signal colour and arrow / flashing shapes, and the
status marks collided / offroad / earlier contact / stopped / removed / ego-view agent), so a
frame's legend stays short and never names something the picture does not have. Roads are drawn
in fixed colours (docs/render.md) and are not listed. The fill of an agent comes from
:func:`agent_color_keys`, which the drawing uses too, so a legend patch always has the colour of
the boxes it names.

Part of :mod:`gpusim.render` (see the package docstring).
"""

from __future__ import annotations

import numpy as np

from gpusim.config import ObjectType
from gpusim.render.frame import COLORS, FrameData

#: Legend label of every entry key (role fills, goals, signals, status marks), in legend order.
LEGEND_LABELS = {
    "sdc": "ego: self-driving car",
    "controlled": "ego (controlled)",
    "coplayer": "co-player (partner policy)",
    "expert_vehicle": "expert vehicle (log replay)",
    "expert_pedestrian": "expert pedestrian (log replay)",
    "expert_cyclist": "expert cyclist (log replay)",
    "goal": "goal",
    "goal_reached": "goal reached",
    "candidate": "goal candidate (memory task)",
    "signal_stop": "signal: stop",
    "signal_caution": "signal: caution",
    "signal_go": "signal: go",
    "signal_unknown": "signal: unknown",
    "signal_arrow": "arrow signal",
    "signal_flashing": "flashing signal",
    "collided": "collided now",
    "offroad": "offroad now",
    "contact_earlier": "contact earlier",
    "stopped": "stopped",
    "removed": "removed (last pose)",
    "highlight": "ego-view agent",
}

#: Signal state code -> colour key (unknown / red / yellow / green, as the observation's groups).
SIGNAL_COLOR_KEYS = {0: "signal_unknown", 1: "signal_stop", 2: "signal_caution", 3: "signal_go", 4: "signal_stop",
                     5: "signal_caution", 6: "signal_go", 7: "signal_stop", 8: "signal_caution"}
#: Arrow (triangle marker) and flashing (hollow marker) signal state codes.
ARROW_STATES, FLASHING_STATES = (1, 2, 3), (7, 8)


def agent_color_keys(f: FrameData) -> list[str]:
    """The :data:`~gpusim.render.frame.COLORS` key of every agent slot's fill ([A] strings): the
    current status (``collided``, ``offroad``) over the role (``coplayer``, ``sdc``,
    ``controlled``, ``expert_pedestrian``, ``expert_cyclist``, ``expert_vehicle``)."""
    keys = []
    for a in range(len(f.pos)):
        if f.collided[a]:
            keys.append("collided")
        elif f.offroad[a]:
            keys.append("offroad")
        elif f.controlled[a] and f.coplayer is not None and f.coplayer[a]:
            keys.append("coplayer")
        elif f.controlled[a]:
            keys.append("sdc" if f.sdc[a] else "controlled")
        elif f.agent_type[a] == int(ObjectType.PEDESTRIAN):
            keys.append("expert_pedestrian")
        elif f.agent_type[a] == int(ObjectType.CYCLIST):
            keys.append("expert_cyclist")
        else:
            keys.append("expert_vehicle")
    return keys


#: Outline of an agent box by :func:`agent_edge_keys` key: (colour, line width in points).
EDGE_STYLE = {
    "collided_offroad": (COLORS["offroad"], 1.6),  # red fill (collided now) with an orange outline
    "stopped": ("#000000", 1.6),
    "collided_earlier": (COLORS["collided"], 1.6),
    "offroad_earlier": (COLORS["offroad"], 1.6),
    "plain": ("#303030", 0.5),
}


def agent_edge_keys(f: FrameData) -> list[str]:
    """The :data:`EDGE_STYLE` key of every agent slot's outline ([A] strings), first match wins:
    collided and offroad now, stopped, collided earlier (not now), offroad earlier (not now), plain."""
    A = len(f.pos)
    ever_c = f.ever_collided if f.ever_collided is not None else np.zeros(A, bool)
    ever_o = f.ever_offroad if f.ever_offroad is not None else np.zeros(A, bool)
    keys = []
    for a in range(A):
        if f.collided[a] and f.offroad[a]:
            keys.append("collided_offroad")
        elif f.stopped[a]:
            keys.append("stopped")
        elif ever_c[a] and not f.collided[a]:
            keys.append("collided_earlier")
        elif ever_o[a] and not f.offroad[a]:
            keys.append("offroad_earlier")
        else:
            keys.append("plain")
    return keys


def _ghosts(f: FrameData) -> np.ndarray:
    """[A] bool removed agents drawn as a dashed outline (last pose known)."""
    if f.ghost_pos is None:
        return np.zeros(len(f.pos), bool)
    return f.removed & np.isfinite(f.ghost_pos).all(1)


def legend_entries(f: FrameData) -> list[str]:
    """Keys of :data:`LEGEND_LABELS` for what frame ``f`` draws, in legend order.

    An agent role counts when a visible box or a removed agent's outline has its colour; goals
    count for the controlled agents whose goal is drawn (reached ones as ``goal_reached``); a
    signal colour when a stop point is in that state, plus ``signal_arrow`` / ``signal_flashing``
    when such a state is shown; status marks when a visible agent carries them (``offroad now``
    also for the orange outline of a box collided and offroad at once, ``contact earlier`` for
    the outlines of :func:`agent_edge_keys`, ``stopped`` for hatched boxes).
    """
    present = set()
    keys = agent_color_keys(f)
    ghosts = _ghosts(f)
    for a in np.nonzero(f.visible | ghosts)[0]:
        present.add(keys[a])
    gsel = f.controlled & (f.visible | f.removed | f.goal_reached) & np.isfinite(f.goal).all(1)
    if (gsel & ~f.goal_reached).any():
        present.add("goal")
    if (gsel & f.goal_reached).any():
        present.add("goal_reached")
    if f.candidates is not None and f.controlled[: f.candidates.shape[0]].any():
        present.add("candidate")
    if f.signal_state is not None and len(f.signal_state):
        codes = [int(c) for c in f.signal_state]
        present.update(SIGNAL_COLOR_KEYS.get(c, "signal_unknown") for c in codes)
        if any(c in ARROW_STATES for c in codes):
            present.add("signal_arrow")
        if any(c in FLASHING_STATES for c in codes):
            present.add("signal_flashing")
    edges = {e for e, v in zip(agent_edge_keys(f), f.visible) if v}
    if "collided_offroad" in edges:
        present.add("offroad")  # the orange outline of a red box
    if edges & {"collided_earlier", "offroad_earlier"}:
        present.add("contact_earlier")
    if (f.visible & f.stopped).any():
        present.add("stopped")
    if ghosts.any():
        present.add("removed")
    if 0 <= f.highlight < len(f.pos) and f.visible[f.highlight]:
        present.add("highlight")
    return [k for k in LEGEND_LABELS if k in present]


def _handle(key: str):
    """A matplotlib legend handle drawn like the frame draws ``key``."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    label = LEGEND_LABELS[key]
    if key in ("goal", "goal_reached", "candidate"):
        col = COLORS[key]
        return Line2D([], [], color=col, marker="o", markerfacecolor="none", markersize=7, linestyle="none",
                      markeredgewidth=0.9, label=label)
    if key.startswith("signal_"):
        grey = COLORS["signal_unknown"]
        if key == "signal_arrow":
            return Line2D([], [], color=grey, marker=(3, 0, 0.0), linestyle="none", label=label)
        if key == "signal_flashing":
            return Line2D([], [], color=grey, marker="o", markerfacecolor="none", linestyle="none", label=label)
        return Line2D([], [], color=COLORS[key], marker="o", linewidth=2.2, label=label)
    if key == "contact_earlier":  # a red outline (collided earlier); orange for offroad earlier
        return Patch(facecolor=COLORS["controlled"], edgecolor=COLORS["collided"], linewidth=1.6, label=label)
    if key == "stopped":
        return Patch(facecolor=COLORS["controlled"], edgecolor="#000000", hatch="///", linewidth=1.2, label=label)
    if key == "removed":
        return Patch(facecolor="none", edgecolor=COLORS["controlled"], linestyle="dashed", label=label)
    if key == "highlight":
        return Patch(facecolor="none", edgecolor=COLORS["highlight"], linewidth=1.5, label=label)
    return Patch(facecolor=COLORS[key], edgecolor="#303030", linewidth=0.5, label=label)


#: Legend positions tried by :func:`quiet_corner`, in order of preference (ties keep the first).
CORNERS = ("lower left", "upper left", "lower right", "upper right")


def quiet_corner(points: np.ndarray, extent: tuple, box: tuple = (0.5, 0.3)) -> str:
    """The corner of the view that covers the fewest ``points``, as a matplotlib legend ``loc``.

    Args:
        points: [N, 2] positions (m; non-finite rows ignored), e.g. agent centres and goals.
        extent: (xmin, xmax, ymin, ymax) of the view (m).
        box: the corner box's width and height as fractions of the view (about the legend's size).

    Returns:
        One of :data:`CORNERS` (the first of them on a tie, so an empty view gets ``lower left``).
    """
    xmin, xmax, ymin, ymax = extent
    pts = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    pts = pts[np.isfinite(pts).all(1)]
    u = (pts[:, 0] - xmin) / max(xmax - xmin, 1e-9)
    v = (pts[:, 1] - ymin) / max(ymax - ymin, 1e-9)
    inside = (u >= 0) & (u <= 1) & (v >= 0) & (v <= 1)
    left, right, low, high = u <= box[0], u >= 1 - box[0], v <= box[1], v >= 1 - box[1]
    counts = [int((inside & a & b).sum()) for a, b in ((left, low), (left, high), (right, low), (right, high))]
    return CORNERS[int(np.argmin(counts))]


def frame_points(f: FrameData) -> np.ndarray:
    """[N, 2] what a legend should not cover in frame ``f``: visible agents and controlled goals."""
    pts = [f.pos[f.visible], f.goal[f.controlled]]
    if f.signal_pos is not None:
        pts.append(f.signal_pos)
    return np.concatenate([np.asarray(p, np.float64).reshape(-1, 2) for p in pts], 0)


def draw_legend(ax, f: FrameData, loc: str | None = None):
    """Add the legend of :func:`legend_entries` to ``ax``: semi-transparent, in ``loc`` (default
    the corner :func:`quiet_corner` finds for the frame's agents, goals and signals; a video passes
    one corner for all its frames), font scaled with the axes height (about 7.5 pt on the default
    6-inch panel), two columns above six entries.

    Returns:
        The matplotlib ``Legend``, or None when the frame shows nothing to list.
    """
    keys = legend_entries(f)
    if not keys:
        return None
    if loc is None:
        loc = quiet_corner(frame_points(f), f.extent)
    height_in = ax.get_position().height * ax.figure.get_size_inches()[1]
    size = float(np.clip(1.4 * height_in, 4.0, 8.0))
    return ax.legend(handles=[_handle(k) for k in keys], loc=loc, fontsize=size, framealpha=0.85,
                     ncol=2 if len(keys) > 6 else 1, handlelength=1.4, borderpad=0.4, labelspacing=0.3,
                     columnspacing=0.8)
