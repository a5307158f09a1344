"""Streaming scenario pool: a resident pool of P scenarios on the device, refreshed
from a dataset (a sharded pack directory, or any pack) by a background loader.

Order of scenarios (seeded, reproducible): epoch ``e`` visits the shards in a permutation drawn
from ``seed`` and ``e``, and the scenarios of each shard in a permutation of their rows; the
*stream* is that sequence, epoch after epoch. The first pool is the first P scenarios of the
stream; each refresh replaces the ``m = ceil(replace_fraction * P)`` scenarios that have been in
the pool longest with the next ``m`` of the stream. So every scenario of the dataset enters the
pool once per epoch (an epoch takes ``ceil((N - P) / m)`` refreshes), whatever P.

Loader: refresh ``n + 1`` is prepared on a background thread as soon as refresh ``n`` has been
handed over: it reads the shards it needs (one at a time; memory: one shard and two pools on the
host), gathers the pool with :meth:`ScenarioPack.select` / :func:`concat_packs`, pins it (CUDA)
and copies it to the device with ``non_blocking=True`` on a side CUDA stream, recording an event.
:meth:`ScenarioPool.swap` (called by the env at an episode boundary, every ``resample_every``
episodes) waits for the *loader thread* if it is not done (host wait, counted in
``stats["waits"]``), makes the step's stream wait on the copy's event (a device-side dependency:
no host sync on the step's stream) and returns the new device pack. Swaps happen at fixed
episode counts, so the same seed gives the same scenario sequence whatever the thread timing.

A corrupt, truncated or missing shard is named in a ``UserWarning`` once, saying how many
scenarios were lost, and its scenarios are left out of the stream (the others are still used);
if every shard is unreadable, :class:`PackFileError`. Every shard file is checked against the
index when the pool opens (size always; CRC-32C too when the dataset is at most
``verify_bytes``, 1 GiB by default: one read of each file), so ``num_scenarios`` counts the
usable scenarios from the start; a shard found corrupt later (when loaded, always verified) is
left out from then on.
"""

from __future__ import annotations

import math
import threading
import time
import warnings

import torch

from gpusim.data.errors import PackFileError, ScenarioError
from gpusim.data.pack import ScenarioPack
from gpusim.data.shards import ShardedPack, concat_packs, is_sharded


class _InMemory:
    """A whole pack seen as a dataset of one shard (the non-sharded source of a pool)."""

    def __init__(self, pack: ScenarioPack):
        self.pack = pack.compact().to("cpu")
        self.num_shards = 1
        self.num_scenarios = pack.num_scenarios
        self.max_segments = pack.road_seg.shape[1]
        self.max_signals = pack.max_signals
        self.config = pack.config
        self.path = pack.path or "<pack in memory>"

    def shard_scenarios(self, i):
        return list(range(self.num_scenarios))

    def load_shard(self, i, device="cpu"):
        return self.pack


class ScenarioPool:
    """Resident pool of ``pool_size`` scenarios of ``source`` on ``device`` (module docstring).

    Args:
        source: a sharded pack directory (path or :class:`ShardedPack`), a pack file / directory
            path, or a :class:`ScenarioPack`.
        pool_size: P >= 1 (clamped to the dataset's size).
        device: where the pool lives.
        replace_fraction: share of the pool replaced per refresh, in (0, 1].
        seed: seed of the stream order.
        background: prepare refreshes on a thread (False: synchronously inside :meth:`swap`; the
            same scenarios either way).
        resample_every: K >= 1, the env swaps in the next pool every K finished episodes
            (:meth:`episode_done`).
        verify_bytes: check every shard's CRC-32C when the pool opens if the dataset's shards
            hold at most this many bytes (0: sizes only; shards are verified when loaded anyway).

    Attributes: ``current`` (the device pack in use), ``num_scenarios`` (usable scenarios: the
    dataset's N less those of shards found bad),
    ``refreshes``, ``stats`` (``{"swaps", "waits", "wait_s", "build_s", "scenarios_loaded",
    "bad_shards"}``), ``history`` (global dataset indices of each pool handed out, in slot order).

    Raises:
        ValueError: ``pool_size < 1`` or a bad ``replace_fraction``. PackFileError: no readable
            shard.
    """

    def __init__(self, source, pool_size: int, device="cpu", *, replace_fraction: float = 0.25, seed: int = 0,
                 background: bool = True, resample_every: int = 1, verify_bytes: int = 1 << 30):
        if int(pool_size) < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}")
        if int(resample_every) < 1:
            raise ValueError(f"resample_every must be >= 1, got {resample_every}")
        self.resample_every = int(resample_every)
        self.episodes = 0
        if not 0.0 < float(replace_fraction) <= 1.0:
            raise ValueError(f"replace_fraction must be in (0, 1], got {replace_fraction}")
        if isinstance(source, ScenarioPack):
            self.data = _InMemory(source)
        elif isinstance(source, ShardedPack):
            self.data = source
        elif is_sharded(source):
            self.data = ShardedPack.open(source)
        else:
            self.data = _InMemory(ScenarioPack.load(source))
        self.device = torch.device(device)
        self.seed = int(seed)
        self.stats = {"swaps": 0, "waits": 0, "wait_s": 0.0, "build_s": 0.0, "scenarios_loaded": 0, "bad_shards": []}
        self._bad: set[int] = set()
        self._check_shards(int(verify_bytes))
        self.pool_size = min(int(pool_size), self.num_scenarios)
        self.replace = max(1, math.ceil(float(replace_fraction) * self.pool_size))
        self.config = self.data.config
        self.history: list[list[int]] = []
        self.background = bool(background)
        self._shard_cache: tuple[int, ScenarioPack] | None = None
        self._stream = self._order()
        self._slots: list[int] = []  # global ids in the host pool, oldest first
        self._side = torch.cuda.Stream(device=self.device) if self.device.type == "cuda" else None
        first = [self._next_id() for _ in range(self.pool_size)]
        host, slots = self._assemble(None, [], first)
        self._host, self._slots = host, slots
        self.current, event = self._to_device(host)
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)
        self.history.append(list(slots))
        self._pending = None
        self._thread = None
        self._start_next()

    # ------------------------------------------------------------------ stream order
    @property
    def num_scenarios(self) -> int:
        """Usable scenarios: the dataset's less those of the shards found bad so far."""
        return self.data.num_scenarios - sum(len(self.data.shard_scenarios(sh)) for sh in self._bad)

    def _check_shards(self, verify_bytes: int) -> None:
        """Check every shard file against the index (CRC-32C too when the dataset holds at most
        ``verify_bytes``), leaving the bad ones out. Raises PackFileError when none is left."""
        if not isinstance(self.data, ShardedPack):
            return
        total = sum(int(e.get("bytes") or 0) for e in self.data.shards)
        for sh, reason in self.data.check_files(verify=total <= verify_bytes):
            self._mark_bad(sh, f"{self.data.shard_file(sh)}: {reason}", stacklevel=4)
        if self.num_scenarios == 0:
            raise PackFileError(self.data.path, "", "no readable shard for the scenario pool; convert the data again")

    def _mark_bad(self, sh: int, what: str, stacklevel: int) -> None:
        """Leave shard ``sh`` out of the stream, with a warning naming it and the scenarios lost."""
        self._bad.add(sh)
        self.stats["bad_shards"].append(what)
        lost = sum(len(self.data.shard_scenarios(b)) for b in self._bad)
        warnings.warn(f"scenario pool: skipping {what}; {len(self.data.shard_scenarios(sh))} scenario(s) lost "
                      f"({self.data.num_scenarios - lost} of {self.data.num_scenarios} left)",
                      stacklevel=stacklevel + 1)

    def _order(self):
        """Generator of global scenario ids (module docstring), skipping bad shards."""
        epoch = 0
        while True:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            any_good = False
            for sh in torch.randperm(self.data.num_shards, generator=g).tolist():
                ids = self.data.shard_scenarios(sh)
                for r in torch.randperm(len(ids), generator=g).tolist():
                    if sh in self._bad:
                        break
                    any_good = True
                    yield sh, ids[r]
            if not any_good:
                raise PackFileError(getattr(self.data, "path", ""), "", "no readable shard for the scenario pool")
            epoch += 1

    def _next_id(self) -> tuple[int, int]:
        return next(self._stream)

    # ------------------------------------------------------------------ loading
    def _shard(self, sh: int) -> ScenarioPack | None:
        if self._shard_cache is not None and self._shard_cache[0] == sh:
            return self._shard_cache[1]
        try:
            pack = self.data.load_shard(sh)
        except ScenarioError as exc:  # PackFileError: names the file
            self._mark_bad(sh, str(exc), stacklevel=3)
            return None
        self._shard_cache = (sh, pack)
        return pack

    def _assemble(self, host: ScenarioPack | None, keep: list[int], new: list[tuple[int, int]]):
        """Host pool of the slots ``keep`` of ``host`` followed by the scenarios ``new`` [(shard, id)]
        (scenarios of a shard found corrupt are replaced by later ones of the stream)."""
        parts, ids = [], []
        if keep:
            parts.append(host.select(keep))
            ids += [self._slots[k] for k in keep]
        pending = list(new)
        while pending:
            sh, gid = pending.pop(0)
            pack = self._shard(sh)
            if pack is None:
                pending.append(self._next_id())
                continue
            row = self.data.shard_scenarios(sh).index(gid)
            parts.append(pack.select([row]))
            ids.append(gid)
            self.stats["scenarios_loaded"] += 1
        pool = concat_packs(parts, self.data.max_segments, self.data.max_signals)
        return pool, ids

    def _to_device(self, host: ScenarioPack):
        if self._side is None:
            return host.to(self.device), None
        pinned = host.pin_memory()
        with torch.cuda.stream(self._side):
            dev = pinned.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._side)
        return dev, event

    def _build(self):
        t0 = time.perf_counter()
        new = [self._next_id() for _ in range(self.replace)]
        keep = list(range(self.replace, self.pool_size)) if self.replace < self.pool_size else []
        host, slots = self._assemble(self._host, keep, new)
        dev, event = self._to_device(host)
        self._pending = (host, slots, dev, event)
        self.stats["build_s"] += time.perf_counter() - t0

    def _start_next(self):
        if self.background:
            self._thread = threading.Thread(target=self._build, name="gpusim-pool-loader", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ public
    def swap(self) -> ScenarioPack:
        """Hand over the next pool (waiting for the loader thread if needed; no host sync on the
        step's CUDA stream) and start preparing the one after. Returns the new device pack."""
        if self._thread is not None and self._thread.is_alive():
            t0 = time.perf_counter()
            self.stats["waits"] += 1
            self._thread.join()
            self.stats["wait_s"] += time.perf_counter() - t0
        if self._pending is None:  # synchronous mode, or the thread died before finishing
            self._build()
        host, slots, dev, event = self._pending
        self._pending = None
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)
        self._host, self._slots, self.current = host, slots, dev
        self.history.append(list(slots))
        self.stats["swaps"] += 1
        self._start_next()
        return dev

    def episode_done(self) -> ScenarioPack | None:
        """Count one finished (synchronous) episode; every ``resample_every`` episodes swap and
        return the new device pack, else None. Called by the env before drawing scenarios."""
        self.episodes += 1
        if self.episodes % self.resample_every:
            return None
        return self.swap()

    @property
    def scenario_ids(self) -> list[str]:
        """Ids of the scenarios in the current pool, slot order."""
        return list(self.current.scenario_ids)

    def close(self) -> None:
        """Wait for the loader thread (nothing else to release)."""
        if self._thread is not None:
            self._thread.join()
