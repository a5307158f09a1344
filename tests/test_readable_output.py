"""Output a person reads: progress lines of the long commands, a real ETA, tables not cut when piped,
the training-scenes warning, the memoryless control named by its flag, the reference line of the
learning curves and the renders' metre scale bar."""

from __future__ import annotations

import json
import math
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "womd_sample"


# --- renders: the metre scale bar ------------------------------------------------------------

def test_scale_bar_length_by_hand():
    """The largest 1/2/5 x 10^k at most a fifth of the span."""
    from gpusim.render.draw import scale_bar_length

    assert scale_bar_length(100.0) == 20.0   # 20 <= 20
    assert scale_bar_length(240.0) == 20.0   # 48 -> 20 (50 > 48)
    assert scale_bar_length(300.0) == 50.0   # 60 -> 50
    assert scale_bar_length(9.0) == 1.0      # 1.8 -> 1
    assert scale_bar_length(1000.0) == 200.0
    for bad in (0.0, -5.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="span"):
            scale_bar_length(bad)


def test_a_render_carries_its_scale_bar():
    """A bundled scene drawn from the log: one 'N m' label whose N is the bar for the view's width,
    and a line of that many metres."""
    from gpusim.config import EnvConfig
    from gpusim.data import ScenarioPack
    from gpusim.render.draw import new_figure, render_log_frame, scale_bar_length
    from gpusim.render.frame import scene_extent

    pack = ScenarioPack.from_json(SAMPLE / sorted(p.name for p in SAMPLE.glob("*.json*"))[0],
                                  EnvConfig().data_config())
    fig = new_figure(4.0, 50)
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    render_log_frame(pack, 0, 0, ax=ax, legend=False)
    xmin, xmax, _, _ = scene_extent(pack, 0)
    want = scale_bar_length(xmax - xmin)
    labels = [t.get_text() for t in ax.texts if re.fullmatch(r"[\d.]+ m", t.get_text())]
    assert labels == [f"{want:g} m"]
    lengths = [abs(l.get_xdata()[1] - l.get_xdata()[0]) for l in ax.lines if len(l.get_xdata()) == 2
               and l.get_ydata()[0] == l.get_ydata()[1]]
    assert any(math.isclose(n, want) for n in lengths)


# --- python -m train.render: the first scenario, with progress ---------------------------------

def test_train_render_draws_the_first_scenario_with_progress(tmp_path, capsys):
    from gpusim.config import EnvConfig
    from gpusim.data import ScenarioPack
    from train.render import main

    first = ScenarioPack.from_json(SAMPLE, EnvConfig().data_config()).scenario_ids[0]
    out = tmp_path / "frame.png"
    assert main(["--policy", str(ROOT / "policies" / "driver.pt"), "--data", str(SAMPLE), "--steps", "2",
                 "--out", str(out), "--seed", "3"]) == 0
    err = capsys.readouterr().err
    assert f"scenario {first}," in err and "3 frame(s)" in err
    assert "train.render: frame 3/3" in err
    assert out.is_file()


def test_log_render_shows_progress(tmp_path, capsys):
    from gpusim.render.cli import main

    assert main(["--data", str(SAMPLE), "--log", "--steps", "2", "--out", str(tmp_path / "log.gif")]) == 0
    err = capsys.readouterr().err
    assert "gpusim.render: frame 3/3" in err and "from the log" in err


def test_progress_printer_prints_about_ten_times():
    import io

    from gpusim.render.cli import progress_printer

    out = io.StringIO()
    show = progress_printer("p", out)
    for done in range(1, 92):
        show(done, 91)
    lines = out.getvalue().splitlines()
    assert lines[0] == "p: frame 10/91" and lines[-1] == "p: frame 91/91" and len(lines) == 10


# --- python -m gpusim.wosac: help and progress ------------------------------------------------

def test_wosac_help_describes_every_option(capsys):
    from gpusim.wosac.__main__ import main

    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for words in ("scenario files or directories", "log baselines to score", "SimAgentsChallengeSubmission",
                  "torch device", "at most N scenarios", "no progress lines", "write every figure"):
        assert words in " ".join(text.split()), words
    assert not text.split("\n\n")[1].startswith("Command line")


def test_wosac_names_each_scenario_as_it_is_scored(capsys):
    from gpusim.wosac.__main__ import main

    assert main([str(ROOT / "data" / "womd_extra"), "--limit", "1", "--baseline", "constant_speed"]) == 0
    err = capsys.readouterr().err
    assert "scoring 1 scenario(s) for constant_speed on cpu" in err
    assert re.search(r"constant_speed: scenario 1/1 \w+ \(\d+\.\d s\)", err)


# --- training: the ETA ------------------------------------------------------------------------

def test_eta_by_hand():
    from train.logger import _fmt_eta, eta_seconds

    assert eta_seconds(1000, 500, 100.0) == 5.0
    assert eta_seconds(1000, 1000, 100.0) == 0.0
    assert eta_seconds(1000, 1300, float("nan")) == 0.0   # the last update overshoots: done, not '?'
    assert math.isnan(eta_seconds(1000, 10, float("nan")))
    assert math.isnan(eta_seconds(1000, 10, 0.0))
    assert _fmt_eta(eta_seconds(2_000_000, 0, 1500.0)) == "22:13"


def test_the_last_report_has_an_eta(tmp_path):
    """A report past the total (the last update overshoots it) says ETA 0:00, not '?'; the line is
    written whole (no wrap at 80 columns when not a terminal)."""
    from rich.console import Console

    from train.logger import Logger

    log = Logger(tmp_path / "run", {"x": 1}, total_steps=1000)
    log._console = Console(record=True, width=80, highlight=False)
    log.log({"update": 1, "global_step": 400, "sps": 200.0, "goal_reached": 0.5, "collided": 0.1,
             "offroad": 0.1, "score": 0.5, "episode_return": 0.3, "pg_loss": 0.1, "v_loss": 0.2,
             "entropy": 4.0, "approx_kl": 0.01})
    log.log({"update": 2, "global_step": 1200, "sps": 200.0})
    log.close()
    lines = log._console.export_text().splitlines()
    assert len(lines) == 2 and lines[0].endswith("ETA 0:03") and lines[1].endswith("ETA 0:00")


# --- evaluate: tables not cut, training scenes, --memory trial ---------------------------------

def test_tables_piped_are_not_cut(capsys):
    """Under pytest stdout is not a terminal: four baselines' table keeps every cell whole."""
    from train.evaluate import main
    from train.logger import PIPE_WIDTH, make_console

    assert make_console().width == PIPE_WIDTH
    assert main(["--policy", "steer_to_goal", "constant_speed", "expert", "random", "--data", str(SAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    assert "steer_to_goal" in out and "constant_speed" in out


def test_training_scenes_warned():
    """A checkpoint whose recorded --data is the evaluation's data (as written or as an absolute
    path) is warned about; one trained elsewhere is not."""
    from train.checkpoint import load_checkpoint
    from train.evaluate import training_scene_notes

    ckpt = load_checkpoint(ROOT / "policies" / "driver.pt")
    assert ckpt["config"]["data"] != "data/womd_sample"

    def entry(data):
        return {"label": "driver", "kind": "checkpoint", "ckpt": {**ckpt, "config": {**ckpt["config"], "data": data}}}

    baseline = {"label": "steer_to_goal", "kind": "baseline", "ckpt": None}
    assert training_scene_notes([entry(ckpt["config"]["data"]), baseline], "data/womd_sample") == []
    for data in ("data/womd_sample", str(SAMPLE), [str(ROOT / "data" / "womd_extra"), str(SAMPLE)]):
        notes = training_scene_notes([baseline, entry(data)], "data/womd_sample")
        assert len(notes) == 1 and "driver was trained on" in notes[0] and "these are its training scenes" in notes[0]
    # an ensemble is warned about when any member was trained here, once however many were
    elsewhere, here = entry(ckpt["config"]["data"])["ckpt"], entry("data/womd_sample")["ckpt"]
    for members, count in (([elsewhere, here], 1), ([here, here], 1), ([elsewhere, elsewhere], 0)):
        ens = {"label": "a+b", "kind": "checkpoint", "ckpt": members[0], "members": members}
        notes = training_scene_notes([ens], "data/womd_sample")
        assert len(notes) == count and all(n.startswith("warning: a+b was trained on") for n in notes)


def test_memoryless_control_named_by_its_flag(capsys):
    from train.evaluate import main

    assert main(["--policy", str(ROOT / "policies" / "memory_probe.pt"), "--memory", "trial",
                 "--data", str(SAMPLE)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "memoryless control (--memory trial: KV cache cleared at every trial start)" in out


# --- learning curves: the steer_to_goal reference line -----------------------------------------

def test_plot_draws_the_reference_line(tmp_path):
    from train.evaluate import main as evaluate
    from train.plot import UserError, plot_runs, reference_values

    ref = tmp_path / "stg.json"
    assert evaluate(["--policy", "steer_to_goal", "--data", str(SAMPLE), "--quiet", "--json", str(ref)]) == 0
    want = json.loads(ref.read_text())["runs"][0]["summary"]["goal_reached"]["mean"]
    assert reference_values(ref)["goal_reached"] == want
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"update": u, "global_step": 1000 * u, "goal_reached": 0.1 * u,
                                                           "collided": 0.2, "offroad": 0.1, "episode_return": 0.0})
                                               + "\n" for u in (1, 2, 3)))
    fig = plot_runs([str(run)], reference=ref)
    goal_ax = fig.axes[0]
    flat = [l for l in goal_ax.lines if l.get_label() == "steer_to_goal (evaluated)"]
    assert len(flat) == 1 and list(flat[0].get_ydata()) == [want, want]
    with pytest.raises(UserError, match="no run of 'expert'"):
        plot_runs([str(run)], reference=ref, reference_policy="expert")
    with pytest.raises(UserError, match="no such file"):
        plot_runs([str(run)], reference=tmp_path / "missing.json")
