"""Drawing frames with matplotlib (Agg canvas, no pyplot): roads, traffic signals (stop line and
marker in the state's colour), agents, goals, trails, legend;
:func:`render_log_frame`, :func:`render_frame` and the reusable :class:`SceneCanvas`.

Part of :mod:`gpusim.render` (see the package docstring); split out of the former single module
without behaviour change.
"""

from __future__ import annotations

import numpy as np

from gpusim.render.frame import (
    COLORS, OTHER_ROAD_STYLE, ROAD_STYLE, FrameData, TrailRecorder, frame_from_env, frame_from_log,
)
from gpusim.render.legend import (
    ARROW_STATES, EDGE_STYLE, FLASHING_STATES, SIGNAL_COLOR_KEYS, agent_color_keys, agent_edge_keys, draw_legend,
)


def box_corners(pos: np.ndarray, heading: np.ndarray, length: np.ndarray, width: np.ndarray) -> np.ndarray:
    """[N, 4, 2] float corners (m) of oriented boxes (front-left, front-right, rear-right, rear-left).

    Args:
        pos: [N, 2] centres (m). heading: [N] (rad, CCW from +x). length, width: [N] box size (m).
    """
    c, s = np.cos(heading), np.sin(heading)
    fx, fy = c * length / 2, s * length / 2  # half-length along the heading
    lx, ly = -s * width / 2, c * width / 2  # half-width to the left
    x, y = pos[:, 0], pos[:, 1]
    xs = np.stack([x + fx + lx, x + fx - lx, x - fx - lx, x - fx + lx], 1)
    ys = np.stack([y + fy + ly, y + fy - ly, y - fy - ly, y - fy + ly], 1)
    return np.stack([xs, ys], -1)


def new_figure(figsize: float, dpi: int):
    """A square ``figsize``-inch matplotlib Figure at ``dpi`` with its own Agg canvas (no pyplot)."""
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
    known = list(ROAD_STYLE)
    groups = [(code, ROAD_STYLE[code]) for code in known] + [(None, OTHER_ROAD_STYLE)]
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


def _draw_agents(ax, f: FrameData) -> None:
    from matplotlib.collections import LineCollection, PolyCollection
    from matplotlib.patches import Circle

    cols = np.array([COLORS[k] for k in agent_color_keys(f)], dtype=object)
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
    # Candidate goals of the memory task (the true one is also drawn as the goal above).
    if f.candidates is not None:
        for c in np.nonzero(f.controlled[: f.candidates.shape[0]])[0]:
            for g in f.candidates[c]:
                ax.add_patch(Circle(tuple(g), f.goal_radius, fill=False, edgecolor=COLORS["candidate"],
                                    linewidth=0.8, linestyle=(0, (1, 1)), zorder=5))
    # Visible agents: filled boxes, stopped ones hatched.
    if vis.any():
        idx = np.nonzero(vis)[0]
        corners = box_corners(f.pos[idx], f.heading[idx], f.length[idx], f.width[idx])
        edge_keys = agent_edge_keys(f)
        edge = [EDGE_STYLE[edge_keys[a]][0] for a in idx]
        lws = [EDGE_STYLE[edge_keys[a]][1] for a in idx]
        ax.add_collection(PolyCollection(corners, facecolors=list(cols[idx]), edgecolors=edge, linewidths=lws,
                                         zorder=6))
        st = [a for a in idx if f.stopped[a]]
        if st:
            ax.add_collection(PolyCollection(box_corners(f.pos[st], f.heading[st], f.length[st], f.width[st]),
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
            corners = box_corners(f.ghost_pos[idx], f.ghost_heading[idx], f.length[idx], f.width[idx])
            ax.add_collection(PolyCollection(corners, facecolors="none", edgecolors=list(cols[idx]), linewidths=0.9,
                                             linestyles="dashed", zorder=6))
    if 0 <= f.highlight < len(f.pos) and (f.visible[f.highlight]):
        h = f.highlight
        corners = box_corners(f.pos[[h]], f.heading[[h]], f.length[[h]] + 1.5, f.width[[h]] + 1.5)
        ax.add_collection(PolyCollection(corners, facecolors="none", edgecolors=COLORS["highlight"], linewidths=1.5,
                                         zorder=9))


def _draw_signals(ax, f: FrameData) -> None:
    """Traffic signals: the stop line (3.5 m across the lane) in the state's colour and a marker at
    the stop point (circle; triangle pointing along the lane for an arrow state; hollow when
    flashing)."""
    if f.signal_pos is None or len(f.signal_pos) == 0:
        return
    from matplotlib.collections import LineCollection

    cols = [COLORS[SIGNAL_COLOR_KEYS.get(int(c), "signal_unknown")] for c in f.signal_state]
    perp = np.stack([-f.signal_dir[:, 1], f.signal_dir[:, 0]], 1) * 1.75
    lines = np.stack([f.signal_pos - perp, f.signal_pos + perp], 1)
    ax.add_collection(LineCollection(lines, colors=cols, linewidths=2.2, zorder=6))
    for p, d, c, code in zip(f.signal_pos, f.signal_dir, cols, f.signal_state):
        arrow, flashing = int(code) in ARROW_STATES, int(code) in FLASHING_STATES
        marker = (3, 0, float(np.degrees(np.arctan2(d[1], d[0]))) - 90.0) if arrow else "o"
        ax.plot([p[0]], [p[1]], marker=marker, markersize=4.5, color=c, markerfacecolor="none" if flashing else c,
                markeredgewidth=1.0, linestyle="none", zorder=7)


def draw_frame(f: FrameData, ax, legend: bool = False, legend_loc: str | None = None) -> None:
    """Draw a :class:`FrameData` into a matplotlib ``Axes`` (cleared first); ``legend`` adds the
    in-image legend of what the frame shows (:func:`gpusim.render.legend.draw_legend`), in corner
    ``legend_loc`` (default: the frame's least crowded corner)."""
    ax.clear()
    ax.set_facecolor(COLORS["background"])
    _draw_roads(ax, f.road_seg, f.road_type, f.extent)
    _draw_signals(ax, f)
    _draw_agents(ax, f)
    xmin, xmax, ymin, ymax = f.extent
    ax.set_xlim(xmin, xmax)
    ax.set_ylim(ymin, ymax)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xticks([])
    ax.set_yticks([])
    if f.title:
        ax.set_title(f.title, fontsize=7)
    draw_scale_bar(ax, f.extent)
    if legend:
        draw_legend(ax, f, legend_loc)


def scale_bar_length(span: float, fraction: float = 0.2) -> float:
    """The scale bar's length in metres for a view ``span`` metres wide: the largest 1, 2 or 5
    times a power of ten that is at most ``fraction`` of the span (a span of 100 m gives 20 m,
    of 240 m gives 20 m, of 300 m gives 50 m). Raises ValueError for a span that is not > 0."""
    if not span > 0 or not np.isfinite(span):
        raise ValueError(f"scale_bar_length: span must be a finite number > 0 (m), got {span}")
    target = fraction * span
    power = 10.0 ** np.floor(np.log10(target))
    return float(max(m * power for m in (1.0, 2.0, 5.0) if m * power <= target))


def draw_scale_bar(ax, extent: tuple) -> None:
    """A metre scale bar at the bottom centre of a top-down view: a line of
    :func:`scale_bar_length` metres and its label (``"20 m"``). extent: (xmin, xmax, ymin, ymax) in
    metres, the view's limits."""
    xmin, xmax, ymin, ymax = extent
    length = scale_bar_length(xmax - xmin)
    x0 = 0.5 * (xmin + xmax) - 0.5 * length
    y0 = ymin + 0.03 * (ymax - ymin)
    ax.plot([x0, x0 + length], [y0, y0], color=COLORS["road_edge"], linewidth=2.0, solid_capstyle="butt",
            zorder=10)
    ax.text(x0 + 0.5 * length, y0 + 0.01 * (ymax - ymin), f"{length:g} m", ha="center", va="bottom", fontsize=6,
            color=COLORS["road_edge"], zorder=10,
            bbox={"facecolor": COLORS["background"], "edgecolor": "none", "pad": 1.0, "alpha": 0.8})


def _image_of(f: FrameData, ax, figsize: float, dpi: int, legend: bool = True) -> np.ndarray:
    if ax is None:
        fig = new_figure(figsize, dpi)
        ax = fig.add_axes((0.01, 0.01, 0.98, 0.89))
    draw_frame(f, ax, legend)
    return figure_to_array(ax.figure)


def render_log_frame(pack, scenario: int = 0, t: int = 0, ax=None, trail: TrailRecorder | None = None,
                     extent: tuple | None = None, figsize: float = 6.0, dpi: int = 100,
                     legend: bool = True) -> np.ndarray:
    """Picture of the logged scene of ``scenario`` at log step ``t`` (no env needed).

    Args:
        pack: :class:`gpusim.data.ScenarioPack` (any device).
        scenario: scenario index. t: log step in ``[0, 91)``.
        ax: draw into this Axes (its whole figure is returned) instead of a new figure.
        trail: a :class:`TrailRecorder`, updated with this frame and drawn.
        extent: (xmin, xmax, ymin, ymax) in metres; default :func:`scene_extent`.
        figsize, dpi: size of a new figure (inches, dots per inch): the image is
            ``round(figsize * dpi)`` pixels square.
        legend: draw the in-image legend of what the frame shows (docs/render.md).

    Returns:
        [H, W, 3] uint8 RGB image.

    Raises:
        IndexError: for a scenario or step out of range.
    """
    return _image_of(frame_from_log(pack, scenario, t, trail=trail, extent=extent), ax, figsize, dpi, legend)


def render_frame(env, world: int = 0, ax=None, trail: TrailRecorder | None = None, extent: tuple | None = None,
                 highlight: int = -1, figsize: float = 6.0, dpi: int = 100, legend: bool = True,
                 partner: str = "") -> np.ndarray:
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
        legend: draw the in-image legend of what the frame shows (docs/render.md).
        partner: name of the partner policy driving the world's co-players (shown in the title;
            co-players are coloured apart from the egos whenever the env has co-players).

    Returns:
        [H, W, 3] uint8 RGB image.

    Raises:
        IndexError: for a world out of range.
    """
    f = frame_from_env(env, world, trail=trail, extent=extent, partner=partner)
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
