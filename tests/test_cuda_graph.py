"""gpusim.cuda_graph: the flag, and the engine (:class:`GraphEngine`) on its own: warm-up, capture,
replay, keys, static env state, audit and fallback, on the CPU through the fake capture backend
(which re-runs the recorded step on every replay, reading and writing the static buffers only);
the CUDA capture backend's failure handling on a CUDA device (skipped without one). The two
clients are tested in test_graphed_env.py and test_cuda_graph_rollout.py."""

import pytest
import torch

from gpusim.config import EnvConfig
from gpusim.cuda_graph import ENV_FLAG, CudaGraphCapture, FakeGraphCapture, GraphEngine, cuda_graphs_enabled
from gpusim.data import ScenarioPack
from gpusim.env import DriveEnv

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
W, C = 2, 4


def test_flag_defaults_and_override(monkeypatch):
    monkeypatch.delenv(ENV_FLAG, raising=False)
    assert cuda_graphs_enabled("cpu") is False
    assert cuda_graphs_enabled() is torch.cuda.is_available()
    monkeypatch.setenv(ENV_FLAG, "0")
    assert cuda_graphs_enabled("cuda") is False and cuda_graphs_enabled() is False
    monkeypatch.setenv(ENV_FLAG, "maybe")
    with pytest.raises(ValueError, match=ENV_FLAG):
        cuda_graphs_enabled()


@pytest.fixture(scope="module")
def pack(sample_dir):
    """Three scenarios of the bundled WOMD sample for C = 4 controlled slots."""
    return ScenarioPack.from_json(sorted(sample_dir.glob("*.json*"))[:3], EnvConfig(max_controlled=C).data_config())


def _env(pack):
    cfg = EnvConfig(max_controlled=C, scenario_length=5, check_actions="async", collision_behavior="remove")
    env = DriveEnv(pack, W, cfg, seed=3)
    env.reset(seed=5)
    return env


class _Client:
    """The smallest client: a static action buffer and a body that steps the env on the static state."""

    def __init__(self, env, capture, warmup=2, extra=None):
        self.env, self.said = env, []
        self.actions = torch.zeros(W, C, dtype=torch.int64)
        self.extra = extra
        self.engine = GraphEngine(env, self.body, lambda: {"env": env}, capture, warmup, self.said.append,
                                  "eager now")

    def body(self):
        new_state, _ = self.env.advance(self.engine.state, self.env.validate_actions(self.actions), False)
        if self.extra is not None:
            self.extra(self.env)
        self.engine.finish(new_state, [], [])

    def step(self, actions, key="k"):
        env = self.env
        if env.episode_step + 1 < env.horizon and self.engine.step(key, [(self.actions, actions)]):
            return "graph"
        env.step(actions)
        return "eager"


def _actions(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 91, (W, C), generator=g) for _ in range(n)]


def test_engine_warms_up_captures_replays_and_matches_eager(pack):
    acts = _actions(12)
    eager, graphed = _env(pack), _env(pack)
    cap = FakeGraphCapture()
    client = _Client(graphed, cap)
    ways = []
    for a in acts:
        eager.step(a)
        ways.append(client.step(a))
        assert graphed.episode_step == eager.episode_step  # the engine commits the host clock
        for k, v in eager.state.tensors().items():
            assert torch.equal(v, graphed.state.tensors()[k]), k
    assert graphed.state is client.engine.state  # env.state is the static state between steps
    H = eager.horizon  # the episode-end step of every episode runs eagerly
    assert ways[:H] == ["graph"] * (H - 1) + ["eager"]
    e = client.engine
    assert e.stats["warm_steps"] == 2 and e.stats["captures"] == 1 and cap.captures == 1
    assert e.stats["replays"] == cap.replays == len(acts) - 2 - len(acts) // H
    assert e.fallback_reason is None and client.said == [] and e.captured
    client.step(acts[0], key="other")  # a new client key: warm up (and later capture) again
    assert not e.captured and e.stats["warm_steps"] == 3


def test_engine_falls_back_once_with_the_reason(pack):
    def count(env):  # a host value changed by the step: a replay could not do it
        env.sim.counted = getattr(env.sim, "counted", 0) + 1

    env = _env(pack)
    client = _Client(env, FakeGraphCapture(), extra=count)
    ways = [client.step(a) for a in _actions(6)]
    reason = client.engine.fallback_reason
    assert reason.startswith("the step changes the host value env.sim.counted")
    assert client.said == [f"CUDA graph off: {reason}; eager now"]
    assert ways == ["graph"] + ["eager"] * 5 and client.engine.stats["captures"] == 0


def test_engine_arguments():
    with pytest.raises(ValueError, match="warmup"):
        GraphEngine(None, lambda: None, dict, FakeGraphCapture(), warmup=0)
    with pytest.raises(ValueError, match="capture backend"):
        GraphEngine(None, lambda: None, dict, None)
    said = []
    e = GraphEngine(None, lambda: None, dict, None, say=said.append, eager_note="x", fallback="no CUDA")
    assert e.fallback_reason == "no CUDA" and said == ["CUDA graph off: no CUDA; x"] and e.step("k") is False


@needs_cuda
def test_failed_capture_leaves_the_generators_usable():  # pragma: no cover  (needs a CUDA device)
    """A capture that fails after a draw from the default generator and from a registered one must
    not leave them in capture mode: the eager fallback samples (torch 2.11 raised "Offset increment
    outside graph capture encountered unexpectedly" at the next ``rand_like`` before
    gpusim.cuda_graph.capture_graph restored them)."""
    user = torch.Generator(device="cuda").manual_seed(1)

    def draws_then_syncs(x):
        y = x + torch.rand_like(x) + torch.rand(x.shape, device=x.device, generator=user)
        return y * float(y.sum().item())

    cap = CudaGraphCapture("cuda", (user,))
    x = torch.ones(4, device="cuda")
    cap.warm(lambda: draws_then_syncs(x))
    with pytest.raises(RuntimeError):
        cap.capture(lambda: draws_then_syncs(x))
    a = torch.rand(3, device="cuda")
    b = torch.rand(3, device="cuda", generator=user)
    assert torch.isfinite(a).all() and torch.isfinite(b).all()


@needs_cuda
def test_cuda_capture_replays_in_place_state():  # pragma: no cover  (needs a CUDA device)
    state = torch.zeros(4, device="cuda")
    x = torch.zeros(4, device="cuda")
    cap = CudaGraphCapture("cuda")
    body = lambda: state.add_(x)  # noqa: E731  (state carried in place: replayed)
    cap.warm(body)
    graph = cap.capture(body)
    total = state.clone()
    for i in range(3):
        x.fill_(float(i + 1))
        total += x
        graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(state, total)
