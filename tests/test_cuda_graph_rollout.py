"""The CUDA-graph rollout (train/graphed_rollout.py) on the CPU, through the fake capture backend.

:class:`gpusim.cuda_graph.FakeGraphCapture` records the step at capture and re-runs it on every
replay, reading and writing only the static buffers: the code path of a real graph. The graphed
rollout must equal :func:`train.rollout.collect_rollout` bit for bit (obs, actions, log-probs,
values, rewards, flags) over rollouts with episode ends, in normal and trial mode, across pool
swaps; the env state and the metrics must agree too. Real CUDA graphs are tested only where a
CUDA device exists.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from gpusim.backend import interpreter_active, use_backend
from gpusim.config import ActionSpace, EnvConfig
from gpusim.cuda_graph import ENV_FLAG, FakeGraphCapture, graph_decision
from gpusim.data.pool import ScenarioPool
from gpusim.env import DriveEnv
from gpusim.sim.pipeline import PIPELINE, Stage
from policy.actor_critic import ActorCritic, PolicyConfig
from synthetic import driver, lane, parked, small_config, synthetic_pack
from train.graphed_rollout import GraphedRollout, make_rollout
from train.rollout import STEP_FIELDS, RolloutBatch, TrialLog, collect_rollout

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# Triton kernels on CPU tensors run only under TRITON_INTERPRET=1 (tests/conftest.py sets it on a
# machine without a GPU); on a GPU machine the real-capture tests (needs_cuda) cover the same paths
needs_interpreter = pytest.mark.skipif(not interpreter_active(),
                                       reason="Triton on CPU tensors needs TRITON_INTERPRET=1 (a machine without "
                                              "a GPU); the CUDA tests of this file cover it on a GPU")
W = 3


def _pack():
    return synthetic_pack([
        {"agents": [driver(0, 0, 0.0, 5.0, (12.0, 0.0)), driver(-20, 4, 0.0, 3.0, (80.0, 4.0)), parked(25, 0.5)],
         "num_controlled": 2, "roads": lane() + lane(y=8.0, rtype=2)},
        {"agents": [driver(0, 0, 0.0, 4.0, (200.0, 0.0)), driver(6, 0, 0.0, 4.0, (300.0, 0.0)), parked(30, 30)],
         "num_controlled": 2, "roads": lane()},
        {"agents": [driver(0, 2, 0.0, 6.0, (30.0, 2.0)), parked(12, 2.0), parked(40, -3)],
         "num_controlled": 1, "roads": lane(y=2.0)},
    ], small_config())


def _config(trial: bool = False, space: str = "discrete", **kw) -> EnvConfig:
    dc = small_config()
    base = dict(max_agents=dc.max_agents, max_controlled=dc.max_controlled, num_roads=dc.grid_k, num_partners=3,
                action_space=space, scenario_length=6, collision_behavior="remove", offroad_behavior="remove")
    if trial:
        base.update(goal_behavior="trial", k_trials=2, scenario_length=4)
    base.update(kw)
    return EnvConfig(**base)


def _setup(cfg: EnvConfig, pool: bool = False, device=None, seed: int = 3):
    """An env, a policy (seeded weights), a buffer and a cache."""
    src = _pack()
    if device is not None:
        src = src.to(device)
    source = ScenarioPool(src, 2, device=device or "cpu", replace_fraction=0.5, seed=1, background=False) \
        if pool else src
    env = DriveEnv(source, W, cfg, device=device or "cpu", seed=seed)
    torch.manual_seed(0)
    continuous = int(cfg.action_space) == int(ActionSpace.CONTINUOUS)
    pol = ActorCritic(env.obs_layout, env.num_actions, continuous,
                      PolicyConfig(d_model=16, n_layers=2, n_heads=2, hidden=16)).to(env.device).eval()
    R, H = W * env.num_slots, env.horizon
    buf = RolloutBatch.for_env(env, continuous)
    return env, pol, buf, pol.init_cache(R, H, env.device)


def _rollouts(cfg, graphed: bool, n: int = 3, pool: bool = False, trial_log: bool = False, capture="fake",
              device=None, deterministic=False, **kw):
    """``n`` rollouts (``capture``: "fake", "cuda" = the default backend, or a backend object).

    Returns (per-rollout clones of the buffer fields, next obs, state and trial counts; env; rollout)."""
    env, pol, buf, cache = _setup(cfg, pool=pool, device=device)
    log = TrialLog(W, cfg.scenario_length, env.device) if trial_log else None
    if capture == "fake":
        capture = FakeGraphCapture()
    roll = GraphedRollout(env, pol, buf, cache, capture=None if capture == "cuda" else capture,
                          deterministic=deterministic, **kw) if graphed else None
    obs = env.reset(seed=5)
    out = []
    for i in range(n):
        torch.manual_seed(100 + i)  # action sampling draws from the default generator
        if graphed:
            obs, b = roll(obs, trial_log=log)
        else:
            obs, b = collect_rollout(env, pol, obs, buf, cache, deterministic, trial_log=log)
        rec = {f: getattr(b, f).clone() for f in STEP_FIELDS + ("scenario", "slot_active")}
        rec["next_obs"] = obs.clone()
        rec["state"] = {k: v.clone() for k, v in env.state.tensors().items()}
        rec["trial_log"] = log.counts.clone() if log is not None else None
        out.append(rec)
    return out, env, roll


def _assert_same(a, b):
    for i, (ra, rb) in enumerate(zip(a, b)):
        for k in ra:
            if k == "state":
                for f in ra[k]:
                    assert torch.equal(ra[k][f], rb[k][f]), f"rollout {i}: state.{f}"
            elif ra[k] is not None:
                assert torch.equal(ra[k], rb[k]), f"rollout {i}: {k}"


@pytest.mark.parametrize("trial", [False, True], ids=["normal", "trial"])
def test_graphed_rollout_equals_eager(trial):
    cfg = _config(trial, check_actions="async" if trial else "sync")  # async: the CUDA default
    eager, env_e, _ = _rollouts(cfg, False, trial_log=trial)
    graphed, env_g, roll = _rollouts(cfg, True, trial_log=trial)
    _assert_same(eager, graphed)
    assert any(bool(r["terminal"].any()) for r in eager)  # episode ends inside the rollouts
    if trial:
        assert any(bool(r["truncation"].any()) for r in eager)  # trial boundaries too
        assert int(eager[-1]["trial_log"][0].sum()) > 0  # trials ended (summed over the worlds)
    assert roll.fallback_reason is None
    H = env_g.horizon
    # one capture; the last step of each rollout (episode end) eager; 2 warm-ups, the rest replays
    assert roll.stats == {"captures": 1, "replays": 3 * (H - 1) - 2, "warm_steps": 2, "eager_steps": 3}
    assert roll.engine.capture.captures == 1 and roll.engine.capture.replays == 3 * (H - 1) - 2
    assert env_e.metrics("mean") == env_g.metrics("mean")
    # the observation stage reassigns ctx.obs_written each step: pinned to a static buffer
    assert "env.sim.obs_written" in roll.engine.pins
    if trial:  # the async action check rebinds its error record
        assert "env._check._record" in roll.engine.pins


def test_continuous_and_deterministic():
    cfg = _config(space="continuous")
    _assert_same(_rollouts(cfg, False, n=2)[0], _rollouts(cfg, True, n=2)[0])
    cfg = _config()
    _assert_same(_rollouts(cfg, False, n=2, deterministic=True)[0],
                 _rollouts(cfg, True, n=2, deterministic=True)[0])


def test_pool_swap_recaptures_and_matches():
    cfg = _config()
    eager, env_e, _ = _rollouts(cfg, False, n=3, pool=True)
    graphed, env_g, roll = _rollouts(cfg, True, n=3, pool=True)
    _assert_same(eager, graphed)
    assert env_g.pool.stats["swaps"] == 3  # a new device pack at every episode end
    assert roll.stats["captures"] == 3 and roll.fallback_reason is None  # one capture per pack


@pytest.mark.slow
@needs_interpreter
def test_triton_backend_matches():
    """The backend a GPU runs (here under Triton's interpreter, ~9 s): one short episode."""
    cfg = _config(scenario_length=4)
    with use_backend("triton"):
        eager = _rollouts(cfg, False, n=1)[0]
        graphed, _, roll = _rollouts(cfg, True, n=1, warmup=1)
    _assert_same(eager, graphed)
    assert roll.stats == {"captures": 1, "replays": 2, "warm_steps": 1, "eager_steps": 1}


def test_returned_buffers_alias_the_next_call():
    """Documented aliasing: the observation and the batch returned by a call are overwritten by
    the next call (clone to keep them)."""
    env, pol, buf, cache = _setup(_config())
    roll = GraphedRollout(env, pol, buf, cache, capture=FakeGraphCapture())
    obs1, b1 = roll(env.reset(seed=5))
    kept_obs, kept_logprobs = obs1.clone(), b1.logprobs.clone()
    obs2, b2 = roll(obs1)
    assert obs2 is obs1 and b2 is b1 is buf
    assert not torch.equal(obs2, kept_obs)  # the first call's observation now shows the second's values
    assert not torch.equal(b1.logprobs, kept_logprobs)


class _FailingCapture(FakeGraphCapture):
    def capture(self, fn, roots=None):
        raise RuntimeError("operation not permitted when stream is capturing")


def test_capture_failure_falls_back_with_one_warning():
    cfg = _config()
    said = []
    eager = _rollouts(cfg, False)[0]
    graphed, _, roll = _rollouts(cfg, True, capture=_FailingCapture(), say=said.append)
    _assert_same(eager, graphed)
    assert roll.fallback_reason == "capture failed: RuntimeError: operation not permitted when stream is capturing"
    assert len(said) == 1 and "CUDA graph off: capture failed" in said[0] and "eagerly" in said[0]


def _counting_stage(ctx, state, step):
    ctx.extra_calls = getattr(ctx, "extra_calls", 0) + 1  # host state: a replay would not run it
    return {}


def _reshaping_stage(ctx, state, step):
    ctx.scratch = torch.zeros(int(getattr(ctx, "scratch", torch.zeros(0)).numel()) + 1)
    return {}


@pytest.mark.parametrize("stage, reason", [
    (_counting_stage, "the step changes the host value env.sim.extra_calls"),
    (_reshaping_stage, "the step reassigns env.sim.scratch to a new shape"),
])
def test_audit_falls_back_on_what_a_replay_cannot_do(stage, reason):
    env, pol, buf, cache = _setup(_config())
    env.pipeline = PIPELINE + (Stage("extra", stage),)
    said = []
    roll = GraphedRollout(env, pol, buf, cache, capture=FakeGraphCapture(), say=said.append)
    roll(env.reset(seed=5))
    assert roll.fallback_reason.startswith(reason) and roll.stats["captures"] == 0 and len(said) == 1


def test_coplayers_fall_back():
    env, pol, buf, cache = _setup(_config())
    said = []
    roll = GraphedRollout(env, pol, buf, cache, capture=FakeGraphCapture(), say=said.append)

    class Partners:  # acts like the ego policy: only the fallback matters here
        def begin(self, env):
            pass

        def act(self, o, action):
            return action

        def observe(self, res):
            pass

    roll(env.reset(seed=5), coplayers=Partners())
    assert "co-players" in roll.fallback_reason and roll.stats["replays"] == 0 and len(said) == 1


def test_flag_decision(monkeypatch):
    monkeypatch.delenv(ENV_FLAG, raising=False)
    assert graph_decision("off", "cpu", "triton") == (False, "cuda_graph='off'")
    assert graph_decision("auto", "cpu", "triton") == (False, "needs a CUDA device (the env runs on cpu)")
    monkeypatch.setenv(ENV_FLAG, "0")
    assert graph_decision("on", "cpu", "triton") == (False, f"{ENV_FLAG}=0")
    with pytest.raises(ValueError, match="cuda_graph"):
        graph_decision("yes", "cpu", "triton")


def test_make_rollout_on_cpu(monkeypatch):
    monkeypatch.delenv(ENV_FLAG, raising=False)
    env, pol, buf, cache = _setup(_config())
    said = []
    auto = make_rollout("auto", env, pol, buf, cache, say=said.append)
    assert not isinstance(auto, GraphedRollout) and said == []  # auto: silent eager on the CPU
    on = make_rollout("on", env, pol, buf, cache, say=said.append)
    assert said == ["cuda_graph='on' but needs a CUDA device (the env runs on cpu): the rollout runs eagerly"]
    obs, batch = on(env.reset(seed=5))
    assert batch is buf and obs.shape == (W, env.num_slots, env.obs_dim)


def test_train_config_flag():
    from train.config import TrainConfig, parse_args

    assert TrainConfig().cuda_graph == "auto" and parse_args([]).cuda_graph == "auto"
    assert parse_args(["--cuda-graph", "off"]).cuda_graph == "off"
    assert TrainConfig.from_dict({"cuda_graph": "on"}).cuda_graph == "on"
    with pytest.raises(ValueError, match="run.json: cuda_graph: expected one of 'auto', 'on', 'off', got 'yes'"):
        TrainConfig.from_dict({"cuda_graph": "yes"}, source="run.json")


# ---------------------------------------------------------------------------- real CUDA graphs
@needs_cuda
@pytest.mark.parametrize("trial", [False, True], ids=["normal", "trial"])
def test_cuda_graph_rollout_equals_eager(trial):  # pragma: no cover  (needs a CUDA device)
    """Deterministic actions (no draws from the default generator), so eager and graphed runs see
    the same numbers; the env's own generator is registered with the graph."""
    cfg = _config(trial, check_actions="async")
    with use_backend("triton"):
        eager = _rollouts(cfg, False, device="cuda", deterministic=True, trial_log=trial)[0]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            graphed, _, roll = _rollouts(cfg, True, device="cuda", deterministic=True, trial_log=trial,
                                         capture="cuda")
    assert roll.fallback_reason is None and roll.stats["captures"] == 1
    _assert_same(eager, graphed)


@needs_cuda
def test_cuda_default_rollout_is_graphed():  # pragma: no cover  (needs a CUDA device)
    cfg = _config(check_actions="async")
    with use_backend("triton"):
        env, pol, buf, cache = _setup(cfg, device="cuda")
        roll = make_rollout("auto", env, pol, buf, cache)
        assert isinstance(roll, GraphedRollout)
        obs = env.reset(seed=5)
        for _ in range(2):
            obs, _ = roll(obs)
    assert roll.fallback_reason is None and roll.stats["captures"] == 1 and roll.stats["replays"] > 0


@needs_cuda
def test_cuda_trainer_default_run_is_graphed(tmp_path, monkeypatch):  # pragma: no cover  (needs CUDA)
    """train/run.py's defaults on CUDA (ProgressShaping, async action check, sampled actions):
    the rollout is captured and replayed, and training goes on (an H100 run once died here)."""
    import train.graphed_rollout as gr
    from train.config import TrainConfig
    from train.run import train

    made = []

    class Recording(gr.GraphedRollout):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(gr, "GraphedRollout", Recording)
    tc = TrainConfig(num_worlds=4, total_timesteps=2 * 4 * 32 * 91, device="cuda", seed=0,
                     log_dir=str(tmp_path), run_name="cuda", quiet=True)  # the bundled scenarios
    out = train(tc)
    assert out["update"] >= 2 and len(made) == 1
    assert made[0].fallback_reason is None, made[0].fallback_reason
    assert made[0].stats["captures"] >= 1 and made[0].stats["replays"] > 0


def test_async_bad_action_is_raised_after_a_graphed_rollout():
    """The async action check's first-error record survives the replays (it is pinned)."""
    cfg = _config(space="continuous", check_actions="async")
    messages = []
    for graphed in (False, True):
        env, pol, buf, cache = _setup(cfg)
        calls = []

        def sample(logits, deterministic=False, temperature=1.0):  # NaN actions from the 4th step on: a replayed step
            calls.append(1)  # (a Python counter: fine for the fake capture, which re-runs Python)
            return torch.full_like(logits, float("nan") if len(calls) >= 4 else 0.0)

        pol.sample = sample
        obs = env.reset(seed=5)
        if graphed:
            roll = GraphedRollout(env, pol, buf, cache, capture=FakeGraphCapture())
            roll(obs)
            assert roll.stats["replays"] > 0
        else:
            collect_rollout(env, pol, obs, buf, cache)
        with pytest.raises(ValueError, match="bad action at env step 4, world 0, slot 0") as e:
            env.check_errors()
        messages.append(str(e.value))
    assert messages[0] == messages[1]


def test_trainer_with_the_graphed_rollout_trains_identically(tmp_path, monkeypatch):
    """train/run.py end to end: the graphed rollout (fake capture standing in for CUDA) gives the
    same weights as cuda_graph='off' after two updates."""
    import train.graphed_rollout as gr
    from train.config import TrainConfig
    from train.run import train

    made = []

    class Recorder(FakeGraphCapture):
        def __init__(self, *a, **k):
            super().__init__()
            made.append(self)

    def run(mode, name):
        cfg = _config()
        env = DriveEnv(_pack(), W, cfg, seed=3)
        tc = TrainConfig(num_worlds=W, total_timesteps=W * env.num_slots * env.horizon // 2, device="cpu", seed=0,
                         log_dir=str(tmp_path), run_name=name, quiet=True, num_threads=1, env=cfg, cuda_graph=mode,
                         policy=PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16))
        out = train(tc, env=env)
        return torch.load(out["checkpoint"], weights_only=True)["model"], out

    eager, _ = run("off", "off")
    monkeypatch.setattr(gr, "graph_decision", lambda mode, device, backend: (True, None))
    monkeypatch.setattr(gr, "CudaGraphCapture", Recorder)
    graphed, out = run("on", "on")
    assert out["update"] >= 2 and len(made) == 1 and made[0].replays > 0
    for k, v in eager.items():
        assert torch.equal(graphed[k], v), k


@pytest.mark.slow
@needs_interpreter
def test_launch_count_outside_the_graph():
    """profiling/kernel_costs.py's count (Triton interpreter, ~10 s): a replayed step issues exactly
    one launch (no copy outside the graph in the steady state)."""
    from profiling.kernel_costs import graphed_launch_counts

    cfg = _config(scenario_length=5)
    r = graphed_launch_counts(_pack(), cfg, worlds=1)
    assert r["replayed"] == 1 and r["captures"] == 1 and r["replays"] == r["horizon"] - 1
    assert r["rollout"] < r["eager_rollout"] / 2


@pytest.mark.slow
@needs_interpreter
def test_replayed_step_makes_no_host_sync(monkeypatch):
    """What a real capture rejects, caught on the CPU (Triton backend under the interpreter, ~10 s):
    no sync-causing op (tests/test_syncs.py's counter) while the captured step replays, policy,
    sampling, env step, buffer writes and static copies included.

    The policy has CPU-only fast paths with host reads (policy/transformer.py, policy/encoders.py:
    guarded by the device type, off under ``torch.compile``); a GPU never runs them. Reporting
    ``torch.compiler.is_compiling()`` during the replays makes the CPU run the GPU's path."""
    from test_syncs import SyncWatchingCapture

    watching = SyncWatchingCapture()
    counters = watching.counters
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: bool(counters) and counters[-1].active)

    for trial in (False, True):
        cfg = _config(trial, check_actions="async", scenario_length=4 if not trial else 3)
        with use_backend("triton"):
            _, _, roll = _rollouts(cfg, True, n=1, capture=watching, warmup=1, trial_log=trial)
        assert roll.stats["replays"] > 0 and roll.fallback_reason is None
    assert counters and all(c.hits == [] for c in counters), [c.hits for c in counters if c.hits]
