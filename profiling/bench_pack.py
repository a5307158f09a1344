"""Bytes per scenario of a scenario pack, by tensor: the format-2 layout (grid tables [S, NC, K]
int32, padded to the largest grid) against the compact layout (issue 21; ``gpusim.data.layout``).

    python profiling/bench_pack.py /tmp/pack                 # a saved pack (any format)
    python profiling/bench_pack.py data/womd_sample          # WOMD JSON / TFRecord sources
    python profiling/bench_pack.py /tmp/pack --json out.json

Also times ``ScenarioPack.select`` (the gather a streaming pool does per swap) per scenario.
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
    args = ap.parse_args(argv)
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
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"scenarios": S, "rows": rows, "select_s_per_scenario": per},
                                                      indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
