"""The CUDA-graph-replayed env step (gpusim/graphed_env.py), on the CPU through the fake capture.

:class:`gpusim.cuda_graph.FakeGraphCapture` records the step at capture and re-runs it on every
replay, reading and writing only the static buffers: the code path of a real graph. A
:class:`GraphedEnv` must give the same StepResults and states as the eager env, bit for bit, at
every step, across auto-resets (eager episode-end steps), with NEW_GOAL draws inside the step and
in trial mode. Real CUDA graphs are tested only where a CUDA device exists.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from gpusim.config import EnvConfig
from gpusim.cuda_graph import ENV_FLAG, FakeGraphCapture
from gpusim.data import ScenarioPack
from gpusim.env import DriveEnv, StepResult
from gpusim.graphed_env import GraphedEnv

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device (real graph capture and replay)")
W, C = 3, 8
FIELDS = [f.name for f in dataclasses.fields(StepResult) if f.name != "info"]


@pytest.fixture(scope="module")
def pack(sample_dir):
    """The bundled WOMD sample (10 scenarios) for C = 8 controlled slots."""
    return ScenarioPack.from_json(sorted(sample_dir.glob("*.json*")), EnvConfig(max_controlled=C).data_config())


def _config(**kw) -> EnvConfig:
    base = dict(max_controlled=C, scenario_length=4, check_actions="async", collision_behavior="remove",
                offroad_behavior="remove")
    base.update(kw)
    return EnvConfig(**base)


def _actions(env, steps: int, seed: int = 7, device=None) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (env.num_worlds, env.num_slots) if env.num_actions > 2 else (env.num_worlds, env.num_slots, 2)
    if env.num_actions > 2:
        acts = [torch.randint(0, env.num_actions, shape, generator=g) for _ in range(steps)]
    else:
        acts = [torch.rand(shape, generator=g) * 2 - 1 for _ in range(steps)]
    return [a.to(device or env.device) for a in acts]


def _snapshot(env, res) -> dict:
    out = {f: getattr(res, f).clone() for f in FIELDS}
    out.update({f"info.{k}": v.clone() for k, v in res.info.items()})
    out.update({f"state.{k}": v.clone() for k, v in env.state.tensors().items()})
    if env.sim.start is not None:
        out.update({f"start.{k}": v.clone() for k, v in env.sim.start.tensors().items()})
    out["t"] = env.episode_step
    return out


def _stepper(pack, cfg, graphed, capture="fake", device="cpu", num_worlds=W, **kw):
    """``(env, genv, stepper)``: an env reset with seed 5, and with ``graphed`` the GraphedEnv
    around it (``genv`` None otherwise); ``stepper`` is the one to call ``step`` on."""
    env = DriveEnv(pack, num_worlds, cfg, device=device, seed=3)
    genv = None
    if graphed:
        genv = GraphedEnv(env, capture=FakeGraphCapture() if capture == "fake" else capture, **kw)
    stepper = genv if graphed else env
    stepper.reset(seed=5)
    return env, genv, stepper


def _run(pack, cfg, graphed, steps, **kw):
    """``steps`` steps of an env (``graphed``: through GraphedEnv; ``kw`` as :func:`_stepper`); a
    snapshot per step."""
    env, genv, stepper = _stepper(pack, cfg, graphed, **kw)
    snaps = [_snapshot(env, stepper.step(a)) for a in _actions(env, steps)]
    return snaps, env, genv


def _assert_same(a, b):
    assert len(a) == len(b)
    for i, (sa, sb) in enumerate(zip(a, b)):
        assert sa.keys() == sb.keys(), f"step {i}"
        for k in sa:
            if k == "t":
                assert sa[k] == sb[k], f"step {i}: clock"
            else:
                assert torch.equal(sa[k], sb[k]), f"step {i}: {k}"


@pytest.mark.parametrize("kw", [
    {},
    {"goal_behavior": "new_goal", "goal_radius": 30.0},  # NEW_GOAL draws from the env generator in the step
    {"goal_behavior": "trial", "k_trials": 2, "scenario_length": 3},
    {"action_space": "continuous"},
], ids=["stop", "new_goal", "trial", "continuous"])
def test_graphed_equals_eager(pack, kw):
    cfg = _config(**kw)
    steps = 2 * cfg.horizon + 3  # the auto-reset step is crossed twice
    eager, env_e, _ = _run(pack, cfg, False, steps)
    graphed, env_g, genv = _run(pack, cfg, True, steps)
    _assert_same(eager, graphed)
    assert sum(bool(s["info.episode_end"]) for s in eager) == 2
    assert genv.fallback_reason is None and genv.captured
    # 2 warm-ups, one capture (its step replayed once), the episode ends eager, the rest replays
    assert genv.stats == {"captures": 1, "replays": steps - 2 - 2, "warm_steps": 2, "eager_steps": 2}
    assert genv.capture.replays == steps - 2 - 2
    assert env_e.metrics("mean") == env_g.metrics("mean")
    assert torch.equal(env_e.generator.get_state(), env_g.generator.get_state())
    if cfg.trial_mode:
        assert any(bool(s["truncation"].any()) for s in eager)  # trial boundaries inside replayed steps
    if kw.get("goal_behavior") == "new_goal":
        assert any(bool(s["info.goal_reached"].any()) for s in eager[:cfg.horizon - 1])  # goals resampled


def test_pack_swap_recaptures(pack, sample_dir):
    cfg = _config()
    other = ScenarioPack.from_json(sorted(sample_dir.glob("*.json*"))[:3], cfg.data_config())
    runs = []
    for graphed in (False, True):
        env, genv, stepper = _stepper(pack, cfg, graphed)
        snaps = []
        for i, a in enumerate(_actions(env, 3 * cfg.horizon)):
            if i == cfg.horizon:  # a new pack from the next episode on (as streaming evaluation does)
                env.use_pack(other)
                stepper.reset(seed=9)
            snaps.append(_snapshot(env, stepper.step(a)))
        runs.append(snaps)
    _assert_same(*runs)
    assert genv.stats["captures"] == 2 and genv.fallback_reason is None


def test_result_is_overwritten_by_the_next_step(pack):
    """Aliasing contract: a replayed step's StepResult tensors are static buffers."""
    env = DriveEnv(pack, W, _config(scenario_length=20), seed=3)
    genv = GraphedEnv(env, capture=FakeGraphCapture())
    genv.reset(seed=5)
    acts = _actions(env, 6)
    for a in acts[:4]:  # past the warm-ups and the capture
        r1 = genv.step(a)
    kept = r1.obs.clone()
    r2 = genv.step(acts[4])
    assert genv.stats["replays"] >= 2
    for f in FIELDS:
        assert getattr(r2, f) is getattr(r1, f), f
    assert r2.info["goal_reached"] is r1.info["goal_reached"]
    assert r1.obs is env.sim.obs_buf  # the env's observation buffer, as eagerly
    assert not torch.equal(r1.obs, kept)  # step t's observation now shows step t+1's values
    assert env.state is genv.engine.state  # env.state is the static state between steps


def test_stage_hook_falls_back_with_one_warning(pack):
    cfg = _config()
    said = []
    env = DriveEnv(pack, W, cfg, seed=3)
    genv = GraphedEnv(env, capture=FakeGraphCapture(), say=said.append)
    env.stage_hook = lambda name, call: call()
    genv.reset(seed=5)
    acts = _actions(env, 2 * cfg.horizon)
    snaps = [_snapshot(env, genv.step(a)) for a in acts]
    assert genv.fallback_reason.startswith("a stage hook is set on the env")
    assert len(said) == 1 and "GraphedEnv steps eagerly" in said[0]
    assert genv.stats["captures"] == 0 and genv.stats["eager_steps"] == len(acts)
    _assert_same(_run(pack, cfg, False, len(acts))[0], snaps)


def test_sync_action_check_runs_eagerly(pack):
    """Documented choice: check_actions='sync' (the CPU's 'auto') steps eagerly, with the reason;
    a bad action raises at the step itself, as the eager env does."""
    said = []
    env = DriveEnv(pack, W, _config(check_actions="sync"), seed=3)
    genv = GraphedEnv(env, capture=FakeGraphCapture(), say=said.append)
    assert "check_actions resolves to 'sync'" in genv.fallback_reason and len(said) == 1
    genv.reset(seed=5)
    genv.step(_actions(env, 1)[0])
    with pytest.raises(ValueError, match="discrete actions must be in"):
        genv.step(torch.full((W, C), 500, dtype=torch.int64))
    assert genv.stats["eager_steps"] == 1 and genv.capture.captures == 0  # a step that raised is not counted


def test_cpu_default_is_eager_without_error(pack, monkeypatch):
    monkeypatch.delenv(ENV_FLAG, raising=False)
    env = DriveEnv(pack, W, _config(), seed=3)
    with pytest.warns(RuntimeWarning, match="needs a CUDA device"):
        genv = GraphedEnv(env)
    assert genv.fallback_reason == "needs a CUDA device (the env runs on cpu)" and not genv.captured
    genv.reset(seed=5)
    res = genv.step(_actions(env, 1)[0])
    assert res.obs.shape == (W, C, env.obs_dim) and genv.stats["eager_steps"] == 1
    assert genv.num_worlds == W and genv.horizon == env.horizon  # other attributes read from the env


def test_async_bad_action_is_raised_at_check_errors(pack):
    """A NaN action at a replayed step is recorded (the record is pinned) and raised at
    env.check_errors(), with the eager env's message."""
    cfg = _config(action_space="continuous", scenario_length=10)
    messages = []
    for graphed in (False, True):
        env, genv, stepper = _stepper(pack, cfg, graphed)
        for i, a in enumerate(_actions(env, 7)):
            if i == 5:
                a[1, 2, 0] = float("nan")
            stepper.step(a)
        if graphed:
            assert genv.stats["replays"] >= 3 and genv.fallback_reason is None
            assert "env._check._record" in genv.engine.pins
        with pytest.raises(ValueError, match="bad action at env step 6, world 1, slot 2") as e:
            env.check_errors()
        messages.append(str(e.value))
    assert messages[0] == messages[1]


def test_bad_action_shape_raises_and_the_graph_stays(pack):
    """A wrong shape or type raises ValueError (as eagerly) and keeps the graph; valid actions of
    another dtype run eagerly once, then warm up and capture again."""
    env = DriveEnv(pack, W, _config(scenario_length=20), seed=3)
    genv = GraphedEnv(env, capture=FakeGraphCapture())
    genv.reset(seed=5)
    acts = _actions(env, 10)
    for a in acts[:4]:
        genv.step(a)
    with pytest.raises(ValueError, match=r"must have shape \[W, C\]"):
        genv.step(torch.zeros(W, C + 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="actions must be a torch.Tensor"):
        genv.step([[0] * C] * W)
    replays = genv.stats["replays"]
    genv.step(acts[4])
    assert genv.stats["replays"] == replays + 1 and genv.stats["captures"] == 1  # the graph stayed
    for a in acts[5:]:
        genv.step(a.to(torch.int32))  # eager once, 2 warm-ups, capture, replay
    assert genv.stats["captures"] == 2 and genv.stats["eager_steps"] == 1 and genv.fallback_reason is None
    assert genv.captured


class _FailingCapture(FakeGraphCapture):
    def capture(self, fn, roots=None):
        raise RuntimeError("operation not permitted when stream is capturing")


def test_capture_failure_falls_back(pack):
    cfg = _config()
    said = []
    steps = 2 * cfg.horizon
    graphed, _, genv = _run(pack, cfg, True, steps, capture=_FailingCapture(), say=said.append)
    _assert_same(_run(pack, cfg, False, steps)[0], graphed)
    assert genv.fallback_reason == "capture failed: RuntimeError: operation not permitted when stream is capturing"
    assert len(said) == 1


def test_coplayers_fall_back(pack):
    env = DriveEnv(pack, W, _config(ego_slots=1), seed=3)
    genv = GraphedEnv(env, capture=FakeGraphCapture(), say=lambda m: None)
    assert "co-players" in genv.fallback_reason


def test_constructor_errors(pack):
    with pytest.raises(TypeError, match="DriveEnv"):
        GraphedEnv(object())
    with pytest.raises(ValueError, match="warmup must be >= 1"):
        GraphedEnv(DriveEnv(pack, 1, _config()), capture=FakeGraphCapture(), warmup=0)


def test_bench_env_graphed_flag_on_cpu(pack, capsys):
    """profiling/bench_env.py --graphed on the CPU: runs (eagerly) and says why, once."""
    from profiling.bench_env import bench, main

    row = bench(pack, EnvConfig(max_controlled=C), 2, steps=2, repeats=1, warmup=1, device="cpu", graphed=True)
    assert row["graph"] == "needs a CUDA device (the env runs on cpu)" and row["agent_steps_per_s"] > 0
    main(["--worlds", "1", "2", "--max-controlled", str(C), "--steps", "1", "--repeats", "1", "--warmup", "0",
          "--graphed", "--json"])
    err = capsys.readouterr().err
    assert err.count("--graphed: stepping eagerly: needs a CUDA device") == 1


@pytest.mark.slow
def test_replayed_step_makes_no_host_sync(pack):
    """What a real capture rejects, caught on the CPU (Triton backend under the interpreter, slow;
    on a GPU machine on CUDA tensors, ``synthetic.KERNEL_DEVICE``): no sync-causing op
    (tests/test_syncs.py's counter) while the captured step replays, the action check, the env
    step and the static copies included."""
    from synthetic import KERNEL_DEVICE
    from test_syncs import SyncWatchingCapture

    from gpusim.backend import use_backend

    watching = SyncWatchingCapture()
    counters = watching.counters
    for kw in ({}, {"goal_behavior": "trial", "k_trials": 2, "scenario_length": 2}):
        with use_backend("triton"):
            _, _, genv = _run(pack, _config(**kw), True, 4, capture=watching, num_worlds=2, warmup=1,
                              device=KERNEL_DEVICE)
        assert genv.stats["replays"] > 0 and genv.fallback_reason is None
    assert counters and all(c.hits == [] for c in counters), [c.hits for c in counters if c.hits]


# ---------------------------------------------------------------------------- real CUDA graphs
@needs_cuda
@pytest.mark.parametrize("kw", [{}, {"goal_behavior": "new_goal", "goal_radius": 30.0},
                                {"goal_behavior": "trial", "k_trials": 2, "scenario_length": 30}],
                         ids=["stop", "new_goal", "trial"])
def test_cuda_graphed_equals_eager(pack, kw):  # pragma: no cover  (needs a CUDA device)
    """Real capture on CUDA (the default backend there): a few hundred steps, auto-resets crossed,
    captured once, no fallback, every result and state field equal to the eager env's."""
    cfg = EnvConfig(max_controlled=C, **{"scenario_length": 60, **kw})  # check_actions 'auto' = async on CUDA
    steps = 300
    eager = _run(pack, cfg, False, steps, device="cuda", num_worlds=16)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        graphed, env, genv = _run(pack, cfg, True, steps, capture=None, device="cuda", num_worlds=16)
    assert genv.fallback_reason is None and genv.captured
    assert genv.stats["captures"] == 1 and genv.stats["replays"] > steps // 2
    _assert_same(eager, graphed)
    env.check_errors()
