"""Bad inputs to the trainer and the evaluator are named in one line, before anything is built:
a config file with a wrong type, a non-checkpoint file given as ``--policy`` (JSON, TFRecord,
scenario pack), checkpoints of different observation sizes evaluated together, an unreadable
shard in the evaluation summary, and a torchrun rank that dies."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest
import torch

from gpusim.config import EnvConfig
from gpusim.data import ScenarioPack

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "womd_sample"
ENV = EnvConfig(max_controlled=4, scenario_length=4)


# ------------------------------------------------------------------------------ --config files
@pytest.mark.parametrize("content, message", [
    ({"total_timesteps": "abc"}, "total_timesteps: expected an integer, got 'abc'; fix the file or pass "
                                 "--total-timesteps"),
    ({"learning_rate": "fast"}, "learning_rate: expected a number, got 'fast'"),
    ({"run_name": 3}, "run_name: expected a string or null, got 3"),
    ({"cuda_graph": "maybe"}, "cuda_graph: expected one of 'auto', 'on', 'off', got 'maybe'"),
    ({"eval_mode": "self_play"}, "eval_mode: expected a list of strings, got 'self_play'"),
    ({"env": 5}, "env: expected a mapping of fields, got 5"),
])
def test_config_file_wrong_type_is_one_line_and_creates_nothing(tmp_path, capsys, content, message):
    from train.run import main

    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(content))
    runs = tmp_path / "runs"
    assert main(["--config", str(cfg), "--log-dir", str(runs), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --config {cfg}: {message}"), err
    assert not runs.exists()  # validated before the run directory is made


def test_config_file_right_types_still_load(tmp_path):
    from train.config import load_config_file

    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"total_timesteps": 64, "learning_rate": 1, "run_name": None,
                               "eval_mode": ["self_play"], "env": {"max_controlled": 4}}))
    c = load_config_file(cfg)
    assert c.total_timesteps == 64 and c.learning_rate == 1 and c.eval_mode == ("self_play",)


# ------------------------------------------------------------------------------ --policy files
@pytest.fixture(scope="module")
def pack_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    return ScenarioPack.from_json([SAMPLE / "db4edc9bd0c9d18c.json.xz"], ENV.data_config()).save(d / "p.pt")


def test_policy_names_what_a_non_checkpoint_file_is(pack_file, tmp_path):
    from train.checkpoint import CheckpointError, load_checkpoint

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"total_timesteps": 64}))
    cases = [(cfg, "is a JSON file, not a gpusim training checkpoint"),
             (REPO / "data" / "womd_tfrecord" / "motion_data_one_scenario.tfrecord.gz",
              "is a gzip-compressed TFRecord file, not a gpusim training checkpoint"),
             (SAMPLE / "db4edc9bd0c9d18c.json.xz", "is an xz-compressed JSON file"),
             (pack_file, "is a scenario pack (gpusim.data), not a gpusim training checkpoint; pass it as --data")]
    from gpusim.data.tfrecord import write_records

    cases.append((write_records(tmp_path / "x.tfrecord", [b"abc"]), "is a TFRecord file, not a gpusim"))
    for path, message in cases:
        with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_checkpoint(path)


def test_evaluate_policy_json_exits_2_naming_it(tmp_path, capsys):
    from train.evaluate import main

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"total_timesteps": 64}))
    assert main(["--policy", str(cfg), "--device", "cpu", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{cfg} is a JSON file, not a gpusim training checkpoint" in err[0]


# ------------------------------------------------------------------------------ evaluate
def _checkpoint(path, num_roads: int):
    from gpusim.kernels.observations import obs_layout
    from policy.actor_critic import ActorCritic, PolicyConfig
    from train.checkpoint import save_checkpoint
    from train.config import TrainConfig

    torch.manual_seed(0)
    pol = ActorCritic(obs_layout(ENV.num_partners, num_roads, ENV.num_signals), 91, False,
                      PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16))
    env_dict = TrainConfig(env=ENV).to_dict()["env"]
    return save_checkpoint(path, policy=pol, optimizer=torch.optim.Adam(pol.parameters()), global_step=1,
                           update=1, config={"env": env_dict}, env_config=env_dict)


def test_observation_size_mismatch_found_before_any_sweep(pack_file, tmp_path, monkeypatch):
    import train.evaluate as ev
    from train.config import UserError

    good = _checkpoint(tmp_path / "a" / "checkpoint.pt", ENV.num_roads)
    other = _checkpoint(tmp_path / "b" / "checkpoint.pt", ENV.num_roads - 8)
    swept = []
    monkeypatch.setattr(ev, "run_sweep", lambda *a, **k: swept.append(1) or (_ for _ in ()).throw(
        AssertionError("a sweep ran before the mismatch was found")))
    cfg = ev.EvalConfig(policy=(str(good), str(other)), data=str(pack_file), device="cpu", num_threads=1)
    with pytest.raises(UserError, match=f"--policy {other}: .*observation"):
        ev.evaluate(cfg)
    assert swept == []


def test_unreadable_shard_is_not_counted_as_a_source_file():
    from train.evaluate import skipped_header

    skipped = [{"file": "a.json", "reason": "invalid JSON"},
               {"file": "sh/shard-00001.pt", "reason": "unreadable shard, 3 scenario(s) left out",
                "shard_scenarios": 3}]
    results = {"skipped": skipped, "files": 10, "num_scenarios": 10}
    assert skipped_header(results) == "data: 1 of 10 file(s) skipped; 1 unreadable shard(s), 3 of 10 scenario(s) left out:"
    results["skipped"] = skipped[1:]
    assert skipped_header(results) == "data: 1 unreadable shard(s), 3 of 10 scenario(s) left out:"


# ------------------------------------------------------------------------------ torchrun
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # two processes joining a gloo group: about 7 s
def test_dead_rank_is_named_in_one_line_on_the_other(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(
        "import os, time, torch, torch.distributed as dist\n"
        "from train.distributed import setup\n"
        "d = setup('cpu')\n"
        "if d.rank == 1:\n"
        "    time.sleep(0.3); os._exit(3)\n"
        "dist.all_reduce(torch.ones(1)); time.sleep(2); dist.all_reduce(torch.ones(1))\n")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2",
               PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, str(script)], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO) for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert procs[1].returncode == 3
    err = outs[0][1].strip().splitlines()
    assert procs[0].returncode == 1 and len(err) == 1, outs[0][1]
    assert err[0].startswith("error: rank 0 of 2: rank 1 stopped (its connection closed: Connection closed by peer")
    assert "Traceback" not in outs[0][1]


def test_peer_lost_line_only_for_lost_peers():
    from train.distributed import peer_lost_line

    assert peer_lost_line(ValueError("bad flag"), 0, 2) is None
    assert peer_lost_line(RuntimeError("CUDA out of memory"), 0, 2) is None
    line = peer_lost_line(RuntimeError("[gloo/pair.cc:553] Connection reset by peer [10.0.0.2]:1. More."), 2, 4)
    assert line.startswith("error: rank 2 of 4: another rank (one of 0, 1, 3) stopped (its connection closed: "
                           "Connection reset by peer [10.0.0.2]:1)")


def test_streaming_pool_line_counts_only_usable_scenarios(tmp_path):
    # finding: "pool of 4 of 10 scenarios" printed when a corrupt shard had left 7
    import warnings

    from gpusim.data.shards import convert_sharded
    from train.config import TrainConfig
    from train.setup import make_env

    files = sorted(SAMPLE.glob("*.json.xz"))[:5]
    sp, _ = convert_sharded(files, tmp_path / "sh", ENV.data_config(), shard_size=2)
    data = bytearray(sp.shard_file(1).read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = bytes(64)
    sp.shard_file(1).write_bytes(bytes(data))
    said = []
    cfg = TrainConfig(data=str(sp.path), pool_size=2, num_worlds=2, device="cpu", env=ENV)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make_env(cfg, ENV, user_set=set(), say=said.append)
    kept = sp.num_scenarios - sp.shards[1]["scenarios"]
    assert said[0].startswith(f"streaming: pool of 2 of {kept} scenarios"), said
