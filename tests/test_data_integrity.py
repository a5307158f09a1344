"""Data integrity: nothing corrupt or stale is served and every bad input is named.

Checksums in pack files and in the shard index (corrupt bytes at the start, middle and end of a
pack and of a shard), invariants checked on load, one dataset per directory (``--overwrite``,
interrupted conversions), ``info`` on real file sizes with verification, packs written before
checksums, empty input files, the scenario pool's counts after a bad shard, and the adapters'
action checks."""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings

import pytest
import torch

from gpusim.config import DataConfig
from gpusim.data import ScenarioPack, convert_sources
from gpusim.data.__main__ import main as cli
from gpusim.data.errors import PackFileError
from gpusim.data.pool import ScenarioPool
from gpusim.data.shards import ShardedPack, convert_sharded, load_any

CFG = DataConfig(max_agents=16, max_controlled=4, grid_k=16, grid_edge_k=8, grid_cell_size=10.0)
FLAGS = ["--max-agents", "16", "--max-controlled", "4", "--grid-k", "16", "--grid-edge-k", "8", "--cell-size", "10",
         "--no-progress"]


@pytest.fixture(scope="module")
def files(sample_dir):
    return sorted(sample_dir.glob("*.json*"))[:5]


@pytest.fixture(scope="module")
def whole(files):
    return ScenarioPack.from_json(files, CFG)


@pytest.fixture(scope="module")
def saved(whole, tmp_path_factory):
    """Bytes of the 5-scenario pack as a .pt file and of a 3-shard dataset (2, 2, 1 scenarios)."""
    d = tmp_path_factory.mktemp("saved")
    whole.save(d / "p.pt")
    sp, _ = convert_sharded(whole.source_files, d / "sh", CFG, shard_size=2)
    return d


def _copy_dataset(saved, tmp_path):
    shutil.copytree(saved, tmp_path / "d")
    return tmp_path / "d"


def _corrupt(file, where: str, n: int = 4096, seed: int = 0):
    """Overwrite ``n`` bytes at the start, middle or end of ``file`` with random bytes."""
    data = bytearray(file.read_bytes())
    n = min(n, len(data) // 4)
    at = {"start": 0, "middle": len(data) // 2, "end": len(data) - n}[where]
    g = torch.Generator().manual_seed(seed)
    data[at:at + n] = bytes(torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8).tolist())
    file.write_bytes(bytes(data))


# ------------------------------------------------------------------------------------ checksums
@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_corrupt_pack_file_is_refused(saved, tmp_path, where):
    d = _copy_dataset(saved, tmp_path)
    _corrupt(d / "p.pt", where)
    with pytest.raises(PackFileError, match=r"p\.pt.*convert the data again"):
        ScenarioPack.load(d / "p.pt")


def test_corrupt_tensor_is_named(whole, tmp_path):
    # flip bytes inside grid_road's storage: the zip still reads, the checksum names the tensor
    out = whole.save(tmp_path / "p.pt")
    data = bytearray(out.read_bytes())
    raw = whole.grid_road.contiguous().view(torch.uint8).numpy().tobytes()
    at = data.find(raw[:64])
    assert at > 0
    data[at + 100:at + 104] = b"\xff\x7f\x00\x80"
    out.write_bytes(bytes(data))
    with pytest.raises(PackFileError, match="p.pt: grid_road: checksum mismatch"):
        ScenarioPack.load(out)


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_corrupt_shard_is_skipped_with_scenarios_lost(saved, tmp_path, whole, where):
    d = _copy_dataset(saved, tmp_path)
    _corrupt(d / "sh" / "shard-00001.pt", where)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        p = load_any(d / "sh")
    msgs = [str(x.message) for x in w]
    assert any("shard-00001.pt" in m and "2 of 5 scenarios lost (3 left)" in m for m in msgs), msgs
    assert p.scenario_ids == [whole.scenario_ids[i] for i in (0, 1, 4)]
    assert p.stats["bad_shards"] == [{"file": "shard-00001.pt", "scenarios": 2}]


def test_stale_shard_from_another_conversion_is_refused(saved, tmp_path, files):
    # a shard file of the same size and config but other scenarios: only the index CRC sees it
    d = _copy_dataset(saved, tmp_path)
    other, _ = convert_sharded([files[3], files[2]], tmp_path / "o", CFG, shard_size=2)
    shutil.copy(other.shard_file(0), d / "sh" / "shard-00001.pt")
    sp = ShardedPack.open(d / "sh")
    sp.shards[1]["bytes"] = (d / "sh" / "shard-00001.pt").stat().st_size  # same size as recorded
    with pytest.raises(PackFileError, match="shard-00001.pt: checksum mismatch with the index"):
        sp.load_shard(1)


def test_pack_written_before_checksums_loads_with_one_note(whole, tmp_path):
    payload = torch.load(whole.save(tmp_path / "new.pt"), weights_only=True)
    del payload["meta"]["checksums"]
    payload["meta"]["format_version"] = 3
    torch.save(payload, tmp_path / "old.pt")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        p = ScenarioPack.load(tmp_path / "old.pt")
        ScenarioPack.load(tmp_path / "old.pt")  # noted once per file
    notes = [str(x.message) for x in w if "checksums" in str(x.message)]
    assert len(notes) == 1 and "old.pt" in notes[0] and "convert the data again" in notes[0]
    assert "\n" not in notes[0] and p.scenario_ids == whole.scenario_ids


def test_sharded_pack_written_before_checksums_is_noted_once(saved, tmp_path, whole):
    d = _copy_dataset(saved, tmp_path) / "sh"
    idx = json.loads((d / "index.json").read_text())
    idx["version"] = 1
    for entry in idx["shards"]:
        payload = torch.load(d / entry["file"], weights_only=True)
        del payload["meta"]["checksums"]
        payload["meta"]["format_version"] = 3
        torch.save(payload, d / entry["file"])
        entry.pop("crc32c")
        entry["bytes"] = (d / entry["file"]).stat().st_size
    (d / "index.json").write_text(json.dumps(idx))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        p = load_any(d)
    notes = [str(x.message) for x in w if "checksums" in str(x.message)]
    assert notes == [f"{d}: sharded pack written before checksums (index version 1; corruption cannot be "
                     f"detected); convert the data again to add them"]
    assert p.scenario_ids == whole.scenario_ids


# ------------------------------------------------------------------------------------ invariants
@pytest.mark.parametrize("field,value,message", [
    ("grid_road", 30000, r"grid_road: row \d+ \(scenario 0, .*\) holds 30000 with \d+ segment"),
    ("grid_edge", -5, r"grid_edge: row \d+ .* holds -5"),
    ("traj_pos", float("nan"), r"traj_pos: nan at index \[0, 0, 0, 0\] \(scenario 0, '\w+'\), expected finite"),
    ("num_controlled", 99, r"num_controlled: scenario 0 \('\w+'\) holds 99, expected in \[0, num_agents\]"),
    ("sdc_index", 16, r"sdc_index: scenario 0 .* holds 16, expected in \[-1, num_agents\)"),
    ("agent_type", 7, r"agent_type: scenario 0 .* holds a value, expected in \[-1, 3\)"),
])
def test_invariants_checked_on_load_name_the_field(whole, tmp_path, field, value, message):
    bad = whole.select([0, 1])
    t = getattr(bad, field).clone()
    t.view(-1)[0] = value
    setattr(bad, field, t)
    out = bad.save(tmp_path / "bad.pt")  # checksums of the bad data: only the invariants catch it
    with pytest.raises(PackFileError, match="bad.pt: inconsistent pack .*" + message):
        ScenarioPack.load(out)


# ----------------------------------------------------------------------- one dataset per directory
def test_pack_into_a_sharded_directory_refused_then_overwritten(saved, tmp_path, files, capsys):
    d = _copy_dataset(saved, tmp_path) / "sh"
    assert cli(["convert", str(files[0]), "--out", str(d), *FLAGS]) == 2
    err = capsys.readouterr().err
    assert f"--out {d} already holds a sharded pack (index.json, 3 shard file(s)): pass --overwrite" in err
    assert load_any(d).num_scenarios == 5  # untouched
    assert cli(["convert", str(files[0]), "--out", str(d), *FLAGS, "--overwrite"]) == 0
    assert sorted(os.listdir(d)) == ["meta.json", "pack.pt"]
    assert load_any(d).num_scenarios == 1
    with pytest.raises(FileExistsError, match="already holds a pack"):
        convert_sharded(files[:1], d, CFG, shard_size=2)


def test_existing_pt_file_refused_without_overwrite(saved, tmp_path, files, capsys):
    d = _copy_dataset(saved, tmp_path)
    assert cli(["convert", str(files[0]), "--out", str(d / "p.pt"), *FLAGS]) == 2
    assert "already holds the pack file" in capsys.readouterr().err
    assert ScenarioPack.load(d / "p.pt").num_scenarios == 5


def test_directory_of_two_datasets_is_refused(saved, tmp_path):
    # what an older version left behind: a pack written beside a sharded pack's index
    d = _copy_dataset(saved, tmp_path)
    shutil.copy(d / "p.pt", d / "sh" / "pack.pt")
    for load in (load_any, ScenarioPack.load, ShardedPack.open):
        with pytest.raises(PackFileError, match="holds two datasets, a sharded pack .* and a pack"):
            load(d / "sh")


def test_interrupted_conversion_is_named_everywhere(saved, tmp_path, files, capsys):
    d = _copy_dataset(saved, tmp_path) / "sh"
    (d / "index.json").unlink()
    expect = "interrupted conversion: 3 orphan shard(s), no index.json"
    with pytest.raises(PackFileError, match=re.escape(expect)):
        load_any(d)
    _, stats = convert_sources([d])
    assert expect in stats["errors"][0]["reason"] and "--overwrite" in stats["errors"][0]["reason"]
    assert cli(["info", str(d)]) == 1
    assert expect in capsys.readouterr().err
    assert cli(["convert", str(files[0]), "--out", str(d), *FLAGS, "--shard-size", "2"]) == 2
    assert expect in capsys.readouterr().err
    assert cli(["convert", str(files[0]), "--out", str(d), *FLAGS, "--shard-size", "2", "--overwrite"]) == 0
    assert sorted(os.listdir(d)) == ["index.json", "shard-00000.pt"]


# ------------------------------------------------------------------------------------ info
def test_info_reads_real_sizes_and_verifies(saved, tmp_path, capsys):
    d = _copy_dataset(saved, tmp_path) / "sh"
    recorded = json.loads((d / "index.json").read_text())["shards"]
    assert cli(["info", str(d)]) == 0
    assert "checksums verified; 0 bad shard(s)" in capsys.readouterr().out
    (d / "shard-00002.pt").unlink()
    data = (d / "shard-00000.pt").read_bytes()
    (d / "shard-00000.pt").write_bytes(data[: len(data) // 2])
    _corrupt(d / "shard-00001.pt", "middle")
    assert cli(["info", str(d)]) == 1
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("shard-")}
    assert rows["shard-00000.pt"][2] == str(len(data) // 2) and rows["shard-00000.pt"][3] == "BAD"
    assert rows["shard-00002.pt"][2] == "0" and rows["shard-00001.pt"][3] == "BAD"
    assert f"{len(data) // 2} bytes where the index records {recorded[0]['bytes']}" in out
    assert "shard-00001.pt: checksum mismatch with the index" in out
    assert "3 bad shard(s), 5 of 5 scenarios lost (0 left)" in out
    assert cli(["info", str(d), "--no-verify"]) == 1  # sizes are still checked
    out = capsys.readouterr().out
    assert "checksums not verified (--no-verify); 2 bad shard(s)" in out and "shard-00001.pt" not in out.split("error:", 1)[1]


def test_info_on_a_corrupt_pack_file_exits_1_naming_it(saved, tmp_path, capsys):
    d = _copy_dataset(saved, tmp_path)
    assert cli(["info", str(d / "p.pt")]) == 0
    capsys.readouterr()
    _corrupt(d / "p.pt", "middle")
    assert cli(["info", str(d / "p.pt")]) == 1
    assert f"error: {d / 'p.pt'}" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ inputs
def test_empty_files_are_named_and_counted(sample_dir, tmp_path, capsys):
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    good = sample_dir / "tfrecord-00068-of-01000_277.json.xz"
    assert cli(["convert", str(tmp_path / "empty.tfrecord"), str(good), "--out", str(tmp_path / "o.pt"), *FLAGS]) == 0
    out = capsys.readouterr().out
    assert f"error: {tmp_path / 'empty.tfrecord'}: empty file (0 bytes)" in out
    assert "converted 1 of 2 file(s)" in out and "1 bad (1 empty file(s))" in out
    assert cli(["convert", str(tmp_path / "empty.tfrecord"), "--out", str(tmp_path / "n.pt"), *FLAGS]) == 1
    assert "empty.tfrecord: empty file (0 bytes)" in capsys.readouterr().out


def test_pool_counts_only_usable_scenarios(saved, tmp_path):
    d = _copy_dataset(saved, tmp_path) / "sh"
    _corrupt(d / "shard-00001.pt", "middle")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        pool = ScenarioPool(d, 2, background=False)
    msgs = [str(x.message) for x in w]
    assert any("shard-00001.pt" in m and "2 scenario(s) lost (3 of 5 left)" in m for m in msgs), msgs
    assert pool.num_scenarios == 3
    seen = {i for _ in range(6) for i in (pool.swap() and pool.history[-1])}
    assert seen <= {0, 1, 4}


def test_info_past_the_verify_limit_checks_sizes_unless_verify(saved, tmp_path, capsys, monkeypatch):
    import gpusim.data.__main__ as data_cli

    d = _copy_dataset(saved, tmp_path) / "sh"
    _corrupt(d / "shard-00001.pt", "middle")
    monkeypatch.setattr(data_cli, "VERIFY_LIMIT", 1000)
    assert cli(["info", str(d)]) == 0
    out = capsys.readouterr().out
    assert "sizes checked, checksums not verified (" in out and " bytes > 1000: pass --verify); 0 bad" in out
    assert cli(["info", str(d), "--verify"]) == 1
    assert "shard-00001.pt: checksum mismatch with the index" in capsys.readouterr().out
