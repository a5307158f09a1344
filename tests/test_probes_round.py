"""Probes of the surfaces merged with the data pool, behaviour cloning and the new settings, as a
new user and as an attacker would try them; each test failed on the tree before its fix.

- A checkpoint whose weights disagree with its recorded policy description (an edited file, or
  weights of one run under another's description) is one line naming the file and the first
  mismatching tensor with both shapes, for evaluation (``load_policy``) and ``--resume``
  (formerly a many-line ``state_dict`` size mismatch traceback); the description is checked
  against the weights before the policy takes memory (a crafted huge description was allocated
  first), and an invalid description (missing or unknown field) is one line, not a traceback.
- An edited split file is refused in one line by both readers (``train/splits.py``, ``convert
  --split``): an id with a path separator (formerly read a file outside ``--data``), a scene in
  two splits or twice in one (formerly listed silently: a held-out scene trained on), a split that
  is a string, ``scenes`` a list (formerly an AttributeError traceback); a fingerprint of NaN or no
  positions (formerly matched any record) and a record address out of range (formerly converted).
- ``train/splits.py train --skip-missing`` finding none of the split is an error (formerly an
  empty list, exit 0); ``--link`` with ``--copy`` is refused (formerly the copy was dropped); an
  output under a file names its flag (formerly ``[Errno 20]``), checked before the scenes are read.
- ``train/bc.py --out`` at a directory or under a file is refused before the data is collected
  (formerly after training: an error, or a ``FileExistsError`` traceback); a missing
  ``--eval-data`` is named as such (formerly called ``--data``).
- Flags that would do nothing are refused: ``--ppo.human-policy`` without ``--ppo.human-kl``
  (formerly not even opened), ``--env.partner-type-prob`` without the partner task, and the
  partner task's references ``partner_ceiling`` / ``partner_floor`` evaluated without it (formerly
  two identical log-tracking columns under the references' names).
- ``profiling/paired.py``: a policy name that is the end of two labels (two runs'
  ``checkpoint.pt``) is refused (formerly the two policies' rows were merged); the interval of an
  unbounded metric (episode length) is not clipped to [-1, 1] (formerly -5.5 [-1.0, +1.0]); an
  unknown ``--metric`` is named with the known ones (formerly ``'foo'``).
- ``convert --split`` finding none of the split no longer suggests ``--allow-missing`` (it would
  write nothing).
- ``train/run.py --resume CKPT --setting NAME`` whose setting differs from the checkpoint's names
  the setting as the source of the conflicting ``--env.*`` values (formerly flags never typed).
"""

from __future__ import annotations

import copy
import json
import pathlib

import pytest
import torch

from policy import PolicyConfig
from policy.actor_critic import ActorCritic
from policy.encoders import ObsDims
from test_checkpoint_integrity import _rewrite
from train.checkpoint import CheckpointError, load_policy, save_checkpoint

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "womd_sample"


def _small_policy(hidden: int = 16) -> ActorCritic:
    dims = ObsDims(ego_dim=11, num_partners=3, partner_dim=11, num_roads=8, road_dim=10, num_signals=2,
                   signal_dim=11, style_dim=0, candidate_dim=0)
    return ActorCritic(dims, 91, False, PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=hidden, max_roads=4,
                                                     action_factors=(7, 13)))


@pytest.fixture
def small_ckpt(tmp_path):
    """A checkpoint of a small policy (hidden 16), as ``train/run.py`` writes one."""
    policy = _small_policy()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    return save_checkpoint(tmp_path / "run" / "checkpoint.pt", policy=policy, optimizer=opt, global_step=10,
                           update=1, config={}, env_config={})


def _widen(payload):
    payload["policy"]["config"]["hidden"] = 32


def test_weights_against_description_one_line(small_ckpt, tmp_path):
    assert load_policy(small_ckpt)[0].describe()["config"]["hidden"] == 16  # the unchanged file loads
    bad = _rewrite(small_ckpt, tmp_path / "bad.pt", _widen)
    with pytest.raises(CheckpointError) as e:
        load_policy(bad)
    msg = str(e.value)
    assert "\n" not in msg and str(bad) in msg
    want = _small_policy(32).state_dict()
    have = _small_policy(16).state_dict()
    first = next(k for k in want if want[k].shape != have[k].shape)  # the first tensor in the policy's order
    assert f"tensor {first} is {list(have[first].shape)} in the file, {list(want[first].shape)} by the description" in msg


def test_missing_extra_and_non_tensor_weights(small_ckpt, tmp_path):
    first = next(iter(_small_policy().state_dict()))

    def drop(p):
        del p["model"][first]

    def add(p):
        p["model"]["extra.weight"] = torch.zeros(2)

    def plain(p):
        p["model"][first] = 3
    with pytest.raises(CheckpointError, match=rf"tensor {first} \[.*\] is missing"):
        load_policy(_rewrite(small_ckpt, tmp_path / "drop.pt", drop))
    with pytest.raises(CheckpointError, match=r"tensor extra.weight \(1 in all\) is not in the described policy"):
        load_policy(_rewrite(small_ckpt, tmp_path / "add.pt", add))
    with pytest.raises(CheckpointError, match=rf"{first} is int, not a tensor"):
        load_policy(_rewrite(small_ckpt, tmp_path / "plain.pt", plain))


def test_resume_restore_names_the_tensor(small_ckpt, tmp_path):
    from train.resume import restore
    bad = _rewrite(small_ckpt, tmp_path / "bad.pt", _widen)
    ckpt = torch.load(bad, map_location="cpu", weights_only=True)
    policy = ActorCritic.from_description(ckpt["policy"])  # as train.setup builds it on --resume
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    with pytest.raises(CheckpointError, match=r"checkpoint .*bad\.pt: its weights do not fit .* in the file"):
        restore(ckpt, bad, policy, opt, None, tmp_path)


def test_evaluate_mismatched_checkpoint_exit_2(tmp_path, capsys):
    from train.evaluate import main
    bad = _rewrite(REPO / "policies" / "driver.pt", tmp_path / "driver_edited.pt", _widen)
    assert main(["--policy", str(bad), "--data", str(SAMPLE), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "driver_edited.pt" in err[0] and "by the description" in err[0]


# ---------------------------------------------------------------- the pool's split file, edited
SPLITS_V2 = REPO / "data" / "splits_v2.json"


def _edited_split(tmp_path, change) -> pathlib.Path:
    doc = json.loads(SPLITS_V2.read_text())
    change(doc)
    f = tmp_path / "edited_splits.json"
    f.write_text(json.dumps(doc))
    return f


def _first(doc, name="validation"):
    return doc["splits"][name][0]


EDITS = {
    "a path": (lambda d: d["splits"]["validation"].__setitem__(0, "../../x"), "holds '../../x', not a scenario file stem"),
    "in two splits": (lambda d: d["splits"]["held_out"].append(_first(d, "train")), "is in splits 'train' and 'held_out'"),
    "twice": (lambda d: d["splits"]["validation"].append(_first(d)), "is twice in split 'validation'"),
    "a string": (lambda d: d["splits"].__setitem__("validation", "abc"), "split 'validation' is str, not a list"),
    "scenes a list": (lambda d: d.__setitem__("scenes", []), '"scenes" is list, not an object'),
    "record name a path": (lambda d: d["scenes"][_first(d)].__setitem__("record_name", "/etc/x"),
                           "record_name '/etc/x' is not a scenario file stem"),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_edited_split_file_refused_by_both_readers(tmp_path, capsys, edit):
    from gpusim.data.__main__ import main as data_main
    from train.splits import main as splits_main
    change, words = EDITS[edit]
    f = _edited_split(tmp_path, change)
    assert splits_main(["validation", "--data", str(SAMPLE), "--splits-file", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(f) in err[0] and words in err[0]
    rc = data_main(["convert", str(REPO / "data" / "womd_tfrecord"), "--split", "validation", "--splits-file", str(f),
                    "--out", str(tmp_path / "pack")])
    err = capsys.readouterr().err
    words = '"scenes" objects' if edit == "scenes a list" else words  # the converter's own older check
    assert rc == 2 and words in err and not (tmp_path / "pack").exists()


@pytest.mark.parametrize("field, value, words", [
    ("first_xy", [[float("nan"), 1.0]], "item 0 is [nan, 1.0], not None or two finite numbers"),
    ("first_xy", [], '"first_xy" has 0 positions for'),
    ("first_xy", [["a", "b"]], "item 0 is ['a', 'b']"),
    ("objects", True, '"objects" True is not a count'),
    ("womd", {"split": "training", "shard": 0, "num_shards": 1000, "record": -1}, "is not a record address"),
    ("womd", {"split": "training", "shard": 5, "num_shards": 0, "record": 1}, "is not a record address"),
])
def test_split_entry_fingerprint_and_address_checked(tmp_path, field, value, words):
    from gpusim.data.convert import read_split_entries
    assert len(read_split_entries(SPLITS_V2, "validation")[0]) == 25  # the shipped file passes
    f = _edited_split(tmp_path, lambda d: d["scenes"][_first(d)].__setitem__(field, copy.deepcopy(value)))
    with pytest.raises(ValueError, match="--splits-file .*edited_splits.json: scene .* of split 'validation': ") as e:
        read_split_entries(f, "validation")
    assert words in str(e.value) and "\n" not in str(e.value)


def test_skip_missing_that_finds_nothing_and_link_with_copy(tmp_path, capsys):
    from train.splits import main as splits_main
    # data/splits.json's train holds bundled scenes; the pool's first 3 train scenes are not bundled
    assert splits_main(["train", "--data", str(SAMPLE), "--skip-missing", "--splits-file",
                        str(REPO / "data" / "splits.json")]) == 0
    assert capsys.readouterr().out.strip()
    assert splits_main(["train", "--data", str(SAMPLE), "--skip-missing", "--limit", "3"]) == 2
    err = capsys.readouterr().err
    assert "none of its 3 scenarios is in" in err and str(SAMPLE) in err
    with pytest.raises(SystemExit) as e:
        splits_main(["train", "--data", str(SAMPLE), "--skip-missing", "--splits-file", str(REPO / "data" / "splits.json"),
                     "--link", str(tmp_path / "l"), "--copy", str(tmp_path / "c")])
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert not (tmp_path / "l").exists() and not (tmp_path / "c").exists()


# ---------------------------------------------------------------- behaviour cloning's outputs
@pytest.mark.parametrize("out, words", [("DIR", "is a directory: give a file name"),
                                        ("FILE/bc.pt", "is a file, not a directory")])
def test_bc_out_checked_before_the_work(tmp_path, capsys, out, words):
    from train.bc import main as bc_main
    (tmp_path / "FILE").write_text("x")
    (tmp_path / "DIR").mkdir()
    out = str(tmp_path / out)
    assert bc_main(["--data", str(SAMPLE), "--out", out, "--epochs", "1", "--num-threads", "1"]) == 2
    got = capsys.readouterr()
    assert f"--out {out}" in got.err and words in got.err and "bc data" not in got.out  # nothing collected


def test_bc_missing_eval_data_named(tmp_path, capsys):
    from train.bc import main as bc_main
    missing = str(tmp_path / "nowhere")
    assert bc_main(["--data", str(SAMPLE), "--eval-data", missing, "--out", str(tmp_path / "bc.pt"), "--epochs", "1",
                    "--num-threads", "1"]) == 2
    got = capsys.readouterr()
    assert f"--eval-data {missing}: no such file or directory" in got.err and "bc data" not in got.out


# ---------------------------------------------------------------- flags that would do nothing
def test_human_policy_without_its_coefficient_refused(tmp_path, capsys):
    from train.ppo import PPOConfig
    from train.run import main as run_main
    with pytest.raises(ValueError, match=r"human_policy .*bc.pt does nothing with human_kl 0: pass --ppo.human-kl"):
        PPOConfig(human_policy=str(tmp_path / "bc.pt"))
    assert PPOConfig(human_policy="bc.pt", human_kl=0.1).human_kl == 0.1
    with pytest.raises(SystemExit) as e:
        run_main(["--ppo.human-policy", str(tmp_path / "bc.pt"), "--total-timesteps", "2000", "--num-worlds", "2",
                  "--log-dir", str(tmp_path / "runs")])
    assert e.value.code == 2 and "does nothing with human_kl 0" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "runs").exists()


def test_partner_type_prob_without_the_task_refused():
    from gpusim.config import EnvConfig
    with pytest.raises(ValueError, match=r"partner_type_prob 0.3 does nothing without the partner task"):
        EnvConfig(partner_type_prob=0.3)
    assert EnvConfig(partner_task="crossing", max_controlled=1, partner_type_prob=0.3).partner_type_prob == 0.3
    assert EnvConfig().partner_task == "none"  # the default probability alone is fine


@pytest.mark.parametrize("ref", ["partner_ceiling", "partner_floor"])
def test_partner_references_need_the_partner_task(capsys, ref):
    from train.evaluate import main
    assert main(["--policy", "steer_to_goal", ref, "--data", str(SAMPLE), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--policy {ref}: a reference of the partner task" in err[0]
    assert "add --partner-task crossing" in err[0]


# ---------------------------------------------------------------- profiling/paired.py
def _records(tmp_path) -> pathlib.Path:
    """Two runs' ``checkpoint.pt`` and a baseline on scenes a (2 slots) and b (1 slot)."""
    rows = []
    for pol, length in (("r1/checkpoint.pt", (80, 60, 91)), ("r2/checkpoint.pt", (91, 91, 91)),
                        ("steer_to_goal", (70, 70, 50))):
        for (scen, slot), n in zip((("a", 0), ("a", 1), ("b", 0)), length):
            rows.append({"policy": pol, "mode": "self_play", "role": "ego", "scenario": scen, "repetition": 0,
                         "slot": slot, "goal_reached": float(n < 91), "collision_or_offroad": 0.0,
                         "episode_length": n})
    f = tmp_path / "rec.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    return f


def test_paired_ambiguous_label_unknown_metric_and_unbounded_interval(tmp_path, capsys):
    from profiling import paired
    from train.eval.stats import paired_difference
    f = _records(tmp_path)
    assert paired.main([str(f), "--policy", "checkpoint.pt", "--baseline", "steer_to_goal"]) == 2
    assert "policy 'checkpoint.pt' names 2 labels (r1/checkpoint.pt, r2/checkpoint.pt)" in capsys.readouterr().err
    assert paired.main([str(f), "--policy", "r1/checkpoint.pt", "--baseline", "steer_to_goal", "--metric", "foo"]) == 2
    assert "--metric foo: not in the records; use one of collision_or_offroad, episode_length, goal_reached" in capsys.readouterr().err
    assert paired.main([str(f), "--policy", "r1/checkpoint.pt", "--baseline", "steer_to_goal", "--metric",
                        "episode_length", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["episode_length"]
    assert got["diff"] == pytest.approx((10 - 10 + 41) / 3)  # (80-70, 60-70, 91-50) by hand
    want = paired_difference([80, 60, 91], [70, 70, 50], [0, 0, 1])  # no bounds: lengths are not rates
    assert (got["lo"], got["hi"]) == pytest.approx((want.lo, want.hi)) and got["lo"] < got["diff"] < got["hi"]


def test_convert_split_none_found_suggests_no_allow_missing(tmp_path, capsys):
    from gpusim.data.__main__ import main as data_main
    rc = data_main(["convert", str(REPO / "data" / "womd_tfrecord"), "--split", "held_out", "--out",
                    str(tmp_path / "pack")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and "50 of the 50 scenes of split 'held_out'" in err and "--allow-missing" not in err
    assert err.endswith("Pass the folders holding them") and not (tmp_path / "pack").exists()


def test_resume_with_a_setting_names_the_setting(tmp_path):
    from train.config import TrainConfig, UserError, parse_args
    from train.resume import prepare_run
    policy = _small_policy()
    ckpt = save_checkpoint(tmp_path / "run" / "checkpoint.pt", policy=policy,
                           optimizer=torch.optim.Adam(policy.parameters()), global_step=10, update=1,
                           config=TrainConfig().to_dict(), env_config=TrainConfig().to_dict()["env"])
    with pytest.raises(UserError, match=r"conflict with it \(--setting sim_agent gives its --env\.\* values\): "
                                        r".*--env\.goal-behavior continue"):
        prepare_run(parse_args(["--resume", str(ckpt), "--setting", "sim_agent"]))


def test_splits_copy_under_a_file_names_the_flag(tmp_path, capsys):
    from train.splits import main as splits_main
    (tmp_path / "f").write_text("x")
    assert splits_main(["train", "--data", str(SAMPLE), "--skip-missing", "--splits-file",
                        str(REPO / "data" / "splits.json"), "--copy", str(tmp_path / "f" / "out")]) == 2
    assert f"--copy {tmp_path / 'f' / 'out'}: {tmp_path / 'f'} is a file, not a directory" in capsys.readouterr().err


def test_description_checked_before_the_policy_takes_memory(small_ckpt, tmp_path):
    """A description far larger than its weights (hidden 2,000,000: a 16 TB layer) is refused by
    its shapes, before any allocation (formerly an allocator error, or a machine out of memory)."""
    huge = _rewrite(small_ckpt, tmp_path / "huge.pt", lambda p: p["policy"]["config"].__setitem__("hidden", 2_000_000))
    with pytest.raises(CheckpointError, match=r"is \[16, 11\] in the file, \[2000000, 11\] by the description"):
        load_policy(huge)


@pytest.mark.parametrize("change, words", [
    (lambda p: p["policy"].pop("dims"), "KeyError: 'dims'"),
    (lambda p: p["policy"]["dims"].__setitem__("bogus", 1), "unexpected keyword argument 'bogus'"),
    (lambda p: p["policy"]["config"].__setitem__("n_heads", 3), "divisible by n_heads (3)"),
])
def test_invalid_description_is_one_line(small_ckpt, tmp_path, change, words):
    bad = _rewrite(small_ckpt, tmp_path / "desc.pt", change)
    with pytest.raises(CheckpointError, match=r"desc\.pt: its recorded policy description is invalid") as e:
        load_policy(bad)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_resume_checks_the_description_before_building(small_ckpt, tmp_path):
    from train.config import parse_args
    from train.resume import prepare_run
    huge = _rewrite(small_ckpt, tmp_path / "r" / "checkpoint.pt",
                    lambda p: p["policy"]["config"].__setitem__("hidden", 2_000_000))
    with pytest.raises(CheckpointError, match=r"\[16, 11\] in the file, \[2000000, 11\] by the description"):
        prepare_run(parse_args(["--resume", str(huge)]))
