"""No finished work is lost to an output: every command checks its output paths before the work,
writes through the atomic writer (a failed write leaves a previous file whole), names write errors
in one line, and a run directory is locked while a run writes to it."""

from __future__ import annotations

import errno
import os
import pathlib
import signal
import subprocess
import sys

import pytest
import torch

from gpusim import fileio
from gpusim.data.__main__ import main as data_main
from train.evaluate import main as eval_main

from test_cli_errors import TINY, _fake_cfg
from test_train_run import FakeEnv

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "womd_sample"
ONE = SAMPLE / "db4edc9bd0c9d18c.json.xz"
EVAL = ["--policy", "constant_speed", "--data", str(ONE), "--num-threads", "1", "--device", "cpu", "--quiet"]


def _error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1, err
    return err[0]


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if an evaluation sweep or a WOSAC scoring starts."""
    import train.eval.wosac as wosac
    import train.evaluate as evaluate

    def ran(*a, **k):
        raise AssertionError("the work started before the output path was checked")

    monkeypatch.setattr(evaluate, "run_sweep", ran)
    monkeypatch.setattr(wosac, "_score_row", ran)


@pytest.mark.parametrize("flag", ["--json", "--records"])
def test_evaluate_output_under_a_file_or_at_a_directory_is_refused_first(tmp_path, capsys, no_work, flag):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert eval_main(EVAL + [flag, str(afile / "out.json")]) == 2
    assert _error_line(capsys) == f"error: {flag} {afile / 'out.json'}: {afile} is a file, not a directory  " \
                                  "(--debug shows the traceback)"
    assert eval_main(EVAL + [flag, str(tmp_path)]) == 2
    assert f"{flag} {tmp_path} is a directory: give a file name" in _error_line(capsys)


def test_wosac_export_to_a_directory_is_refused_before_scoring(tmp_path, capsys, no_work):
    args = ["--policy", "log_replay", "--mode", "wosac", "--data", str(ONE), "--num-threads", "1", "--device", "cpu",
            "--quiet", "--wosac-rollouts", "2"]
    assert eval_main(args + ["--export-rollouts", str(tmp_path)]) == 2
    assert "--export-rollouts" in _error_line(capsys)


def test_evaluate_prints_the_table_when_the_json_write_fails(tmp_path, capsys, monkeypatch):
    """A write failing after the checks (here: a full disk) still shows the finished table."""
    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fileio.os, "fsync", full)
    out = tmp_path / "e.json"
    args = [a for a in EVAL if a != "--quiet"]
    assert eval_main(args + ["--json", str(out)]) == 2
    cap = capsys.readouterr()
    assert "constant_speed" in cap.out and "goal" in cap.out  # the summary table
    assert f"error: cannot write --json {out}: no space left on device" in cap.err.splitlines()
    assert not out.exists() and list(tmp_path.iterdir()) == []


def _limited(max_bytes: int):
    """preexec_fn: files this process writes may not grow past ``max_bytes`` (EFBIG beyond)."""
    import resource

    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
    return apply


def test_export_proto_failing_midway_keeps_the_previous_file(tmp_path):
    """A write cut short (a file-size limit: the same as a full disk for the writer) leaves the
    previous export whole and no temporary behind, with one line naming the file."""
    out = tmp_path / "s.tfrecord"
    assert data_main(["export-proto", str(ONE), "--out", str(out)]) == 0
    good = out.read_bytes()
    assert len(good) > 50_000
    res = subprocess.run([sys.executable, "-m", "gpusim.data", "export-proto", str(ONE), str(SAMPLE), "--out",
                          str(out)], capture_output=True, text=True, preexec_fn=_limited(len(good) + 1000),
                         cwd=REPO, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines()[-1] == f"error: cannot write --out {out}: file too large"
    assert out.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.tfrecord"]


def test_export_proto_to_a_read_only_place_is_one_line(tmp_path, capsys, monkeypatch):
    def read_only(directory):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(fileio, "_probe_writable", read_only)
    assert data_main(["export-proto", str(ONE), "--out", str(tmp_path / "s.tfrecord")]) == 2
    assert _error_line(capsys) == (f"error: --out {tmp_path / 's.tfrecord'}: cannot write in {tmp_path}: "
                                   "read-only file system")


def test_train_log_dir_read_only_or_a_file_is_one_line(tmp_path, capsys, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("x")
    from train.run import main
    assert main(["--data", str(ONE), "--log-dir", str(afile), "--run-name", "r"] + TINY) == 2
    assert f"--log-dir {afile / 'r'}: {afile} is a file, not a directory" in _error_line(capsys)

    def read_only(directory):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(fileio, "_probe_writable", read_only)
    assert main(["--data", str(ONE), "--log-dir", str(tmp_path / "runs"), "--run-name", "r"] + TINY) == 2
    assert "read-only file system" in _error_line(capsys)
    assert not (tmp_path / "runs").exists()


def test_a_locked_run_directory_is_refused_naming_the_holder_and_freed_when_it_dies(tmp_path):
    cfg = _fake_cfg(tmp_path)
    run_dir = tmp_path / "runs" / "r"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from gpusim.fileio import lock_directory; "
                               f"lock = lock_directory({str(run_dir)!r}); print('locked', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(fileio.DirectoryInUse, match=rf"^{run_dir} is in use by another run \(pid {holder.pid}\): "
                                                         "wait for it to end, or pass another --run-name$"):
            torch.set_num_threads(1)
            from train.run import train
            train(cfg, env=FakeEnv(num_worlds=2))
        assert not (run_dir / "metrics.jsonl").exists()
    finally:
        holder.kill()  # killed: the OS drops its lock, no stale lock is left
        holder.wait()
    from train.run import train
    out = train(cfg, env=FakeEnv(num_worlds=2))
    assert out["run_dir"] == str(run_dir) and (run_dir / "metrics.jsonl").stat().st_size > 0


@pytest.mark.slow
def test_two_runs_started_together_one_is_refused(tmp_path):
    """Two ``train/run.py --run-name X`` started at once: one trains, the other is refused with one
    line (formerly both exited 0 with one interleaved metrics.jsonl)."""
    args = [sys.executable, str(REPO / "train" / "run.py"), "--data", str(ONE), "--log-dir", str(tmp_path / "runs"),
            "--run-name", "x", "--total-timesteps", "3000"] + TINY
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
             for _ in range(2)]
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    codes = sorted(r[2] for r in results)
    assert codes == [0, 2], results
    refused = next(r for r in results if r[2] == 2)[1]
    assert ("is in use by another run (pid" in refused) or ("already holds a run" in refused), refused
    records = (tmp_path / "runs" / "x" / "metrics.jsonl").read_text().splitlines()
    updates = [int(__import__("json").loads(r)["update"]) for r in records]
    assert updates == sorted(set(updates))  # one run's records, each update once


def test_wosac_scorer_refusals(tmp_path, capsys, no_work):
    from gpusim.wosac.__main__ import main as wosac_main

    assert wosac_main([str(ONE), "--limit", "0"]) == 2
    assert "--limit must be >= 1, got 0" in _error_line(capsys)
    if not torch.cuda.is_available():
        assert wosac_main([str(ONE), "--device", "cuda"]) == 2
        assert _error_line(capsys) == "error: --device cuda: CUDA is not available here; pass --device cpu"
    assert wosac_main([str(ONE), "--json", str(tmp_path)]) == 2
    assert f"--json {tmp_path} is a directory" in _error_line(capsys)
    empty = tmp_path / "empty.binproto"
    from gpusim.data.proto_export import write_submission
    write_submission(empty, {})
    assert wosac_main([str(ONE), "--submission", str(empty)]) == 2
    assert "empty submission" in _error_line(capsys)


@pytest.mark.slow
def test_fewer_than_32_rollouts_are_named_by_export_and_scorer(tmp_path, capsys):
    from gpusim.wosac.__main__ import main as wosac_main

    sub = tmp_path / "sub.binproto"
    assert eval_main(["--policy", "log_replay", "--mode", "wosac", "--data", str(ONE), "--num-threads", "1",
                      "--device", "cpu", "--wosac-rollouts", "2", "--export-rollouts", str(sub)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "INCOMPLETE submission: 2 rollout(s) per scenario, the challenge requires 32" in out
    assert "complete)" not in out
    assert wosac_main([str(ONE), "--submission", str(sub)]) == 0
    err = capsys.readouterr().err
    assert f"note: {sub}: 2 rollout(s) per scenario; the challenge requires 32" in err


def test_plot_out_under_a_file_is_refused_first_and_a_failed_write_keeps_the_old_image(tmp_path, capsys,
                                                                                       monkeypatch):
    import json

    from train.plot import main as plot_main

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"update": i, "global_step": 1000 * i, "goal_reached": 0.1 * i})
                                               + "\n" for i in range(1, 4)))
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert plot_main([str(run), "--out", str(afile / "c.png")]) == 2
    assert _error_line(capsys) == f"error: --out {afile / 'c.png'}: {afile} is a file, not a directory"
    out = tmp_path / "c.png"
    assert plot_main([str(run), "--out", str(out)]) == 0
    good = out.read_bytes()
    assert good[:8] == b"\x89PNG\r\n\x1a\n"

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fileio.os, "fsync", full)
    assert plot_main([str(run), "--out", str(out), "--title", "other"]) == 2
    assert _error_line(capsys) == f"error: cannot write --out {out}: no space left on device"
    assert out.read_bytes() == good and sorted(p.name for p in tmp_path.iterdir()) == ["afile", "c.png", "run"]


def test_render_out_at_a_directory_is_refused_before_rendering(tmp_path, capsys, monkeypatch):
    from gpusim.render import cli as render_cli

    def ran(*a, **k):
        raise AssertionError("rendering started before the output path was checked")

    monkeypatch.setattr(render_cli, "_load_data", ran)
    (tmp_path / "v.gif").mkdir()
    assert render_cli.main(["--data", str(ONE), "--log", "--out", str(tmp_path / "v.gif")]) == 2
    assert f"--out {tmp_path / 'v.gif'} is a directory: give a file name" in capsys.readouterr().err


def test_write_video_failing_keeps_the_previous_file(tmp_path, monkeypatch):
    import numpy as np

    from gpusim.render.video import write_video

    frames = [np.full((8, 8, 3), v, np.uint8) for v in (0, 128, 255)]
    out = write_video(frames, tmp_path / "v.gif")
    good = out.read_bytes()

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fileio.os, "fsync", full)
    with pytest.raises(fileio.OutputError, match="no space left on device"):
        write_video(frames[::-1], out)
    assert out.read_bytes() == good and [p.name for p in tmp_path.iterdir()] == ["v.gif"]


def test_data_convert_out_under_a_file_is_refused_before_converting(tmp_path, capsys, monkeypatch):
    import gpusim.data.__main__ as data_cli

    def ran(*a, **k):
        raise AssertionError("the conversion started before the output path was checked")

    monkeypatch.setattr(data_cli, "_convert_with_report", ran)
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (afile / "pack", afile / "p.pt"):
        assert data_main(["convert", str(ONE), "--out", str(out)]) == 2
        assert _error_line(capsys) == f"error: --out {out}: {afile} is a file, not a directory"
