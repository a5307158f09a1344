"""Probes of the surfaces merged with the data pool, behaviour cloning and the new settings, as a
new user and as an attacker would try them; each test failed on the tree before its fix.

- A checkpoint whose weights disagree with its recorded policy description (an edited file, or
  weights of one run under another's description) is one line naming the file and the first
  mismatching tensor with both shapes, for evaluation (``load_policy``) and ``--resume``
  (formerly a many-line ``state_dict`` size mismatch traceback).
"""

from __future__ import annotations

import pathlib

import pytest
import torch

from policy import PolicyConfig
from policy.actor_critic import ActorCritic
from policy.encoders import ObsDims
from train.checkpoint import CheckpointError, checkpoint_checksums, load_policy, save_checkpoint

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


def _rewrite(src: pathlib.Path, dst: pathlib.Path, change) -> pathlib.Path:
    """``dst``: checkpoint ``src`` with ``change(payload)`` applied and its checksums recomputed
    (anyone who edits a checkpoint can do so: the checksum guards against corruption, not edits)."""
    payload = torch.load(src, map_location="cpu", weights_only=True)
    change(payload)
    payload["checksums"] = checkpoint_checksums(payload)
    dst.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, dst)
    return dst


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
