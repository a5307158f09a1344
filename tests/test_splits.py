"""data/splits.json and train/splits.py: the split is disjoint, complete, follows its recorded rule,
keeps the bundled sample in train; the loader resolves ids to files and errors clearly."""

import json
import pathlib

import pytest

from train import splits
from train.splits import SplitError, held_out_ids, load_split, read_splits, split_ids

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "womd"


@pytest.fixture(scope="module")
def doc():
    return read_splits()


def test_split_is_disjoint_complete_and_sized(doc):
    train, held = doc["splits"]["train"], doc["splits"]["held_out"]
    assert set(doc["splits"]) == set(splits.SPLIT_NAMES)
    assert len(train) == len(set(train)) == 52 and len(held) == len(set(held)) == 20
    assert not set(train) & set(held)
    assert train == sorted(train) and held == sorted(held)
    assert doc["rule"]["held_out"] == len(held)
    assert "sha256" in doc["about"] and "womd_sample" in doc["about"] and "72" in doc["source"]


def test_bundled_sample_is_in_train(doc, sample_dir):
    bundled = sorted(f.name.removesuffix(".json.xz") for f in sample_dir.glob("*.json.xz"))
    assert len(bundled) == 10 and doc["bundled"] == bundled
    assert set(bundled) <= set(doc["splits"]["train"])
    assert load_split("train", sample_dir, missing="skip") == [sample_dir / f"{b}.json.xz" for b in bundled]


def test_held_out_follows_the_recorded_rule(doc):
    """Recomputing the rule from the ids in the file gives the file's held-out list, with 4 of the
    11 signal scenarios held out (20 * 11 / 62 = 3.55 rounds up by the largest remainder)."""
    ids = doc["splits"]["train"] + doc["splits"]["held_out"]
    held = held_out_ids(ids, doc["bundled"], doc["signal_scenarios"], doc["rule"]["held_out"], doc["rule"]["salt"])
    assert held == doc["splits"]["held_out"]
    assert len(doc["signal_scenarios"]) == 11 and len(set(held) & set(doc["signal_scenarios"])) == 4
    assert held_out_ids(ids, doc["bundled"], doc["signal_scenarios"], 20, "another salt") != held


def test_held_out_rule_by_hand():
    """Six ids, one bundled, two with signals: hold out 2 of the 5 others -> quotas 2*2/5 = 0.8 and
    2*3/5 = 1.2 -> 0 + 1, then the larger remainder (0.8) gets the second: one of each group, each the
    smallest sha256 in its group."""
    import hashlib

    ids, bundled, sig = ["a", "b", "c", "d", "e", "f"], ["a"], ["b", "c"]
    rank = lambda i: hashlib.sha256(f"s:{i}".encode()).hexdigest()  # noqa: E731
    want = sorted([min(["b", "c"], key=rank), min(["d", "e", "f"], key=rank)])
    assert held_out_ids(ids, bundled, sig, 2, "s") == want
    assert held_out_ids(ids, bundled, sig, 5, "s") == ["b", "c", "d", "e", "f"]
    with pytest.raises(ValueError, match="cannot hold out 6 of 5"):
        held_out_ids(ids, bundled, sig, 6, "s")
    with pytest.raises(ValueError, match="must be scenario ids"):
        held_out_ids(ids, ["z"], sig, 1, "s")


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"the project's shared WOMD scenarios are not at {SHARED}")
def test_split_covers_the_shared_scenarios(doc):
    ids = sorted(f.name.removesuffix(".json.xz") for f in SHARED.glob("*.json.xz"))
    assert ids == sorted(doc["splits"]["train"] + doc["splits"]["held_out"])
    held = load_split("held_out", SHARED)
    assert [f.name for f in held] == [f"{i}.json.xz" for i in doc["splits"]["held_out"]]


def test_loader_errors_are_one_clear_line(sample_dir, tmp_path):
    with pytest.raises(SplitError, match=r"split 'held_out' .*20 of its 20 scenarios are not in .*womd_sample, "
                                         r"first 238786b3cccc4a0e\.json\.xz"):
        load_split("held_out", sample_dir)
    with pytest.raises(SplitError, match=r"unknown split 'test'.*use one of: train, held_out"):
        split_ids("test")
    with pytest.raises(SplitError, match="not a directory"):
        load_split("train", tmp_path / "nowhere")
    with pytest.raises(SplitError, match="missing must be"):
        load_split("train", sample_dir, missing="ignore")
    bad = tmp_path / "splits.json"
    bad.write_text("{not json")
    with pytest.raises(SplitError, match="not valid JSON"):
        split_ids("train", path=bad)
    bad.write_text(json.dumps({"about": "x"}))
    with pytest.raises(SplitError, match='no "splits" object'):
        split_ids("train", path=bad)
    with pytest.raises(SplitError, match="no such file"):
        split_ids("train", path=tmp_path / "absent.json")


def test_cli_links_and_exit_2(sample_dir, tmp_path, capsys):
    out = tmp_path / "train_sample"
    assert splits.main(["train", "--data", str(sample_dir), "--skip-missing", "--link", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in sample_dir.glob("*.json.xz"))
    assert all(p.is_symlink() for p in out.iterdir())
    assert splits.main(["train", "--data", str(sample_dir), "--skip-missing", "--link", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert splits.main(["held_out", "--data", str(sample_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train/splits.py: split 'held_out'")
