"""The evaluator's "these are its training scenes" warning compares what the scenes are, not
where they lie: a checkpoint records the scenario ids it trained on, so a copy of its training
scenes in another directory is warned about, a partial overlap is counted, other scenes are not
warned about; a checkpoint without the ids falls back to the file stems of its recorded directory,
then to the path."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from gpusim.config import EnvConfig
from policy import PolicyConfig
from train.checkpoint import TRAINING_SCENES_KEY, load_checkpoint
from train.config import TrainConfig
from train.packs import load_pack
from train.run import train

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLE, EXTRA = ROOT / "data" / "womd_sample", ROOT / "data" / "womd_extra"
ENV = dict(max_controlled=8)
SAMPLE_IDS = sorted(load_pack(str(SAMPLE), EnvConfig(**ENV)).scenario_ids)


def _copy(src: pathlib.Path, dst: pathlib.Path, names=None) -> pathlib.Path:
    dst.mkdir(parents=True)
    for f in sorted(src.glob("*.json.xz")):
        if names is None or f.name in names:
            shutil.copy(f, dst / f.name)
    return dst


@pytest.fixture(scope="module")
def ckpt_path(tmp_path_factory):
    """A one-update run on a copy of the bundled sample, which is then removed (as a shipped
    checkpoint records a directory of the machine it was trained on)."""
    tmp = tmp_path_factory.mktemp("train")
    data = _copy(SAMPLE, tmp / "womd_sample_copy")
    cfg = TrainConfig(num_worlds=2, total_timesteps=1, device="cpu", seed=0, log_dir=str(tmp / "runs"), run_name="r",
                      quiet=True, num_threads=1, data=str(data), env=EnvConfig(**ENV),
                      policy=PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16, max_roads=8))
    out = pathlib.Path(train(cfg)["checkpoint"])
    shutil.rmtree(data)
    return out


def _entry(ckpt: dict) -> dict:
    return {"label": "ck", "kind": "checkpoint", "ckpt": ckpt}


def test_checkpoint_records_its_training_scenes(ckpt_path):
    assert load_checkpoint(ckpt_path)["extra"][TRAINING_SCENES_KEY] == SAMPLE_IDS  # 10 ids, sorted


def test_a_copy_elsewhere_warns_other_scenes_do_not(ckpt_path, tmp_path):
    from train.evaluate import main, training_scene_notes

    copy = _copy(SAMPLE, tmp_path / "elsewhere")
    out = tmp_path / "eval.json"
    assert main(["--policy", str(ckpt_path), "--data", str(copy), "--device", "cpu", "--num-threads", "1",
                 "--quiet", "--json", str(out)]) == 0
    notes = json.loads(out.read_text())["notes"]
    assert notes[0].startswith("warning: r/checkpoint.pt was trained on ") and "these are its training scenes" in notes[0]
    ckpt = load_checkpoint(ckpt_path)
    extra = load_pack(str(EXTRA), EnvConfig(**ENV))
    assert training_scene_notes([_entry(ckpt)], str(EXTRA), extra) == []
    mixed = _copy(SAMPLE, tmp_path / "mixed", {"db4edc9bd0c9d18c.json.xz", "1c365f15b70ebdbf.json.xz"})
    for f in EXTRA.glob("*.json.xz"):
        shutil.copy(f, mixed / f.name)
    notes = training_scene_notes([_entry(ckpt)], str(mixed), load_pack(str(mixed), EnvConfig(**ENV)))
    assert len(notes) == 1 and "ck: 2 of 5 scenes evaluated here are among its training scenes" in notes[0]


def test_older_checkpoint_falls_back_to_stems_then_paths(ckpt_path, tmp_path):
    from train.evaluate import training_scene_notes

    ckpt = load_checkpoint(ckpt_path)
    old = {**ckpt, "extra": {k: v for k, v in ckpt["extra"].items() if k != TRAINING_SCENES_KEY}}
    copy = _copy(SAMPLE, tmp_path / "elsewhere")
    pack = load_pack(str(copy), EnvConfig(**ENV))
    assert training_scene_notes([_entry(old)], str(copy), pack) == []  # its directory is gone: the path, which differs
    here = {**old, "config": {**old["config"], "data": str(_copy(SAMPLE, tmp_path / "trained_here"))}}
    notes = training_scene_notes([_entry(here)], str(copy), pack)  # its recorded directory exists: its stems
    assert len(notes) == 1 and "these are its training scenes" in notes[0]
    assert training_scene_notes([_entry(here)], str(EXTRA), load_pack(str(EXTRA), EnvConfig(**ENV))) == []
    same = {**old, "config": {**old["config"], "data": str(copy)}}
    assert len(training_scene_notes([_entry(same)], str(copy), None)) == 1
