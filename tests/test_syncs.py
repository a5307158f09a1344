"""No host sync in ``DriveEnv.step`` / ``expert_actions`` on the Triton path (docs/design.md section 3),
and one per PPO update with ``--ppo.pack-removed`` (``train.ppo.ppo_update``).

A :class:`TorchDispatchMode` watches every aten op while the env steps with
``check_actions="async"`` on the Triton backend (on ``synthetic.KERNEL_DEVICE``: CUDA tensors and
compiled kernels with a GPU, else CPU tensors under ``TRITON_INTERPRET=1``, the way every kernel
runs on a machine without a GPU) and records the ops that force a host sync on CUDA:

* ``aten._local_scalar_dense`` (``.item()``, ``bool(t)``, ``int(t)``), ``aten.item``,
  ``aten.equal``, ``aten.is_nonzero``;
* data-dependent shapes: ``aten.nonzero``, ``aten.masked_select``, ``aten.unique*``;
* tensors built from Python data (``torch.tensor(list)``: ``aten.lift_fresh``), which on CUDA is a
  blocking host->device copy; and any copy from a CPU tensor into a non-CPU one;
* ``Tensor.tolist`` (not an aten op: counted by wrapping the method during the test).

Ops run by Triton's interpreter itself while it launches a kernel (it copies every argument to
NumPy and back, on the host, because it *is* the host) are not the env's: an op whose Python call
stack contains a frame of ``triton/runtime/interpreter.py`` is skipped. On a GPU those copies do
not exist (the compiled kernel takes device pointers) and the real CUDA step is watched.

The torch (CPU) backend's observation compaction uses ``nonzero`` on purpose (no sync on a CPU);
it is not exercised here.

The PPO update with ``pack_removed`` (the policy's forward on the kept steps only) reads the packed
size of every minibatch once per update, in one ``tolist``; the counter watches the whole update
(minibatches, forward, loss, backward, clipping, Adam) and skips only ``torch/optim`` (the default
Adam's step counters are host tensors on every device, so reading them is no device sync).
"""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpusim.backend import use_backend
from gpusim.config import EnvConfig
from gpusim.cuda_graph import FakeGraphCapture
from gpusim.env import DriveEnv
from synthetic import KERNEL_DEVICE, driver, lane, parked, small_config, synthetic_pack
from train.rollout import RolloutBatch

SYNC_OPS = {"_local_scalar_dense", "item", "equal", "is_nonzero", "nonzero", "masked_select", "unique",
            "_unique", "_unique2", "unique_dim", "unique_consecutive", "lift_fresh", "lift_fresh_copy"}


def _in_triton_interpreter() -> bool:
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename.replace("\\", "/")
        if "triton/runtime/interpreter" in name:
            return True
        f = f.f_back
    return False


class SyncCounter(TorchDispatchMode):
    """Records the sync-causing aten ops run inside the block (name and where they came from)."""

    def __init__(self, skip: tuple = ()):
        super().__init__()
        self.hits: list[str] = []
        self.skip = tuple(skip)  # path parts: an op called from a frame of such a file is not counted

    def _hit(self, what: str) -> None:
        if _in_triton_interpreter():
            return
        frames, f = [], sys._getframe(2)
        while f is not None:
            name = f.f_code.co_filename.replace("\\", "/")
            if any(part in name for part in self.skip):
                return
            if len(frames) < 4 and any(part in name for part in ("gpusim/", "train/", "policy/")):
                frames.append(f"{'/'.join(name.split('/')[-2:])}:{f.f_lineno}")
            f = f.f_back
        self.hits.append(f"{what} at {' <- '.join(frames)}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in SYNC_OPS:
            self._hit(f"aten.{name}")
        elif name in ("copy_", "_to_copy", "_copy_from"):
            src = args[1] if name == "copy_" else args[0]
            dst_dev = args[0].device if name == "copy_" else kwargs.get("device", None)
            if isinstance(src, torch.Tensor) and src.device.type == "cpu" and dst_dev is not None \
                    and torch.device(dst_dev).type != "cpu":
                self._hit(f"aten.{name} host->device")
        return func(*args, **kwargs)


class SyncWatchingCapture(FakeGraphCapture):
    """:class:`gpusim.cuda_graph.FakeGraphCapture` whose graphs run every replay under a new
    :class:`SyncCounter` (kept in ``counters``; its ``active`` is True while the replay runs): the
    CPU stand-in for what a real capture rejects, a host sync inside the captured step."""

    def __init__(self):
        super().__init__()
        self.counters: list[SyncCounter] = []

    def capture(self, fn, roots=None):
        graph = super().capture(fn, roots)
        replay = graph.replay

        def watched():
            counter = SyncCounter()
            counter.active = True
            self.counters.append(counter)
            with counter:
                replay()
            counter.active = False

        graph.replay = watched
        return graph


@pytest.fixture()
def count_tolist(monkeypatch):
    """Wraps ``Tensor.tolist`` so that calls inside an active :class:`SyncCounter` are recorded."""
    active: list[SyncCounter] = []
    orig = torch.Tensor.tolist

    def tolist(self):
        if active:
            active[-1]._hit("Tensor.tolist")
        return orig(self)

    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    return active


def _pack():
    return synthetic_pack([
        {"agents": [driver(0, 0, 0.0, 5.0, (12.0, 0.0)), driver(-20, 4, 0.0, 3.0, (80.0, 4.0)), parked(25, 0.5)],
         "num_controlled": 2, "roads": lane() + lane(y=8.0, rtype=2)},
        {"agents": [driver(0, 0, 0.0, 4.0, (200.0, 0.0)), driver(6, 0, 0.0, 4.0, (300.0, 0.0)), parked(30, 30)],
         "num_controlled": 2, "roads": lane()},
    ], small_config())


def _config(space: str, trial: bool, styles: bool = False) -> EnvConfig:
    dc = small_config()
    kw = dict(max_agents=dc.max_agents, max_controlled=dc.max_controlled, num_roads=dc.grid_k, num_partners=3,
              action_space=space, check_actions="async", scenario_length=4, collision_behavior="stop",
              reward_conditioning=styles)
    if trial:
        kw.update(goal_behavior="trial", k_trials=2, scenario_length=3)
    return EnvConfig(**kw)


@pytest.mark.parametrize("space, trial, styles", [
    ("discrete", False, False), ("discrete", True, False), ("continuous", False, False), ("continuous", True, False),
    ("discrete", True, True)], ids=["discrete-normal", "discrete-trial", "continuous-normal", "continuous-trial",
                                    "discrete-trial-styles"])
def test_step_and_expert_actions_make_no_host_sync(space, trial, styles, count_tolist):
    """Steps across a trial restart and an episode end (auto-reset): zero sync-causing ops (also with
    reward conditioning: the style draw at the auto-reset, the conditioned reward, the style block)."""
    cfg = _config(space, trial, styles)
    with use_backend("triton"):
        env = DriveEnv(_pack(), 3, cfg, seed=1, device=KERNEL_DEVICE)
        env.reset()
        assert env.check_actions == "async"
        g = torch.Generator().manual_seed(0)
        acts = [env.expert_actions()]  # outside the counter: warm-up
        for _ in range(cfg.horizon + 1):  # drawn on the CPU, moved to the env's device before counting
            if space == "discrete":
                acts.append(torch.randint(0, env.num_actions, (3, env.num_slots), generator=g).to(env.device))
            else:
                acts.append((torch.rand(3, env.num_slots, 2, generator=g) * 2 - 1).to(env.device))
        counter = SyncCounter()
        ended = []
        with counter:
            count_tolist.append(counter)
            for a in acts:
                env.expert_actions()
                r = env.step(a)
                ended.append(r.info["episode_end"])
            count_tolist.clear()
    assert any(bool(e) for e in ended)  # the auto-reset ran inside the counter
    assert counter.hits == [], "\n".join(counter.hits)


def _update_batch(R: int, H: int, obs_dim: int, device, first_removed: int = 2, seed: int = 0) -> RolloutBatch:
    """A rollout of R rows x H steps: row r's agent is removed after step ``first_removed + r``
    (removed tails of different lengths), random observations, actions and returns (``seed``)."""
    g = torch.Generator().manual_seed(seed)
    b = RolloutBatch.empty(R, H, obs_dim, False, 1, "cpu")
    b.obs.copy_(torch.randn(R, H, obs_dim, generator=g))
    b.actions.copy_(torch.randint(91, (R, H), generator=g))
    b.logprobs.fill_(-4.5)
    b.rewards.copy_(torch.randn(R, H, generator=g))
    b.values.copy_(torch.randn(R, H, generator=g))
    b.removed.copy_(torch.arange(H)[None, :] > first_removed + torch.arange(R)[:, None])
    b.loss_mask.copy_(~b.removed)
    b.terminal[:, -1] = True
    b.slot_active.fill_(True)
    return RolloutBatch(**{k: v.to(device) for k, v in vars(b).items()})


@pytest.mark.parametrize("n_steps", [2, 8])
def test_ppo_update_with_pack_removed_reads_once_per_update(n_steps, count_tolist, monkeypatch):
    """``PPOConfig(pack_removed=True)``: one host read (the ``tolist`` of the packed sizes) per
    update, however many minibatches; before, one per minibatch (the forward's kept-step count)."""
    import policy.encoders as encoders
    from policy.actor_critic import ActorCritic, PolicyConfig
    from policy.encoders import ObsDims
    from train.ppo import PPOConfig, ppo_update

    monkeypatch.setattr(encoders, "COMPACT_MIN_ROWS", 10**12)  # the encoder's CPU-only slot compaction reads
    dims = ObsDims(4, 2, 3, 3, 4)
    torch.manual_seed(0)
    model = ActorCritic(dims, 91, False, PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16)).to(KERNEL_DEVICE)
    model.pack_removed = False  # the device path: packing only because the update asks for it
    batch = _update_batch(6, 8, dims.obs_dim, KERNEL_DEVICE)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    rows = torch.arange(6, device=KERNEL_DEVICE)
    counter = SyncCounter(skip=("torch/optim/",))
    with counter:
        count_tolist.append(counter)
        stats = ppo_update(model, opt, batch, PPOConfig(pack_removed=True), n_steps, 2, rows)
        count_tolist.clear()
    assert len(counter.hits) == 1 and counter.hits[0].startswith("Tensor.tolist at train/ppo.py"), \
        "\n".join(counter.hits)
    assert all(torch.isfinite(v) for v in stats.values())


def test_counter_catches_syncs(count_tolist):
    """The counter itself works: each kind of sync it must catch is caught."""
    x = torch.arange(4.0)
    counter = SyncCounter()
    with counter:
        count_tolist.append(counter)
        bool(x.any())
        (x > 1).nonzero()
        torch.tensor([1.0, 2.0])
        x.tolist()
        count_tolist.clear()
    kinds = " ".join(counter.hits)
    for k in ("_local_scalar_dense", "nonzero", "lift_fresh", "tolist"):
        assert k in kinds, k
