"""The fused CPU step (gpusim/sim/fused_cpu.py) against the stage pipeline it replaces.

The pipeline is the oracle: the same env with a pass-through stage hook runs every stage (a hook
turns the fused path off). Over several episodes (auto-resets, terminals, metrics) every
``StepResult`` tensor, every info entry, every state field and the metrics are equal bit for bit,
for several contact / reward / role settings; the fused function must actually have run. Settings
outside its conditions (trial mode, RESPAWN / NEW_GOAL, continuous actions, a stage hook, the
first step, the episode-end step) must run the pipeline.
"""

import pytest
import torch

from gpusim.config import EnvConfig
from gpusim.data import ScenarioPack
from gpusim.env import DriveEnv
from gpusim.kernels.step_cpu import discrete_motion_tables, step_kernels_available
from gpusim.sim import fused_cpu

W, STEPS = 7, 40

pytestmark = pytest.mark.skipif(not step_kernels_available() or discrete_motion_tables() is None,
                                reason="no C compiler here (or position-dependent trig): the fused step never runs")


@pytest.fixture(scope="module")
def pack(sample_dir):
    return ScenarioPack.from_json(sorted(sample_dir.glob("*.json*")), EnvConfig(max_controlled=8).data_config())


@pytest.fixture
def counted(monkeypatch):
    """Count the fused steps (the env calls ``fused_cpu.fused_step`` through the module)."""
    calls = []
    original = fused_cpu.fused_step

    def fused_step(ctx, state, step):
        calls.append(1)
        return original(ctx, state, step)

    monkeypatch.setattr(fused_cpu, "fused_step", fused_step)
    return calls


def _bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def _run(pack, cfg, pipeline: bool, steps: int = STEPS):
    env = DriveEnv(pack, W, cfg, seed=3)
    if pipeline:
        env.stage_hook = lambda name, call: call()
    env.reset(seed=5)
    g = torch.Generator().manual_seed(1)
    shape = (W, env.num_slots) if cfg.action_space == 0 else (W, env.num_slots, 2)
    snaps = []
    for _ in range(steps):
        a = (torch.randint(0, env.num_actions, shape, generator=g) if cfg.action_space == 0
             else torch.rand(shape, generator=g) * 2 - 1)
        r = env.step(a)
        tensors = {f"result.{k}": v for k, v in vars(r).items() if isinstance(v, torch.Tensor)}
        tensors.update({f"info.{k}": v for k, v in r.info.items()})
        tensors.update({f"state.{k}": v for k, v in env.state.tensors().items()})
        snaps.append({k: v.clone() for k, v in tensors.items()})
    return snaps, env.metrics(kind="mean"), env.metrics(kind="mean", role="coplayer") if cfg.ego_slots else None


@pytest.mark.parametrize("kw", [
    {},
    {"collision_behavior": "remove", "offroad_behavior": "stop", "reward_red_light": -0.5},
    {"collision_behavior": "stop", "offroad_behavior": "remove", "num_signals": 0, "goal_radius": 6.0},
    {"ego_slots": 1, "collision_behavior": "remove", "stop_truncate_fraction": 0.3},
], ids=["default", "remove-stop-red", "stop-remove-nosignalobs", "coplayers"])
def test_fused_equals_pipeline(pack, counted, kw):
    cfg = EnvConfig(**{"max_controlled": 8, "scenario_length": 12, "goal_radius": 4.0, **kw})
    fused, m_fused, c_fused = _run(pack, cfg, pipeline=False)
    ran = len(counted)
    ref, m_ref, c_ref = _run(pack, cfg, pipeline=True)
    assert len(counted) == ran, "a stage hook must turn the fused path off"
    assert ran >= STEPS - STEPS // 12 - 2, f"the fused step ran {ran} times in {STEPS} steps"
    for t, (a, b) in enumerate(zip(fused, ref)):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype and torch.equal(_bits(a[k]), _bits(b[k])), f"step {t}: {k}"
    assert m_fused == m_ref and c_fused == c_ref
    terminal = torch.stack([s["result.terminal"] for s in ref])
    assert terminal.any() and torch.stack([s["result.reward"] for s in ref]).ne(0).any()


@pytest.mark.parametrize("kw", [
    {"goal_behavior": "trial", "k_trials": 2}, {"goal_behavior": "respawn"}, {"goal_behavior": "new_goal"},
    {"action_space": "continuous"}, {"cpu_kernels": False},
], ids=["trial", "respawn", "new_goal", "continuous", "no-c-kernels"])
def test_outside_its_conditions_the_pipeline_runs(pack, counted, kw):
    _run(pack, EnvConfig(max_controlled=8, scenario_length=6, **kw), pipeline=False, steps=8)
    assert counted == []


def test_first_and_episode_end_steps_run_the_pipeline(pack, counted):
    """The first step (layout not yet checked) and each episode-end step (auto-reset) take the
    pipeline: 2 episodes of 6 steps give 12 - 1 - 2 fused steps."""
    _run(pack, EnvConfig(max_controlled=8, scenario_length=6), pipeline=False, steps=12)
    assert len(counted) == 12 - 1 - 2


def test_fused_step_knows_every_stage():
    """A stage added to, removed from or moved in PIPELINE switches the fused step off until
    gpusim/sim/fused_cpu.py reproduces the new pipeline (and its STAGES says so)."""
    from gpusim.sim.pipeline import PIPELINE

    assert tuple(stage.name for stage in PIPELINE) == fused_cpu.STAGES, (
        "PIPELINE changed: update gpusim/sim/fused_cpu.py (fused_step and STAGES) to run the new stage")
