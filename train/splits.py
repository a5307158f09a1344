"""The project's fixed splits of its WOMD scenes and a loader that turns a split into scenario files.

``data/splits_v2.json`` (the default, :data:`SPLITS_FILE`) splits the project's pool of 250 WOMD
scenes (GPUDrive-layout JSON, one file per scene: the 72 of ``../shared/data/womd`` and the 178 of
``../shared/data/womd_more``; docs/data.md says where each comes from) into ``train`` (175),
``validation`` (25) and ``held_out`` (50). Recipes, checkpoints, coefficients and decoding are
chosen on ``validation``; ``held_out`` is read once, for the final tables. Its rule
(:func:`assign_pool`): every scene of the first split, ``data/splits.json`` (72 scenes: 52 train,
20 held out; :func:`held_out_ids`), keeps its assignment, so the policies trained on those 52 stay
clean; the new scenes, ranked by the SHA-256 of ``"<salt>:<stem>"``, give 30 more held-out scenes
and the 25 validation scenes; the rest join train. Each entry of ``scenes`` records the file stem,
the ``scenario_id`` where the JSON has one, the WOMD split / shard / record of its
``tfrecord-SSSSS-of-NNNNN_R`` name where known, and a fingerprint (object count, first valid
positions) that ``python -m gpusim.data convert --split`` checks when it rebuilds a split from a
WOMD download. A split file is never edited: a new split gets a new salt and a new file
(``python train/splits.py build``).

Usage::

    from train.splits import load_split
    files = load_split("validation", ["../shared/data/womd", "../shared/data/womd_more"])

    python train/splits.py held_out --data ../shared/data/womd ../shared/data/womd_more   # paths
    python train/splits.py train --data ../shared/data/womd ../shared/data/womd_more --link /tmp/train
        # a directory of symbolic links, usable as --data of train/run.py and train/evaluate.py
    python train/splits.py train --data ... --limit 50 --copy /tmp/train50   # nested subset, copies
    python train/splits.py build --data ../shared/data/womd ../shared/data/womd_more --out NEW.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import re
import sys

from gpusim.data.convert import split_doc_problem
from gpusim.fileio import OutputError, check_output_path, write_text

REPO = pathlib.Path(__file__).resolve().parents[1]
#: The split of the 250-scene pool (train / validation / held_out): the default of every loader.
SPLITS_FILE = REPO / "data" / "splits_v2.json"
#: The first split (72 scenes, train / held_out), kept unedited: the parent of ``splits_v2.json``.
SPLITS_V1_FILE = REPO / "data" / "splits.json"
#: The split names of the pool's split file (``data/splits.json`` has only train and held_out).
SPLIT_NAMES = ("train", "validation", "held_out")
#: Scenario file endings tried, in order, for an id (the shared data is ``.json.xz``).
SUFFIXES = (".json.xz", ".json", ".json.gz")


class SplitError(ValueError):
    """A split that cannot be used: unknown name, unreadable ``splits.json``, a scenario missing
    from the data directory. The message is one line naming the file or flag and what to do."""


def read_splits(path=SPLITS_FILE) -> dict:
    """The parsed ``splits.json`` (keys ``about``, ``source``, ``rule``, ``bundled``,
    ``signal_scenarios``, ``splits`` = ``{name: [scenario ids]}``).

    Raises:
        SplitError: the file is missing, not JSON, has no ``splits``, or fails
            :func:`gpusim.data.convert.split_doc_problem` (an id that is not a file stem, a scene
            in two splits, ...).
    """
    path = pathlib.Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise SplitError(f"{path}: no such file (the split files ship with the repository: data/splits_v2.json, "
                         f"the pool's, and data/splits.json, the first)") from None
    except json.JSONDecodeError as e:
        raise SplitError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("splits"), dict):
        raise SplitError(f"{path}: no \"splits\" object; restore data/splits.json from the repository")
    problem = split_doc_problem(doc)
    if problem:
        raise SplitError(f"{path}: {problem}; restore the file from the repository or rebuild it with "
                         f"`python train/splits.py build`")
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


def _candidates(scenario_id: str, entry: dict | None) -> list[str]:
    """File stems under which a scene may be stored: its recorded stem, its ``scenario_id`` and
    its WOMD record name (the pool uses both conventions, GPUDrive's converter writes either)."""
    names = [scenario_id]
    if entry:
        for key in ("scenario_id", "record_name"):
            v = entry.get(key)
            if v and v not in names:
                names.append(v)
    return names


def scenario_file(data_dir, scenario_id: str, entry: dict | None = None) -> pathlib.Path | None:
    """The file of ``scenario_id`` in ``data_dir`` (one directory or a list of them), named by the
    stem, or by the entry's ``scenario_id`` or ``record_name`` when ``entry`` (a ``scenes`` entry of
    the pool's split file) is given; ``.json.xz``, ``.json`` or ``.json.gz``. None when absent."""
    dirs = [data_dir] if isinstance(data_dir, (str, pathlib.Path)) else list(data_dir)
    for d in dirs:
        for stem in _candidates(scenario_id, entry):
            for suffix in SUFFIXES:
                f = pathlib.Path(d) / f"{stem}{suffix}"
                if f.is_file():
                    return f
    return None


def _unreadable(f: pathlib.Path) -> str | None:
    """Why ``f`` cannot be read as a scenario file (empty, no permission, not xz / gzip / JSON by
    its first bytes), or None. A cheap check of the header only; a file corrupt further in is
    named by the converter when it reads it."""
    magic = {".xz": b"\xfd7zXZ\x00", ".gz": b"\x1f\x8b"}.get(f.suffix)
    try:
        with open(f, "rb") as fh:
            head = fh.read(8)
    except OSError as e:
        return e.strerror or type(e).__name__
    if not head:
        return "empty file"
    if magic and not head.startswith(magic):
        return f"not a {f.suffix[1:]} file"
    if f.suffix == ".json" and not head.lstrip()[:1] == b"{":
        return "not a JSON object"
    return None


def load_split(name: str, data_dir, missing: str = "error", path=SPLITS_FILE, limit: int | None = None
               ) -> list[pathlib.Path]:
    """The scenario files of split ``name`` found in ``data_dir``, in the split's order.

    Args:
        name: ``"train"``, ``"validation"`` or ``"held_out"`` (``data/splits.json``: ``"train"`` or
            ``"held_out"``).
        data_dir: directory of WOMD JSON scenarios, or a list of them (the pool of 250:
            ``[../shared/data/womd, ../shared/data/womd_more]``; the bundled ten, ``data/womd_sample``,
            hold part of ``train``). A scene is found by its stem, its scenario id or its WOMD record
            name (``tfrecord-SSSSS-of-NNNNN_R``), so both naming conventions work.
        missing: ``"error"`` (default: every scenario of the split must be there and readable) or
            ``"skip"`` (return those present, e.g. the bundled part of ``train``; refused for
            ``held_out`` and ``validation``, whose figures would silently rest on fewer scenes).
        path: the splits file (default ``data/splits_v2.json``).
        limit: the first ``limit`` scenes of the split only (the order of the pool's split file is the
            salted hash order, so the first N are nested subsets: the scaling curve's 25, 50, 100).

    Raises:
        SplitError: unknown ``name`` or ``missing``, ``data_dir`` not a directory, scenarios of the
            split absent or unreadable (named, with how many of the split are lost), none found even with
            ``missing="skip"``, or as
            :func:`read_splits`.
    """
    if missing not in ("error", "skip"):
        raise SplitError(f"load_split: missing must be 'error' or 'skip', got {missing!r}")
    if missing == "skip" and name in ("held_out", "validation"):
        raise SplitError(f"split {name!r}: scenes may not be skipped (its figures would rest on fewer scenes "
                         f"without a word); pass the directories that hold all of them")
    doc = read_splits(path)
    ids = split_ids(name, path)
    if limit is not None:
        if not 1 <= limit <= len(ids):
            raise SplitError(f"--limit {limit}: split {name!r} has {len(ids)} scenes; pass 1..{len(ids)}")
        ids = ids[:limit]
    scenes = doc.get("scenes", {})
    dirs = [data_dir] if isinstance(data_dir, (str, pathlib.Path)) else list(data_dir)
    for d in dirs:
        if not pathlib.Path(d).is_dir():
            raise SplitError(f"{d}: not a directory; pass the directories of the WOMD scenarios "
                             f"(the pool of 250: ../shared/data/womd ../shared/data/womd_more)")
    files, absent, bad = [], [], []
    for sid in ids:
        f = scenario_file(dirs, sid, scenes.get(sid))
        if f is None:
            absent.append(sid)
            continue
        why = _unreadable(f)
        if why is not None:
            bad.append(f"{f} ({why})")
            continue
        files.append(f)
    if bad:
        raise SplitError(f"split {name!r} ({pathlib.Path(path).name}): {len(bad)} of its {len(ids)} scenario files "
                         f"are unreadable, first {bad[0]}; restore them from the pool")
    if absent and missing == "error":
        where = " ".join(str(d) for d in dirs)
        raise SplitError(f"split {name!r} ({pathlib.Path(path).name}): {len(absent)} of its {len(ids)} scenarios are "
                         f"not in {where}, first {absent[0]}{SUFFIXES[0]}; pass the directories of the pool "
                         f"(docs/data.md says where each scene comes from)")
    if not files:
        raise SplitError(f"split {name!r} ({pathlib.Path(path).name}): none of its {len(ids)} scenarios is in "
                         f"{' '.join(str(d) for d in dirs)}; pass the directories of the pool")
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


#: The salt of the pool's split (``data/splits_v2.json``).
POOL_SALT = "gpusim-split-v2"
#: WOMD's shard counts by split: training has 1,000 shards, validation and testing 150 each.
WOMD_SHARDS = {1000: "training", 150: "validation"}
_RECORD = re.compile(r"^tfrecord-(\d{5})-of-(\d{5})_(\d+)$")
#: How many objects' first valid positions a ``scenes`` entry records (the converter's match check).
FINGERPRINT_OBJECTS = 8


def _rank(salt: str, stem: str) -> str:
    return hashlib.sha256(f"{salt}:{stem}".encode()).hexdigest()


def assign_pool(stems, parent: dict, salt: str = POOL_SALT, held_out: int = 30, validation: int = 25
                ) -> dict[str, list[str]]:
    """The pool's split under its rule: every scene of ``parent`` (the ``splits`` of
    ``data/splits.json``) keeps its assignment; of the new scenes, ranked by the SHA-256 of
    ``"<salt>:<stem>"`` (hex, smallest first), the first ``held_out`` join ``held_out``, the next
    ``validation`` form ``validation``, the rest join ``train``. Each list is in the same hash order,
    so its first N scenes are nested subsets.

    Args:
        stems: every scene of the pool (file stems). parent: ``{"train": [...], "held_out": [...]}``.

    Raises:
        ValueError: a parent scene not in ``stems``, or fewer new scenes than held_out + validation.
    """
    stems = set(stems)
    old = {s: k for k, v in parent.items() for s in v}
    if not set(old) <= stems:
        raise ValueError(f"assign_pool: {len(set(old) - stems)} scenes of the parent split are not in the pool")
    new = sorted(stems - set(old), key=lambda s: _rank(salt, s))
    if len(new) < held_out + validation:
        raise ValueError(f"assign_pool: {len(new)} new scenes, fewer than {held_out} + {validation}")
    pick = {s: "held_out" for s in new[:held_out]} | {s: "validation" for s in new[held_out:held_out + validation]}
    out = {"train": [], "validation": [], "held_out": []}
    for s in sorted(stems, key=lambda s: _rank(salt, s)):
        out[old.get(s) or pick.get(s, "train")].append(s)
    return out


def womd_origin(record_name: str | None) -> dict | None:
    """The WOMD split, shard and record of a ``tfrecord-SSSSS-of-NNNNN_R`` name, or None.

    ``-of-01000`` is WOMD's training split; ``-of-00150`` is validation or testing, and a scene
    with 91 logged steps is validation (testing shards hold the first 11 steps only), which every
    scene of the pool has. Returns ``{"split", "shard", "num_shards", "record"}``."""
    m = _RECORD.match(record_name or "")
    if not m:
        return None
    shard, n, rec = (int(g) for g in m.groups())
    return {"split": WOMD_SHARDS.get(n, "unknown"), "shard": shard, "num_shards": n, "record": rec}


def describe_scene(f: pathlib.Path) -> dict:
    """What a pool scene's JSON tells of its origin and the fingerprint the converter matches:
    ``scenario_id`` (or None), ``record_name`` (the converter's ``name`` or the file stem, or None),
    ``womd`` (:func:`womd_origin`), ``objects`` (count), ``first_xy`` (metres, the first valid
    position of each of the first :data:`FINGERPRINT_OBJECTS` objects, rounded to 1 cm; None for
    an object never valid), ``tracks_to_predict`` (count) and ``signals`` (per-lane signal states
    present)."""
    doc = _read_scene_json(f)
    stem = f.name.split(".json")[0]
    name = (doc.get("name") or "").split(".json")[0] or None
    record = name if _RECORD.match(name or "") else (stem if _RECORD.match(stem) else None)
    first = []
    for o in doc.get("objects", [])[:FINGERPRINT_OBJECTS]:
        i = next((t for t, v in enumerate(o.get("valid", [])) if v), None)
        p = o["position"][i] if i is not None else None
        first.append(None if p is None else [round(p["x"], 2), round(p["y"], 2)])
    return {"scenario_id": doc.get("scenario_id") or None, "record_name": record, "womd": womd_origin(record),
            "objects": len(doc.get("objects", [])), "first_xy": first,
            "tracks_to_predict": len((doc.get("metadata") or {}).get("tracks_to_predict") or []),
            "signals": bool(doc.get("tl_states"))}


def _read_scene_json(f: pathlib.Path) -> dict:
    import gzip
    import lzma

    opener = {".xz": lzma.open, ".gz": gzip.open}.get(f.suffix, open)
    with opener(f, "rt") as fh:
        return json.load(fh)


def build_pool_split(pool_dirs, parent_path=SPLITS_V1_FILE, salt: str = POOL_SALT, held_out: int = 30,
                     validation: int = 25, progress=None) -> dict:
    """The document of ``data/splits_v2.json``: the rule (:func:`assign_pool`) applied to every
    scene of ``pool_dirs``, with each scene's origin and fingerprint (:func:`describe_scene`).

    Raises:
        SplitError: a pool directory missing, a scene unreadable (named), or as :func:`assign_pool`.
    """
    files = {}
    for d in pool_dirs:
        d = pathlib.Path(d)
        if not d.is_dir():
            raise SplitError(f"--data {d}: not a directory of WOMD scenes")
        for f in sorted(d.glob("*.json*")):
            files.setdefault(f.name.split(".json")[0], f)
    parent = read_splits(parent_path)
    try:
        splits = assign_pool(files, parent["splits"], salt, held_out, validation)
    except ValueError as e:
        raise SplitError(str(e)) from None
    scenes = {}
    for i, (stem, f) in enumerate(sorted(files.items())):
        try:
            scenes[stem] = {"source": f.parent.name, **describe_scene(f)}
        except (OSError, ValueError, KeyError, EOFError) as e:
            raise SplitError(f"{f}: unreadable scene ({type(e).__name__}: {e}); restore it from the pool") from None
        if progress:
            progress(i + 1, len(files))
    for k, v in splits.items():
        for s in v:
            scenes[s]["split"] = k
    return {
        "about": ("Train / validation / held-out split of the project's pool of 250 WOMD scenes (GPUDrive-layout "
                  "JSON, one file each; docs/data.md says where each comes from and how to rebuild it from a WOMD "
                  "download). Choose recipes, checkpoints, coefficients and decoding on 'validation'; read "
                  "'held_out' once, for the final tables. Rule (train/splits.py, assign_pool): every scene of "
                  "the parent split keeps its assignment (its 52 train scenes stay in train, its 20 held-out in "
                  "held_out); the new scenes ranked by sha256('<salt>:<stem>') hex, smallest first: the first 30 "
                  "join held_out, the next 25 form validation, the rest join train. Each list is in hash order, "
                  "so its first N scenes are nested subsets. Never edit by hand: a new split gets a new salt and "
                  "a new file. WOMD origin: '-of-01000' shards are WOMD training, '-of-00150' shards with 91 "
                  "logged steps are WOMD validation (testing shards hold 11 steps). The WOMD version the records "
                  "were converted from is not recorded by the converter: unknown (the ids and record names match "
                  "any release that keeps WOMD 1.x's sharding)."),
        "version": 2,
        "parent": parent_path.name if isinstance(parent_path, pathlib.Path) else str(parent_path),
        "rule": {"salt": salt, "held_out_new": held_out, "validation": validation,
                 "hash": "sha256 of '<salt>:<stem>' (hex), smallest first", "parent": "assignments kept",
                 "fingerprint": f"objects count; first valid (x, y) of the first {FINGERPRINT_OBJECTS} objects, 1 cm"},
        "counts": {k: len(v) for k, v in splits.items()},
        "splits": splits,
        "scenes": scenes,
    }


def main(argv=None) -> int:
    """``python train/splits.py NAME --data DIR [DIR ...] [--link OUT | --copy OUT] [--limit N]``,
    or ``python train/splits.py build --data DIR [DIR ...] --out FILE`` (module docstring); exit 2 on
    a user error (one line)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["build"]:
        return _main_build(argv[1:])
    p = argparse.ArgumentParser(description="Scenario files of a split (default data/splits_v2.json).")
    p.add_argument("name", choices=SPLIT_NAMES)
    p.add_argument("--data", required=True, nargs="+", help="directories of the WOMD scenes "
                   "(the pool: ../shared/data/womd ../shared/data/womd_more)")
    out_flags = p.add_mutually_exclusive_group()
    out_flags.add_argument("--link", metavar="OUT", help="make OUT a directory of symbolic links to the split's files")
    out_flags.add_argument("--copy", metavar="OUT", help="make OUT a directory of copies of the split's files "
                   "(a folder that travels to another machine)")
    p.add_argument("--limit", type=int, help="the first N scenes of the split only (nested subsets)")
    p.add_argument("--splits-file", default=str(SPLITS_FILE), help="the split file (default data/splits_v2.json; "
                   "the first split: data/splits.json)")
    p.add_argument("--skip-missing", action="store_true", help="leave out scenarios not in --data (train only)")
    args = p.parse_args(argv)
    out_dir = args.link or args.copy
    try:
        if out_dir:
            check_output_path(out_dir, "--link" if args.link else "--copy", kind="dir")  # before the scenes are read
        files = load_split(args.name, args.data, missing="skip" if args.skip_missing else "error",
                           path=pathlib.Path(args.splits_file), limit=args.limit)
        if out_dir:
            out = pathlib.Path(out_dir)
            if out.exists() and any(out.iterdir()):
                raise SplitError(f"--{'link' if args.link else 'copy'} {out}: the directory is not empty; "
                                 f"pass a new or empty directory")
            out.mkdir(parents=True, exist_ok=True)
            import shutil

            for f in files:
                if args.link:
                    (out / f.name).symlink_to(f.resolve())
                else:
                    shutil.copyfile(f, out / f.name)
    except (SplitError, OSError, OutputError) as e:
        print(f"train/splits.py: {e}", file=sys.stderr)
        return 2
    verb = "linked" if args.link else "copied"
    print(f"{len(files)} scenarios of split {args.name!r} {verb} in {out_dir}" if out_dir
          else "\n".join(str(f) for f in files))
    return 0


def _main_build(argv) -> int:
    p = argparse.ArgumentParser(prog="train/splits.py build",
                                description="Write the pool's split file from its rule (never over an existing file).")
    p.add_argument("--data", required=True, nargs="+", help="the pool's directories")
    p.add_argument("--out", required=True, help="the new split file (e.g. data/splits_v2.json)")
    p.add_argument("--parent", default=str(SPLITS_V1_FILE), help="the split whose assignments are kept")
    p.add_argument("--salt", default=POOL_SALT)
    args = p.parse_args(argv)
    out = pathlib.Path(args.out)
    try:
        if out.exists():
            raise SplitError(f"--out {out}: exists; a split file is never rewritten (a new split gets a new salt "
                             f"and a new file)")
        check_output_path(out, "--out")  # before the scenes are read
        doc = build_pool_split(args.data, pathlib.Path(args.parent), args.salt,
                               progress=lambda i, n: print(f"read {i}/{n} scenes", file=sys.stderr) if i % 50 == 0 or i == n else None)
        write_text(out, json.dumps(doc, indent=1) + "\n", flag="--out")
    except (SplitError, OSError, OutputError) as e:
        print(f"train/splits.py: {e}", file=sys.stderr)
        return 2
    print(f"{out}: {doc['counts']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
