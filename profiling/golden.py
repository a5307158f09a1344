"""Golden hashes of the simulator: a fingerprint of every tensor a run produces, to show that a
refactor changes no result, bit for bit.

For each *config* (below) on each *backend* the script builds a :class:`gpusim.DriveEnv` on real
scenarios, resets it with a fixed seed and steps it ``--steps`` times (40 by default) with seeded,
deterministic, varied actions, recording after the reset and after every step:

* ``state.<field>``: every tensor field of ``env.state`` (:class:`gpusim.EnvState`);
* ``result.<field>`` / ``info.<key>``: every tensor of the :class:`gpusim.StepResult` (obs, reward,
  terminal, truncation, loss mask, ..., and the ``info`` dict);
* ``actions``: the actions sent (they include ``env.expert_actions()``, so the inverse dynamics is
  covered too);

then ``observe`` (``env.observe()`` of the final state) and the metrics ``env.metrics("ema")``,
``env.metrics("mean")`` (and ``role="coplayer"`` where the config has co-players) as plain
numbers. A tensor's hash is the first 16 hex digits of SHA-256 over its dtype, shape and raw bytes
(so ``-0.0`` and ``0.0`` differ: "the same" means bit for bit).

Configs (``CONFIGS``): ``default`` (``EnvConfig()``: no episode ends within 40 steps, so most steps
take the C fast path), ``continuous`` (continuous actions, collision and offroad STOP, a 12-step
horizon), ``respawn_remove`` (goal RESPAWN, collision and
offroad REMOVE, a 10-step horizon so auto-resets run), ``new_goal``, ``trial`` (two trials of 6
steps), ``signals`` (the bundled TFRecord scenario with 12 traffic signals and a red-light
penalty) and ``coplayers`` (half of each world's slots are co-players, drawn at random per
episode, collision STOP and offroad REMOVE, a 12-step horizon; co-player slots follow the log
through ``expert_actions``, egos take the varied actions).

Backends: ``c`` (torch with the C kernels: ``EnvConfig.cpu_kernels`` True, the default), ``torch``
(``cpu_kernels=False``: the torch references) and ``triton`` (the Triton kernels through Triton's
CPU interpreter, ``TRITON_INTERPRET=1`` and ``GPUSIM_BACKEND=triton``, in a subprocess because the
interpreter must be set before Triton is imported; it runs fewer worlds and steps:
``--triton-worlds``, ``--triton-steps``).

Actions (seeded per config): per slot and step, the expert action with probability 0.45, a uniform
random action with 0.30, else one of the edge / stop values (discrete: 45 = zero acceleration and
steering, 6 = full brake straight, 0 and 90 = the grid's corners; continuous: (0, 0), (-1, 0),
(1, 1), (-1, -1)).

It uses only the public API (``DriveEnv``, ``EnvConfig``, ``ScenarioPack.from_json``) and reads the
scenarios of this script's repository (``data/womd_sample``, ``data/womd_tfrecord``), so the same
script fingerprints any tree put first on ``PYTHONPATH``::

    PYTHONPATH=/path/to/old/tree python profiling/golden.py --out /tmp/golden_old.json
    python profiling/golden.py --out /tmp/golden_now.json --compare /tmp/golden_old.json

``--compare REF`` prints, per config and backend, ``equal`` or ``DIFFERENT`` with the first step and
field that differ, and exits 1 if any differ (0 otherwise). Fields present only in the new run are
listed but do not count as a difference; a field, metric or record missing from it does.
Runtime: about 2.5 minutes of CPU time on one core, most of it the Triton interpreter (``--backends
c torch`` takes about 10 s).

The C kernels and the torch references agree bit for bit except in the last bit of the
observation's goal distance (``gpusim/kernels/observations``: ``sqrtf`` in C against torch's
``sqrt``), so a ``c`` and a ``torch`` record differ only in their observation hashes (``result.obs``
and ``observe``; measured on every config here), and each record is compared with its own
backend's reference. Those hashes alone cannot show whether the C kernels ran. Each record therefore also lists ``c_calls``, the C entry points the run
called (``gpusim.kernels.cbuild.CALL_COUNTS``): ``--compare`` reports a ``c`` record that called
none (a fallback to torch) or a ``torch`` / ``triton`` record that called some as ``DIFFERENT``,
and so is a change in the set of entry points called when the reference lists them too.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import zlib

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE_DIR = REPO / "data" / "womd_sample"
TFRECORD = REPO / "data" / "womd_tfrecord" / "motion_data_one_scenario.tfrecord.gz"
FORMAT = 1

#: name -> (EnvConfig keyword arguments, data source: "sample" | "tfrecord").
CONFIGS = {
    "default": ({}, "sample"),
    "continuous": ({"action_space": "continuous", "collision_behavior": "stop", "offroad_behavior": "stop",
                    "scenario_length": 12}, "sample"),
    "respawn_remove": ({"goal_behavior": "respawn", "collision_behavior": "remove", "offroad_behavior": "remove",
                        "scenario_length": 10}, "sample"),
    "new_goal": ({"goal_behavior": "new_goal", "scenario_length": 20}, "sample"),
    "trial": ({"goal_behavior": "trial", "k_trials": 2, "scenario_length": 6, "collision_behavior": "stop"},
              "sample"),
    "signals": ({"reward_red_light": -0.5, "scenario_length": 20}, "tfrecord"),
    "coplayers": ({"ego_fraction": 0.5, "ego_choice": "random", "scenario_length": 12,
                   "collision_behavior": "stop", "offroad_behavior": "remove"}, "sample"),
}
BACKENDS = ("c", "torch", "triton")
#: Discrete edge / stop actions: no-op (accel 0, steer 0), full brake straight, the two grid corners.
DISCRETE_SPECIAL = (45, 6, 0, 90)
#: Continuous edge / stop actions (acceleration, steering) in [-1, 1].
CONTINUOUS_SPECIAL = ((0.0, 0.0), (-1.0, 0.0), (1.0, 1.0), (-1.0, -1.0))


def tensor_hash(t) -> str:
    """First 16 hex digits of SHA-256 over a tensor's dtype, shape and bytes (moved to the CPU,
    made contiguous). Bit-exact: any changed element, dtype or shape changes it."""
    import torch

    t = t.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    if t.numel():
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.dtype != torch.bool
                 else t.to(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _tensors_of(obj, prefix: str) -> dict:
    """``{prefix.name: tensor}`` for the tensor fields of a dataclass instance (and the ``info``
    dict of a StepResult as ``info.<key>``)."""
    import torch

    out = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, torch.Tensor):
            out[f"{prefix}.{f.name}"] = v
        elif isinstance(v, dict):
            out.update({f"info.{k}": x for k, x in v.items() if isinstance(x, torch.Tensor)})
    return out


def load_packs(needed) -> dict:
    """The ScenarioPacks of the configs ``needed``, converted once per (source, DataConfig):
    ``{(source, DataConfig): ScenarioPack}``.

    Raises:
        ScenarioError: a bundled scenario file is missing or unreadable.
    """
    from gpusim import EnvConfig, ScenarioPack

    packs = {}
    for name in needed:
        kwargs, source = CONFIGS[name]
        dc = EnvConfig(**kwargs).data_config()
        key = (source, dc)
        if key not in packs:
            files = sorted(SAMPLE_DIR.glob("*.json*")) if source == "sample" else [TFRECORD]
            packs[key] = ScenarioPack.from_json([str(f) for f in files], dc, on_error="raise")
    return packs


def make_actions(env, gen, coplayers: bool):
    """One step of seeded varied actions (module docstring): discrete [W, C] int64 or continuous
    [W, C, 2] float32. With ``coplayers`` the non-ego slots take the expert action."""
    import torch

    W, C = env.num_worlds, env.num_slots
    expert = env.expert_actions().to("cpu")
    u = torch.rand(W, C, generator=gen)
    pick = torch.randint(0, 4, (W, C), generator=gen)
    if expert.dim() == 2:  # discrete
        rnd = torch.randint(0, 91, (W, C), generator=gen)
        special = torch.tensor(DISCRETE_SPECIAL)[pick]
        sel_e, sel_r = u < 0.45, u < 0.75
    else:
        rnd = torch.rand(W, C, 2, generator=gen) * 2 - 1
        special = torch.tensor(CONTINUOUS_SPECIAL)[pick]
        sel_e, sel_r = (u < 0.45)[..., None], (u < 0.75)[..., None]
    act = torch.where(sel_e, expert, torch.where(sel_r, rnd.to(expert.dtype), special.to(expert.dtype)))
    if coplayers:
        ego = env.state.ego.to("cpu")
        act = torch.where(ego if act.dim() == 2 else ego[..., None], act, expert)
    return act.to(env.device)


def run_record(name: str, backend: str, pack, worlds: int, steps: int) -> dict:
    """Run one config on one backend; returns ``{"meta", "fields": {name: [hash per step]},
    "final": {name: hash}, "metrics": {...}}`` (step 0 = after the reset)."""
    import torch
    from gpusim import DriveEnv, EnvConfig

    kwargs, _ = CONFIGS[name]
    config = EnvConfig(**config_kwargs_for(kwargs, backend))
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    env = DriveEnv(pack, worlds, config, device="cpu", seed=7)
    fields: dict[str, list] = {}

    def add(named: dict, t: int):
        for k, v in named.items():
            fields.setdefault(k, [None] * (steps + 1))[t] = tensor_hash(v)

    counts = _c_call_counts()
    add({"result.obs": env.reset(seed=11), **_tensors_of(env.state, "state")}, 0)
    for t in range(1, steps + 1):
        actions = make_actions(env, gen, config.has_coplayers)
        add({"actions": actions}, t)
        result = env.step(actions)
        add({**_tensors_of(result, "result"), **_tensors_of(env.state, "state")}, t)
    final = {"observe": tensor_hash(env.observe())}
    metrics = {"ema": env.metrics("ema"), "mean": env.metrics("mean")}
    if config.has_coplayers:
        metrics["coplayer_ema"] = env.metrics("ema", role="coplayer")
        metrics["coplayer_mean"] = env.metrics("mean", role="coplayer")
    metrics = {k: {m: float(x) for m, x in v.items()} for k, v in metrics.items()}
    meta = {"config": kwargs, "backend": backend, "worlds": worlds, "steps": steps,
            "scenarios": list(pack.scenario_ids)}
    rec = {"meta": meta, "fields": fields, "final": final, "metrics": metrics}
    if counts is not None:  # the C entry points this run called (a tree with the counter)
        rec["c_calls"] = sorted(k for k, n in _c_call_counts().items() if n)
    return rec


def _c_call_counts() -> dict | None:
    """The C entry points called since the last call, by argument-struct name
    (``gpusim.kernels.cbuild.CALL_COUNTS``, cleared here), or None for a tree without the counter."""
    try:
        from gpusim.kernels.cbuild import reset_call_counts
    except ImportError:
        return None
    return reset_call_counts()


def config_kwargs_for(kwargs: dict, backend: str) -> dict:
    """EnvConfig keywords of a config on a backend (``torch``: the C kernels off).

    Raises:
        SystemExit: the tree's EnvConfig has no ``cpu_kernels`` switch (backend ``torch``).
    """
    from gpusim import EnvConfig

    out = dict(kwargs)
    if backend == "torch":
        if "cpu_kernels" not in {f.name for f in dataclasses.fields(EnvConfig)}:
            raise SystemExit("golden.py: this tree's EnvConfig has no cpu_kernels field; "
                             "run with --backends c triton")
        out["cpu_kernels"] = False
    return out


def run_in_process(configs, backends, worlds: int, steps: int, label: str | None = None) -> dict:
    """Records ``"<config>/<backend>"`` for the in-process backends (``c``, ``torch``); ``label``
    replaces the backend's name in the keys, metadata and progress lines (the Triton worker)."""
    import torch

    torch.set_num_threads(1)
    from gpusim import EnvConfig

    packs = load_packs(configs)
    records = {}

    for name in configs:
        kwargs, source = CONFIGS[name]
        pack = packs[(source, EnvConfig(**kwargs).data_config())]
        for backend in backends:
            t0 = time.perf_counter()
            try:
                rec = run_record(name, backend, pack, worlds, steps)
                rec["meta"]["backend"] = label or backend
            except SystemExit:
                raise
            except Exception as exc:  # recorded: a run that fails is a difference, not a crash
                rec = {"error": f"{type(exc).__name__}: {exc}"}
            records[f"{name}/{label or backend}"] = rec
            print(f"  {name}/{label or backend}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return records


def run_triton_subprocess(configs, worlds: int, steps: int) -> dict:
    """Records ``"<config>/triton"``, computed by this script in a child process with
    ``TRITON_INTERPRET=1`` and ``GPUSIM_BACKEND=triton`` (same ``PYTHONPATH``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "triton.json"
        env = dict(os.environ, TRITON_INTERPRET="1", GPUSIM_BACKEND="triton")
        cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--_triton-worker", "--out", str(out),
               "--configs", *configs, "--triton-worlds", str(worlds), "--triton-steps", str(steps)]
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0 or not out.exists():
            tail = proc.stdout.strip().splitlines()[-1:] or ["no output"]
            return {f"{n}/triton": {"error": f"triton worker failed (exit {proc.returncode}): {tail[0]}"}
                    for n in configs}
        sys.stderr.write(proc.stdout)
        return json.loads(out.read_text())["records"]


def compare(now: dict, ref: dict) -> tuple[list[str], bool]:
    """Compare two golden files' ``records``: lines to print and whether all compared records are
    equal. Records of ``ref`` that ``now`` did not run are reported as skipped (not a difference);
    records ``now`` has and ``ref`` lacks are differences."""
    lines, ok = [], True
    for key in sorted(set(now) | set(ref)):
        if key not in now:
            lines.append(f"{key}: skipped (not run now)")
            continue
        verdict = compare_record(now[key], ref.get(key))
        ok &= verdict.startswith("equal")
        lines.append(f"{key}: {verdict}")
    return lines, ok


#: Record fields renamed in the tree, old name -> new name: a reference file written before the
#: rename is compared under the new name (the state field that holds the clean per-trial score).
RENAMED_FIELDS = {"state.trial_score": "state.trial_clean"}


def compare_record(a: dict, b: dict | None) -> str:
    """``"equal"`` (plus extra fields of ``a``) or ``"DIFFERENT: <first difference>"``; ``a`` is the
    new record, ``b`` the reference (its fields of :data:`RENAMED_FIELDS` read under their new names)."""
    if b is None:
        return "DIFFERENT: not in the reference file"
    if "error" in a or "error" in b:
        if a.get("error") == b.get("error"):
            return f"equal (both failed: {a['error']})"
        return f"DIFFERENT: now {a.get('error', 'ran')!r}, reference {b.get('error', 'ran')!r}"
    if a["meta"] != b["meta"]:
        diff = [k for k in b["meta"] if a["meta"].get(k) != b["meta"][k]]
        return f"DIFFERENT: not comparable, the runs differ in {', '.join(diff)}"
    calls = a.get("c_calls")
    if calls is not None and (a["meta"]["backend"] == "c") != bool(calls):
        return ("DIFFERENT: the c backend called no C kernel (it fell back to torch)" if not calls else
                f"DIFFERENT: the {a['meta']['backend']} backend called the C kernels {', '.join(calls)}")
    if calls is not None and b.get("c_calls") is not None and calls != b["c_calls"]:
        return f"DIFFERENT: C kernels called now {calls}, reference {b['c_calls']}"
    fa, fb = a["fields"], {RENAMED_FIELDS.get(k, k): v for k, v in b["fields"].items()}
    missing = [k for k in fb if k not in fa]
    if missing:
        return f"DIFFERENT: field {missing[0]} missing now ({len(missing)} missing)"
    for t in range(b["meta"]["steps"] + 1):
        bad = [k for k in fb if fa[k][t] != fb[k][t]]
        if bad:
            when = "after the reset" if t == 0 else f"at step {t}"
            more = f" (and {len(bad) - 1} more: {', '.join(bad[1:4])}{', ...' if len(bad) > 4 else ''})" \
                if len(bad) > 1 else ""
            return f"DIFFERENT {when}: {bad[0]}{more}"
    for k in b["final"]:
        if a["final"].get(k) != b["final"][k]:
            return f"DIFFERENT: final {k}"
    for kind, vals in b["metrics"].items():
        got = a["metrics"].get(kind, {})
        for m, v in vals.items():
            if m not in got or not _same_number(got[m], v):
                return f"DIFFERENT: metrics[{kind}][{m}] now {got.get(m)} reference {v}"
    extra = [k for k in fa if k not in fb]
    return "equal" + (f" (new fields not in the reference: {', '.join(extra)})" if extra else "")


def _same_number(x: float, y: float) -> bool:
    """Equal floats, NaN equal to NaN."""
    return x == y or (x != x and y != y)


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line flags (``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--compare", metavar="REF", help="golden JSON of the reference tree; exit 1 if any record differs")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    p.add_argument("--worlds", type=int, default=16, help="worlds of the c and torch runs (default 16)")
    p.add_argument("--steps", type=int, default=40, help="steps of the c and torch runs (default 40)")
    p.add_argument("--triton-worlds", type=int, default=2, help="worlds of the interpreted Triton runs (default 2)")
    p.add_argument("--triton-steps", type=int, default=22, help="steps of the interpreted Triton runs (default 22)")
    p.add_argument("--_triton-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if min(args.worlds, args.steps, args.triton_worlds, args.triton_steps) < 1:
        p.error("--worlds, --steps, --triton-worlds and --triton-steps must be >= 1")
    if args.compare and not pathlib.Path(args.compare).is_file():
        p.error(f"--compare {args.compare}: no such file; write it first with --out on the reference tree")
    return args


def main(argv=None) -> int:
    """Run the records, write ``--out``, compare with ``--compare``; returns the exit code."""
    args = parse_args(argv)
    if args._triton_worker:
        records = run_in_process_triton(args.configs, args.triton_worlds, args.triton_steps)
    else:
        records = {}
        in_proc = [b for b in args.backends if b != "triton"]
        forced = os.environ.pop("GPUSIM_BACKEND", None)  # c and torch: the backend comes from the config
        try:
            if in_proc:
                records.update(run_in_process(args.configs, in_proc, args.worlds, args.steps))
        finally:
            if forced is not None:
                os.environ["GPUSIM_BACKEND"] = forced
        if "triton" in args.backends:
            records.update(run_triton_subprocess(args.configs, args.triton_worlds, args.triton_steps))
    import gpusim

    doc = {"format": FORMAT, "gpusim": str(pathlib.Path(gpusim.__file__).resolve().parent),
           "about": "profiling/golden.py: per-step tensor hashes (see its docstring)", "records": records}
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=0, sort_keys=True))
    if args._triton_worker:
        return 0
    print(f"golden: {len(records)} records of {doc['gpusim']} -> {out}")
    if not args.compare:
        failed = [k for k, r in records.items() if "error" in r]
        for k in failed:
            print(f"{k}: failed: {records[k]['error']}")
        return 0
    ref = json.loads(pathlib.Path(args.compare).read_text())
    lines, ok = compare(records, ref["records"])
    print(f"compare with {args.compare} ({ref.get('gpusim', '?')}):")
    print("\n".join(lines))
    return 0 if ok else 1


def run_in_process_triton(configs, worlds: int, steps: int) -> dict:
    """The child process of :func:`run_triton_subprocess`: records ``"<config>/triton"``.

    Raises:
        SystemExit: the interpreter or the forced backend is not set in this process's environment.
    """
    if os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get("GPUSIM_BACKEND") != "triton":
        raise SystemExit("golden.py --_triton-worker needs TRITON_INTERPRET=1 and GPUSIM_BACKEND=triton")
    return run_in_process(configs, ["c"], worlds, steps, label="triton")  # the backend is forced


if __name__ == "__main__":
    sys.exit(main())
