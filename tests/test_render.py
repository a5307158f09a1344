"""Tests of gpusim.render: top-down frames of real sample scenarios, videos, the ego view, the CLI."""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import warnings

import imageio.v3 as iio
import numpy as np
import pytest
import torch

from gpusim import render
from gpusim.config import EnvConfig, ObjectType, RoadType
from gpusim.kernels.observations import obs_layout

SCENARIO = "db4edc9bd0c9d18c"  # 8 controlled vehicles, pedestrians and a cyclist
SMALL = dict(figsize=3.0, dpi=80)  # 240 x 240 pixels


def _rgb(hex_color: str) -> np.ndarray:
    h = hex_color.lstrip("#")
    return np.array([int(h[i:i + 2], 16) for i in (0, 2, 4)], dtype=np.int32)


def _mask(img: np.ndarray, hex_color: str, tol: int = 12) -> np.ndarray:
    """[H, W] bool: pixels within ``tol`` (max channel difference) of a colour."""
    return (np.abs(img.astype(np.int32) - _rgb(hex_color)).max(-1) <= tol)


@pytest.fixture(scope="module")
def pack(sample_dir):
    from gpusim.data import ScenarioPack

    path = sample_dir / f"{SCENARIO}.json.xz"
    if not path.exists():
        pytest.fail(f"bundled sample scenario {path} is missing")
    return ScenarioPack.from_json([path], EnvConfig().data_config())


@pytest.fixture(scope="module")
def env(pack):
    """A one-world env on the sample scenario (skipped while the env cannot reset)."""
    from gpusim.env import DriveEnv

    e = DriveEnv(pack, 1, EnvConfig(), device="cpu", seed=0)
    try:
        e.reset(seed=0)
    except ImportError as err:  # a kernel the env needs is not in the tree yet
        pytest.skip(f"DriveEnv.reset not usable yet: {err}")
    return e


# ------------------------------------------------------------------------------------- log frames
def test_log_frames_are_nontrivial_and_change(pack, tmp_path):
    a = render.render_log_frame(pack, 0, 0, **SMALL)
    b = render.render_log_frame(pack, 0, 50, **SMALL)
    assert a.shape == (240, 240, 3) and a.dtype == np.uint8
    colours = np.unique(a.reshape(-1, 3), axis=0)
    assert len(colours) >= 8
    # Road edges (dark), controlled agents (blue), experts (grey) are all in the picture.
    assert _mask(a, render.COLORS["road_edge"], 40).sum() > 100
    assert _mask(a, render.COLORS["controlled"]).sum() + _mask(a, render.COLORS["sdc"]).sum() > 5
    assert _mask(a, render.COLORS["expert_vehicle"]).sum() > 5
    # Agents moved between t=0 and t=50; the background (roads) stays.
    diff = np.abs(a.astype(int) - b.astype(int)).max(-1) > 30
    assert 20 < diff.sum() < 0.5 * diff.size
    out = tmp_path / "frame.png"
    iio.imwrite(out, a)
    assert np.array_equal(iio.imread(out)[..., :3], a)


def test_agent_box_is_drawn_where_the_agent_is(pack):
    """The pixel at a controlled agent's logged centre has its colour; its goal is drawn too."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    t = 10
    fig = Figure(figsize=(4, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    f = render.frame_from_log(pack, 0, t)
    render.draw_frame(f, ax)
    img = render.figure_to_array(fig)
    H = img.shape[0]
    nc = int(pack.num_controlled[0])
    hits = 0
    for a in range(nc):
        if not bool(pack.traj_valid[0, a, t]):
            continue
        x, y = pack.traj_pos[0, a, t].tolist()
        px, py = ax.transData.transform((x, y))
        r, c = int(round(H - py)), int(round(px))
        patch = img[max(r - 1, 0):r + 2, max(c - 1, 0):c + 2].reshape(-1, 3)
        want = render.COLORS["sdc"] if int(pack.sdc_index[0]) == a else render.COLORS["controlled"]
        if (np.abs(patch.astype(int) - _rgb(want)).max(-1) <= 12).any():
            hits += 1
    assert hits >= max(1, nc - 1)  # boxes may overlap another agent drawn later


def test_trail_recorder_keeps_recent_poses():
    tr = render.TrailRecorder(3)
    vis = np.array([True, False])
    for k in range(5):
        tr.update(np.array([[k, 0.0], [0.0, k]], np.float32), np.zeros(2, np.float32), vis, step=k)
    tr.update(np.array([[99, 0.0], [0.0, 99]], np.float32), np.zeros(2, np.float32), vis, step=4)  # same step
    trails = tr.trails()
    assert trails.shape == (3, 2, 2)
    assert trails[:, 0, 0].tolist() == [2.0, 3.0, 4.0]
    assert np.isnan(trails[:, 1]).all()  # never visible
    tr.update(np.zeros((2, 2), np.float32), np.zeros(2, np.float32), vis, step=0)  # new episode
    assert tr.trails().shape == (1, 2, 2)
    with pytest.raises(ValueError):
        render.TrailRecorder(0)


def test_bad_indices_raise(pack):
    with pytest.raises(IndexError):
        render.render_log_frame(pack, 1, 0, **SMALL)
    with pytest.raises(IndexError):
        render.render_log_frame(pack, 0, pack.num_steps, **SMALL)


# ------------------------------------------------------------------------------------- videos
def test_log_gif_has_expected_frames(pack, tmp_path):
    frames, path = render.render_log_episode(pack, 0, steps=4, out=tmp_path / "log.gif", fps=10, **SMALL)
    assert path.suffix == ".gif" and len(frames) == 5
    back = iio.imread(path, index=None)
    assert back.shape[:3] == (5, 240, 240)
    assert not np.array_equal(back[0], back[-1])


def test_video_format_from_extension_never_silently_gif(tmp_path):
    """The video format follows the extension: .mp4/.webm are written by ffmpeg or refused with what to install; other
    extensions are refused (formerly .mp4 fell back to GIF and .webm got GIF bytes)."""
    frames = [np.full((16, 16, 3), v, np.uint8) for v in (0, 128, 255)]
    for ext in (".mp4", ".webm"):
        if importlib.util.find_spec("imageio_ffmpeg") is not None:
            path = render.write_video(frames, tmp_path / f"v{ext}", fps=5)
            assert path.suffix == ext and path.read_bytes()[:6] != b"GIF89a"
        else:
            with pytest.raises(ValueError, match="pip install imageio-ffmpeg"):
                render.write_video(frames, tmp_path / f"v{ext}", fps=5)
            assert not (tmp_path / f"v{ext}").exists() and not (tmp_path / "v.gif").exists()
    with pytest.raises(ValueError, match=r"unsupported video format '\.avi'.*\.gif"):
        render.write_video(frames, tmp_path / "v.avi")
    path = render.write_video(frames, tmp_path / "v.GIF", fps=5)
    assert path.read_bytes()[:6] == b"GIF89a" and iio.imread(path, index=None).shape[0] == 3
    with pytest.raises(ValueError):
        render.write_video([], tmp_path / "empty.gif")


# ------------------------------------------------------------------------------------- env frames
def test_env_frame_shows_status_colours(env):
    env.reset(seed=0)
    base = render.render_frame(env, 0, **SMALL)
    assert base.shape == (240, 240, 3)
    assert _mask(base, render.COLORS["collided"]).sum() == 0 or bool(env.state.collided_now[0].any())
    st = env.state
    saved = st.collided_now.clone(), st.offroad_now.clone()
    try:
        st.collided_now[0].zero_()
        st.offroad_now[0].zero_()
        big = dict(figsize=5.0, dpi=100)
        clean = render.render_frame(env, 0, **big)
        assert _mask(clean, render.COLORS["collided"]).sum() == 0
        st.collided_now[0, 0] = True
        st.offroad_now[0, 1] = True
        marked = render.render_frame(env, 0, **big)
        assert _mask(marked, render.COLORS["collided"]).sum() > 8
        assert _mask(marked, render.COLORS["offroad"]).sum() > 8
        assert "collided" in render.frame_from_env(env, 0).title
    finally:
        st.collided_now.copy_(saved[0])
        st.offroad_now.copy_(saved[1])


def test_env_episode_gif_expert_and_random(env, tmp_path):
    frames, path = render.render_episode(env, "expert", steps=3, out=tmp_path / "e.gif", **SMALL)
    assert len(frames) == 4 and iio.imread(path, index=None).shape[0] == 4
    assert not np.array_equal(frames[0], frames[-1])
    frames, _ = render.render_episode(env, "random", steps=2, out=None, seed=3, ego_agent=0, **SMALL)
    assert len(frames) == 3 and frames[0].shape == (240, 480, 3)  # top-down + ego view
    with pytest.raises(ValueError):
        render.render_episode(env, "nonsense", steps=1)
    with pytest.raises(ValueError):
        render.render_episode(env, "expert", steps=env.horizon)


# ------------------------------------------------------------------------------------- ego view
def _crafted_obs(layout, partner_xy=None, road=None, goal=(40.0, 0.0), pr=50.0, rr=50.0):
    """One observation vector built from the layout's feature names (denormalised inputs in m)."""
    obs = torch.zeros(layout.obs_dim)
    ego_idx = {n.split("/")[0]: i for i, n in enumerate(layout.ego_features)}
    obs[ego_idx["speed"]] = 5.0 / 20
    obs[ego_idx["length"]] = 4.5 / 5
    obs[ego_idx["width"]] = 2.0 / 5
    obs[ego_idx["goal_x"]] = goal[0] / 100
    obs[ego_idx["goal_y"]] = goal[1] / 100
    pi = {n.split("/")[0]: i for i, n in enumerate(layout.partner_features)}
    if partner_xy is not None:
        row = obs[layout.partners].view(layout.num_partners, layout.partner_dim)[0]
        row[pi["rel_x"]], row[pi["rel_y"]] = partner_xy[0] / pr, partner_xy[1] / pr
        row[pi["rel_heading_cos"]], row[pi["rel_heading_sin"]] = 1.0, 0.0
        row[pi["length"]], row[pi["width"]] = 4.5 / 5, 2.0 / 5
        row[pi["is_vehicle"]] = 1.0
        row[-1] = 1.0
    ri = {n.split("/")[0]: i for i, n in enumerate(layout.road_features)}
    if road is not None:  # (mid_x, mid_y, length, dir angle) in metres / rad, road edge
        row = obs[layout.roads].view(layout.num_roads, layout.road_dim)[0]
        row[ri["mid_x"]], row[ri["mid_y"]], row[ri["length"]] = road[0] / rr, road[1] / rr, road[2] / rr
        row[ri["dir_cos"]], row[ri["dir_sin"]] = float(np.cos(road[3])), float(np.sin(road[3]))
        row[ri["is_road_edge"]] = 1.0
        row[-1] = 1.0
    return obs


def _ego_axes():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 3), dpi=80)
    FigureCanvasAgg(fig)
    return fig.add_axes((0, 0, 1, 1))


def _inner(mask: np.ndarray, border: int = 3) -> np.ndarray:
    """``mask`` with the picture border (where the axes frame is drawn) cleared."""
    out = mask.copy()
    out[:border], out[-border:], out[:, :border], out[:, -border:] = False, False, False, False
    return out


def _pixel(ax, img, x, y):
    """(row, col) of data point (x, y) in the picture."""
    px, py = ax.transData.transform((x, y))
    return img.shape[0] - py, px


@pytest.mark.parametrize("where", ["ahead", "left", "behind"])
def test_ego_view_puts_partner_where_it_is(where):
    layout = obs_layout(3, 5)
    xy = {"ahead": (30.0, 0.0), "left": (0.0, 30.0), "behind": (-30.0, 0.0)}[where]
    ax = _ego_axes()
    img = render.render_ego_view(_crafted_obs(layout, partner_xy=xy, goal=(-20.0, -20.0)), layout, ax=ax)
    grey = _inner(_mask(img, render.COLORS["expert_vehicle"]))
    assert grey.sum() >= 3
    rows, cols = np.nonzero(grey)
    r0, c0 = _pixel(ax, img, 0.0, 0.0)  # the ego's centre
    # Ego frame -> picture: ahead is up (smaller row), left is left (smaller column).
    rp, cp = rows.mean(), cols.mean()
    px_per_m = (_pixel(ax, img, 0.0, -10.0)[0] - r0) / 10.0  # picture y is ego x
    assert px_per_m > 0
    d = 30.0 * px_per_m
    want = {"ahead": (r0 - d, c0), "left": (r0, c0 - d), "behind": (r0 + d, c0)}[where]
    assert abs(rp - want[0]) < 3 and abs(cp - want[1]) < 3, (rp, cp, want)
    # The ego box itself is at the centre.
    er, ec = np.nonzero(_mask(img, render.COLORS["controlled"])[
        int(r0) - 8:int(r0) + 8, int(c0) - 8:int(c0) + 8])
    assert er.size >= 2


def test_ego_view_road_segment_and_decoding():
    layout = obs_layout(2, 4)
    # A 20 m road edge 10 m to the right of the ego, parallel to its heading.
    obs = _crafted_obs(layout, road=(0.0, -10.0, 20.0, 0.0))
    dec = render.decode_ego_observation(obs, layout)
    assert dec["roads"]["type"].tolist() == [int(RoadType.ROAD_EDGE)]
    np.testing.assert_allclose(dec["roads"]["seg"][0], [-10.0, -10.0, 10.0, -10.0], atol=1e-4)
    assert dec["partners"]["x"].size == 0
    assert dec["ego"]["speed"] == pytest.approx(5.0) and dec["ego"]["goal_x"] == pytest.approx(40.0)
    ax = _ego_axes()
    img = render.render_ego_view(obs, layout, ax=ax)
    r0, c0 = _pixel(ax, img, 0.0, 0.0)
    dark = _inner(_mask(img, render.COLORS["road_edge"], 40))
    dark[int(r0) - 10:int(r0) + 10, int(c0) - 10:int(c0) + 10] = False  # the ego box outline
    rows, cols = np.nonzero(dark)
    px_per_m = (c0 - _pixel(ax, img, -10.0, 0.0)[1]) / 10.0
    assert cols.size > 5
    # A vertical line 10 m right of the ego, from 10 m behind to 10 m ahead.
    assert abs(cols.mean() - (c0 + 10 * px_per_m)) < 2
    assert abs(rows.min() - (r0 - 10 * px_per_m)) < 3 and abs(rows.max() - (r0 + 10 * px_per_m)) < 3
    # Partner position and type decoded from the slot.
    obs2 = _crafted_obs(layout, partner_xy=(10.0, 5.0))
    d2 = render.decode_ego_observation(obs2, layout)
    assert d2["partners"]["type"].tolist() == [int(ObjectType.VEHICLE)]
    np.testing.assert_allclose([d2["partners"]["x"][0], d2["partners"]["y"][0]], [10.0, 5.0], atol=1e-4)


def test_ego_view_bad_input():
    layout = obs_layout(2, 4)
    with pytest.raises(ValueError, match="features"):
        render.render_ego_view(torch.zeros(layout.obs_dim + 1), layout)
    with pytest.raises(ValueError, match="1-D"):
        render.render_ego_view(torch.zeros(2, layout.obs_dim), layout)
    broken = dataclasses.replace(layout, partner_features=tuple(f"f{i}" for i in range(layout.partner_dim)))
    with pytest.raises(ValueError, match="rel_x"):
        render.render_ego_view(torch.zeros(layout.obs_dim), broken)


def test_ego_view_of_real_observation_matches_env(env):
    """The partners drawn in the ego view are the env's partners, at their positions."""
    obs = env.reset(seed=0)
    dec = render.decode_ego_observation(obs[0, 0], env.obs_layout, env.config.partner_radius,
                                        env.config.road_radius)
    st = env.state
    ego_pos, h = st.pos[0, 0], float(st.heading[0, 0])
    rel = st.pos[0] - ego_pos
    c, s = np.cos(h), np.sin(h)
    ex = (rel[:, 0] * c + rel[:, 1] * s).numpy()
    ey = (rel[:, 1] * c - rel[:, 0] * s).numpy()
    assert dec["partners"]["x"].size > 0
    for x, y in zip(dec["partners"]["x"], dec["partners"]["y"]):
        d = np.hypot(ex - x, ey - y)
        d[0] = np.inf
        assert d.min() < 0.05  # every decoded partner is some agent of the world, in the ego frame


# ------------------------------------------------------------------------------------- CLI
def test_cli_log_png_and_errors(sample_dir, tmp_path, capsys):
    out = tmp_path / "log.png"
    rc = render.main(["--data", str(sample_dir), "--scenario", SCENARIO, "--log", "--out", str(out),
                      "--steps", "20", "--size", "3", "--dpi", "60"])
    assert rc == 0 and iio.imread(out).shape[:2] == (180, 180)
    rc = render.main(["--data", str(sample_dir), "--scenario", "no-such-id", "--log", "--out", str(out)])
    assert rc == 2 and "no-such-id" in capsys.readouterr().err
    rc = render.main(["--data", str(tmp_path / "missing"), "--log", "--out", str(out)])
    assert rc == 2
    rc = render.main(["--data", str(sample_dir), "--checkpoint", "ck.pt", "--out", str(out)])
    assert rc == 2 and "python -m train.render" in capsys.readouterr().err  # the renderer loads no checkpoints


def test_cli_checkpoint_rollout(env, sample_dir, tmp_path):
    """``python -m train.render --checkpoint``: the trainer side builds the policy callable and the
    renderer (which never imports train/policy) draws the rollout."""
    policy_mod = pytest.importorskip("policy.actor_critic")
    ckpt_mod = pytest.importorskip("train.checkpoint")
    from train import render as train_render

    pol = policy_mod.ActorCritic(env.obs_layout, env.num_actions, False,
                                 policy_mod.PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16))
    opt = torch.optim.Adam(pol.parameters())
    # checkpoints hold plain data only (weights_only loading): enums by name
    plain_env_config = {k: (str(v) if isinstance(v, enum.Enum) else v) for k, v in dataclasses.asdict(env.config).items()}
    ck = ckpt_mod.save_checkpoint(tmp_path / "ck.pt", policy=pol, optimizer=opt, global_step=0, update=0,
                                  config={}, env_config=plain_env_config)
    out = tmp_path / "ck.gif"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = train_render.main(["--data", str(sample_dir), "--scenario", SCENARIO, "--checkpoint", str(ck),
                                "--out", str(out), "--steps", "2", "--size", "2", "--dpi", "60"])
    assert rc == 0
    assert iio.imread(out, index=None).shape[0] == 3


def test_train_render_errors_are_one_line(sample_dir, tmp_path, capsys):
    """A missing checkpoint, or --log with --checkpoint, is a one-line error with exit code 2."""
    from train import render as train_render

    args = ["--data", str(sample_dir), "--out", str(tmp_path / "x.gif")]
    assert train_render.main([*args, "--checkpoint", str(tmp_path / "missing.pt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("train.render: error:") and "missing.pt" in err and len(err.strip().splitlines()) == 1
    assert train_render.main([*args, "--checkpoint", str(tmp_path / "missing.pt"), "--log"]) == 2
    assert "python -m gpusim.render" in capsys.readouterr().err
