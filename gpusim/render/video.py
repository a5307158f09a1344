"""Episodes as videos: :func:`write_video` (GIF; MP4/WebM with imageio-ffmpeg), :func:`render_episode`
(a rollout of an env driven by a policy, the expert actions or random actions) and
:func:`render_log_episode` (the log itself).

Part of :mod:`gpusim.render` (see the package docstring); split out of the former single module
without behaviour change.
"""

from __future__ import annotations

import pathlib
from typing import Callable

import numpy as np
import torch

from gpusim.render.draw import SceneCanvas, draw_frame
from gpusim.render.ego import render_ego_view
from gpusim.render.frame import TrailRecorder, frame_from_env, frame_from_log, scene_extent
from gpusim.render.legend import quiet_corner


#: Output formats by file extension: name -> (ffmpeg codec or None for GIF, what it needs).
VIDEO_FORMATS = {".gif": None, ".mp4": "libx264", ".webm": "libvpx-vp9"}


def _has_ffmpeg() -> bool:
    try:
        import imageio_ffmpeg  # noqa: F401
    except Exception:
        return False
    return True


def video_format(out) -> str:
    """The output format of ``out`` from its extension: ``".gif"``, ``".mp4"`` or ``".webm"``.

    Checked before any frame is rendered, so a bad name fails at once.

    Raises:
        ValueError: an extension other than ``.gif``/``.mp4``/``.webm`` (the message lists them), or
            ``.mp4``/``.webm`` without the ``imageio-ffmpeg`` package (the message says what to install).
    """
    suffix = pathlib.Path(out).suffix.lower()
    if suffix not in VIDEO_FORMATS:
        raise ValueError(f"{out}: unsupported video format {suffix or '(no extension)'!r}; "
                         f"use one of {', '.join(VIDEO_FORMATS)}")
    if VIDEO_FORMATS[suffix] is not None and not _has_ffmpeg():
        raise ValueError(f"{out}: writing {suffix} needs the imageio-ffmpeg package "
                         "(pip install imageio-ffmpeg), or use a .gif name")
    return suffix


def write_video(frames: list, out, fps: int = 10) -> pathlib.Path:
    """Write [H, W, 3] uint8 frames in the format of ``out``'s extension (:func:`video_format`).

    ``.gif``: animated GIF, frame durations ``1000 / fps`` ms (GIF stores 10 ms units, so 10 fps
    is exact). ``.mp4`` (H.264) and ``.webm`` (VP9): through ffmpeg from the ``imageio-ffmpeg``
    package; never a silent fallback to another format. Written atomically
    (:mod:`gpusim.fileio`: a failed write leaves a previous file whole). Returns the path written
    (= ``out``).

    Raises:
        ValueError: no frames, ``fps <= 0``, or an unsupported/unavailable format (see
            :func:`video_format`). OutputError (a ValueError): the file cannot be written.
    """
    import imageio.v3 as iio

    if not frames:
        raise ValueError("write_video: no frames")
    if fps <= 0:
        raise ValueError(f"write_video: fps must be > 0, got {fps}")
    from gpusim.fileio import atomic_path, write_bytes

    out = pathlib.Path(out)
    suffix = video_format(out)
    if suffix == ".gif":  # encoded in memory, then written atomically
        write_bytes(out, iio.imwrite("<bytes>", np.stack(frames), extension=".gif", duration=1000.0 / fps, loop=0))
    else:
        with atomic_path(out) as tmp:  # ffmpeg writes a named file: a temporary one, renamed when whole
            _write_ffmpeg(tmp, frames, fps, VIDEO_FORMATS[suffix])
    return out


def _write_ffmpeg(out: pathlib.Path, frames: list, fps: int, codec: str) -> None:
    import imageio

    # libx264 wants even sizes; crop one pixel row/column if needed.
    h, w = frames[0].shape[:2]
    h2, w2 = h - h % 2, w - w % 2
    with imageio.get_writer(out, format="FFMPEG", fps=fps, codec=codec, macro_block_size=1) as wr:
        for fr in frames:
            wr.append_data(np.ascontiguousarray(fr[:h2, :w2]))


def _random_actions(env, generator: torch.Generator | None) -> torch.Tensor:
    W, C = env.num_worlds, env.num_slots
    from gpusim.config import ActionSpace

    if env.config.action_space == ActionSpace.CONTINUOUS:
        return torch.rand((W, C, 2), generator=generator, device="cpu").mul(2).sub(1).to(env.device)
    return torch.randint(0, int(env.num_actions), (W, C), generator=generator, device="cpu").to(env.device)


def _video_legend_corner(pack, scenario: int, extent: tuple) -> str:
    """One legend corner for a whole video: the corner covering the fewest logged agent positions
    and controlled goals of ``scenario`` (so the legend does not jump between frames)."""
    valid = pack.traj_valid[scenario].cpu()
    pts = [pack.traj_pos[scenario].cpu()[valid], pack.agent_goal[scenario, : int(pack.num_controlled[scenario])].cpu()]
    return quiet_corner(torch.cat([p.reshape(-1, 2) for p in pts]).numpy(), extent)


def render_episode(env, policy: Callable | str = "expert", world: int = 0, steps: int | None = None,
                   out=None, fps: int = 10, seed: int | None = None, trail_length: int = 10,
                   ego_agent: int | None = None, figsize: float = 6.0,
                   dpi: int = 100, legend: bool = True,
                   progress: Callable[[int, int], None] | None = None) -> tuple[list, pathlib.Path | None]:
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
        out: output path (``.gif``, or ``.mp4``/``.webm`` with imageio-ffmpeg; see :func:`write_video`);
            None keeps the frames in memory only.
        fps: frames per second of the video.
        seed: passed to ``env.reset`` and used for random actions.
        trail_length: trail positions kept per agent.
        ego_agent: also draw the ego view of this policy slot in a second panel (and outline the
            agent in the top-down view).
        figsize, dpi: panel size (inches, dots per inch).
        legend: draw the in-image legend of the top-down view (what each frame shows, so entries
            such as ``collided now`` appear with the first frame that has them; docs/render.md).
        progress: optional ``progress(done, total)`` called after each frame is drawn (``done``
            frames of ``total = steps + 1``), e.g. to print how far a long render is.

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
    if out is not None:
        video_format(out)  # fail before rendering
    gen = torch.Generator().manual_seed(0 if seed is None else int(seed))
    obs = env.reset(seed=seed)
    s = int(env.state.scenario[world])
    extent = scene_extent(env.pack, s)
    loc = _video_legend_corner(env.pack, s, extent)
    trail = TrailRecorder(trail_length)
    canvas = SceneCanvas(ego=ego_agent is not None, figsize=figsize, dpi=dpi)
    layout = env.obs_layout if ego_agent is not None else None
    frames = []

    def snap(obs_now):
        f = frame_from_env(env, world, trail=trail, extent=extent)
        if ego_agent is not None:
            f.highlight = ego_agent
        draw_frame(f, canvas.ax, legend, loc)
        if ego_agent is not None:
            render_ego_view(obs_now[world, ego_agent], layout, ax=canvas.ego_ax,
                            title=f"ego view, slot {ego_agent}", partner_radius=env.config.partner_radius,
                            road_radius=env.config.road_radius)
        frames.append(canvas.image())
        if progress is not None:
            progress(len(frames), steps + 1)

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
                       trail_length: int = 10, figsize: float = 6.0, dpi: int = 100,
                       legend: bool = True,
                       progress: Callable[[int, int], None] | None = None) -> tuple[list, pathlib.Path | None]:
    """Video of the logged scenario (every agent follows its log; no env needed).

    Args:
        pack: :class:`gpusim.data.ScenarioPack`. scenario: scenario index.
        steps: log steps after the first; default all (``num_steps - 1 - init_steps``). Frames
            written = ``steps + 1``, starting at log step ``pack.config.init_steps``.
        out, fps, trail_length, figsize, dpi, legend, progress: as :func:`render_episode`.

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
    loc = _video_legend_corner(pack, scenario, extent)
    trail = TrailRecorder(trail_length)
    canvas = SceneCanvas(figsize=figsize, dpi=dpi)
    if out is not None:
        video_format(out)  # fail before rendering
    frames = []
    for t in range(t0, t0 + steps + 1):
        draw_frame(frame_from_log(pack, scenario, t, trail=trail, extent=extent), canvas.ax, legend, loc)
        frames.append(canvas.image())
        if progress is not None:
            progress(len(frames), steps + 1)
    path = write_video(frames, out, fps) if out is not None else None
    return frames, path
