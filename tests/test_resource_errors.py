"""Write and memory errors are one line naming the cause: a full or read-only file system under a
run (its log, its checkpoint), and a rollout too large for the memory, sized before allocating."""

from __future__ import annotations

import errno
import os
import pathlib
import subprocess
import sys

import pytest

from gpusim.fileio import OutputError

from test_cli_errors import TINY

REPO = pathlib.Path(__file__).resolve().parents[1]
ONE = REPO / "data" / "womd_sample" / "db4edc9bd0c9d18c.json.xz"


def _error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1, err
    return err[0]


def test_a_rollout_too_large_for_the_memory_is_sized_first(tmp_path, capsys):
    from train.run import main

    runs = tmp_path / "runs"
    assert main(["--data", str(ONE), "--log-dir", str(runs), "--env.goal-behavior", "trial",
                 "--env.k-trials", "1000000"] + TINY) == 2
    line = _error_line(capsys)
    assert line.startswith("error: the rollout needs ") and "GiB" in line
    assert "horizon 10000000 = 1000000 trials x 10 steps" in line and "lower --env.k-trials" in line
    assert not runs.exists()  # nothing was written


def test_rollout_size_is_that_of_the_buffers():
    from train.rollout import RolloutBatch

    meta = RolloutBatch.empty(6, 5, 7, False, 1, "meta")
    real = RolloutBatch.empty(6, 5, 7, False, 1, "cpu")
    # obs float32 [6, 5, 7]; actions int64, logprobs/values/rewards float32, 5 bool [6, 5]; three [6]
    assert meta.nbytes() == real.nbytes() == 6 * 5 * 7 * 4 + 6 * 5 * (8 + 3 * 4 + 5) + 6 * (8 + 8 + 1)


def test_a_full_disk_under_the_log_is_one_line(tmp_path):
    from train.logger import Logger

    log = Logger(tmp_path / "run", {"a": 1}, 10, quiet=True)

    class Full:
        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def flush(self):
            pass

        def close(self):
            pass

    log._file = Full()
    with pytest.raises(OutputError, match=r"^cannot write --log-dir .*/run/metrics.jsonl: no space left on device$"):
        log.log({"update": 1})


@pytest.mark.slow
def test_a_checkpoint_that_cannot_be_written_is_one_line_and_keeps_the_previous(tmp_path):
    """The file-size limit cuts the checkpoint write short, as a full disk would."""
    runs = tmp_path / "runs"
    args = [sys.executable, str(REPO / "train" / "run.py"), "--data", str(ONE), "--log-dir", str(runs), "--run-name",
            "r", "--total-timesteps", "500"] + TINY
    env = dict(os.environ, OMP_NUM_THREADS="1")
    assert subprocess.run(args, cwd=REPO, env=env, capture_output=True, timeout=300).returncode == 0
    ckpt = runs / "r" / "checkpoint.pt"
    good = ckpt.read_bytes()

    def limit():
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(good) // 2, len(good) // 2))

    res = subprocess.run([sys.executable, str(REPO / "train" / "run.py"), "--resume", str(ckpt), "--data", str(ONE),
                          "--total-timesteps", "2000"] + TINY, cwd=REPO, env=env, capture_output=True, text=True,
                         preexec_fn=limit, timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1].startswith(f"error: cannot write {ckpt}: file too large")
    assert ckpt.read_bytes() == good
    assert [p.name for p in ckpt.parent.iterdir() if p.name.endswith(".tmp")] == []
