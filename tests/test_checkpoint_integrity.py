"""Checkpoints: no code from a file (an experience hook a checkpoint or a config file records is
imported only when the command line names it or trusts it), checksums verified at load (a flipped
byte is named, an old checkpoint loads with one note), NaN weights and invalid env settings
refused at load, and the shipped policies carry checksums their cards' SHA-256 matches."""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import sys

import pytest
import torch

from policy import PolicyConfig
from train.checkpoint import (CheckpointError, checkpoint_checksums, load_checkpoint, load_policy,
                              save_checkpoint)
from train.config import TrainConfig, UserError, parse_args
from train.run import main, train

from test_resume import _cfg, _fcfg, small_pack  # noqa: F401  (small_pack: a fixture)
from test_train_run import FakeEnv

REPO = pathlib.Path(__file__).resolve().parents[1]
POLICIES = REPO / "policies"


@pytest.fixture(scope="module")
def run_ckpt(tmp_path_factory):
    """A short FakeEnv run's checkpoint (identity hook)."""
    tmp = tmp_path_factory.mktemp("run")
    out = train(_fcfg(tmp, total_timesteps=100, experience="identity"), env=FakeEnv(num_worlds=2))
    return pathlib.Path(out["checkpoint"])


def _rewrite(src: pathlib.Path, dst: pathlib.Path, change) -> pathlib.Path:
    """``dst``: the checkpoint ``src`` with ``change(payload)`` applied and its checksums recomputed
    (as anyone who edits a checkpoint can do: the checksum is for corruption, not for trust)."""
    payload = torch.load(src, map_location="cpu", weights_only=True)
    change(payload)
    payload["checksums"] = checkpoint_checksums(payload)
    dst.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, dst)
    return dst


@pytest.fixture
def probe_module(tmp_path, monkeypatch):
    """A module ``h2_probe_hook`` on sys.path whose import writes ``imported.txt`` and whose hook
    class (an identity hook) writes ``called.txt``; yields the folder."""
    name = "h2_probe_hook"
    (tmp_path / f"{name}.py").write_text(
        "import pathlib\n"
        "from train.experience import ExperienceHook\n"
        "pathlib.Path(__file__).with_name('imported.txt').write_text('x')\n"
        "class Hook(ExperienceHook):\n"
        "    def __init__(self, args=(), context=None):\n"
        "        pathlib.Path(__file__).with_name('called.txt').write_text('x')\n"
        "        super().__init__((), context)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    yield tmp_path
    sys.modules.pop(name, None)


def _with_hook(run_ckpt, tmp_path, experience, args=()):
    def change(p):
        p["config"]["experience"] = experience
        p["config"]["experience_arg"] = list(args)
        p["extra"]["run_dir"] = str(tmp_path / "elsewhere")
    return _rewrite(run_ckpt, tmp_path / "ck" / "checkpoint.pt", change)


def test_resume_never_imports_a_hook_the_checkpoint_names(run_ckpt, tmp_path, probe_module):
    """Formerly `--resume` imported and called the recorded MODULE:CLASS (a shell command ran)."""
    ck = _with_hook(run_ckpt, tmp_path, "h2_probe_hook:Hook")
    with pytest.raises(UserError, match=r"--trust-checkpoint-code") as e:
        train(_fcfg(tmp_path, total_timesteps=400, resume=str(ck)), env=FakeEnv(num_worlds=2))
    assert "h2_probe_hook:Hook" in str(e.value) and str(ck) in str(e.value) and "\n" not in str(e.value)
    assert not (probe_module / "imported.txt").exists() and "h2_probe_hook" not in sys.modules
    # the user names it again: it is theirs to run
    train(_fcfg(tmp_path, total_timesteps=400, resume=str(ck), experience="h2_probe_hook:Hook"),
          env=FakeEnv(num_worlds=2))
    assert (probe_module / "called.txt").exists()


def test_trust_flag_allows_the_recorded_hook(run_ckpt, tmp_path, probe_module):
    ck = _with_hook(run_ckpt, tmp_path, "h2_probe_hook:Hook")
    train(_fcfg(tmp_path, total_timesteps=400, resume=str(ck), trust_checkpoint_code=True), env=FakeEnv(num_worlds=2))
    assert (probe_module / "called.txt").exists()


def test_drop_predicate_from_a_checkpoint_is_code_too(run_ckpt, tmp_path, probe_module):
    ck = _with_hook(run_ckpt, tmp_path, "drop", ["predicate=h2_probe_hook:Hook"])
    with pytest.raises(UserError, match=r"predicate=h2_probe_hook:Hook"):
        train(_fcfg(tmp_path, total_timesteps=400, resume=str(ck)), env=FakeEnv(num_worlds=2))
    assert not (probe_module / "imported.txt").exists()


def test_cli_resume_with_a_shell_hook_runs_nothing(tmp_path, small_pack, capsys):  # noqa: F811
    """The issue's probe: a recorded ``pty:spawn`` with ``sh -c`` arguments in a checkpoint of a
    real run; exit 2, one line, and the command's file never appears."""
    out = train(_cfg(tmp_path, data=str(small_pack), total_timesteps=100, experience="identity"))
    marker = tmp_path / "pwned"
    ck = _with_hook(pathlib.Path(out["checkpoint"]), tmp_path, "pty:spawn", ["sh", "-c", f"touch {marker}"])
    assert main(["--resume", str(ck), "--data", str(small_pack), "--device", "cpu", "--total-timesteps", "400",
                 "--num-threads", "1", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pty:spawn" in err[0] and "--trust-checkpoint-code" in err[0]
    assert not marker.exists()


def test_config_file_hook_needs_the_command_line(tmp_path, probe_module):
    cfg_file = tmp_path / "c.json"
    cfg_file.write_text(json.dumps({"experience": "h2_probe_hook:Hook"}))
    with pytest.raises(UserError, match=rf"--config {re.escape(str(cfg_file))} records the experience hook"):
        parse_args(["--config", str(cfg_file), "--device", "cpu"])
    assert parse_args(["--config", str(cfg_file), "--device", "cpu", "--trust-checkpoint-code"]).experience == \
        "h2_probe_hook:Hook"
    assert parse_args(["--config", str(cfg_file), "--device", "cpu", "--experience", "h2_probe_hook:Hook"]
                      ).experience == "h2_probe_hook:Hook"
    assert not (probe_module / "imported.txt").exists()  # parsing imports nothing
    # the trust decision itself is never read from a file, nor written to one
    cfg_file.write_text(json.dumps({"trust_checkpoint_code": True}))
    with pytest.raises(ValueError, match="command-line decision"):
        parse_args(["--config", str(cfg_file), "--device", "cpu"])
    assert "trust_checkpoint_code" not in TrainConfig(trust_checkpoint_code=True).to_dict()


# ------------------------------------------------------------------------------------ checksums
def _flip(path: pathlib.Path, data: bytes, out: pathlib.Path) -> pathlib.Path:
    """``out``: ``path`` with 8 bytes in the middle of ``data`` (a tensor's bytes) inverted."""
    raw = bytearray(path.read_bytes())
    at = raw.find(data)
    assert at > 0
    mid = at + len(data) // 2
    raw[mid: mid + 8] = bytes(b ^ 0xFF for b in raw[mid: mid + 8])
    out.write_bytes(bytes(raw))
    return out


def test_a_flipped_weight_is_named(run_ckpt, tmp_path):
    """Formerly the corrupted file loaded silently (driver.pt: goal 0.756 instead of 0.878)."""
    payload = load_checkpoint(run_ckpt)
    assert payload["checksums"]["algorithm"] == "crc32c" and "model/actor.weight" in payload["checksums"]["tensors"]
    weight = payload["model"]["actor.weight"]
    bad = _flip(run_ckpt, weight.numpy().tobytes(), tmp_path / "bad.pt")
    with pytest.raises(CheckpointError) as e:
        load_policy(bad)
    msg = str(e.value)
    assert str(bad) in msg and "model/actor.weight" in msg and "checksum" in msg and "\n" not in msg
    with pytest.raises(CheckpointError, match="model/actor.weight"):  # --resume reads it the same way
        train(_fcfg(tmp_path, total_timesteps=400, resume=str(bad)), env=FakeEnv(num_worlds=2))


def test_a_changed_setting_is_named(run_ckpt, tmp_path):
    raw = run_ckpt.read_bytes()
    p = torch.load(run_ckpt, weights_only=True)
    p["global_step"] += 1  # edited without recomputing the checksums
    torch.save(p, tmp_path / "edited.pt")
    with pytest.raises(CheckpointError, match="plain data"):
        load_checkpoint(tmp_path / "edited.pt")
    assert run_ckpt.read_bytes() == raw


def test_checkpoint_without_checksum_loads_with_one_note(run_ckpt, tmp_path, capsys):
    old = tmp_path / "old.pt"
    p = torch.load(run_ckpt, weights_only=True)
    del p["checksums"]
    torch.save(p, old)
    capsys.readouterr()
    policy, payload = load_policy(old)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("note:") and str(old) in err[0] and "no checksum" in err[0]
    assert torch.equal(policy.state_dict()["actor.weight"], p["model"]["actor.weight"])
    load_checkpoint(run_ckpt)
    assert capsys.readouterr().err == ""  # a checkpoint with checksums: no note


# ------------------------------------------------------------------------ non-finite contents
def test_nan_weights_are_refused_at_load(run_ckpt, tmp_path):
    """Formerly a policy with NaN weights evaluated to a normal-looking table."""
    def poison(p):
        p["model"]["critic.bias"] = torch.full_like(p["model"]["critic.bias"], float("nan"))
        p["model"]["actor.weight"][0, 0] = float("inf")
    bad = _rewrite(run_ckpt, tmp_path / "nan.pt", poison)
    with pytest.raises(CheckpointError) as e:
        load_policy(bad)
    assert str(bad) in str(e.value) and "actor.weight holds 1 of" in str(e.value)


@pytest.mark.parametrize("field,value", [("reward_goal", float("nan")), ("reward_collision", float("inf")),
                                         ("partner_radius", 0.0)])
def test_invalid_env_settings_in_a_checkpoint_are_named(run_ckpt, tmp_path, field, value):
    """Formerly a checkpoint with reward_goal NaN evaluated with NaN observations, exit 0."""
    bad = _rewrite(run_ckpt, tmp_path / "env.pt", lambda p: p["env_config"].__setitem__(field, value))
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(bad))}: its env settings are invalid: "
                                              rf"EnvConfig\.{field} must be"):
        load_checkpoint(bad)


# --------------------------------------------------------------------------- shipped policies
def _card_facts(card: pathlib.Path) -> tuple[int, str]:
    text = " ".join(card.read_text().split())
    m = re.search(r"([\d,]+) bytes \(at most [\d,]+\), SHA-256 ([0-9a-f]{64})", text)
    assert m, f"{card.name}: no 'N bytes ..., SHA-256 HEX' line"
    return int(m.group(1).replace(",", "")), m.group(2)


@pytest.mark.parametrize("path", sorted(POLICIES.glob("*.pt")), ids=lambda p: p.name)
def test_shipped_policy_has_a_checksum_and_its_card_the_file_hash(path, capsys):
    payload = load_checkpoint(path)
    assert "checksums" in payload and capsys.readouterr().err == ""
    size, sha = _card_facts(path.with_suffix(".md"))
    assert path.stat().st_size == size
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha


def test_save_checkpoint_writes_checksums_that_verify(tmp_path):
    from policy.actor_critic import ActorCritic
    from policy.encoders import ObsDims

    torch.manual_seed(0)
    pol = ActorCritic(ObsDims(4, 2, 3, 3, 4), 91, False, PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16))
    env = TrainConfig().to_dict()["env"]
    path = save_checkpoint(tmp_path / "c.pt", policy=pol, optimizer=torch.optim.Adam(pol.parameters()),
                           global_step=3, update=1, config={"env": env}, env_config=env)
    raw = torch.load(path, weights_only=True)
    assert raw["checksums"] == checkpoint_checksums(raw)
    assert set(raw["checksums"]["tensors"]) >= {f"model/{k}" for k in pol.state_dict()} | {"rng"}
