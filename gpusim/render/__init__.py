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
  (the env keeps no history);
* an in-image legend listing what the frame shows (:func:`legend_entries`; on by default,
  ``legend=False`` or ``--no-legend`` leaves it out).

Entry points: :func:`render_log_frame` (a logged scene, needs only a :class:`ScenarioPack`),
:func:`render_frame` (a world of a running :class:`gpusim.env.DriveEnv`), :func:`render_episode`
(GIF/MP4 of a rollout driven by a policy callable ``act(obs) -> actions``, the expert actions,
random actions, or the log itself), :func:`render_ego_view` (what one agent observes, drawn from
its observation vector) and the command line ``python -m gpusim.render`` (see :func:`main`).
The package never imports ``train`` or ``policy``: rendering a trained checkpoint is
``python -m train.render`` (``train/render.py``), which hands a policy callable to
:func:`render_from_args`.

Device tensors are read only when a frame is drawn (``.cpu()`` of the few rows needed).
Matplotlib is used through :class:`matplotlib.figure.Figure` with the Agg canvas directly, so the
module never touches pyplot's global backend and works without a display.

Package layout (one concern per module, all re-exported here): ``frame`` (colours, :class:`FrameData`,
:class:`TrailRecorder`, frames from the log or an env), ``draw`` (matplotlib drawing,
:func:`render_log_frame`, :func:`render_frame`, :class:`SceneCanvas`), ``video`` (:func:`write_video`,
:func:`render_episode`, :func:`render_log_episode`), ``ego`` (:func:`decode_ego_observation`,
:func:`render_ego_view`), ``legend`` (:func:`legend_entries`, :func:`draw_legend`),
``cli`` (:func:`main`; ``python -m gpusim.render`` runs ``__main__``).
"""

from __future__ import annotations

from gpusim.render.cli import build_parser, main, render_from_args, select_scenario
from gpusim.render.draw import SceneCanvas, draw_frame, figure_to_array, render_frame, render_log_frame
from gpusim.render.ego import EGO_NEEDS, PARTNER_NEEDS, ROAD_NEEDS, decode_ego_observation, render_ego_view
from gpusim.render.frame import COLORS, FrameData, TrailRecorder, frame_from_env, frame_from_log, scene_extent
from gpusim.render.legend import LEGEND_LABELS, draw_legend, legend_entries
from gpusim.render.video import render_episode, render_log_episode, write_video

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
    "LEGEND_LABELS",
    "legend_entries",
    "draw_legend",
    "draw_frame",
    "figure_to_array",
    "select_scenario",
    "build_parser",
    "render_from_args",
    "main",
]
