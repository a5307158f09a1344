"""Traffic-signal data from GPUDrive JSON ``tl_states`` (gpusim.data.signals) and the pack's signal
tensors; corrupt packs, format-1 packs, the pack/env config check; the data layer's import graph."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import pytest
import torch

from gpusim.config import DataConfig, EnvConfig
from gpusim.data import PackFileError, ScenarioError, ScenarioPack, SignalState, load_scenario
from gpusim.data.__main__ import main
from test_data_parse import obj, scenario, write

CFG = DataConfig(grid_k=16, grid_edge_k=8)


def _tl(lane_states):
    """``tl_states`` from ``{lane: [(t, name, x, y), ...]}``."""
    return {str(lane): {"state": [s for _, s, _, _ in obs], "x": [x for *_, x, _ in obs],
                        "y": [y for *_, y in obs], "z": [0.0] * len(obs), "time_index": [t for t, *_ in obs]}
            for lane, obs in lane_states.items()}


def _doc(tl):
    return scenario([obj(0.0, 0.0, vx=5.0), obj(0.0, 4.0, vx=3.0)], tl_states=tl)


def test_json_signals_become_per_step_tensors(tmp_path):
    tl = _tl({"12": [(3, "stop", 10.0, 1.0), (4, "go", 10.0, 1.0)],
              "5": [(0, "arrow_caution", -3.0, 2.0), (90, "flashing_stop", -3.0, 2.0), (7, "LANE_STATE_GO", -3, 2)]})
    sc = load_scenario(write(tmp_path / "s.json", _doc(tl)), CFG)
    assert sc.signal_lane.tolist() == [5, 12]  # sorted by lane id
    assert sc.signal_state.shape == (91, 2) and sc.signal_valid.sum().item() == 5
    assert sc.signal_state[0, 0] == SignalState.ARROW_CAUTION and sc.signal_state[90, 0] == SignalState.FLASHING_STOP
    assert sc.signal_state[7, 0] == SignalState.GO and sc.signal_state[3, 1] == SignalState.STOP
    assert sc.signal_state[5, 1] == SignalState.UNKNOWN and not sc.signal_valid[5, 1]
    # centred like the tracks
    torch.testing.assert_close(sc.signal_pos[1].double() + sc.offset, torch.tensor([10.0, 1.0], dtype=torch.float64))
    # lane 5 / 12 are not map features of this JSON (no road ids): direction unknown
    assert sc.signal_dir.abs().sum() == 0 and sc.stats["signals_without_lane"] == 2


def test_signal_direction_from_the_lane(tmp_path):
    roads = [{"id": 40, "type": "lane", "geometry": [{"x": 0.0, "y": -20.0 + 5 * i} for i in range(9)]},
             {"geometry": [{"x": -50.0 + i, "y": -5.0} for i in range(101)], "type": "road_edge"}]
    doc = scenario([obj(0.0, 0.0, vx=5.0)], roads=roads, tl_states=_tl({40: [(0, "stop", 0.2, 1.0)]}))
    sc = load_scenario(write(tmp_path / "d.json", doc), CFG)
    torch.testing.assert_close(sc.signal_dir[0], torch.tensor([0.0, 1.0]))


@pytest.mark.parametrize("tl, field", [
    ([], "tl_states"),
    ({"x1": {"state": [], "x": [], "y": [], "time_index": []}}, "tl_states.x1"),
    ({"3": {"state": ["go"], "x": [0.0], "y": [0.0]}}, "tl_states.3.time_index"),
    ({"3": {"state": ["go", "go"], "x": [0.0], "y": [0.0], "time_index": [0]}}, "tl_states.3.state"),
    ({"3": {"state": ["go"], "x": [0.0], "y": [0.0], "time_index": [91]}}, "tl_states.3.time_index[0]"),
    ({"3": {"state": [4], "x": [0.0], "y": [0.0], "time_index": [0]}}, "tl_states.3.state[0]"),
    ({"3": {"state": ["go"], "x": [float("nan")], "y": [0.0], "time_index": [0]}}, "tl_states.3.x[0]"),
])
def test_bad_tl_states_name_the_field(tmp_path, tl, field):
    with pytest.raises(ScenarioError) as ei:
        load_scenario(write(tmp_path / "bad.json", _doc(tl)), CFG)
    assert ei.value.field == field and "bad.json" in str(ei.value)


def test_unknown_state_names_are_counted(tmp_path):
    sc = load_scenario(write(tmp_path / "u.json", _doc(_tl({1: [(0, "purple", 0.0, 0.0)]}))), CFG)
    assert sc.signal_state[0, 0] == SignalState.UNKNOWN and sc.signal_valid[0, 0]
    assert sc.stats["unknown_signal_states"] == 1


def test_pack_pads_signals_and_info_prints_them(tmp_path, capsys):
    a = write(tmp_path / "a.json", _doc(_tl({1: [(0, "stop", 0.0, 0.0)], 2: [(1, "go", 1.0, 1.0)]})))
    b = write(tmp_path / "b.json", _doc({}))
    pack = ScenarioPack.from_json([a, b], CFG)
    assert pack.num_signals.tolist() == [2, 0] and pack.max_signals == 2
    assert pack.signal_lane.tolist() == [[1, 2], [-1, -1]] and pack.signal_state.dtype == torch.int8
    assert pack.signal_state.shape == (2, 91, 2) and not pack.signal_valid[1].any()
    pack.save(tmp_path / "p")
    again = ScenarioPack.load(tmp_path / "p")
    assert torch.equal(again.signal_state, pack.signal_state) and torch.equal(again.signal_pos, pack.signal_pos)
    assert main(["info", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "signals: 2 in 1 scenario(s) (max 2 per scenario); valid lane-steps: 2; by state: stop 1, go 1" in out


# ----------------------------------------------------------------------------- pack files
@pytest.fixture(scope="module")
def small_pack(sample_dir):
    return ScenarioPack.from_json(sample_dir / "tfrecord-00068-of-01000_277.json.xz", CFG)


@pytest.mark.parametrize("content, what", [
    (b"", "empty file"),
    (b"\x00garbage" * 100, "truncated or not a scenario pack"),
    ("truncate", "truncated or not a scenario pack"),
], ids=["empty", "random", "truncated"])
def test_corrupt_pack_is_one_line_naming_the_file(tmp_path, small_pack, content, what):
    path = tmp_path / "pack.pt"
    small_pack.save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if content == "truncate" else content)
    with pytest.raises(PackFileError) as ei:
        ScenarioPack.load(path)
    msg = str(ei.value)
    assert msg.startswith(str(path)) and what in msg and "\n" not in msg and "weights_only" not in msg
    assert isinstance(ei.value, ValueError)


def test_not_a_pack_and_missing_tensor(tmp_path, small_pack):
    path = tmp_path / "x.pt"
    torch.save({"hello": 1}, path)
    with pytest.raises(PackFileError, match="not a gpusim scenario pack"):
        ScenarioPack.load(path)
    small_pack.save(path)
    payload = torch.load(path, weights_only=True)
    del payload["tensors"]["grid_road"]
    torch.save(payload, path)
    with pytest.raises(PackFileError, match="grid_road: missing tensor"):
        ScenarioPack.load(path)


def test_format_1_pack_loads_without_signals(tmp_path, small_pack):
    path = tmp_path / "v1.pt"
    small_pack.save(path)
    payload = torch.load(path, weights_only=True)
    payload["meta"]["format_version"] = 1
    for k in ("agent_interest", "agent_predict", "signal_lane", "signal_pos", "signal_dir", "signal_state",
              "signal_valid", "num_signals"):
        del payload["tensors"][k]
    torch.save(payload, path)
    pack = ScenarioPack.load(path)
    assert pack.num_signals.tolist() == [0] and pack.signal_state.shape == (1, 91, 1)
    assert torch.equal(pack.traj_pos, small_pack.traj_pos)


def test_check_compatible_names_both_flags(tmp_path, small_pack):
    path = small_pack.save(tmp_path / "p.pt")
    pack = ScenarioPack.load(path)
    env = EnvConfig(max_controlled=8, num_roads=CFG.grid_k)
    with pytest.raises(ValueError) as ei:
        pack.check_compatible(env)
    msg = str(ei.value)
    assert str(path) in msg and "--env.max-controlled 32" in msg and "convert --max-controlled 8" not in msg
    assert "--max-controlled 8`" in msg and "\n" not in msg
    pack.check_compatible(dataclasses.replace(env, max_controlled=32))  # no error


def test_cli_convert_tfrecord_limit_and_corrupt_info(tmp_path, capsys):
    from womd_records import small_scenario

    from gpusim.data.tfrecord import write_records

    src = write_records(tmp_path / "t.tfrecord", [small_scenario(f"c{i}").SerializeToString() for i in range(3)])
    assert main(["convert", str(src), "--out", str(tmp_path / "o.pt"), "--limit", "2", "--grid-k", "16",
                 "--grid-edge-k", "8", "--max-controlled", "8"]) == 0
    out = capsys.readouterr().out
    assert "converted 2 scenario(s) from 1 file(s)" in out and "stopped at --limit 2" in out
    pack = ScenarioPack.load(tmp_path / "o.pt")
    assert pack.scenario_ids == ["c0", "c1"] and pack.config.max_controlled == 8
    pack.check_compatible(EnvConfig(max_controlled=8, num_roads=16))
    with pytest.raises(ValueError, match=r"pass --env.max-controlled 8, or convert again with .*--max-controlled 32"):
        pack.check_compatible(EnvConfig(num_roads=16))
    assert main(["convert", str(src), "--out", str(tmp_path / "x.pt"), "--workers", "0"]) == 2
    (tmp_path / "bad.pt").write_bytes(b"\x01\x02")
    assert main(["info", str(tmp_path / "bad.pt")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[-1].startswith(f"error: {tmp_path / 'bad.pt'}: truncated or not a scenario pack")


# ----------------------------------------------------------------------------- layering
def test_data_modules_import_no_cycle():
    """Every import between gpusim.data modules (top-level or inside functions) points one way."""
    root = pathlib.Path(__file__).resolve().parents[1] / "gpusim" / "data"
    graph = {}
    for f in root.glob("*.py"):
        mod = f.stem
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpusim.data."):
                deps.add(node.module.split(".")[2])
            elif isinstance(node, ast.Import):
                deps |= {a.name.split(".")[2] for a in node.names if a.name.startswith("gpusim.data.")}
        graph[mod] = deps - {mod}
    state = {}

    def visit(m, path):
        if state.get(m) == "done":
            return
        assert state.get(m) != "open", f"import cycle: {' -> '.join(path + [m])}"
        state[m] = "open"
        for d in graph.get(m, ()):
            visit(d, path + [m])
        state[m] = "done"

    for m in graph:
        visit(m, [])
    assert "pack" not in graph["build"] and "pack" not in graph["convert"]
