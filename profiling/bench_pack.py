"""Bytes per scenario of a scenario pack, by tensor: the format-2 layout (grid tables [S, NC, K]
int32, padded to the largest grid) against the compact layout (``gpusim.data.layout``).

    python profiling/bench_pack.py /tmp/pack                 # a saved pack (any format)
    python profiling/bench_pack.py data/womd_sample          # WOMD JSON / TFRecord sources
    python profiling/bench_pack.py /tmp/pack --json out.json

Also times ``ScenarioPack.select`` (the gather a streaming pool does per swap) per scenario, and
with ``--pool-size P`` the refresh of a streaming pool (``gpusim.data.pool``, built synchronously:
shard reads, gathers, concatenation and the copy to ``--device``) per scenario replaced:

    python profiling/bench_pack.py /tmp/shards --pool-size 16 --swaps 20
Numbers are bytes of the tensors (what sits on the device), not of the file.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpusim.data import ScenarioPack  # noqa: E402
from gpusim.data.pool import ScenarioPool  # noqa: E402
from gpusim.data.shards import ShardedPack, is_sharded  # noqa: E402


def load(src: str) -> ScenarioPack:
    """A pack from a saved pack (directory with pack.pt or .pt) or from WOMD sources."""
    p = pathlib.Path(src)
    if p.suffix == ".pt" or (p / "pack.pt").exists():
        return ScenarioPack.load(p)
    return ScenarioPack.from_json(src)


def table(pack: ScenarioPack) -> list[dict]:
    """Rows ``{tensor, before, after}`` in bytes per scenario, largest first, and a total row."""
    S = pack.num_scenarios
    before = pack.padded().nbytes_by_tensor()
    after = pack.compact().nbytes_by_tensor()
    names = sorted(set(before) | set(after), key=lambda k: -before.get(k, 0))
    rows = [{"tensor": k, "before": before.get(k, 0) / S, "after": after.get(k, 0) / S} for k in names]
    rows.append({"tensor": "TOTAL", "before": sum(before.values()) / S, "after": sum(after.values()) / S})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="saved pack or WOMD sources")
    ap.add_argument("--json", default=None, help="also write the numbers to this file")
    ap.add_argument("--pool-size", type=int, default=0, help="also time streaming-pool refreshes of this size")
    ap.add_argument("--swaps", type=int, default=20, help="refreshes timed with --pool-size")
    ap.add_argument("--device", default="cpu", help="device of the pool (default cpu)")
    args = ap.parse_args(argv)
    if is_sharded(args.src):
        sp = ShardedPack.open(args.src)
        print(f"sharded: {sp.num_scenarios} scenarios in {sp.num_shards} shards, "
              f"{sum(s['bytes'] for s in sp.shards) / sp.num_scenarios / 2**20:.2f} MiB per scenario on disk")
        pack = sp.load_all()
    else:
        pack = load(args.src).compact()
    rows = table(pack)
    S = pack.num_scenarios
    print(f"{S} scenarios; grid tables {pack.grid_road.dtype}; cells per scenario: mean "
          f"{float(pack.num_cells.float().mean()):.0f}, max {int(pack.num_cells.max())}; "
          f"segments R = {pack.road_seg.shape[1]}")
    print(f"{'tensor':<20}{'before B/scen':>16}{'after B/scen':>16}{'ratio':>8}")
    for r in rows:
        ratio = r["before"] / r["after"] if r["after"] else float("inf")
        print(f"{r['tensor']:<20}{r['before']:>16,.0f}{r['after']:>16,.0f}{ratio:>8.2f}")
    idx = torch.randperm(S)[: max(1, min(S, 16))]
    t0 = time.perf_counter()
    for _ in range(5):
        pack.select(idx)
    per = (time.perf_counter() - t0) / 5 / idx.numel()
    print(f"select (host gather) per scenario: {per * 1e3:.2f} ms")
    result = {"scenarios": S, "rows": rows, "select_s_per_scenario": per}
    if args.pool_size:
        pool = ScenarioPool(args.src if is_sharded(args.src) else pack, args.pool_size, args.device, background=False)
        t0 = time.perf_counter()
        for _ in range(args.swaps):
            pool.swap()
        if pool.device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        per_swap = dt / args.swaps
        result.update(pool_size=pool.pool_size, replaced_per_swap=pool.replace, swap_s=per_swap,
                      swap_s_per_scenario=per_swap / pool.replace, pool_bytes=pool.current.nbytes())
        print(f"pool of {pool.pool_size}: {per_swap * 1e3:.1f} ms per refresh of {pool.replace} scenarios "
              f"({per_swap / pool.replace * 1e3:.1f} ms per scenario, synchronous); pool "
              f"{pool.current.nbytes() / 2**20:.1f} MiB on {pool.device}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
