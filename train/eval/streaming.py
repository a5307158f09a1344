"""Streaming evaluation over a large (sharded) dataset: every scenario exactly
``episodes`` times per sweep, with at most ``chunk_size`` scenarios on the device at a time.

The dataset's readable shards are taken in index order and grouped into chunks of whole shards
(at least one shard, at most ``chunk_size`` scenarios when shards allow); each chunk becomes one
pack (R and L padded to the dataset's maxima, so the kernels' compile-time sizes never change),
the env switches to it (:meth:`gpusim.env.DriveEnv.use_pack`) and the deterministic sweep of
:mod:`train.eval.sweep` runs over it. The next chunk is read and assembled on a background thread
while the current one runs. Records carry the scenario's *global* index in the sharded pack
(``ShardedPack.scenarios`` order). A corrupt shard is named in a warning and its scenarios are
left out (the returned ids say which scenarios were run).
"""

from __future__ import annotations

import concurrent.futures
import warnings

import torch

from gpusim.data.errors import PackFileError, ScenarioError
from gpusim.data.shards import ShardedPack, concat_packs
from train.eval.sweep import run_sweep, sweep_plan


def chunks(sharded: ShardedPack, chunk_size: int) -> list[list[int]]:
    """Shard indices grouped in order so each group holds at most ``chunk_size`` scenarios (a
    larger shard is a group of its own)."""
    out, cur, n = [], [], 0
    for i, s in enumerate(sharded.shards):
        if cur and n + s["scenarios"] > chunk_size:
            out.append(cur)
            cur, n = [], 0
        cur.append(i)
        n += s["scenarios"]
    if cur:
        out.append(cur)
    return out


def _load_chunk(sharded: ShardedPack, shards: list[int]):
    packs, ids = [], []
    for i in shards:
        try:
            packs.append(sharded.load_shard(i))
            ids += sharded.shard_scenarios(i)
        except ScenarioError as exc:
            warnings.warn(f"streaming evaluation: skipping {exc}", stacklevel=2)
    if not packs:
        return None, []
    return concat_packs(packs, sharded.max_segments, sharded.max_signals), ids


def first_pack(sharded: ShardedPack):
    """The first readable shard as a pack padded like every chunk (R, L = the dataset's maxima),
    to build the env of a streaming sweep with (its pack is replaced chunk by chunk).

    Raises:
        PackFileError: no shard of ``sharded`` can be read (naming the directory).
    """
    for i in range(sharded.num_shards):
        try:
            return concat_packs([sharded.load_shard(i)], sharded.max_segments, sharded.max_signals)
        except ScenarioError:
            continue
    raise PackFileError(sharded.path, "", "no readable shard; convert the data again")


def local_records(agents: dict, worlds: dict, run_ids: list[int], num_scenarios: int) -> tuple[dict, dict]:
    """Records of :func:`streaming_sweep` with ``scenario`` = position in ``run_ids`` (the
    in-memory sweep's convention: an index into the list of scenarios that were run) instead of the
    global index in the sharded pack (``num_scenarios`` of them)."""
    lut = torch.full((max(int(num_scenarios), 1),), -1, dtype=torch.int64)
    lut[torch.tensor(run_ids, dtype=torch.int64)] = torch.arange(len(run_ids))
    out = []
    for rec in (agents, worlds):
        rec = dict(rec)
        if rec:
            rec["scenario"] = lut[rec["scenario"].to(torch.int64)]
        out.append(rec)
    return out[0], out[1]


def streaming_sweep(env, driver, sharded: ShardedPack, *, episodes: int = 1, chunk_size: int = 64,
                    egos=None, on_batch=None) -> tuple[dict, dict, list[int]]:
    """Run the sweep of every scenario of ``sharded``, ``episodes`` times each, chunk by chunk.

    Args:
        env: a DriveEnv built for the dataset's config (its pack is replaced chunk by chunk).
        driver: a :class:`train.eval.sweep.Driver`. episodes: N per scenario.
        chunk_size: scenarios per chunk on the device (whole shards). egos, on_batch: as
            :func:`train.eval.sweep.run_sweep` (default egos: self-play, every controlled slot).

    Returns:
        ``(agents, worlds, run_ids)``: the records of :func:`train.eval.sweep.run_sweep` with
        ``scenario`` = global index in ``sharded``, and the global indices that were run.

    Raises:
        ValueError: ``chunk_size < 1``; what ``DriveEnv.use_pack`` raises.
    """
    if int(chunk_size) < 1:
        raise ValueError(f"streaming_sweep: chunk_size must be >= 1, got {chunk_size}")
    groups = chunks(sharded, int(chunk_size))
    agents, worlds, run_ids = [], [], []
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        nxt = pool.submit(_load_chunk, sharded, groups[0]) if groups else None
        for k in range(len(groups)):
            pack, ids = nxt.result()
            nxt = pool.submit(_load_chunk, sharded, groups[k + 1]) if k + 1 < len(groups) else None
            if pack is None:
                continue
            env.use_pack(pack)
            plan = sweep_plan(pack.num_scenarios, episodes, env.num_worlds)
            a, w = run_sweep(env, driver, plan, on_batch=on_batch, **({} if egos is None else {"egos": egos}))
            glob = torch.tensor(ids, dtype=torch.int64)
            for rec in (a, w):
                if rec:
                    rec["scenario"] = glob[rec["scenario"].to(torch.int64)]
            agents.append(a)
            worlds.append(w)
            run_ids += ids
    cat = lambda parts: {k: torch.cat([p[k] for p in parts if p]) for k in next((p for p in parts if p), {})}  # noqa: E731
    return cat(agents), cat(worlds), run_ids
