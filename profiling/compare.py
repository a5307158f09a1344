"""Same-run A/B speed comparison for ``profiling/bench_env.py --compare REF``.

A is this working tree, B is ``REF``: ``.`` (this tree again, e.g. with ``--ref-backend``), a
directory holding another checkout, or a git commit-ish of this repository (exported once with
``git archive`` into a temporary directory; nothing in the repository is touched). Each round runs
``bench_env.py --json`` with the same arguments in both trees as separate processes, in the order
A, B in odd rounds and B, A in even rounds, so a slow drift of the machine's load hits both sides
alike. The table gives, per (worlds, C), the median agent-steps/s of each side over the rounds and
the ratio A/B of the medians, plus the per-round ratios (their spread shows the noise). The 1-minute
load average before each run is printed: on a shared machine, ratios are what to quote.

Usage::

    python profiling/bench_env.py --compare HEAD~3 --worlds 256 1024 --max-controlled 8
    python profiling/bench_env.py --compare /tmp/other_checkout --worlds 1 64 4096
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
#: bench_env.py options that belong to the comparison itself (not passed to the two sides).
_OWN = {"--compare": 1, "--ref-backend": 1, "--rounds": 1, "--json": 0, "--backend": 1}


def _side_args(argv: list[str]) -> list[str]:
    """``argv`` without the comparison's own options (and without ``--backend``, set per side)."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        name = a.split("=", 1)[0]
        if name in _OWN:
            i += 1 + (_OWN[name] if "=" not in a else 0)
            continue
        out.append(a)
        i += 1
    return out


def _ref_tree(ref: str, tmp: str) -> pathlib.Path:
    """The directory of side B (module docstring).

    Raises:
        SystemExit: ``ref`` is neither a directory nor a commit-ish of this repository.
    """
    if ref == ".":
        return REPO
    p = pathlib.Path(ref)
    if p.is_dir():
        return p.resolve()
    r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", ref + "^{commit}"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"bench_env.py --compare: {ref!r} is neither a directory nor a commit of {REPO}", file=sys.stderr)
        raise SystemExit(2)
    dest = pathlib.Path(tmp) / "ref"
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", r.stdout.strip()], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def _run(tree: pathlib.Path, args: list[str], backend: str) -> dict:
    """One ``bench_env.py --json`` run in ``tree``; returns its JSON plus the load before it."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    load = os.getloadavg()[0]
    cmd = [sys.executable, str(tree / "profiling" / "bench_env.py"), *args, "--backend", backend, "--json"]
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"bench_env.py failed in {tree}:\n{r.stderr[-2000:]}")
    res = json.loads(r.stdout)
    res["load_before"] = load
    return res


def compare_main(args, argv: list[str]) -> dict:
    """Run the interleaved comparison described in the module docstring; prints a table and
    returns ``{"meta": ..., "rows": [...]}`` (per row: worlds, C, a/b medians, ratio, per-round
    ratios)."""
    side = _side_args(argv)
    a_backend = args.backend
    b_backend = args.ref_backend or args.backend
    runs = {"A": [], "B": []}
    args.rounds = args.rounds or 3  # bench_env's --rounds defaults to None (1 round without --compare)
    with tempfile.TemporaryDirectory(prefix="gpusim-compare-") as tmp:
        trees = {"A": REPO, "B": _ref_tree(args.compare, tmp)}
        backends = {"A": a_backend, "B": b_backend}
        for r in range(args.rounds):
            for s in ("AB" if r % 2 == 0 else "BA"):
                res = _run(trees[s], side, backends[s])
                runs[s].append(res)
                print(f"# round {r + 1}/{args.rounds} {s} ({backends[s]}) load {res['load_before']:.1f}",
                      file=sys.stderr)
    rows = []
    for i, row in enumerate(runs["A"][0]["results"]):
        a = [run["results"][i]["agent_steps_per_s"] for run in runs["A"]]
        b = [run["results"][i]["agent_steps_per_s"] for run in runs["B"]]
        rows.append({"worlds": row["worlds"], "max_controlled": row["max_controlled"],
                     "a_agent_steps_per_s": statistics.median(a), "b_agent_steps_per_s": statistics.median(b),
                     "ratio": statistics.median(a) / statistics.median(b),
                     "round_ratios": [x / y for x, y in zip(a, b)]})
    loads = [run["load_before"] for s in runs for run in runs[s]]
    meta = {"a": f"{REPO} ({a_backend})", "b": f"{args.compare} ({b_backend})", "rounds": args.rounds,
            "args": side, "load_min": min(loads), "load_max": max(loads)}
    if args.json:
        json.dump({"meta": meta, "rows": rows}, sys.stdout, indent=1)
        print()
        return {"meta": meta, "rows": rows}
    print(f"# A/B interleaved, {args.rounds} rounds; A = {meta['a']}, B = {meta['b']}; "
          f"load avg {meta['load_min']:.1f}..{meta['load_max']:.1f}; args {' '.join(side)}")
    print(f"{'worlds':>7} {'C':>3} {'A agent-steps/s':>16} {'B agent-steps/s':>16} {'A/B':>6}  per-round A/B")
    for r in rows:
        rr = " ".join(f"{x:.2f}" for x in r["round_ratios"])
        print(f"{r['worlds']:>7} {r['max_controlled']:>3} {r['a_agent_steps_per_s']:>16,.0f} "
              f"{r['b_agent_steps_per_s']:>16,.0f} {r['ratio']:>6.2f}  {rr}")
    return {"meta": meta, "rows": rows}
