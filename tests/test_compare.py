"""profiling/bench_env.py --compare: a bad REF is a one-line user error (exit 2), no benchmark runs."""

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_compare_rejects_unknown_ref():
    r = subprocess.run([sys.executable, "profiling/bench_env.py", "--compare", "no-such-ref-xyz", "--worlds", "1"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "neither a directory nor a commit" in r.stderr
    assert "Traceback" not in r.stderr
