"""profiling/golden.py: a tiny run is deterministic, and the comparison finds a changed tensor
(step and field), a missing record and a changed metric; the hash is bit-exact."""

import json
import pathlib
import sys

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `profiling` is a directory of scripts, not an installed package
    sys.path.insert(0, str(REPO))

from profiling import golden  # noqa: E402

TINY = ["--configs", "respawn_remove", "--backends", "c", "--worlds", "2", "--steps", "11"]  # horizon 10


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A golden file of the respawn + remove config (2 worlds, 11 steps: one auto-reset; C kernels)."""
    path = tmp_path_factory.mktemp("golden") / "ref.json"
    assert golden.main(TINY + ["--out", str(path)]) == 0
    return path


def test_record_covers_every_state_field_and_step(reference):
    from gpusim.state import STATE_FIELDS

    doc = json.loads(reference.read_text())
    assert set(doc["records"]) == {"respawn_remove/c"}
    rec = doc["records"]["respawn_remove/c"]
    assert rec["meta"]["worlds"] == 2 and rec["meta"]["steps"] == 11 and rec["meta"]["backend"] == "c"
    fields = rec["fields"]
    assert {f"state.{name}" for name in STATE_FIELDS} <= set(fields)
    for name in ("result.obs", "result.reward", "result.terminal", "result.truncation", "info.truncated", "actions"):
        assert name in fields
    assert all(len(v) == 12 for v in fields.values())  # after the reset + 11 steps
    assert fields["actions"][0] is None and fields["state.pos"][0] is not None
    assert len(set(fields["state.pos"])) == 12  # agents move every step
    assert rec["metrics"]["mean"]["n"] > 0  # episodes finished at the horizon


def test_same_tree_compares_equal(reference, tmp_path, capsys):
    assert golden.main(TINY + ["--out", str(tmp_path / "now.json"), "--compare", str(reference)]) == 0
    assert "respawn_remove/c: equal" in capsys.readouterr().out


def test_changed_reward_is_found_at_its_step(reference, tmp_path, monkeypatch, capsys):
    from gpusim.env import DriveEnv

    step = DriveEnv.step

    def nudged(self, actions):  # a simulator whose reward differs by one float32 ulp at step 3
        result = step(self, actions)
        if self.episode_step == 3:
            result.reward[0, 0] = torch.nextafter(result.reward[0, 0], torch.tensor(1.0))
        return result

    monkeypatch.setattr(DriveEnv, "step", nudged)
    assert golden.main(TINY + ["--out", str(tmp_path / "now.json"), "--compare", str(reference)]) == 1
    assert "respawn_remove/c: DIFFERENT at step 3: result.reward" in capsys.readouterr().out


def test_compare_reports_missing_fields_records_and_metrics(reference):
    ref = json.loads(reference.read_text())["records"]
    now = json.loads(json.dumps(ref))
    assert golden.compare(now, ref)[1]
    now["respawn_remove/c"]["fields"]["state.extra"] = ["0"] * 12  # a new field alone is no difference
    lines, ok = golden.compare(now, ref)
    assert ok and "new fields not in the reference: state.extra" in lines[0]
    del now["respawn_remove/c"]["fields"]["state.speed"]
    want = ["respawn_remove/c: DIFFERENT: field state.speed missing now (1 missing)"]
    assert golden.compare(now, ref) == (want, False)
    now = json.loads(json.dumps(ref))
    now["respawn_remove/c"]["metrics"]["mean"]["n"] += 1
    lines, ok = golden.compare(now, ref)
    assert not ok and "metrics[mean][n]" in lines[0]
    lines, ok = golden.compare({}, ref)
    assert ok and lines == ["respawn_remove/c: skipped (not run now)"]
    lines, ok = golden.compare({"x/c": {"error": "boom"}}, ref)
    assert not ok and "x/c: DIFFERENT: not in the reference file" in lines


def test_reference_of_a_renamed_field_compares_under_its_new_name(reference):
    """A reference written before a state field was renamed (``RENAMED_FIELDS``: ``trial_score``,
    the clean per-trial score, now ``trial_clean``) still compares equal, and still finds a change."""
    ref = json.loads(reference.read_text())["records"]
    fields = ref["respawn_remove/c"]["fields"]
    fields["state.trial_score"] = fields.pop("state.trial_clean")
    now = json.loads(reference.read_text())["records"]
    assert golden.compare(now, ref) == (["respawn_remove/c: equal"], True)
    fields["state.trial_score"] = ["0"] * len(fields["state.trial_score"])
    lines, ok = golden.compare(now, ref)
    assert not ok and "after the reset: state.trial_clean" in lines[0]


def test_tensor_hash_is_bit_exact():
    zero = torch.zeros(3)
    assert golden.tensor_hash(zero) == golden.tensor_hash(torch.zeros(3))
    assert golden.tensor_hash(zero) != golden.tensor_hash(-zero)  # -0.0 is another bit pattern
    assert golden.tensor_hash(zero) != golden.tensor_hash(torch.zeros(3, dtype=torch.float64))
    assert golden.tensor_hash(zero) != golden.tensor_hash(torch.zeros(1, 3))
    b = torch.tensor([True, False])
    assert golden.tensor_hash(b) != golden.tensor_hash(~b)


def test_bad_flags_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        golden.main(["--out", str(tmp_path / "x.json"), "--compare", str(tmp_path / "missing.json")])
    assert e.value.code == 2 and "missing.json: no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        golden.main(["--out", str(tmp_path / "x.json"), "--steps", "0"])
    assert e.value.code == 2


def test_c_record_that_called_no_c_kernel_differs(reference, tmp_path, monkeypatch, capsys):
    """The hashes of the C kernels and the torch references are equal, so the record lists the C
    entry points called: a fallback to torch on the c backend is reported."""
    rec = json.loads(reference.read_text())["records"]["respawn_remove/c"]
    assert {"EventsArgs", "ObservationsStateArgs", "ReplayStateArgs"} <= set(rec["c_calls"])
    from gpusim.kernels import cbuild

    monkeypatch.setattr(cbuild.CLibrary, "load", lambda self, stacklevel=3: None)  # every C library missing
    assert golden.main(TINY + ["--out", str(tmp_path / "now.json"), "--compare", str(reference)]) == 1
    assert "respawn_remove/c: DIFFERENT: the c backend called no C kernel (it fell back to torch)" in \
        capsys.readouterr().out
