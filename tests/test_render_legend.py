"""The in-image legend of top-down renders (gpusim/render/legend.py): it lists exactly what a frame
of a real scenario shows (roles, goals, signals by state, status marks), sits in the image, avoids
the crowded corner, and ``legend=False`` / ``--no-legend`` leave it out."""

from __future__ import annotations

import imageio.v3 as iio
import numpy as np
import pytest

from gpusim import render
from gpusim.config import EnvConfig
from gpusim.data import ScenarioPack
from gpusim.env import DriveEnv
from gpusim.render.draw import new_figure
from gpusim.render.legend import CORNERS, LEGEND_LABELS, quiet_corner

SAMPLE = "db4edc9bd0c9d18c"  # bundled: SDC, 7 more controlled vehicles, pedestrians, a cyclist
SIGNALS = "2d84b1ab55ab81d3"  # data/womd_extra: 16 signalled lanes, arrow states


def _axes(size=3.0, dpi=80):
    fig = new_figure(size, dpi)
    return fig.add_axes((0.01, 0.01, 0.98, 0.89))


def _labels(ax) -> list[str]:
    leg = ax.get_legend()
    return [] if leg is None else [t.get_text() for t in leg.get_texts()]


@pytest.fixture(scope="module")
def sample_pack(sample_dir):
    return ScenarioPack.from_json([sample_dir / f"{SAMPLE}.json.xz"], EnvConfig().data_config())


@pytest.fixture(scope="module")
def signal_env(sample_dir):
    path = sample_dir.parent / "womd_extra" / f"{SIGNALS}.json.xz"
    pack = ScenarioPack.from_json([path], EnvConfig().data_config())
    return DriveEnv(pack, 1, EnvConfig(), device="cpu", seed=0)


def test_log_frame_legend_of_bundled_scenario(sample_pack):
    ax = _axes()
    img = render.render_log_frame(sample_pack, 0, 10, ax=ax)
    assert _labels(ax) == ["ego: self-driving car", "ego (controlled)", "expert vehicle (log replay)",
                           "expert pedestrian (log replay)", "expert cyclist (log replay)", "goal"]
    # drawn inside the picture, and it changes pixels there
    fig = ax.figure
    box = ax.get_legend().get_window_extent(fig.canvas.get_renderer())
    assert 0 <= box.x0 < box.x1 <= img.shape[1] and 0 <= box.y0 < box.y1 <= img.shape[0]
    ax2 = _axes()
    plain = render.render_log_frame(sample_pack, 0, 10, ax=ax2, legend=False)
    assert ax2.get_legend() is None
    r0, r1 = int(img.shape[0] - box.y1), int(img.shape[0] - box.y0)
    diff = np.abs(img.astype(int) - plain.astype(int)).max(-1) > 30
    assert diff[r0:r1, int(box.x0):int(box.x1)].sum() > 0.5 * diff.sum() > 100


def test_env_frame_legend_lists_signals_by_state_and_status(signal_env):
    env = signal_env
    env.reset(seed=0)
    ax = _axes()
    render.render_frame(env, 0, ax=ax)
    codes = render.frame_from_env(env, 0).signal_state.tolist()
    assert sorted(set(codes)) == [0, 1, 6]  # unknown, arrow stop, go at the first step
    assert _labels(ax) == ["ego (controlled)", "expert vehicle (log replay)", "expert pedestrian (log replay)",
                           "expert cyclist (log replay)", "goal", "signal: stop", "signal: go", "signal: unknown",
                           "arrow signal"]
    for _ in range(30):
        env.step(env.expert_actions())
    f = render.frame_from_env(env, 0)
    keys = render.legend_entries(f)
    assert {"goal_reached", "collided", "offroad", "stopped"} <= set(keys)  # agent 6: collided and offroad
    assert "signal_stop" not in keys and "signal_go" in keys  # the arrow-stop lanes turned unknown / go
    assert bool((f.collided & f.offroad).any())


def test_legend_entries_follow_the_frame(signal_env):
    """Co-players, candidates, ghosts of removed agents, the ego-view agent and a flashing signal
    appear exactly when the frame has them; an empty frame has no legend."""
    env = signal_env
    env.reset(seed=0)
    f = render.frame_from_env(env, 0)
    base = set(render.legend_entries(f))
    assert not base & {"coplayer", "candidate", "removed", "highlight", "signal_flashing", "contact_earlier"}
    f.coplayer = np.zeros(len(f.pos), bool)
    f.coplayer[1] = True
    f.candidates = np.zeros((env.num_slots, 3, 2), np.float32)
    f.highlight = 0
    f.signal_state = f.signal_state.copy()
    f.signal_state[0] = 7  # flashing stop
    f.ever_offroad = f.ever_offroad.copy()
    f.ever_offroad[2] = True
    f.removed = f.removed.copy()
    f.removed[3], f.visible[3] = True, False
    f.ghost_pos = np.where(f.removed[:, None], f.pos, np.nan).astype(np.float32)
    f.ghost_heading = f.heading.copy()
    got = render.legend_entries(f)
    assert set(got) - base == {"coplayer", "candidate", "removed", "highlight", "signal_flashing", "contact_earlier"}
    assert got == [k for k in LEGEND_LABELS if k in got]  # legend order
    ax = _axes()
    render.draw_frame(f, ax, legend=True)
    assert "co-player (partner policy)" in _labels(ax) and "goal candidate (memory task)" in _labels(ax)
    empty = render.frame_from_env(env, 0)
    empty.visible[:] = False
    empty.controlled[:] = False
    empty.signal_pos = empty.signal_dir = empty.signal_state = None
    assert render.legend_entries(empty) == []
    render.draw_frame(empty, ax, legend=True)
    assert ax.get_legend() is None


def test_quiet_corner_hand_cases():
    ext = (0.0, 100.0, 0.0, 100.0)
    assert quiet_corner(np.zeros((0, 2)), ext) == "lower left"  # tie: the first of CORNERS
    crowd_ll = np.array([[10.0, 10.0], [20.0, 5.0], [95.0, 95.0]])
    assert quiet_corner(crowd_ll, ext) == "upper left"
    everywhere_but_lr = np.array([[10, 10], [10, 90], [90, 90], [np.nan, 0.0], [500.0, 5.0]])
    assert quiet_corner(everywhere_but_lr, ext) == "lower right"  # NaN and outside the view ignored
    assert set(CORNERS) == {"lower left", "upper left", "lower right", "upper right"}


def test_video_keeps_one_legend_corner_and_no_legend_flag(sample_pack, sample_dir, tmp_path):
    from gpusim.render.video import _video_legend_corner

    extent = render.scene_extent(sample_pack, 0)
    loc = _video_legend_corner(sample_pack, 0, extent)
    assert loc in CORNERS
    frames, _ = render.render_log_episode(sample_pack, 0, steps=2, figsize=2.0, dpi=60)
    bare, _ = render.render_log_episode(sample_pack, 0, steps=2, figsize=2.0, dpi=60, legend=False)
    assert not np.array_equal(frames[0], bare[0])
    out = tmp_path / "f.png"
    args = ["--data", str(sample_dir), "--scenario", SAMPLE, "--log", "--out", str(out), "--size", "2", "--dpi", "60"]
    for extra, legend in (([], True), (["--no-legend"], False)):
        assert render.main([*args, *extra]) == 0
        want = render.render_log_frame(sample_pack, 0, 0, figsize=2.0, dpi=60, legend=legend)
        assert np.array_equal(iio.imread(out)[..., :3], want), extra
