"""Multi-process training on ``torch.distributed``: DDP under ``torchrun`` (docs/design.md section 12).

``torchrun --nproc-per-node N train/run.py ...`` starts N copies of the trainer; each is one *rank*
of a process group (``nccl`` when the device is CUDA, ``gloo`` on the CPU) and trains the same
policy on its own env shard. ``python train/run.py`` (no ``RANK``/``WORLD_SIZE`` in the
environment) creates no process group and every method here is a pass-through, so a plain run is
unchanged bit for bit.

What each rank owns and what is synchronised (docs/training.md, "Scaling out"):

* Rank ``r`` runs ``--num-worlds`` worlds of its own (``--num-worlds`` is *per rank*), seeded
  ``seed + r`` (env scenario draws, action sampling, minibatch permutations), on
  ``cuda:LOCAL_RANK`` or the CPU. Every rank loads the whole scenario pack and samples scenarios
  from it with its own generator (no partition: a rank with few worlds still sees every scenario).
* Start: rank 0 checks the run directory and reads the ``--resume`` checkpoint, and sends the
  result to the others (:meth:`Distributed.from_main`); the data is loaded by rank 0 first, then by
  the others behind a barrier (:meth:`Distributed.main_first`). The model is wrapped in
  ``DistributedDataParallel``, which broadcasts rank 0's weights once.
* Per update: one all-reduce of four integers (valid steps before/after the experience hook, active
  slots, kept rows) fixes the global step count and the number of optimizer steps, so every rank
  steps the optimizer equally often even when its hook dropped a different amount of data (a rank
  that dropped everything runs the same steps on an all-masked row: zero loss, zero gradient). Per
  optimizer step: DDP all-reduces the gradients; each rank's gradient is weighted by its share of
  the kept (effective) steps, ``effective_r / sum(effective)``, so the result is the data-weighted
  mean (the plain mean when all ranks kept as much) and a rank without data adds nothing.
  Advantage normalisation stays per rank and minibatch (no extra communication).
* Per report: one all-reduce of the loss statistics (weighted like the gradients) and the env
  metrics as sums and counts (:meth:`gpusim.metrics.EpisodeMetrics.ema_totals`), so the reported
  EMA population mean is over all ranks' slots with data, not a mean of means.
* Per checkpoint: the ranks' metric states and RNG states are gathered to rank 0, which alone
  writes the checkpoint (atomically), the JSONL, wandb and the console.

The process-group timeout is torch's default unless ``GPUSIM_DIST_TIMEOUT_S`` is set (seconds).

A rank that dies (an error of its own, or killed) closes its connections; a collective on the
others then fails (gloo: "Connection closed by peer"). Those ranks print one line naming the lost
rank instead of a traceback (:func:`peer_lost_line`, installed as ``sys.excepthook`` by
:func:`setup`) and exit with code 1; the dead rank's own output says why it stopped.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from train.config import UserError
from train.ppo import optimizer_steps

#: Seconds a rank other than 0 waits before leaving after rank 0 reported an error.
FOLLOWER_EXIT_DELAY_S = 3.0
#: Environment variables torchrun sets for every worker (all are needed to join a group).
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launched_by_torchrun(environ=None) -> bool:
    """True when ``RANK`` and ``WORLD_SIZE`` are set (``torchrun``/``srun`` with those exported)."""
    environ = os.environ if environ is None else environ
    return "RANK" in environ and "WORLD_SIZE" in environ


def backend_for(device: torch.device) -> str:
    """``"nccl"`` for a CUDA device, ``"gloo"`` otherwise."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


class _DDP(DistributedDataParallel):
    """DDP whose unknown attributes are looked up on the wrapped module, so the trainer can call
    ``policy.log_prob``/``policy.entropy`` on the wrapper (they do not go through ``forward``; the
    parameters they use, e.g. the continuous log-std, still get their gradient all-reduced because
    DDP hooks every parameter's gradient accumulation in the backward)."""

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module":  # not set yet (inside DDP's constructor): no recursion
                raise
            return getattr(self.module, name)


def _weighted_allreduce_hook(state: "Distributed", bucket):
    """DDP communication hook: ``grad = sum_r share_r * grad_r`` (one all-reduce per bucket).

    ``state.share`` is this rank's share of the update's effective steps (set by
    :meth:`Distributed.agree_update`); the time from launch to completion is added to
    ``state.comm_seconds`` (it includes waiting for the slowest rank)."""
    buf = bucket.buffer()
    if state.share != 1.0:
        buf.mul_(state.share)
    t0 = time.perf_counter()
    fut = dist.all_reduce(buf, op=dist.ReduceOp.SUM, async_op=True).get_future()

    def done(f):
        state.comm_seconds += time.perf_counter() - t0
        return f.value()[0]

    return fut.then(done)


class NullLogger:
    """Stands in for :class:`train.logger.Logger` on ranks other than 0: writes nothing."""

    def __init__(self, elapsed: float = 0.0):
        self.start = time.time() - float(elapsed)

    @property
    def elapsed(self) -> float:
        return time.time() - self.start

    def log(self, record: dict) -> None:
        pass

    def info(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class Distributed:
    """This process's place in the training job; disabled (one process, pass-through) by default.

    Args:
        rank, world_size, local_rank: from torchrun's environment. device: this rank's device.
        enabled: a process group is in use. owns_group: :meth:`close` destroys it.

    Attributes:
        share: this rank's weight in the gradient all-reduce of the current update.
        comm_seconds: seconds spent in all-reduces since the last report (rank-local).
    """

    def __init__(self, rank: int = 0, world_size: int = 1, local_rank: int = 0, device=None,
                 enabled: bool = False, owns_group: bool = False):
        self.rank, self.world_size, self.local_rank = int(rank), int(world_size), int(local_rank)
        self.device = None if device is None else torch.device(device)
        self.enabled, self.owns_group = bool(enabled), bool(owns_group)
        self.share = 1.0
        self.comm_seconds = 0.0

    @property
    def is_main(self) -> bool:
        """Rank 0 (always True for a single process): the one that writes files and the console."""
        return self.rank == 0

    # ------------------------------------------------------------------ start-up
    def rank_config(self, cfg):
        """``cfg`` for this rank: ``seed + rank`` and this rank's device (``cfg`` itself when disabled)."""
        if not self.enabled:
            return cfg
        return dataclasses.replace(cfg, seed=cfg.seed + self.rank, device=str(self.device))

    def from_main(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` run on rank 0 only, its result sent to every rank (pickled).

        An exception on rank 0 is raised there; the other ranks leave the group and exit with
        ``SystemExit(2)`` for a ``UserError``/``ValueError``/``OSError`` (the user's mistake,
        printed once by rank 0), else ``SystemExit(1)``."""
        if not self.enabled:
            return fn(*args, **kwargs)
        box = [None]
        err = None
        if self.is_main:
            try:
                box[0] = ("ok", fn(*args, **kwargs))
            except Exception as e:  # noqa: BLE001 - re-raised below after telling the others
                err, box[0] = e, ("error", type(e).__name__, isinstance(e, (UserError, ValueError, OSError)))
        self._broadcast(box)
        if err is not None:
            raise err
        return self._follow(box[0])

    def main_first(self, fn):
        """``fn()`` on rank 0, then (behind a barrier) on the other ranks: one-time work such as data
        conversion or caching happens once, and the others reuse it. Errors as :meth:`from_main`."""
        if not self.enabled:
            return fn()
        status = [("ok", None)]
        out, err = None, None
        if self.is_main:
            try:
                out = fn()
            except Exception as e:  # noqa: BLE001
                err, status[0] = e, ("error", type(e).__name__, isinstance(e, (UserError, ValueError, OSError)))
        self._broadcast(status)  # doubles as the barrier
        if err is not None:
            raise err
        if not self.is_main:
            self._follow(status[0])
            out = fn()
        return out

    def _broadcast(self, box: list) -> None:
        dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)

    def _follow(self, msg):
        if msg[0] == "ok":
            return msg[1]
        self.close()
        # give rank 0 time to print the error and exit first (torchrun then stops this rank), so the
        # user's one-line message is not lost to a launcher that tears rank 0 down on our exit
        time.sleep(FOLLOWER_EXIT_DELAY_S)
        raise SystemExit(2 if msg[2] else 1)

    def wrap(self, policy):
        """The model the PPO update trains: ``policy`` itself, or a DDP wrapper of it (rank 0's
        weights broadcast once; gradients all-reduced with :func:`_weighted_allreduce_hook`). Roll
        out with ``policy`` (no DDP involvement outside the update)."""
        if not self.enabled:
            return policy
        ids = [self.device.index] if self.device.type == "cuda" else None
        # buffers (constants) are synced once at construction, not before every forward
        params = inspect.signature(DistributedDataParallel.__init__).parameters
        no_sync = {"forward_sync_buffers": False} if "forward_sync_buffers" in params else {"broadcast_buffers": False}
        ddp = _DDP(policy, device_ids=ids, **no_sync)
        ddp.register_comm_hook(state=self, hook=_weighted_allreduce_hook)
        return ddp

    # ------------------------------------------------------------------ per update
    def agree_update(self, *, nominal: int, effective: int, active_slots: int, kept_rows: int, rows: int,
                     batch, active_rows: torch.Tensor, ppo_cfg):
        """Agree on the update across ranks with one all-reduce of four integers.

        Args:
            nominal, effective: this rank's valid steps before/after the hook. active_slots: its
                active slots (``rows`` is counted instead when it reports none, as a single process
                does). kept_rows: rows with a valid step after the hook. batch, active_rows: the
                rank's experience and its kept-row indices [n] int64. ppo_cfg: :class:`PPOConfig`.

        Returns:
            ``(totals, n_steps, rows_per_minibatch, batch, active_rows)``: ``totals`` the global
            ``nominal_steps``/``effective_steps``/``active_slots``; ``n_steps`` =
            :func:`train.ppo.optimizer_steps` of the global counts (the same on every rank);
            ``rows_per_minibatch = ceil(kept_rows * update_epochs / n_steps)``, so each rank makes
            about ``update_epochs`` passes over the rows it kept and the minibatches of all ranks
            together are about the single-process minibatch. A rank that kept no row gets a batch
            with every step masked and one row to draw from (zero loss and gradient, but it joins
            every all-reduce).
        """
        local = [nominal, effective, active_slots if active_slots > 0 else rows, kept_rows]
        t = torch.tensor(local, dtype=torch.int64, device=self.device)
        t0 = time.perf_counter()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        nominal_g, effective_g, slots_g, _ = t.tolist()
        self.comm_seconds += time.perf_counter() - t0
        n_steps = optimizer_steps(effective_g, nominal_g, ppo_cfg)
        self.share = effective / effective_g if effective_g > 0 else 0.0
        rows_per_mb = max(1, -(-max(kept_rows, 1) * ppo_cfg.update_epochs // max(n_steps, 1)))
        if n_steps > 0 and active_rows.numel() == 0:
            batch = batch.replace(loss_mask=torch.zeros_like(batch.loss_mask))
            active_rows = torch.zeros(1, dtype=torch.int64, device=active_rows.device)
            self.share = 0.0
        totals = {"nominal_steps": nominal_g, "effective_steps": effective_g, "active_slots": slots_g}
        return totals, n_steps, rows_per_mb, batch, active_rows

    # ------------------------------------------------------------------ per report
    def reduce_report(self, record: dict, stats: dict, metric_log) -> dict:
        """Reduce a report over the ranks (one all-reduce; every rank must call it).

        Loss statistics (``stats``, this rank's averages over the update's optimizer steps) become
        the effective-step-weighted mean over ranks; env metrics become the EMA population mean
        over every rank's slots with data (:meth:`gpusim.metrics.EpisodeMetrics.ema_totals` summed,
        then divided), replacing this rank's. Adds ``world_size`` and ``allreduce_s`` (this
        rank's seconds in all-reduces since the last report). Returns ``record`` (modified)."""
        if not self.enabled:
            return record
        from gpusim.metrics import report_from_totals

        keys = [k for k in stats if k != "valid_steps"]
        parts = [torch.stack([stats[k].detach().to(torch.float64) for k in keys]) * self.share] if keys else []
        if metric_log is not None:
            parts.append(metric_log.ema_totals().to(torch.float64))
        t0 = time.perf_counter()
        if parts:
            vec = torch.cat(parts).to(self.device)
            dist.all_reduce(vec, op=dist.ReduceOp.SUM)
            host = vec.tolist()
            record.update(zip(keys, host[:len(keys)]))
            if metric_log is not None:
                for name in list(metric_log.names) + ["n"]:
                    record.pop(name, None)
                for name in [k for k in record if k.startswith("ada_delta_trial_")]:
                    record.pop(name)
                record.update(report_from_totals(metric_log.names, host[len(keys):]))
        self.comm_seconds += time.perf_counter() - t0
        record["world_size"] = self.world_size
        record["allreduce_s"] = self.comm_seconds
        self.comm_seconds = 0.0
        return record

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_extra(self, extra: dict, metric_log) -> dict:
        """Add every rank's metric state and RNG state to a checkpoint's ``extra`` (gathered to all
        ranks with one ``all_gather_object``; every rank must call it): ``world_size``,
        ``env_metrics_ranks`` (list, rank order), ``rng_ranks``. ``extra["env_metrics"]`` stays rank
        0's, so a single process can resume the checkpoint too."""
        if not self.enabled:
            return extra
        mine = {"env_metrics": metric_log.state_dict() if metric_log is not None else None,
                "rng": torch.get_rng_state()}
        states = [None] * self.world_size
        dist.all_gather_object(states, mine)
        return dict(extra, world_size=self.world_size, env_metrics_ranks=[s["env_metrics"] for s in states],
                    rng_ranks=[s["rng"] for s in states])

    def rank_checkpoint(self, ckpt: dict, seed: int) -> dict:
        """A view of a loaded checkpoint for this rank: its own saved metric and RNG state.

        Resuming with another number of ranks than the checkpoint's: rank ``r`` takes the state of
        saved rank ``r`` when there is one; a rank beyond the saved ones starts its metric EMAs
        empty and seeds its RNG from ``(seed, rank, update)``; saved ranks beyond the current ones
        are dropped (their slots leave the population mean). A single process takes rank 0's
        (``extra["env_metrics"]`` and ``rng``, as saved by any run)."""
        if not self.enabled:
            return ckpt
        extra = dict(ckpt.get("extra") or {})
        metrics, rngs = extra.get("env_metrics_ranks"), extra.get("rng_ranks")
        if metrics is not None:
            extra["env_metrics"] = metrics[self.rank] if self.rank < len(metrics) else None
        elif self.rank > 0:
            extra["env_metrics"] = None
        out = dict(ckpt, extra=extra)
        if rngs is not None and self.rank < len(rngs):
            out["rng"] = rngs[self.rank]
        elif self.rank > 0:
            g = torch.Generator().manual_seed(int(seed) * 1_000_003 + self.rank * 7_919 + int(ckpt.get("update", 0)))
            out["rng"] = g.get_state()
        return out

    def close(self) -> None:
        """Destroy the process group if :func:`setup` created it."""
        if self.enabled and self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self.owns_group = False


#: Text of the errors a collective raises when a peer's connection is gone (gloo; NCCL's watchdog).
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing", "Broken pipe",
              "NCCL communicator was aborted")


def peer_lost_line(exc: BaseException, rank: int, world_size: int) -> str | None:
    """The one line for a collective that failed because another rank is gone, else None: it
    names the lost rank when it can be known (two ranks: the other one), and where to look.

    Args:
        exc: the exception that ended this rank. rank, world_size: this rank's place.
    """
    text = str(exc)
    is_dist = isinstance(exc, RuntimeError) or type(exc).__name__.startswith("Dist")
    if not is_dist or not any(k in text for k in _PEER_LOST):
        return None
    others = [r for r in range(world_size) if r != rank]
    who = f"rank {others[0]}" if len(others) == 1 else f"another rank (one of {', '.join(map(str, others))})"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    first = first.split("] ", 1)[-1].split(". ", 1)[0][:120]  # gloo prefixes its source file and line
    return (f"error: rank {rank} of {world_size}: {who} stopped (its connection closed: {first}); its own "
            f"output says why. This rank stops too.")


def _install_peer_lost_hook(rank: int, world_size: int) -> None:
    """Replace ``sys.excepthook`` so an uncaught lost-peer error prints :func:`peer_lost_line`
    (exit code 1); any other error keeps the previous hook (a traceback)."""
    previous = sys.excepthook

    def hook(tp, exc, tb):
        line = peer_lost_line(exc, rank, world_size)
        if line is None:
            return previous(tp, exc, tb)
        print(line, file=sys.stderr)

    sys.excepthook = hook


def setup(device: str) -> Distributed:
    """Join the process group when launched by torchrun, else return a disabled context.

    Args:
        device: the ``--device`` flag. Under torchrun a CUDA device becomes ``cuda:LOCAL_RANK``
            (any index given is replaced) and is made current; ``cpu`` stays ``cpu``.

    Returns:
        :class:`Distributed`. An already initialised default group (e.g. made by a test) is used
        as is and not destroyed by :meth:`Distributed.close`.

    Raises:
        UserError: ``RANK``/``WORLD_SIZE`` set without ``MASTER_ADDR``/``MASTER_PORT`` (launch with
            torchrun), ``--device cuda`` with fewer CUDA devices than ``LOCAL_RANK + 1``.
    """
    if not launched_by_torchrun() and not dist.is_initialized():
        return Distributed()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available() or torch.cuda.device_count() <= local_rank:
            raise UserError(f"--device {device}: rank with LOCAL_RANK={local_rank} needs CUDA device {local_rank}, "
                            f"this node has {torch.cuda.device_count() if torch.cuda.is_available() else 0}; "
                            "pass --nproc-per-node <= the number of GPUs")
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    if dist.is_initialized():
        return Distributed(dist.get_rank(), dist.get_world_size(), local_rank, dev, enabled=True, owns_group=False)
    missing = [v for v in TORCHRUN_VARS if v not in os.environ]
    if missing:
        raise UserError(f"RANK/WORLD_SIZE are set but {', '.join(missing)} is not: launch with `torchrun "
                        "--nproc-per-node N train/run.py ...` (or unset RANK and WORLD_SIZE for one process)")
    timeout = os.environ.get("GPUSIM_DIST_TIMEOUT_S")
    kwargs = {"timeout": datetime.timedelta(seconds=float(timeout))} if timeout else {}
    if dev.type == "cuda":
        kwargs["device_id"] = dev
    dist.init_process_group(backend=backend_for(dev), **kwargs)
    _install_peer_lost_hook(dist.get_rank(), dist.get_world_size())
    return Distributed(dist.get_rank(), dist.get_world_size(), local_rank, dev, enabled=True, owns_group=True)
