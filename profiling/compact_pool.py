"""Copy a split's WOMD JSON scenes with their floats rounded, so that a split fits a size limit.

A GPU device call of this workplace carries at most 64 MiB with the working tree; the pool's train
split is 55 MB of xz-compressed JSON, whose floats print every digit of a float32 or float64
value. Rounding them to 3 decimals (1 mm for positions and sizes, 1 mm/s for velocities, 0.001 deg
for headings) and compressing with xz -9e makes the files about 3.3x smaller; every value moves by
at most 0.0005 of its unit. Training on the rounded copies is training on the same scenes; figures
meant to be exact (the validation and held-out tables) use the original files.

    python -m profiling.compact_pool SRC_DIR OUT_DIR [--decimals 3]
"""

from __future__ import annotations

import argparse
import json
import lzma
import pathlib
import sys


def _round(x, nd: int):
    if isinstance(x, float):
        return round(x, nd)
    if isinstance(x, list):
        return [_round(v, nd) for v in x]
    if isinstance(x, dict):
        return {k: _round(v, nd) for k, v in x.items()}
    return x


def compact(src: pathlib.Path, out: pathlib.Path, decimals: int = 3) -> tuple[int, int]:
    """Write the rounded ``src`` (a ``.json.xz`` scene) as ``out``; returns (bytes in, bytes out)."""
    doc = json.load(lzma.open(src, "rt"))
    data = json.dumps(_round(doc, decimals), separators=(",", ":")).encode()
    out.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    return src.stat().st_size, out.stat().st_size


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=pathlib.Path)
    p.add_argument("out", type=pathlib.Path)
    p.add_argument("--decimals", type=int, default=3)
    a = p.parse_args(argv)
    files = sorted(a.src.glob("*.json.xz"))
    if not files:
        print(f"compact_pool: no .json.xz scenes in {a.src}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    tin = tout = 0
    for i, f in enumerate(files):
        bi, bo = compact(f, a.out / f.name, a.decimals)
        tin, tout = tin + bi, tout + bo
        if (i + 1) % 25 == 0 or i + 1 == len(files):
            print(f"{i + 1}/{len(files)} scenes: {tin / 1e6:.1f} MB -> {tout / 1e6:.1f} MB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
