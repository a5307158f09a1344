"""``python -m gpusim.data convert SRC --split NAME``: a split's scenes taken from WOMD TFRecord shards
by record or by scenario id and checked against the split file's fingerprints; and objects with a
bad box size dropped (the scene kept) rather than the scene refused.

The TFRecord shards are written by the project's own exporter (``export-proto``) from bundled
GPUDrive-layout scenes, so the fingerprints recorded from those JSON files in
``data/splits_v2.json`` must match the records: the same objects in the same order, their first
valid positions within 1 cm.
"""

from __future__ import annotations

import copy
import json
import lzma
import math
import pathlib

import pytest
import torch

from gpusim.config import DataConfig
from gpusim.data import ScenarioPack
from gpusim.data.__main__ import main
from gpusim.data.convert import fingerprint_mismatch, womd_shard_key
from gpusim.data.parse import read_scenario
from gpusim.data.parse_proto import parse_record
from gpusim.data.proto_export import scenario_proto_from_json
from gpusim.data.tfrecord import write_records
from train.splits import read_splits

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "womd_sample"
#: Bundled scenes: two with a scenario id, one known only by its WOMD record name.
S1, S2, S3 = "db4edc9bd0c9d18c", "1c365f15b70ebdbf", "tfrecord-00001-of-01000_307"
SHARD0 = "training.tfrecord-00000-of-01000"


def sample(stem: str) -> pathlib.Path:
    return SAMPLE / f"{stem}.json.xz"


@pytest.fixture(scope="module")
def womd(tmp_path_factory):
    """A folder laid out like Waymo's download: ``training/training.tfrecord-00000-of-01000`` holding
    S1, S2, S3 (records 0, 1, 2, exported from the bundled JSON), and a corrupt shard 5 that a
    conversion by record must never open."""
    root = tmp_path_factory.mktemp("womd")
    (root / "training").mkdir()
    rc = main(["export-proto", *(str(sample(s)) for s in (S1, S2, S3)), "--out", str(root / "training" / SHARD0)])
    assert rc == 0
    (root / "training" / "training.tfrecord-00005-of-01000").write_bytes(b"not a tfrecord" * 10)
    return root


def real_entries(*stems) -> dict:
    """Deep copies of the split file's own entries for ``stems`` (scenario id, WOMD record, fingerprint)."""
    scenes = read_splits()["scenes"]
    return {s: copy.deepcopy(scenes[s]) for s in stems}


def write_split(path: pathlib.Path, entries: dict, name: str = "train") -> pathlib.Path:
    path.write_text(json.dumps({"splits": {name: list(entries)}, "scenes": entries}))
    return path


def at_record(entry: dict, record: int) -> dict:
    """The entry pointing at ``record`` of the test's shard 0 (the bundled scenes' real records are
    222, 4 and 307 of WOMD shards 0 and 1; the test shard holds three records)."""
    entry["womd"] = {"split": "training", "shard": 0, "num_shards": 1000, "record": record}
    return entry


def convert(capsys, *args) -> tuple[int, str, str]:
    rc = main(["convert", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def assert_same_as_json(pack_dir: pathlib.Path, stems):
    """The pack converted from the records equals the pack converted from the bundled JSON files."""
    got = ScenarioPack.load(pack_dir)
    want = ScenarioPack.from_json([str(sample(s)) for s in stems], DataConfig())
    assert got.num_scenarios == len(stems)
    assert torch.equal(got.num_agents, want.num_agents) and torch.equal(got.num_controlled, want.num_controlled)
    assert torch.equal(got.agent_source_index, want.agent_source_index)
    assert torch.allclose(got.traj_pos, want.traj_pos, atol=1e-3)


def test_by_record_reads_only_the_shards_the_split_names(womd, tmp_path, capsys):
    e = real_entries(S1, S3)
    del e[S1]["scenario_id"]  # found by record only
    at_record(e[S1], 0)
    at_record(e[S3], 2)  # S3 has no scenario id in its JSON: only its record finds it
    split = write_split(tmp_path / "split.json", e)
    rc, out, err = convert(capsys, womd, "--split", "train", "--splits-file", split, "--out", tmp_path / "pack")
    assert rc == 0, out + err
    assert "2 found and matching their fingerprint (2 by record, 0 by scenario id), 0 missing" in out
    assert "1 of 2 TFRecord file(s) read" in out
    assert "00005-of-01000" not in out + err  # the corrupt shard, named by no entry, was never opened
    assert "WOMD version its scenes were converted from: unknown" in out
    assert_same_as_json(tmp_path / "pack", [S1, S3])


def test_by_scenario_id_scans_the_given_files(womd, tmp_path, capsys):
    e = real_entries(S2, S1)
    del e[S1]["womd"]  # found by id only
    at_record(e[S2], 0)  # record 0 holds S1: S2's id does not match there, so its id finds it
    split = write_split(tmp_path / "split.json", e)
    rc, out, err = convert(capsys, womd, "--split", "train", "--splits-file", split, "--out", tmp_path / "pack")
    assert rc == 0, out + err
    assert "2 found and matching their fingerprint (0 by record, 2 by scenario id)" in out
    assert "1 of 2 TFRecord file(s) read" in out  # the scan stops once every scene is found
    assert_same_as_json(tmp_path / "pack", [S2, S1])


def test_mismatch_and_missing_scenes_are_named_and_refused(womd, tmp_path, capsys):
    e = real_entries(S1, S3, S2)
    at_record(e[S1], 0)
    x, y = e[S1]["first_xy"][2]
    e[S1]["first_xy"][2] = [x + 0.05, y]  # 5 cm off: another scene
    at_record(e[S3], 2)
    e[S3]["objects"] += 1
    e["0000000000000001"] = {**e[S2], "scenario_id": "0000000000000001", "womd": None}
    split = write_split(tmp_path / "split.json", e)
    pack = tmp_path / "pack"
    rc, out, err = convert(capsys, womd, "--split", "train", "--splits-file", split, "--out", pack)
    assert rc == 2
    lines = out.splitlines()
    assert any(ln.startswith(f"mismatch: {S1}: ") and "object 2's first valid position" in ln and "0.05 m" in ln
               for ln in lines), out
    n3 = read_splits()["scenes"][S3]["objects"]
    assert any(ln.startswith(f"mismatch: {S3}: ") and f"{n3} objects, the split file records {n3 + 1}" in ln
               for ln in lines), out
    assert any(ln.startswith("missing: 0000000000000001: scenario id 0000000000000001 not in the 2 TFRecord")
               for ln in lines), out
    assert "1 found and matching their fingerprint (0 by record, 1 by scenario id), 1 missing, 2 not matching" in out
    # the missing id made the scan read every given file: the corrupt shard is named, not skipped quietly
    assert any(ln.startswith("error: ") and "training.tfrecord-00005-of-01000: record[0]" in ln for ln in lines), out
    assert "3 of the 4 scenes" in err and "--allow-missing" in err
    assert not pack.exists()
    rc, out, err = convert(capsys, womd, "--split", "train", "--splits-file", split, "--out", pack, "--allow-missing")
    assert rc == 0, out + err
    assert ScenarioPack.load(pack).scenario_ids == [S2]


def test_by_record_stops_after_the_last_record_wanted(womd, tmp_path, capsys):
    e = real_entries(S1)
    at_record(e[S1], 0)
    split = write_split(tmp_path / "split.json", e)
    rc, out, err = convert(capsys, womd, "--split", "train", "--splits-file", split, "--out", tmp_path / "pack")
    assert rc == 0, out + err
    assert "1 of 2 TFRecord file(s) read, 1 record(s)" in out  # not the shard's other two records


def test_record_missing_from_its_shard_without_an_id_is_named(womd, tmp_path, capsys):
    e = real_entries(S3)  # no scenario id; its real record is 307 of shard 1
    split = write_split(tmp_path / "split.json", e)
    rc, out, _ = convert(capsys, womd, "--split", "train", "--splits-file", split, "--out", tmp_path / "p")
    assert rc == 2
    assert f"missing: {S3}: record 307 of training.tfrecord-00001-of-01000: that shard file is not among" in out
    e[S3]["womd"]["shard"] = 0  # shard 0 is given but holds 3 records
    write_split(split, e)
    rc, out, _ = convert(capsys, womd, "--split", "train", "--splits-file", split, "--out", tmp_path / "p")
    assert rc == 2 and f"missing: {S3}: record 307 of " in out and "the file holds 3 record(s)" in out


def test_fingerprint_tolerance_is_one_centimetre():
    entry = {"objects": 3, "first_xy": [[10.0, -5.0], None, [1.25, 2.5]]}
    assert fingerprint_mismatch(entry, 3, [(10.004, -4.996), None, (1.25, 2.5)]) is None
    assert "0.02 m" in fingerprint_mismatch(entry, 3, [(10.0, -5.02), None, (1.25, 2.5)])
    assert "never valid in the split file" in fingerprint_mismatch(entry, 3, [(10.0, -5.0), (0.0, 0.0), (1.25, 2.5)])
    assert "4 objects" in fingerprint_mismatch(entry, 4, [(10.0, -5.0), None, (1.25, 2.5)])


@pytest.mark.parametrize("path, key", [
    ("dl/training/training.tfrecord-00012-of-01000", ("training", 12, 1000)),
    ("validation.tfrecord-00003-of-00150.gz", ("validation", 3, 150)),
    ("x/validation/tfrecord-00003-of-00150", ("validation", 3, 150)),  # the folder names the split
    ("x/tfrecord-00003-of-00150", (None, 3, 150)),
    ("training_20s.tfrecord-00001-of-01000", ("training_20s", 1, 1000)),  # another set: never a training shard
    ("tfrecord-00001-of-01000_307.json.xz", None),
])
def test_womd_shard_names(path, key):
    assert womd_shard_key(path) == key


@pytest.mark.parametrize("args, words", [
    (["--splits-file", "x.json"], "--splits-file needs --split"),
    (["--split", "nope"], "--split nope: no such split"),
    (["--split", "train", "--shard-size", "2"], "--shard-size cannot be combined with --split"),
    (["--split", "train", "--splits-file", "no/such.json"], "--splits-file no/such.json: cannot read"),
])
def test_split_usage_errors(womd, tmp_path, capsys, args, words):
    rc, out, err = convert(capsys, womd, "--out", tmp_path / "p", *args)
    assert rc == 2 and words in err and not (tmp_path / "p").exists()


def test_missing_source_folder_is_a_usage_error(tmp_path, capsys):
    rc, _, err = convert(capsys, tmp_path / "nowhere", "--split", "held_out", "--out", tmp_path / "p")
    assert rc == 2 and "nowhere: no such file or directory" in err


# ----------------------------------------------------------------- one bad object does not cost the scene

def _doc(stem: str) -> dict:
    with lzma.open(sample(stem), "rt") as fh:
        return json.load(fh)


def _kept_object(stem: str) -> int:
    """The file index of a packed, non-SDC object of a bundled scene."""
    pack = ScenarioPack.from_json(str(sample(stem)))
    src = [int(i) for i in pack.agent_source_index[0, : int(pack.num_agents[0])]]
    sdc = _doc(stem).get("metadata", {}).get("sdc_track_index")
    return next(i for i in src if i != sdc)


@pytest.mark.parametrize("key, value", [("width", 0), ("length", -1.5), ("width", math.nan)])
def test_object_with_bad_size_is_dropped_and_counted(tmp_path, capsys, key, value):
    stem = S3
    k = _kept_object(stem)
    doc = _doc(stem)
    doc["objects"][k][key] = value
    f = tmp_path / f"{stem}.json"
    f.write_text(json.dumps(doc))
    raw = read_scenario(f)
    assert k not in raw.source_index.tolist() and raw.num_objects == len(doc["objects"]) - 1
    assert raw.dropped_objects == [{"field": f"objects[{k}]", "reason": raw.dropped_objects[0]["reason"]}]
    assert raw.dropped_objects[0]["reason"].startswith(f"{key} {float(value)!r}")
    rc, out, err = convert(capsys, f, "--out", tmp_path / "pack")
    assert rc == 0, out + err
    assert f"dropped: {f}: objects[{k}]: {key} " in out
    assert f"converted 1 of 1 file(s)" in out
    assert f"1 object(s) with a width or length that is not a finite number > 0 dropped, their scenarios kept " \
           f"({f.name}: 1)" in out
    pack = ScenarioPack.load(tmp_path / "pack")
    assert pack.stats["bad_size_objects"] == 1
    assert k not in pack.agent_source_index[0].tolist()


def test_never_valid_object_with_zero_width_is_dropped_as_never_valid(tmp_path):
    doc = _doc(S3)
    doc["objects"][0]["valid"] = [False] * len(doc["objects"][0]["valid"])
    doc["objects"][0]["width"] = 0
    f = tmp_path / "s.json"
    f.write_text(json.dumps(doc))
    pack = ScenarioPack.from_json(str(f))
    base = ScenarioPack.from_json(str(sample(S3)))
    assert pack.stats["bad_size_objects"] == 0 and pack.stats["dropped_objects"] == []
    assert pack.stats["never_valid_objects"] == base.stats["never_valid_objects"] + 1


def test_track_with_bad_size_in_a_tfrecord_is_dropped(tmp_path):
    stem = S3
    k = _kept_object(stem)
    msg = scenario_proto_from_json(sample(stem))  # every object of the JSON is a track, in order
    last = max(t for t, s in enumerate(msg.tracks[k].states) if s.valid)
    msg.tracks[k].states[last].width = 0.0
    f = write_records(tmp_path / "one.tfrecord", [msg.SerializeToString()])
    raw = parse_record(msg.SerializeToString(), f, 0)
    assert k not in raw.source_index.tolist() and raw.num_objects == len(msg.tracks) - 1
    assert [d["field"] for d in raw.dropped_objects] == [f"record[0].tracks[{k}].states[{last}]"]
    pack = ScenarioPack.from_json(str(f))
    assert pack.stats["bad_size_objects"] == 1 and pack.stats["dropped_objects"][0]["record"] == 0
    assert k not in pack.agent_source_index[0].tolist()
