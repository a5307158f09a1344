"""Multi-process training (``train/distributed.py``): 2 gloo ranks on the CPU.

Ranks are started with ``torch.multiprocessing`` (spawn) and the torchrun environment variables
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), so ``train()`` joins
the group exactly as under torchrun; every launch is guarded by a timeout (a hang fails the test
instead of blocking the suite). The slow test runs the documented ``torchrun`` command line.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.multiprocessing as mp

from gpusim.metrics import EpisodeMetrics, episode_values, report_from_totals
from policy import PolicyConfig
from test_train_run import FakeEnv, small_policy
from train import distributed
from train.config import TrainConfig, UserError
from train.experience import DropExperience, ExperienceHook
from train.ppo import PPOConfig, ppo_loss
from train.rollout import RolloutBatch, collect_rollout

REPO = pathlib.Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT_S = 180


class MetricFakeEnv(FakeEnv):
    """FakeEnv with the real per-agent EMA log (:class:`gpusim.metrics.EpisodeMetrics`) fed at every
    terminal, found by the trainer as ``env.episode_metrics`` (like DriveEnv's)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.episode_metrics = EpisodeMetrics(self.num_worlds, self.num_slots, alpha=0.5)

    def step(self, actions):
        res = super().step(actions)
        terminal, reached = self._episodes.pop()
        zeros = torch.zeros_like(terminal)
        vals = episode_values(reached.float(), torch.full_like(reached, self.t, dtype=torch.int64), reached,
                              zeros, zeros)
        self.episode_metrics.add(vals, terminal)
        return res

    def metrics(self):
        return self.episode_metrics.report()


class DropAllOnCalls(ExperienceHook):
    """Drops every step on the given (1-based) calls of this hook."""

    def __init__(self, calls=()):
        super().__init__()
        self.calls, self.n = set(calls), 0

    def preprocess_unroll_experience(self, batch):
        self.n += 1
        if self.n in self.calls:
            batch = batch.replace(loss_mask=torch.zeros_like(batch.loss_mask))
        return batch, batch.loss_mask.sum()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank, world, port, args):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), GPUSIM_DIST_TIMEOUT_S="60")
    torch.set_num_threads(1)
    fn(rank, *args)
    # Leave without interpreter teardown: freeing a DDP reducer after its gloo group was destroyed
    # can hang in ProcessGroupGloo's destructor (seen once); errors above still exit non-zero.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _launch(fn, world: int, *args) -> None:
    """Run ``fn(rank, *args)`` in ``world`` spawned ranks; fail on a non-zero exit or a hang."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, args)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.time() + LAUNCH_TIMEOUT_S
    for p in procs:
        p.join(max(1.0, deadline - time.time()))
    hung = [i for i, p in enumerate(procs) if p.is_alive()]
    for i in hung:
        procs[i].kill()
        procs[i].join()
    assert not hung, f"ranks {hung} still running after {LAUNCH_TIMEOUT_S} s (hang)"
    assert [p.exitcode for p in procs] == [0] * world, [p.exitcode for p in procs]


def _cfg(tmp, **kw):
    base = dict(num_worlds=3, total_timesteps=1, learning_rate=3e-3, device="cpu", seed=0, log_dir=str(tmp / "runs"),
                run_name="r", quiet=True, num_threads=1, report_interval=1,
                policy=PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16))
    base.update(kw)
    return TrainConfig(**base)


def _flat(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in params])


# ------------------------------------------------------------------------------------- rank bodies
def _train_worker(rank, tmp, total, drop_calls_rank1, resume):
    """train() on this rank's MetricFakeEnv (seed 10 + rank); records the parameters after every
    update (through a wrapper around ``train.run.ppo_update``) to ``tmp/rank<r>.pt``."""
    import train.run as run

    tmp = pathlib.Path(tmp)
    seen = []
    original = run.ppo_update

    def recording(policy, *a, **k):
        out = original(policy, *a, **k)
        seen.append(_flat(policy.parameters()))
        return out

    run.ppo_update = recording
    env = MetricFakeEnv(num_worlds=3, num_slots=4, horizon=12, seed=10 + rank)
    hook = DropAllOnCalls(drop_calls_rank1 if rank == 1 else ())
    cfg = _cfg(tmp, total_timesteps=total, resume=str(resume) if resume else None)
    out = run.train(cfg, env=env, hook=hook)
    torch.save({"params": seen, "summary": {k: out[k] for k in ("global_step", "update", "checkpoint")},
                "reports": out["reports"], "pg_initialized": torch.distributed.is_initialized()},
               tmp / f"rank{rank}{'-resume' if resume else ''}.pt")


def _grad_then_train_worker(rank, tmp, total, drop_calls_rank1):
    """:func:`_grad_check`, then :func:`_train_worker` in the same process group (one launch)."""
    ranks = _grad_check(rank)
    _train_worker(rank, tmp, total, drop_calls_rank1, None)
    assert torch.distributed.is_initialized()  # train() reused the group and left it to its owner
    ranks.close()


def _grad_check(rank):
    """The DDP gradient equals sum_r share_r * grad_r of the per-rank gradients computed separately
    (share_r = effective_r / sum effective); rank 1 drops every other row, so the shares differ."""
    ranks = distributed.setup("cpu")
    assert ranks.enabled and ranks.world_size == 2 and ranks.rank == rank
    env = FakeEnv(num_worlds=3, num_slots=4, horizon=12, seed=20 + rank)
    policy = small_policy(env)
    R, H = env.num_worlds * env.num_slots, env.horizon
    buf = RolloutBatch.empty(R, H, env.obs_dim, False, 1, "cpu")
    torch.manual_seed(rank)
    _, batch = collect_rollout(env, policy, env.reset(seed=rank), buf, policy.init_cache(R, H, "cpu"))
    if rank == 1:
        batch, _ = DropExperience(["rows=even"]).preprocess_unroll_experience(batch)
    effective = int(batch.loss_mask.sum())
    active = torch.nonzero(batch.loss_mask.any(dim=1)).flatten()
    ddp = ranks.wrap(policy)
    cfg = PPOConfig()
    _, n_steps, _, batch, active = ranks.agree_update(
        nominal=effective, effective=effective, active_slots=R, kept_rows=active.numel(), rows=R, batch=batch,
        active_rows=active, ppo_cfg=cfg)
    assert n_steps == cfg.update_epochs * cfg.num_minibatches
    stop = batch.bootstrap_stop()
    mb = {k: getattr(batch, k)[active] for k in ("obs", "actions", "logprobs", "values", "rewards", "terminal",
                                                  "removed", "loss_mask")}
    mb["bootstrap_stop"] = stop[active]
    local = copy.deepcopy(policy)
    ppo_loss(local, mb, cfg)[0].backward()
    g_local = _flat(p.grad for p in local.parameters())
    ppo_loss(ddp, mb, cfg)[0].backward()
    g_ddp = _flat(p.grad for p in policy.parameters())
    gathered = [torch.zeros_like(g_local) for _ in range(2)]
    torch.distributed.all_gather(gathered, g_local)
    shares = [None, None]
    torch.distributed.all_gather_object(shares, ranks.share)
    assert abs(sum(shares) - 1.0) < 1e-12 and abs(shares[0] - shares[1]) > 0.05, shares
    expected = shares[0] * gathered[0] + shares[1] * gathered[1]
    assert g_ddp.abs().sum() > 0
    torch.testing.assert_close(g_ddp, expected, rtol=1e-5, atol=1e-7)
    return ranks


def _error_worker(rank, tmp):
    """A user error found by rank 0 (missing --resume file) is raised there; rank 1 leaves with
    exit code 2 instead of waiting for collectives that never come."""
    from train.run import train

    distributed.FOLLOWER_EXIT_DELAY_S = 0.0
    cfg = _cfg(pathlib.Path(tmp), resume=str(pathlib.Path(tmp) / "missing.pt"))
    if rank == 0:
        with pytest.raises(FileNotFoundError, match="missing.pt"):
            train(cfg, env=FakeEnv())
        torch.distributed.destroy_process_group()
    else:
        with pytest.raises(SystemExit) as e:
            train(cfg, env=FakeEnv())
        assert e.value.code == 2


# ------------------------------------------------------------------------------------------- tests
def test_no_process_group_without_torchrun(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(v, raising=False)
    ranks = distributed.setup("cpu")
    assert not ranks.enabled and ranks.is_main and not torch.distributed.is_initialized()
    cfg = TrainConfig(seed=3, device="cpu")
    assert ranks.rank_config(cfg) is cfg and ranks.wrap(cfg) is cfg
    assert ranks.from_main(lambda x: x + 1, 1) == 2 and ranks.main_first(lambda: 5) == 5


def test_rank_variables_without_master_address_is_a_user_error(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(UserError, match="MASTER_ADDR.*torchrun"):
        distributed.setup("cpu")


def test_backend_from_device():
    assert distributed.backend_for(torch.device("cpu")) == "gloo"
    assert distributed.backend_for(torch.device("cuda", 1)) == "nccl"


def test_ema_totals_pool_slots_not_means():
    """Two logs with different numbers of slots with data: the pooled report from summed totals is
    the mean over all their slots (a mean of the two means would weigh 1 slot like 3)."""
    a, b = EpisodeMetrics(1, 4), EpisodeMetrics(1, 4)
    z = torch.zeros(1, 4, dtype=torch.bool)
    vals = lambda g: episode_values(torch.ones(1, 4), torch.full((1, 4), 7), g, z, z)  # noqa: E731
    a.add(vals(torch.tensor([[True, True, True, False]])), torch.tensor([[True, True, True, False]]))
    b.add(vals(torch.tensor([[False, False, False, False]])), torch.tensor([[True, False, False, False]]))
    pooled = report_from_totals(a.names, a.ema_totals() + b.ema_totals())
    assert pooled["n"] == 4 and pooled["goal_reached"] == pytest.approx(3 / 4)
    assert a.report()["goal_reached"] == pytest.approx(a.ema.report()["goal_reached"])
    assert report_from_totals(a.names, a.ema_totals()) == pytest.approx(a.report())
    assert report_from_totals(a.names, EpisodeMetrics(1, 4).ema_totals()) == {}
    with pytest.raises(ValueError, match=f"expected {len(a.names) + 1} numbers"):
        report_from_totals(a.names, [1.0])


def _continuous_ddp_worker(rank):
    """Body of :func:`test_continuous_policy_under_ddp_all_reduces_the_log_std_gradient` (one rank)."""
    from policy import ActorCritic

    env = FakeEnv(num_worlds=2, num_slots=3, horizon=6)
    torch.manual_seed(0)
    policy = ActorCritic(env.obs_layout, 2, True, PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16))
    B, T = 4, env.horizon
    g = torch.Generator().manual_seed(1)
    mb = {"obs": torch.randn(B, T, env.obs_dim, generator=g), "actions": torch.randn(B, T, 2, generator=g),
          "logprobs": torch.randn(B, T, generator=g), "values": torch.randn(B, T, generator=g),
          "rewards": torch.randn(B, T, generator=g), "terminal": torch.zeros(B, T, dtype=torch.bool),
          "removed": torch.zeros(B, T, dtype=torch.bool), "loss_mask": torch.ones(B, T, dtype=torch.bool),
          "bootstrap_stop": torch.zeros(B, T, dtype=torch.bool)}
    mb["bootstrap_stop"][:, -1] = True
    plain = copy.deepcopy(policy)
    ppo_loss(plain, mb, PPOConfig())[0].backward()
    torch.distributed.init_process_group("gloo", rank=rank, world_size=1)
    ranks = distributed.setup("cpu")
    assert ranks.enabled and not ranks.owns_group
    ddp = ranks.wrap(policy)
    ppo_loss(ddp, mb, PPOConfig())[0].backward()
    assert policy.log_std.grad is not None and policy.log_std.grad.abs().sum() > 0
    for a, b in zip(plain.parameters(), policy.parameters()):
        assert torch.equal(a.grad, b.grad)


@pytest.mark.slow  # in-process gloo teardown hung once (ProcessGroupGloo destructor joining a thread)
def test_continuous_policy_under_ddp_all_reduces_the_log_std_gradient():
    """The Gaussian head's log-std is used outside ``forward`` (in ``log_prob``/``entropy``, called
    on the DDP wrapper): it still gets its gradient, equal to the plain module's (1-rank group).
    Runs in a spawned rank with a timeout, so a hang fails the test instead of the suite."""
    _launch(_continuous_ddp_worker, 1)


def test_two_ranks_gradient_lockstep_one_log_one_checkpoint_reduced_metrics(tmp_path):
    """One launch of 2 ranks (spawn costs most of the time): first the gradient all-reduce equals
    the share-weighted mean of the per-rank gradients (:func:`_grad_check`); then training where
    rank 1's hook drops everything on its 2nd rollout: no hang, equal parameters after every
    update, one JSONL and one checkpoint, metrics pooled over both ranks' slots, steps counted over
    both ranks; the checkpoint then resumes in a single process."""
    _launch(_grad_then_train_worker, 2, str(tmp_path), 600, (2,))
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert len(r0["params"]) == len(r1["params"]) == r0["summary"]["update"] >= 3
    for a, b in zip(r0["params"], r1["params"]):
        assert torch.equal(a, b)
    assert not torch.equal(r0["params"][0], r0["params"][-1])
    assert r0["summary"]["global_step"] == r1["summary"]["global_step"] >= 600
    assert r1["reports"] == [] and r1["summary"]["checkpoint"] is None
    run_dir = tmp_path / "runs" / "r"
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", "checkpoint.pt", "config.json", "metrics.jsonl"]
    assert [p for p in (tmp_path / "runs").iterdir()] == [run_dir]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records] == list(range(1, len(records) + 1))
    assert all(r["world_size"] == 2 and r["allreduce_s"] >= 0 for r in records)
    assert records[1]["optimizer_steps"] > 0  # rank 0 still trained while rank 1 dropped everything
    # step counts: both ranks' active slots (3 worlds x up to 4 slots x 12 steps each, per update)
    assert 12 * 2 * 3 <= records[0]["global_step"] <= 12 * 2 * 12
    ck = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    states = ck["extra"]["env_metrics_ranks"]
    assert ck["extra"]["world_size"] == 2 and len(states) == 2 and len(ck["extra"]["rng_ranks"]) == 2
    has = torch.cat([s["has_data"] for s in states])
    slots = torch.cat([s["slots"] for s in states])
    goal = slots[has][:, list(states[0]["names"]).index("goal_reached")].double().mean().item()
    assert records[-1]["n"] == has.sum().item() > states[0]["has_data"].sum().item()
    assert records[-1]["goal_reached"] == pytest.approx(goal, abs=1e-6)
    # resume the 2-rank checkpoint in one process: continues the same JSONL and counters
    from train.run import train

    out = train(_cfg(tmp_path, total_timesteps=ck["global_step"] + 1, resume=str(run_dir / "checkpoint.pt")),
                env=MetricFakeEnv(num_worlds=3, num_slots=4, horizon=12, seed=10))
    assert out["update"] == ck["update"] + 1 and not torch.distributed.is_initialized()
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in lines] == list(range(1, ck["update"] + 2)) and "world_size" not in lines[-1]
    assert lines[-1]["n"] >= states[0]["has_data"].sum().item()  # rank 0's EMA slots were restored


def _plain_digest(tmp: pathlib.Path) -> list[torch.Tensor]:
    import train.run as run

    seen, original = [], run.ppo_update

    def recording(policy, *a, **k):
        out = original(policy, *a, **k)
        seen.append(_flat(policy.parameters()))
        return out

    run.ppo_update = recording
    try:
        run.train(_cfg(tmp, total_timesteps=300), env=MetricFakeEnv(num_worlds=3, num_slots=4, horizon=12, seed=10),
                  hook=DropAllOnCalls(()))
    finally:
        run.ppo_update = original
    return seen


@pytest.mark.slow
def test_one_rank_group_equals_plain_run_bit_for_bit(tmp_path):
    """A 1-rank process group (DDP, all-reduces, reductions) trains exactly like a plain run."""
    plain = _plain_digest(tmp_path / "plain")
    assert not torch.distributed.is_initialized()
    _launch(_train_worker, 1, str(tmp_path), 300, (), None)
    one = torch.load(tmp_path / "rank0.pt", weights_only=False)["params"]
    assert len(one) == len(plain) >= 2
    for a, b in zip(plain, one):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_resume_single_process_checkpoint_with_two_ranks(tmp_path):
    """--resume works with another number of ranks: a plain run's checkpoint continues on 2 ranks
    (rank 1 starts its EMA slots empty) and the ranks stay in lockstep."""
    from train.run import train

    out = train(_cfg(tmp_path, total_timesteps=200), env=MetricFakeEnv(num_worlds=3, num_slots=4, horizon=12, seed=10))
    _launch(_train_worker, 2, str(tmp_path), out["global_step"] + 300, (), out["checkpoint"])
    r0, r1 = (torch.load(tmp_path / f"rank{r}-resume.pt", weights_only=False) for r in (0, 1))
    for a, b in zip(r0["params"], r1["params"]):
        assert torch.equal(a, b)
    assert r0["summary"]["update"] > out["update"]
    lines = [json.loads(x) for x in (tmp_path / "runs" / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in lines] == list(range(1, r0["summary"]["update"] + 1))


@pytest.mark.slow
def test_torchrun_command_line_on_the_sample(tmp_path):
    """The documented ``torchrun --standalone --nproc-per-node 2 train/run.py ...`` (tiny budget)."""
    env = dict(os.environ, GPUSIM_BACKEND="torch", OMP_NUM_THREADS="1")
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(REPO / "train" / "run.py"), "--total-timesteps", "400", "--num-worlds", "2", "--device", "cpu",
           "--num-threads", "1", "--env.scenario-length", "10", "--policy.d-model", "16",
           "--log-dir", str(tmp_path / "runs"), "--run-name", "tr", "--quiet"]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = tmp_path / "runs" / "tr"
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", "checkpoint.pt", "config.json", "metrics.jsonl"]
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["global_step"] >= 400 and lines[-1]["world_size"] == 2 and "goal_reached" in lines[-1]


@pytest.mark.slow
def test_user_error_on_rank_0_ends_every_rank(tmp_path):
    _launch(_error_worker, 2, str(tmp_path))
