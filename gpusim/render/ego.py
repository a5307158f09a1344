"""The ego view: :func:`decode_ego_observation` reads one agent's observation vector back into ego-frame
geometry (columns found by feature name) and :func:`render_ego_view` draws it.

Part of :mod:`gpusim.render` (see the package docstring); split out of the former single module
without behaviour change.
"""

from __future__ import annotations

import numpy as np
import torch
from einops import rearrange

from gpusim.config import ObjectType, RoadType
from gpusim.render.draw import box_corners, figure_to_array, new_figure
from gpusim.render.frame import COLORS, OTHER_ROAD_STYLE, ROAD_STYLE


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
    D = layout.obs_dim  # every block; the signal, style and candidate blocks are not drawn here
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
    ego_v = v[layout.ego]
    ego = {name: float(ego_v[i] * d) for name, (i, d) in ego_c.items()}

    P = rearrange(v[layout.partners], "(p f) -> p f", p=layout.num_partners)
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

    Rm = rearrange(v[layout.roads], "(k f) -> k f", k=layout.num_roads)
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
    dec = decode_ego_observation(obs, layout, partner_radius, road_radius)
    if ax is None:
        fig = new_figure(figsize, dpi)
        ax = fig.add_axes((0.01, 0.01, 0.98, 0.89))
    ax.clear()
    ax.set_facecolor(COLORS["background"])
    span = max(float(partner_radius), float(road_radius)) * 1.05
    ego, par, rd = dec["ego"], dec["partners"], dec["roads"]
    _draw_roads(ax, rd)
    _draw_partner_ring(ax, partner_radius)
    _draw_partners(ax, par)
    _draw_ego(ax, ego)
    _draw_goal(ax, ego, span)
    _finish_ego_axes(ax, span, title, ego, par, rd)
    return figure_to_array(ax.figure)


def _draw_roads(ax, rd: dict) -> None:
    """Road segments (``rd`` as ``decode_ego_observation``'s ``roads``), coloured by type as in the
    top-down view (one LineCollection per type present, lines 1.3x as wide)."""
    from matplotlib.collections import LineCollection

    if not len(rd["seg"]):
        return
    x0, y0 = _to_screen(rd["seg"][:, 0], rd["seg"][:, 1])
    x1, y1 = _to_screen(rd["seg"][:, 2], rd["seg"][:, 3])
    segs = np.stack([np.stack([x0, y0], 1), np.stack([x1, y1], 1)], 1)
    for code, (ckey, lw, _ls, z) in list(ROAD_STYLE.items()) + [(int(RoadType.OTHER), OTHER_ROAD_STYLE)]:
        sel = rd["type"] == code
        if sel.any():
            ax.add_collection(LineCollection(segs[sel], colors=COLORS[ckey], linewidths=lw * 1.3, zorder=z))


def _draw_partner_ring(ax, partner_radius: float) -> None:
    """Dashed grey circle of radius ``partner_radius`` (m) around the ego."""
    from matplotlib.patches import Circle

    ax.add_patch(Circle((0, 0), partner_radius, fill=False, edgecolor="#bbbbbb", linestyle=(0, (3, 3)),
                        linewidth=0.7, zorder=0))


def _draw_partners(ax, par: dict) -> None:
    """Partner boxes coloured by type, with slot numbers and heading ticks (``par`` as
    ``decode_ego_observation``'s ``partners``). Heading in the picture = ego-frame heading + 90 degrees."""
    from matplotlib.collections import LineCollection, PolyCollection

    if not len(par["x"]):
        return
    sx, sy = _to_screen(par["x"], par["y"])
    corners = box_corners(np.stack([sx, sy], 1), par["heading"] + np.pi / 2,
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


def _draw_ego(ax, ego: dict) -> None:
    """The ego box at the origin, pointing up (collided / offroad / controlled colour), with a heading tick."""
    from matplotlib.collections import PolyCollection

    L, Wd = max(ego["length"], 0.5), max(ego["width"], 0.3)
    ego_col = COLORS["collided"] if ego.get("collided", 0) > 0.5 else (
        COLORS["offroad"] if ego.get("offroad", 0) > 0.5 else COLORS["controlled"])
    ax.add_collection(PolyCollection(box_corners(np.zeros((1, 2)), np.array([np.pi / 2]), np.array([L]),
                                                 np.array([Wd])), facecolors=ego_col, edgecolors="#000000",
                                     linewidths=0.8, zorder=7))
    ax.plot([0, 0], [0, L / 2], color="#000000", linewidth=0.8, zorder=8)


def _draw_goal(ax, ego: dict, span: float) -> None:
    """The goal: a "+" and dashed 2 m circle inside the view (half-width ``span``, m), else an arrow
    on the border pointing at it."""
    from matplotlib.patches import Circle

    gx, gy = _to_screen(ego["goal_x"], ego["goal_y"])
    gx, gy = float(gx), float(gy)
    if max(abs(gx), abs(gy)) <= span:
        ax.add_patch(Circle((gx, gy), 2.0, fill=False, edgecolor=COLORS["goal"], linestyle=(0, (2, 1.5)), zorder=5))
        ax.plot([gx], [gy], marker="+", color=COLORS["goal"], markersize=7, zorder=5)
    else:  # arrow on the border, pointing at the goal
        scale = 0.9 * span / max(abs(gx), abs(gy))
        ax.annotate("", xy=(gx * scale, gy * scale), xytext=(gx * scale * 0.8, gy * scale * 0.8),
                    arrowprops=dict(arrowstyle="->", color=COLORS["goal"], linewidth=1.5), zorder=5)


def _finish_ego_axes(ax, span: float, title: str, ego: dict, par: dict, rd: dict) -> None:
    """Limits ``+-span`` (m), equal aspect, no ticks, and the title: ``title``, then ego speed, goal,
    partner and road counts and set flags, then any trial features present."""
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
