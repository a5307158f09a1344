"""Command-line helper shared by the profiling scripts that drive ``train/run.py``."""

from __future__ import annotations

import sys


def split_train_argv(argv=None) -> tuple[list[str], list[str]]:
    """Split a command line at the first ``--``: ``(script_args, train_args)``.

    ``argv`` defaults to ``sys.argv[1:]``; everything after ``--`` is passed through unchanged to
    ``train/run.py``'s parser (``bench_train.py``, ``bench_coplayer.py``, ``trace.py``). Without
    ``--`` the second list is empty.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1:]
