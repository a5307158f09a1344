"""The project's fixed train / held-out split of its WOMD scenarios (``data/splits.json``), and a
loader that turns a split into scenario files.

The split names the 72 WOMD scenarios of the project's shared data (``../shared/data/womd``, JSON
in the GPUDrive layout, one ``<scenario id>.json.xz`` file each) by scenario id. Every learning
claim (a trained policy's card in ``policies/``, a figure in the docs) trains on ``train`` and
reports on ``held_out``.

The rule (:func:`held_out_ids`, recorded in the file's ``rule``): the ten scenarios bundled in
``data/womd_sample`` are all in ``train`` (tests and the default run train on them); among the other
62, 20 are held out, stratified by traffic signals (scenarios with per-lane signal states in
``tl_states`` vs without) with quotas proportional to the group sizes (largest remainder); within a
group the ids with the smallest SHA-256 of ``"<salt>:<id>"`` are held out. The salt fixes the
draw; a different split needs a new salt and a new file, never an edit of this one.

Usage::

    from train.splits import load_split
    files = load_split("held_out", "../shared/data/womd")   # list[Path], in the file's order

    python train/splits.py held_out --data ../shared/data/womd               # the paths, one a line
    python train/splits.py held_out --data ../shared/data/womd --link /tmp/held_out
        # a directory of symbolic links, usable as --data of train/run.py and train/evaluate.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
SPLITS_FILE = REPO / "data" / "splits.json"
#: The split names of ``data/splits.json``.
SPLIT_NAMES = ("train", "held_out")
#: Scenario file endings tried, in order, for an id (the shared data is ``.json.xz``).
SUFFIXES = (".json.xz", ".json", ".json.gz")


class SplitError(ValueError):
    """A split that cannot be used: unknown name, unreadable ``splits.json``, a scenario missing
    from the data directory. The message is one line naming the file or flag and what to do."""


def read_splits(path=SPLITS_FILE) -> dict:
    """The parsed ``splits.json`` (keys ``about``, ``source``, ``rule``, ``bundled``,
    ``signal_scenarios``, ``splits`` = ``{name: [scenario ids]}``).

    Raises:
        SplitError: the file is missing, not JSON, or has no ``splits``.
    """
    path = pathlib.Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise SplitError(f"{path}: no such file (the split ships with the repository as data/splits.json)") from None
    except json.JSONDecodeError as e:
        raise SplitError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("splits"), dict):
        raise SplitError(f"{path}: no \"splits\" object; restore data/splits.json from the repository")
    return doc


def split_ids(name: str, path=SPLITS_FILE) -> list[str]:
    """The scenario ids of split ``name`` (``"train"`` or ``"held_out"``), in the file's order.

    Raises:
        SplitError: unknown split name, or as :func:`read_splits`.
    """
    splits = read_splits(path)["splits"]
    if name not in splits:
        raise SplitError(f"unknown split {name!r} in {path}; use one of: {', '.join(splits)}")
    return list(splits[name])


def scenario_file(data_dir: pathlib.Path, scenario_id: str) -> pathlib.Path | None:
    """The file of ``scenario_id`` in ``data_dir`` (``<id>.json.xz``, ``<id>.json`` or
    ``<id>.json.gz``), or None."""
    for suffix in SUFFIXES:
        f = data_dir / f"{scenario_id}{suffix}"
        if f.is_file():
            return f
    return None


def load_split(name: str, data_dir, missing: str = "error", path=SPLITS_FILE) -> list[pathlib.Path]:
    """The scenario files of split ``name`` found in ``data_dir``, in the split's order.

    Args:
        name: ``"train"`` or ``"held_out"``.
        data_dir: directory of WOMD JSON scenarios named by scenario id (the shared 72:
            ``../shared/data/womd``; the bundled ten, ``data/womd_sample``, hold part of ``train``).
        missing: ``"error"`` (default: every scenario of the split must be there) or ``"skip"``
            (return those present, e.g. the bundled part of ``train``).
        path: the splits file (default ``data/splits.json``).

    Raises:
        SplitError: unknown ``name`` or ``missing``, ``data_dir`` not a directory, a scenario of
            the split not in ``data_dir`` (with ``missing="error"``), or as :func:`read_splits`.
    """
    if missing not in ("error", "skip"):
        raise SplitError(f"load_split: missing must be 'error' or 'skip', got {missing!r}")
    ids = split_ids(name, path)
    data_dir = pathlib.Path(data_dir)
    if not data_dir.is_dir():
        raise SplitError(f"{data_dir}: not a directory; pass the directory of the WOMD scenarios "
                         f"(the project's 72: ../shared/data/womd)")
    files, absent = [], []
    for sid in ids:
        f = scenario_file(data_dir, sid)
        (files if f is not None else absent).append(f if f is not None else sid)
    if absent and missing == "error":
        raise SplitError(f"split {name!r} ({path}): {len(absent)} of its {len(ids)} scenarios are not in {data_dir}, "
                         f"first {absent[0]}{SUFFIXES[0]}; pass the directory of the 72 shared WOMD scenarios")
    return files


def held_out_ids(ids, bundled, signal_ids, count: int, salt: str) -> list[str]:
    """The held-out ids under the rule of the module docstring, sorted.

    Args:
        ids: every scenario id. bundled: ids that stay in train (the bundled sample).
        signal_ids: ids of the scenarios with traffic-signal states (a stratum of their own).
        count: how many to hold out. salt: the hash salt (fixes the draw).

    Raises:
        ValueError: ``count`` larger than the scenarios that may be held out, or a bundled or
            signal id that is not in ``ids``.
    """
    ids, bundled, signal_ids = set(ids), set(bundled), set(signal_ids)
    if not bundled <= ids or not signal_ids <= ids:
        raise ValueError("held_out_ids: bundled and signal ids must be scenario ids")
    pool = sorted(ids - bundled)
    if not 0 <= count <= len(pool):
        raise ValueError(f"held_out_ids: cannot hold out {count} of {len(pool)} scenarios")
    groups = [[i for i in pool if i in signal_ids], [i for i in pool if i not in signal_ids]]
    exact = [count * len(g) / len(pool) for g in groups] if pool else [0.0, 0.0]
    quota = [int(x) for x in exact]
    by_remainder = sorted(range(len(groups)), key=lambda k: (quota[k] - exact[k], k))  # largest remainder first
    for k in by_remainder[: count - sum(quota)]:
        quota[k] += 1

    def rank(sid: str) -> str:
        return hashlib.sha256(f"{salt}:{sid}".encode()).hexdigest()

    chosen = [sid for g, q in zip(groups, quota) for sid in sorted(g, key=rank)[:q]]
    return sorted(chosen)


def main(argv=None) -> int:
    """``python train/splits.py NAME --data DIR [--link OUT]`` (module docstring); exit 2 on a
    user error (one line)."""
    p = argparse.ArgumentParser(description="Scenario files of a split of data/splits.json.")
    p.add_argument("name", choices=SPLIT_NAMES)
    p.add_argument("--data", required=True, help="directory of the WOMD scenarios (e.g. ../shared/data/womd)")
    p.add_argument("--link", metavar="OUT", help="make OUT a directory of symbolic links to the split's files")
    p.add_argument("--skip-missing", action="store_true", help="leave out scenarios not in --data")
    args = p.parse_args(argv)
    try:
        files = load_split(args.name, args.data, missing="skip" if args.skip_missing else "error")
        if args.link:
            out = pathlib.Path(args.link)
            if out.exists() and any(out.iterdir()):
                raise SplitError(f"--link {out}: the directory is not empty; pass a new or empty directory")
            out.mkdir(parents=True, exist_ok=True)
            for f in files:
                (out / f.name).symlink_to(f.resolve())
    except (SplitError, OSError) as e:
        print(f"train/splits.py: {e}", file=sys.stderr)
        return 2
    print(f"{len(files)} scenarios of split {args.name!r} linked in {args.link}" if args.link
          else "\n".join(str(f) for f in files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
