"""Gymnasium and TorchRL adapters (gpusim/adapters): thin views of DriveEnv
(same numbers as the native [W, C] API, stepped in lockstep), TorchRL's check_env_specs, the
documented autoreset semantics, and the README examples. Skipped with the reason when the
optional package is not installed (CI installs both through the dev extra)."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

from gpusim.config import EnvConfig

REPO = pathlib.Path(__file__).resolve().parents[1]
ONE = REPO / "data" / "womd_sample" / "db4edc9bd0c9d18c.json.xz"
CFG = EnvConfig(max_controlled=8, scenario_length=4, collision_behavior="remove", offroad_behavior="remove")


@pytest.fixture(scope="module")
def pack():
    from gpusim.data import ScenarioPack

    return ScenarioPack.from_json(
        [REPO / "data" / "womd_sample" / f for f in ("db4edc9bd0c9d18c.json.xz", "b5f53fa2db40a6b4.json.xz")],
        CFG.data_config())


def _pair(pack, W=2):
    from gpusim.env import DriveEnv

    return DriveEnv(pack, W, config=CFG, seed=5), DriveEnv(pack, W, config=CFG, seed=5)


def test_adapters_import_lazily_and_name_the_extra(monkeypatch):
    import sys

    import gpusim.adapters as ad

    monkeypatch.setitem(sys.modules, "gymnasium", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "gpusim.adapters.gym_vector", raising=False)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[gymnasium\]"'):
        ad.DriveVectorEnv  # noqa: B018


def test_gymnasium_vector_env_matches_native_api(pack):
    gym = pytest.importorskip("gymnasium", reason="optional extra: pip install -e '.[gymnasium]'")
    from gpusim.adapters import DriveVectorEnv

    raw, wrapped = _pair(pack)
    venv = DriveVectorEnv(wrapped)
    assert isinstance(venv, gym.vector.VectorEnv)
    W, C, D = raw.num_worlds, raw.num_slots, raw.obs_dim
    N = W * C
    assert venv.num_envs == N and venv.single_observation_space.shape == (D,)
    assert venv.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    obs, info = venv.reset(seed=7)
    ref = raw.reset(seed=7)
    assert torch.equal(obs, ref.reshape(N, D)) and obs.dtype == torch.float32
    assert torch.equal(info["active"], raw.state.slot_active.reshape(N))
    gen = torch.Generator().manual_seed(0)
    slots, ended = info["slot_active"].clone(), torch.zeros(N, dtype=torch.bool)
    for t in range(2 * raw.horizon + 1):  # across two automatic resets
        a = torch.randint(0, raw.num_actions, (N,), generator=gen)
        if t == 1:
            a = venv.action_space.sample()  # NumPy works too
            a = torch.as_tensor(a)
        obs, rew, term, trunc, info = venv.step(a)
        res = raw.step(a.reshape(W, C))
        assert torch.equal(obs, res.obs.reshape(N, D)) and torch.equal(rew, res.reward.reshape(N))
        assert torch.equal(term, res.terminal.reshape(N)) and torch.equal(trunc, res.truncation.reshape(N))
        assert torch.equal(info["active"], res.loss_mask.reshape(N))
        assert term.dtype == torch.bool and obs.device == raw.device
        assert not (term & ended).any() and not (term & ~slots).any()  # once per episode, occupied slots only
        ended |= term
        if (t + 1) % raw.horizon == 0:  # same-step autoreset: every slot's episode is over, new episode's obs
            assert torch.equal(ended, slots)
            slots, ended = info["slot_active"].clone(), torch.zeros_like(ended)
    with pytest.raises(ValueError, match="shape"):
        venv.step(torch.zeros(N + 1, dtype=torch.int64))


def test_torchrl_env_passes_check_env_specs_and_matches_native_api(pack):
    pytest.importorskip("torchrl", reason="optional extra: pip install -e '.[torchrl]'")
    from torchrl.envs.utils import check_env_specs, step_mdp

    from gpusim.adapters import DriveTorchRLEnv

    raw, wrapped = _pair(pack)
    env = DriveTorchRLEnv(wrapped)
    W, C = raw.num_worlds, raw.num_slots
    assert tuple(env.batch_size) == (W, C)
    check_env_specs(env, break_when_any_done="both")
    raw.reset(seed=11)
    env.set_seed(11)
    td = env.reset()
    torch.testing.assert_close(td["observation"], raw.reset(), rtol=0, atol=0)
    assert td["observation"].device == raw.device
    gen = torch.Generator().manual_seed(1)
    for t in range(raw.horizon + 2):
        a = torch.randint(0, raw.num_actions, (W, C), generator=gen)
        td = env.step(td.set("action", a))
        res = raw.step(a)
        nxt = td["next"]
        assert torch.equal(nxt["observation"], res.obs) and torch.equal(nxt["reward"][..., 0], res.reward)
        assert torch.equal(nxt["terminated"][..., 0], res.terminal)
        assert torch.equal(nxt["done"][..., 0], res.terminal | res.truncation)
        assert torch.equal(nxt["active"][..., 0], res.loss_mask)
        td = step_mdp(td)
    roll = env.rollout(2 * raw.horizon, break_when_any_done=False)
    assert tuple(roll.batch_size) == (W, C, 2 * raw.horizon)
    assert roll["next", "terminated"][..., raw.horizon - 1, 0].any()


def _readme_block(title: str) -> str:
    """The example of docs/adapters.md ("Quick examples") that mentions ``title``."""
    text = (REPO / "docs" / "adapters.md").read_text()
    m = re.search(r"^## Quick examples$(.*?)^## ", text, re.M | re.S)
    assert m, "docs/adapters.md section 'Quick examples' is missing"
    blocks = re.findall(r"```python\n(.*?)```", m.group(1), re.S)
    found = [b for b in blocks if title in b]
    assert len(found) == 1, f"one docs/adapters.md example mentioning {title}"
    return found[0]


@pytest.mark.parametrize("lib", ["gymnasium", "torchrl"])
def test_readme_examples_run(lib, monkeypatch):
    pytest.importorskip(lib, reason=f"optional extra: pip install -e '.[{lib}]'")
    code = _readme_block("DriveVectorEnv" if lib == "gymnasium" else "DriveTorchRLEnv")
    assert len(code.strip().splitlines()) <= 12
    monkeypatch.chdir(REPO)
    exec(compile(code, f"docs/adapters.md ({lib} example)", "exec"), {})


@pytest.mark.parametrize("lib", ["gymnasium", "torchrl"])
def test_adapters_apply_the_env_action_checks(pack, lib):
    # a float action for a discrete env was cast to int64 (1.7 -> joint 1) and stepped the worlds
    pytest.importorskip(lib, reason=f"optional extra: pip install -e '.[{lib}]'")
    import gpusim.adapters as adapters  # each adapter imported only for its own library (the other may be absent)

    raw, wrapped = _pair(pack)
    W, C = raw.num_worlds, raw.num_slots
    if lib == "gymnasium":
        env = adapters.DriveVectorEnv(wrapped)
        env.reset(seed=3)

        def step(a):
            return env.step(a.reshape(W * C))
    else:
        env = adapters.DriveTorchRLEnv(wrapped)
        env.set_seed(3)
        td = env.reset()

        def step(a):
            return env.step(td.clone().set("action", a))
    before = wrapped.state.pos.clone()
    with pytest.raises(ValueError, match="discrete actions must be an integer tensor, got torch.float32"):
        step(torch.full((W, C), 1.7))
    with pytest.raises(ValueError, match="discrete actions contain NaN"):
        step(torch.full((W, C), float("nan")))
    with pytest.raises(ValueError, match=r"must be in \[0, 91\)"):
        step(torch.full((W, C), 91, dtype=torch.int64))
    assert torch.equal(wrapped.state.pos, before) and wrapped.sim.t == 0  # nothing was stepped
    step(torch.full((W, C), 45, dtype=torch.int32))  # any integer dtype, as DriveEnv.step
    assert wrapped.sim.t == 1
