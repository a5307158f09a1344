"""One command for whoever has a CUDA GPU: does gpusim work on it, and how fast is it?

Steps (each one's result goes into the report, a failing step does not stop the others):

1. ``device``: the GPU's name, capability and memory, torch / Triton / CUDA versions.
2. ``tests``: the test suite on CUDA, compiled kernels (no interpreter): a subprocess
   ``python -m pytest -q`` with ``TRITON_INTERPRET`` unset. ``GPUSIM_BACKEND`` is not forced: the
   kernel tests build their inputs on ``tests/synthetic.py``'s ``KERNEL_DEVICE`` (CUDA here), and the
   trainer and CPU-path tests keep their CPU tensors, which a forced Triton backend would refuse
   (``gpusim.backend.backend_for`` raises without the interpreter). Failures and errors are listed
   from pytest's ``-rfEs`` lines, and so are the skipped tests with their reasons (on a GPU without
   CuPy the ``cupy`` backend's cases skip: the report says so instead of passing them silently);
   the whole output goes to ``pytest.log`` beside the report.
3. ``env``: the env-only benchmark (``profiling/bench_env.py``'s ``bench``) over worlds
   256 ... 16384 with the Triton backend: controlled-agent-steps/s, ms/step, per-kernel ms/step,
   memory per world (``EnvState`` + observation buffer bytes, and peak CUDA memory / worlds).
4. ``train``: a 2-minute ``python train/run.py`` run (the trainer's own SPS from its
   ``metrics.jsonl``: SPS, rollout / update seconds per report), then
   ``profiling/bench_train.py`` for the env step / policy / update split.

Output: ``--out DIR`` receives ``gpu_check.json`` (everything) and ``gpu_check.md`` (tables for
the README and docs/benchmarks.md).

Usage (from the repository root)::

    python profiling/gpu_check.py --out gpu_check/          # on a CUDA machine, ~10-15 minutes
    python profiling/gpu_check.py --dry-run --out /tmp/gc   # CPU, tiny sizes, seconds: checks the script

``--dry-run`` runs every step on the CPU with tiny sizes (a few tests under the interpreter, 1-2
worlds, a few-step training run) so the script itself is tested (tests/test_profiling.py); its
numbers mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
GPU_WORLDS = [256, 1024, 4096, 16384]
DRY_WORLDS = [1, 2]


def _console():
    try:
        from rich.console import Console

        return Console(stderr=True)
    except ImportError:  # pragma: no cover  (rich is a core dependency; keep the script usable)
        return None


CONSOLE = _console()


def say(msg: str) -> None:
    """Progress line on stderr (rich markup when rich is available)."""
    if CONSOLE is not None:
        CONSOLE.print(msg)
    else:  # pragma: no cover
        print(msg, file=sys.stderr)


@contextlib.contextmanager
def step(report: dict, name: str):
    """Record a step's wall time and any exception in ``report[name]`` instead of aborting."""
    entry = report.setdefault(name, {})
    say(f"[bold]== {name}[/bold]")
    t0 = time.perf_counter()
    try:
        yield entry
        entry.setdefault("ok", True)
    except Exception as e:  # one failing step must not hide the others' results
        entry.update(ok=False, error=f"{type(e).__name__}: {e}")
        say(f"[red]{name} failed: {type(e).__name__}: {e}[/red]")
    entry["seconds"] = round(time.perf_counter() - t0, 2)


def device_info(device: torch.device) -> dict:
    """Names and versions of the machine (the GPU's when ``device`` is CUDA)."""
    import triton

    info = {"device": str(device), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "host": platform.node(), "cpus": os.cpu_count()}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(name=p.name, capability=f"{p.major}.{p.minor}", memory_gb=round(p.total_memory / 2**30, 1),
                    multiprocessors=p.multi_processor_count, cuda=torch.version.cuda)
    else:
        info.update(name=platform.processor() or platform.machine(), cuda=None)
    return info


PYTEST_SUMMARY = re.compile(r"^=*\s*(\d+ (passed|failed|errors?|skipped|deselected)[, ]*)+.* in [\d.]+s")


def run_tests(pytest_args: list[str], dry_run: bool, timeout: float, log: pathlib.Path | None = None) -> dict:
    """The test suite in a subprocess: on CUDA the kernels compiled (interpreter off, backend left to
    the suite); in a dry run on the CPU the interpreter stays on (the only way Triton runs there).
    ``log`` receives pytest's whole output."""
    env = dict(os.environ)
    env.pop("GPUSIM_BACKEND", None)
    if dry_run:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", *pytest_args]
    say("  " + " ".join(cmd))
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        out, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), 124
    tail = out.strip().splitlines()
    # pytest's closing line, e.g. "==== 3 failed, 1040 passed, 6 skipped in 160.2s ====" (with -q the
    # "=" framing may be absent); a test's own output can mention "error", so only that shape counts
    summary = next((ln for ln in reversed(tail) if PYTEST_SUMMARY.search(ln)), "")
    failed = [ln.split(" ", 1)[1] for ln in tail if ln.startswith(("FAILED ", "ERROR "))]
    # a test that builds CPU tensors and forces the Triton backend cannot run without the
    # interpreter (gpusim.backend.backend_for raises): a test-suite limitation, listed apart
    cpu_only = [f for f in failed if "needs TRITON_INTERPRET=1" in f]
    skipped = [ln.split(" ", 1)[1] for ln in tail if ln.startswith("SKIPPED ")]  # "[n] file:line: reason"
    if log is not None:  # the whole output: the report keeps only its last 40 lines
        log.write_text(out)
    return {"ok": rc == 0, "returncode": rc, "command": " ".join(cmd[1:]), "summary": summary.strip("= "),
            "failed": [f for f in failed if f not in cpu_only], "failed_cpu_tensor_tests": cpu_only,
            "skipped": skipped, "tail": "\n".join(tail[-40:])}


def run_env_bench(worlds: list[int], device: torch.device, backend: str, steps: int, repeats: int,
                  warmup: int, data: str | None) -> list[dict]:
    """``bench_env.bench`` per worlds count (breakdown on), plus peak CUDA memory per world."""
    from gpusim.backend import use_backend
    from gpusim.config import EnvConfig

    from profiling import bench_env

    config = EnvConfig()
    pack = bench_env.load_pack(data, config)
    rows = []
    with use_backend(backend):
        for w in worlds:
            say(f"  worlds {w}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            row = bench_env.bench(pack, config, w, steps, repeats, warmup, str(device), breakdown=True)
            if device.type == "cuda":
                row["peak_cuda_bytes_per_world"] = torch.cuda.max_memory_allocated(device) / w
            rows.append(row)
    return rows


def run_training(seconds: float, train_args: list[str], out_dir: pathlib.Path) -> dict:
    """``python train/run.py`` for at most ``seconds`` (then stopped); the trainer's reports."""
    log_dir = out_dir / "train_runs"
    cmd = [sys.executable, str(REPO / "train" / "run.py"), "--quiet", "--log-dir", str(log_dir),
           "--run-name", "gpu_check", "--report-interval", "1", *train_args]
    say("  " + " ".join(cmd[1:]) + f"  (stopped after {seconds:.0f} s)")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=seconds)
        stopped = False
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        stopped = True
    records = []
    path = log_dir / "gpu_check" / "metrics.jsonl"
    if path.exists():
        records = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    res = {"command": " ".join(cmd[1:]), "stopped_at_time_limit": stopped, "reports": len(records),
           "returncode": proc.returncode}
    if not records:
        res.update(ok=False, error="no report in metrics.jsonl", tail=(out or "")[-3000:])
        return res
    steady = records[1:] or records  # the first report includes compilation and warm-up
    res.update(ok=True, global_step=records[-1].get("global_step"), elapsed_s=records[-1].get("time"),
               sps_last=records[-1].get("sps"),
               sps_median=sorted(r.get("sps", 0.0) for r in steady)[len(steady) // 2],
               rollout_s_per_report=sum(r.get("rollout_s", 0.0) for r in steady) / len(steady),
               update_s_per_report=sum(r.get("update_s", 0.0) for r in steady) / len(steady))
    return res


def run_train_split(iters: int, train_args: list[str]) -> dict:
    """``bench_train`` (median over ``iters`` iterations after one warm-up): env / policy / update."""
    from profiling import bench_train

    buf = tempfile.SpooledTemporaryFile(mode="w+")
    with contextlib.redirect_stdout(buf):
        res = bench_train.main(["--iters", str(iters), "--warmup", "1", "--json", "--", *train_args])
    return {"median": res["median"], "meta": res["meta"],
            **{k: v for k, v in res.items() if k.startswith("peak")}}


def markdown(report: dict) -> str:
    """The report as Markdown tables."""
    d = report.get("device", {})
    lines = [f"# gpusim GPU check: {d.get('name', '?')} ({d.get('device', '?')})", "",
             f"torch {d.get('torch')}, Triton {d.get('triton')}, CUDA {d.get('cuda')}, "
             f"capability {d.get('capability', '-')}, {d.get('memory_gb', '-')} GB; "
             f"{'DRY RUN (CPU, tiny sizes: numbers mean nothing)' if report['meta']['dry_run'] else ''}", ""]
    t = report.get("tests", {})
    lines += ["## Tests", "", f"`{t.get('command', '')}`: **{t.get('summary') or t.get('error', '')}**", ""]
    if t.get("failed_cpu_tensor_tests"):
        lines += [f"{len(t['failed_cpu_tensor_tests'])} failures are tests that force the Triton backend on CPU "
                  "tensors (they need the interpreter); the others:", ""]
    lines += [f"- `{f}`" for f in t.get("failed", [])[:50]] + ([""] if t.get("failed") else [])
    env = report.get("env", {})
    if env.get("rows"):
        lines += ["## Env only (Triton backend, default `EnvConfig`, C = 32)", "",
                  "| worlds | agent-steps/s | ms/step | µs/agent-step | state + obs KB/world | peak CUDA KB/world | "
                  "slowest kernels (ms/step) |", "|---:|---:|---:|---:|---:|---:|---|"]
        for r in env["rows"]:
            bd = sorted(r.get("breakdown_ms", {}).items(), key=lambda kv: -kv[1])[:4]
            peak = r.get("peak_cuda_bytes_per_world")
            lines.append(
                f"| {r['worlds']} | {r['agent_steps_per_s']:,.0f} | {r['ms_per_step']:.2f} | "
                f"{r['us_per_agent_step']:.3f} | {(r['state_bytes_per_world'] + r['obs_bytes_per_world']) / 1024:.1f} | "
                f"{'-' if peak is None else f'{peak / 1024:.1f}'} | "
                + ", ".join(f"{k} {v:.2f}" for k, v in bd) + " |")
        lines.append("")
    elif env:
        lines += ["## Env only", "", f"failed: {env.get('error')}", ""]
    tr = report.get("train", {})
    if tr:
        lines += ["## Training", ""]
        run = tr.get("run", {})
        if run.get("ok"):
            lines.append(f"`train/run.py` for {report['meta']['train_seconds']:.0f} s: {run['global_step']:,} "
                         f"agent-steps, SPS {run['sps_median']:,.0f} (median of the reports after the first), "
                         f"rollout {run['rollout_s_per_report']:.2f} s + update {run['update_s_per_report']:.2f} s "
                         "per report.")
        else:
            lines.append(f"`train/run.py`: failed ({run.get('error', tr.get('error'))})")
        split = tr.get("split", {}).get("median")
        if split:
            lines += ["", "| phase (bench_train, s / iteration) | seconds | share |", "|---|---:|---:|"]
            for k in ("env_step", "policy_rollout", "rollout_other", "advantage", "ppo_update"):
                lines.append(f"| {k} | {split[k]:.3f} | {100 * split[k] / split['seconds']:.0f}% |")
            lines.append(f"| **total** ({split['sps']:,.0f} agent-steps/s) | {split['seconds']:.3f} | |")
        lines.append("")
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for gpu_check.json and gpu_check.md")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, seconds: tests the script")
    ap.add_argument("--worlds", type=int, nargs="+", default=None, help=f"default {GPU_WORLDS}")
    ap.add_argument("--train-seconds", type=float, default=None, help="training run length (default 120)")
    ap.add_argument("--pytest-args", nargs=argparse.REMAINDER, default=None,
                    help="arguments for pytest (default: the whole suite; last option)")
    ap.add_argument("--skip", nargs="+", default=[], choices=["tests", "env", "train"])
    ap.add_argument("--data", default=None, help="scenario dir or saved pack (default data/womd_sample)")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    """Run the checks, write ``gpu_check.json`` and ``gpu_check.md`` to ``--out``, return the report.

    Exit code 2 (with one line on stderr) when no CUDA device is present and ``--dry-run`` is not given.
    """
    args = parse_args(argv)
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run on a GPU machine, or pass --dry-run to test the script",
              file=sys.stderr)
        raise SystemExit(2)
    if dry and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu" if dry else "cuda")
    worlds = args.worlds or (DRY_WORLDS if dry else GPU_WORLDS)
    train_seconds = args.train_seconds if args.train_seconds is not None else (60.0 if dry else 120.0)
    data = args.data
    report = {"meta": {"dry_run": dry, "worlds": worlds, "train_seconds": train_seconds,
                       "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv[1:] if argv is None else argv}}
    with step(report, "device") as e:
        e.update(device_info(device))
        say(f"  {e['name']} ({device})")
    if "tests" not in args.skip:
        with step(report, "tests") as e:
            pytest_args = args.pytest_args if args.pytest_args is not None else (
                ["tests/test_dynamics.py", "-k", "decode_encode_roundtrip"] if dry else [])
            e.update(run_tests(pytest_args, dry, timeout=3600, log=out / "pytest.log"))
            say(f"  {e['summary']}")
    if "env" not in args.skip:
        with step(report, "env") as e:
            e["rows"] = run_env_bench(worlds, device, "torch" if dry else "triton", steps=1 if dry else 20,
                                      repeats=1 if dry else 3, warmup=0 if dry else 5, data=data)
    if "train" not in args.skip:
        with step(report, "train") as e:
            train_args = ["--device", str(device)]
            if data:
                train_args += ["--data", data]
            if dry:
                train_args += ["--num-worlds", "2", "--env.scenario-length", "4", "--num-threads", "1"]
            run_args = train_args + (["--total-timesteps", "64"] if dry else ["--total-timesteps", "1000000000"])
            e["run"] = run_training(train_seconds, run_args, out)
            e["split"] = run_train_split(1 if dry else 3, train_args)
            e["ok"] = bool(e["run"].get("ok"))
    report["meta"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "gpu_check.md").write_text(markdown(report))
    say(f"wrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'}")
    return report


if __name__ == "__main__":
    main()
