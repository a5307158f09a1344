"""data/splits.json and train/splits.py: the split is disjoint, complete, follows its recorded rule,
keeps the bundled sample in train; the loader resolves ids to files and errors clearly."""

import json
import pathlib

import pytest

from train import splits
from train.splits import SPLITS_V1_FILE, SplitError, held_out_ids, load_split, read_splits, split_ids

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "womd"


@pytest.fixture(scope="module")
def doc():
    return read_splits(SPLITS_V1_FILE)


def test_split_is_disjoint_complete_and_sized(doc):
    train, held = doc["splits"]["train"], doc["splits"]["held_out"]
    assert set(doc["splits"]) == {"train", "held_out"}
    assert len(train) == len(set(train)) == 52 and len(held) == len(set(held)) == 20
    assert not set(train) & set(held)
    assert train == sorted(train) and held == sorted(held)
    assert doc["rule"]["held_out"] == len(held)
    assert "sha256" in doc["about"] and "womd_sample" in doc["about"] and "72" in doc["source"]


def test_bundled_sample_is_in_train(doc, sample_dir):
    bundled = sorted(f.name.removesuffix(".json.xz") for f in sample_dir.glob("*.json.xz"))
    assert len(bundled) == 10 and doc["bundled"] == bundled
    assert set(bundled) <= set(doc["splits"]["train"])
    assert load_split("train", sample_dir, missing="skip", path=SPLITS_V1_FILE) == [
        sample_dir / f"{b}.json.xz" for b in bundled]


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
    held = load_split("held_out", SHARED, path=SPLITS_V1_FILE)
    assert [f.name for f in held] == [f"{i}.json.xz" for i in doc["splits"]["held_out"]]


def test_loader_errors_are_one_clear_line(sample_dir, tmp_path):
    with pytest.raises(SplitError, match=r"split 'held_out' .*20 of its 20 scenarios are not in .*womd_sample, "
                                         r"first 238786b3cccc4a0e\.json\.xz"):
        load_split("held_out", sample_dir, path=SPLITS_V1_FILE)
    with pytest.raises(SplitError, match=r"unknown split 'test'.*use one of: train, validation, held_out"):
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


# --- the pool's split (data/splits_v2.json) -------------------------------------------------------

SHARED_MORE = REPO.parent / "shared" / "data" / "womd_more"


@pytest.fixture(scope="module")
def pool():
    return read_splits()


def test_pool_split_sizes_and_parent_kept(pool, doc):
    s = pool["splits"]
    assert {k: len(v) for k, v in s.items()} == {"train": 175, "validation": 25, "held_out": 50} == pool["counts"]
    every = s["train"] + s["validation"] + s["held_out"]
    assert len(every) == len(set(every)) == 250 == len(pool["scenes"])
    assert set(doc["splits"]["train"]) <= set(s["train"]) and set(doc["splits"]["held_out"]) <= set(s["held_out"])
    assert not set(s["validation"]) & set(doc["splits"]["train"] + doc["splits"]["held_out"])
    assert all(pool["scenes"][x]["split"] == k for k, v in s.items() for x in v)
    assert pool["rule"]["salt"] == splits.POOL_SALT and pool["parent"] == "splits.json"


def test_pool_split_follows_its_recorded_rule(pool, doc):
    """The rule recomputed from the stems the file records gives the file's lists, order included;
    another salt gives another draw."""
    stems = list(pool["scenes"])
    again = splits.assign_pool(stems, doc["splits"], pool["rule"]["salt"], pool["rule"]["held_out_new"],
                               pool["rule"]["validation"])
    assert again == pool["splits"]
    assert splits.assign_pool(stems, doc["splits"], "another salt")["validation"] != pool["splits"]["validation"]


def test_assign_pool_by_hand():
    """Parent: a train, b held out. Of c..g ranked by sha256('s:<stem>'): 1 to held_out, 2 to validation."""
    import hashlib

    rank = lambda i: hashlib.sha256(f"s:{i}".encode()).hexdigest()  # noqa: E731
    new = sorted("cdefg", key=rank)
    got = splits.assign_pool(list("abcdefg"), {"train": ["a"], "held_out": ["b"]}, "s", held_out=1, validation=2)
    assert sorted(got["held_out"]) == sorted(["b", new[0]]) and got["validation"] == new[1:3]
    assert sorted(got["train"]) == sorted(["a", *new[3:]])
    assert got["train"] == sorted(got["train"], key=rank)  # hash order: first N nested
    with pytest.raises(ValueError, match="fewer than 4 \\+ 2"):
        splits.assign_pool(list("abcdefg"), {"train": ["a"], "held_out": ["b"]}, "s", held_out=4, validation=2)
    with pytest.raises(ValueError, match="not in the pool"):
        splits.assign_pool(list("cdefg"), {"train": ["a"]}, "s", 1, 1)


def test_womd_origin():
    assert splits.womd_origin("tfrecord-00124-of-00150_62") == {"split": "validation", "shard": 124,
                                                                 "num_shards": 150, "record": 62}
    assert splits.womd_origin("tfrecord-00001-of-01000_307")["split"] == "training"
    assert splits.womd_origin("1c365f15b70ebdbf") is None and splits.womd_origin(None) is None


def test_recorded_origin_and_fingerprint_of_the_bundled_scenes(pool, sample_dir):
    """The bundled scenes are pool scenes: their entries equal what their JSON tells."""
    for f in sorted(sample_dir.glob("*.json.xz")):
        stem = f.name.removesuffix(".json.xz")
        entry = {k: v for k, v in pool["scenes"][stem].items() if k not in ("source", "split")}
        assert splits.describe_scene(f) == entry, stem
        assert pool["scenes"][stem]["split"] == "train"


def test_loader_finds_either_name_and_names_what_is_lost(pool, sample_dir, tmp_path):
    """A scene stored under its record name instead of its scenario id is found; a split with
    absent scenes names how many are lost; held_out cannot be skipped; an unreadable file is named."""
    sid = next(s for s, e in pool["scenes"].items()
               if e["split"] == "train" and e["scenario_id"] == s and e["record_name"] and (sample_dir / f"{s}.json.xz").exists())
    d = tmp_path / "pool"
    d.mkdir()
    (d / f"{pool['scenes'][sid]['record_name']}.json.xz").write_bytes((sample_dir / f"{sid}.json.xz").read_bytes())
    assert [f.name for f in load_split("train", d, missing="skip")] == [f"{pool['scenes'][sid]['record_name']}.json.xz"]
    with pytest.raises(SplitError, match=r"split 'train' \(splits_v2.json\): 174 of its 175 scenarios are not in"):
        load_split("train", d)
    with pytest.raises(SplitError, match="may not be skipped"):
        load_split("held_out", d, missing="skip")
    (d / f"{pool['scenes'][sid]['record_name']}.json.xz").write_bytes(b"")
    with pytest.raises(SplitError, match=r"1 of its 175 scenario files are unreadable, first .*\(empty file\)"):
        load_split("train", d, missing="skip")
    assert [len(load_split("train", sample_dir, missing="skip", limit=n)) for n in (175, 50)][0] == 10
    with pytest.raises(SplitError, match="--limit 0"):
        load_split("train", sample_dir, missing="skip", limit=0)


def test_build_refuses_to_rewrite(tmp_path, capsys):
    f = tmp_path / "s.json"
    f.write_text("{}")
    assert splits.main(["build", "--data", str(tmp_path), "--out", str(f)]) == 2
    assert "never rewritten" in capsys.readouterr().err and f.read_text() == "{}"


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_MORE.is_dir(), reason=f"the pool is not at {SHARED_MORE}")
def test_pool_split_rebuilds_from_the_pool(pool, tmp_path):
    """Reading all 250 scenes again gives the file, byte for byte."""
    out = tmp_path / "v2.json"
    assert splits.main(["build", "--data", str(SHARED), str(SHARED_MORE), "--out", str(out)]) == 0
    assert out.read_text() == splits.SPLITS_FILE.read_text()
    held = load_split("held_out", [SHARED, SHARED_MORE])
    assert len(held) == 50
