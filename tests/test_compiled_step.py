"""The compiled CPU step (``EnvConfig.compile=True``, gpusim/sim/compiled.py) against the eager
pipeline, the oracle, on the real WOMD sample scenarios: same observations (float32 rounding),
rewards, flags, states and metric logs, step by step through episode ends (auto-reset), for every
goal and contact behaviour and in trial mode.

Cost: each configuration compiles its graphs once (tens of seconds on a loaded 2-core machine
the first time; inductor's on-disk cache makes later runs fast). The default run compiles two
configurations (respawn/remove/stop with episode ends, and trial mode); the other behaviours are
``slow``.
"""

import dataclasses

import pytest
import torch
from torch._dynamo.utils import counters

from gpusim.config import EnvConfig
from gpusim.data import ScenarioPack
from gpusim.env import DriveEnv
from gpusim.sim.compiled import CompiledStep
from gpusim.sim.pipeline import PIPELINE

W = 5
BASE = EnvConfig(max_controlled=8, scenario_length=9)


@pytest.fixture(scope="module")
def pack(sample_dir):
    files = sorted(sample_dir.glob("*.json*"))
    if not files:
        pytest.fail("data/womd_sample/ is empty: the bundled scenarios are missing")
    return ScenarioPack.from_json(files, BASE.data_config())


def _actions(env, g):
    if env.num_actions == 2:
        return torch.rand(env.num_worlds, env.num_slots, 2, generator=g) * 2 - 1
    return torch.randint(0, env.num_actions, (env.num_worlds, env.num_slots), generator=g)


def _same(a: torch.Tensor, b: torch.Tensor, what: str):
    if a.dtype == torch.bool or not a.is_floating_point():
        assert torch.equal(a, b), what
    else:
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5, equal_nan=True, msg=what)


def run_both(pack, config, steps, seed=0):
    """Step an eager and a compiled env with the same actions; compare everything each step."""
    traced = counters["frames"]["ok"]
    eager = DriveEnv(pack, W, config, seed=seed)
    comp = DriveEnv(pack, W, dataclasses.replace(config, compile=True), seed=seed)
    _same(eager.reset(), comp.reset(), "reset obs")
    g = torch.Generator().manual_seed(seed)
    ends = 0
    for i in range(steps):
        a = _actions(eager, g)
        r0, r1 = eager.step(a), comp.step(a.clone())
        for k in ("obs", "reward", "terminal", "truncation", "loss_mask", "slot_active", "removed", "stopped",
                  "trial_ended"):
            _same(getattr(r0, k), getattr(r1, k), f"step {i}: {k}")
        assert r0.info.keys() == r1.info.keys()
        for k in r0.info:
            _same(r0.info[k], r1.info[k], f"step {i}: info[{k}]")
        s1 = comp.state.tensors()
        for k, v in eager.state.tensors().items():
            _same(v, s1[k], f"step {i}: state.{k}")
        ends += int(eager.episode_step == 0)
    assert isinstance(comp._compiled, CompiledStep)  # the compiled path really ran:
    assert counters["frames"]["ok"] > traced  # dynamo traced its segments for this config
    assert eager.metrics("mean") == comp.metrics("mean")
    return eager, comp, ends


def test_compiled_equals_eager_respawn_remove(pack):
    cfg = dataclasses.replace(BASE, goal_behavior="respawn", collision_behavior="remove", offroad_behavior="stop")
    _, _, ends = run_both(pack, cfg, steps=2 * BASE.scenario_length + 2)
    assert ends == 2  # two auto-resets went through the compiled step


def test_compiled_equals_eager_trial_mode(pack):
    cfg = dataclasses.replace(BASE, goal_behavior="trial", k_trials=2, scenario_length=6,
                              collision_behavior="stop")
    eager, comp, ends = run_both(pack, cfg, steps=2 * 6 + 3)
    assert ends == 1
    assert comp.metrics("ema") == eager.metrics("ema")


@pytest.mark.slow
@pytest.mark.parametrize("goal,collision,offroad,space", [
    ("stop", "ignore", "ignore", "discrete"),
    ("new_goal", "stop", "remove", "discrete"),
    ("respawn", "ignore", "remove", "continuous"),
    ("trial", "remove", "remove", "continuous"),
])
def test_compiled_equals_eager_behaviours(pack, goal, collision, offroad, space):
    cfg = dataclasses.replace(BASE, goal_behavior=goal, collision_behavior=collision, offroad_behavior=offroad,
                              action_space=space, k_trials=2)
    run_both(pack, cfg, steps=2 * cfg.horizon + 1, seed=3)


def test_stage_hook_runs_the_eager_pipeline(pack):
    env = DriveEnv(pack, 2, dataclasses.replace(BASE, compile=True))
    seen = []
    env.stage_hook = lambda name, call: (seen.append(name), call())[1]
    env.reset()
    env.step(torch.zeros(2, BASE.max_controlled, dtype=torch.int64))
    assert seen == [s.name for s in PIPELINE]  # per-stage timing needs the stages one by one
    assert env._compiled is None  # nothing compiled while a hook is set


def test_pipeline_must_end_with_restart_observe(pack):
    env = DriveEnv(pack, 2, BASE)
    with pytest.raises(ValueError, match="restart, observe"):
        CompiledStep(env.sim, PIPELINE[:-1])
