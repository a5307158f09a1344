"""``--keep-best``: the policy of the best periodic evaluation is kept as ``best.pt`` beside the last
checkpoint (selection on ``--eval-data``, e.g. the validation split), and ``--eval-episodes``."""

from __future__ import annotations

import json
import types

import pytest
import torch

from policy import ActorCritic, PolicyConfig
from train.config import TrainConfig, UserError, keep_best_entry
from train.run import BestCheckpoint, train


def _run(tmp_path):
    """The pieces of a run that :meth:`BestCheckpoint.offer` writes (a tiny real policy)."""
    from policy.encoders import ObsDims

    dims = ObsDims(ego_dim=11, num_partners=2, partner_dim=11, num_roads=2, road_dim=13)
    policy = ActorCritic(dims, 5, PolicyConfig(d_model=8, n_layers=1, n_heads=2, hidden=8))
    lines = []
    return types.SimpleNamespace(
        policy=policy, optimizer=torch.optim.Adam(policy.parameters()), human_sha=None, env=None,
        config_dict={"env": {}}, logger=types.SimpleNamespace(elapsed=0.0, info=lines.append), lines=lines)


def test_best_checkpoint_writes_only_on_improvement(tmp_path):
    cfg = TrainConfig(eval_interval=1, keep_best="eval/self_play/goal_reached")
    best, run = BestCheckpoint(cfg, tmp_path, None), _run(tmp_path)
    assert not best.offer({}, run, 10, 1)  # no evaluation this update: nothing
    assert best.offer({"eval/self_play/goal_reached": 0.4, "eval/self_play/n": 9}, run, 10, 1)
    first = (tmp_path / "best.pt").read_bytes()
    assert not best.offer({"eval/self_play/goal_reached": 0.4}, run, 20, 2)  # a tie keeps the first
    assert not best.offer({"eval/self_play/goal_reached": float("nan")}, run, 25, 3)
    assert (tmp_path / "best.pt").read_bytes() == first
    assert best.offer({"eval/self_play/goal_reached": 0.5}, run, 30, 4)
    ck = torch.load(tmp_path / "best.pt", weights_only=False)
    assert ck["extra"]["best"] == {"entry": "eval/self_play/goal_reached", "value": 0.5, "update": 4,
                                   "global_step": 30}
    assert ck["update"] == 4 and ck["global_step"] == 30


def test_best_checkpoint_lower_is_better_and_resume(tmp_path):
    cfg = TrainConfig(eval_interval=1, keep_best="-eval/self_play/collision_or_offroad")
    best, run = BestCheckpoint(cfg, tmp_path, None), _run(tmp_path)
    assert best.offer({"eval/self_play/collision_or_offroad": 0.3}, run, 1, 1)
    assert not best.offer({"eval/self_play/collision_or_offroad": 0.35}, run, 2, 2)
    assert best.offer({"eval/self_play/collision_or_offroad": 0.1}, run, 3, 3)
    # a resumed run starts from the record in its checkpoint: a worse value does not overwrite best.pt
    resumed = BestCheckpoint(cfg, tmp_path, {"extra": {"best": best.record}})
    assert not resumed.offer({"eval/self_play/collision_or_offroad": 0.2}, run, 4, 4)
    assert torch.load(tmp_path / "best.pt", weights_only=False)["extra"]["best"]["value"] == 0.1


def test_best_checkpoint_names_the_entries_when_the_metric_is_unknown(tmp_path):
    best = BestCheckpoint(TrainConfig(eval_interval=1, keep_best="eval/self_play/goal"), tmp_path, None)
    with pytest.raises(UserError, match=r"--keep-best eval/self_play/goal: .*goal_reached, n"):
        best.offer({"eval/self_play/goal_reached": 0.4, "eval/self_play/n": 9}, _run(tmp_path), 1, 1)
    assert not (tmp_path / "best.pt").exists()


@pytest.mark.parametrize("spec, kw, match", [
    ("goal_reached", {"eval_interval": 1}, "expected eval/<mode>/<metric>"),
    ("eval/self_play/goal_reached", {}, "--eval-interval"),
    ("eval/human_replay/goal_reached", {"eval_interval": 1}, "is not evaluated"),
])
def test_keep_best_refuses_bad_specs(spec, kw, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(keep_best=spec, **kw)
    assert keep_best_entry("-eval/self_play/offroad", 1, ("self_play",)) == ("eval/self_play/offroad", -1.0)


def test_keep_best_in_a_real_run_matches_the_logged_evaluations(tmp_path):
    """A short run on the bundled sample: ``best.pt`` holds the update of the first maximum of the
    logged periodic evaluations, and the last checkpoint records the same."""
    cfg = TrainConfig(data="data/womd_sample", num_worlds=2, total_timesteps=3 * 2 * 8 * 91, report_interval=1, seed=0,
                      device="cpu", num_threads=1, quiet=True, log_dir=str(tmp_path), run_name="kb",
                      learning_rate=3e-3, eval_interval=1,
                      keep_best="eval/self_play/episode_return",
                      policy=PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16))
    out = train(cfg)
    records = [json.loads(line) for line in (tmp_path / "kb" / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["eval/self_play/episode_return"], r["update"]) for r in records if "eval/self_play/n" in r]
    assert len(evals) == out["update"] >= 3
    value, update = max(evals, key=lambda e: (e[0], -e[1]))
    ck = torch.load(tmp_path / "kb" / "best.pt", weights_only=False)
    assert ck["update"] == update and ck["extra"]["best"]["value"] == pytest.approx(value)
    assert torch.load(out["checkpoint"], weights_only=False)["extra"]["best"] == ck["extra"]["best"]
