"""The learning runs of docs/results/ in one prepared device call: the driver's scaling curve and
what-helps rows, the sim-agent grid (behaviour cloning, PPO alone, human-regularised PPO), and the
WOSAC scoring of the sim agents, all side by side on one GPU within a deadline.

Every run writes its checkpoint every few updates and its ``metrics.jsonl`` as it goes, so the
deadline loses nothing but the last minutes; at the end the results are packed into at most six
archives of at most 15 MB under ``--out`` (the device tool brings back 8 files of 16 MiB).

Data (``--data DIR``): ``DIR/train`` (the pool's train split, e.g. the 1-mm-rounded copy of
``profiling/compact_pool.py``), ``DIR/validation`` and ``DIR/held_out`` (the original files), as
``python train/splits.py NAME --data ../shared/data/womd ../shared/data/womd_more --copy DIR/NAME``
writes them. Nested train subsets come from the split's order (``train/splits.py --limit``).

    OUT=/tmp/out python -m profiling.round_runs --data .gpudata --out $OUT --deadline 540   # on a GPU
    python -m profiling.round_runs --data .gpudata --out /tmp/dry --device cpu --dry-run  # a CPU check

``--dry-run`` runs every step with tiny budgets on a few scenes (minutes on a CPU), to catch a
broken command before a device minute is spent.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
PY = sys.executable


def log(t0: float, msg: str) -> None:
    print(f"[{time.time() - t0:6.1f} s] {msg}", flush=True)


class Job:
    """One subprocess with a name, a log file and a deadline (killed when it passes)."""

    def __init__(self, name: str, argv: list[str], logdir: pathlib.Path, deadline: float, env=None):
        self.name, self.argv, self.deadline = name, argv, deadline
        self.logfile = logdir / f"{name}.log"
        self.fh = open(self.logfile, "w")
        self.fh.write(" ".join(argv) + "\n")
        self.fh.flush()
        self.p = subprocess.Popen(argv, stdout=self.fh, stderr=subprocess.STDOUT, cwd=REPO,
                                  env={**os.environ, **(env or {})}, start_new_session=False)
        self.start = time.time()
        self.rc: int | None = None

    def poll(self) -> int | None:
        if self.rc is None:
            rc = self.p.poll()
            if rc is None and time.time() > self.deadline:
                self.p.terminate()
                try:
                    rc = self.p.wait(10)
                except subprocess.TimeoutExpired:
                    self.p.kill()
                    rc = self.p.wait()
                rc = 124 if rc in (-15, -9) else rc
            if rc is not None:
                self.rc = rc
                self.seconds = time.time() - self.start
                self.fh.close()
        return self.rc


def subset(src: pathlib.Path, n: int, dst: pathlib.Path) -> pathlib.Path:
    """``dst``: symbolic links to the first ``n`` train scenes (the split's nested order) in ``src``."""
    from train.splits import load_split

    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in load_split("train", src, missing="skip", limit=None)[:n]:
        (dst / f.name).symlink_to(f.resolve())
    return dst


def pack_job(name, src, setting_flags, out, logdir, deadline, device) -> Job:
    """Convert ``src`` once into a pack with the env settings of ``setting_flags`` (the trainer's
    defaults plus those flags), so that the runs sharing it skip the conversion."""
    code = ("import sys; from train.config import parse_args; from gpusim.data import ScenarioPack; "
            "cfg = parse_args(sys.argv[3:]); "
            "p = ScenarioPack.from_json(sys.argv[1], cfg.env.data_config(), workers=4); p.save(sys.argv[2], overwrite=True); "
            "print(sys.argv[2], p.num_scenarios if hasattr(p, 'num_scenarios') else '')")
    return Job(name, [PY, "-c", code, str(src), str(out), "--device", device, *setting_flags], logdir, deadline)


def subset_of(src: pathlib.Path, n: int, dst: pathlib.Path) -> pathlib.Path:
    """``dst``: symbolic links to the first ``n`` scene files of ``src`` (sorted names)."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in sorted(src.glob("*.json*"))[:n]:
        (dst / f.name).symlink_to(f.resolve())
    return dst


def wait_all(jobs: list[Job], t0: float) -> None:
    """Block until every job ended; log each end."""
    while any(j.poll() is None for j in jobs):
        time.sleep(1)
    for j in jobs:
        log(t0, f"{j.name}: rc {j.rc} in {j.seconds:.0f} s" + ("" if j.rc == 0 else f" (see {j.logfile})"))
        if j.rc != 0:
            print(j.logfile.read_text()[-2000:], flush=True)


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__})"
    return f"cpu ({os.cpu_count()} cores, torch {torch.__version__})"


def pack_results(work: pathlib.Path, out: pathlib.Path, limit: int = 15_000_000) -> None:
    """Archive the runs' checkpoints, metrics and configs, the logs, the scoring JSONs and the
    summary into ``out/results_<i>.tgz`` of at most ``limit`` bytes each (greedy by file)."""
    files = [f for f in sorted(work.rglob("*")) if f.is_file() and not f.is_symlink()
             and not any(part.startswith(("goal_", "sim_", "train", "val", "held", "warm")) for part in f.relative_to(work).parts[:1])]
    groups, cur, size = [], [], 0
    for f in files:
        n = f.stat().st_size
        if cur and size + n > limit * 0.9:
            groups.append(cur)
            cur, size = [], 0
        cur.append(f)
        size += n
    if cur:
        groups.append(cur)
    for i, g in enumerate(groups[:5]):
        with tarfile.open(out / f"results_{i}.tgz", "w:gz") as tar:
            for f in g:
                tar.add(f, arcname=str(f.relative_to(work)))


#: The sim-agent setting (train/settings.py SETTINGS["sim_agent"]): every object valid at step
#: 10 controlled (at most 64), start at step 10, 80 steps, goals do not stop agents.
SIM_AGENT_FLAGS = ["--setting", "sim_agent"]
#: The generalising driver's recipe on top of the GPU recipe: goal resampling, periodic evaluation
#: on validation every 20 updates.
DRIVER_FLAGS = ["--env.goal-resample"]
#: HR-PPO coefficients of the grid (Cornelisse & Vinitsky 2024 use coefficients of this order).
HUMAN_KL = (0.02, 0.1, 0.5)


def driver_runs(work: pathlib.Path, sizes, budget: int, dry: bool) -> list[dict]:
    """The driver rows: the scaling curve (nested train subsets, seed 1; the largest also seed 2),
    then what helps at the largest size, one lever at a time (seed 1): mirror-image scenes, 4096
    worlds, BC initialisation with the human-KL term, an entropy schedule."""
    big = sizes[-1]
    # the periodic validation evaluation, and best.pt at its best goal rate (the run's pick, never held out)
    ev = ["--eval-interval", "20", "--eval-data", str(work / "goal_val"), "--keep-best", "eval/self_play/goal_reached"]

    def run(name, n, extra, seed=1, after=None):
        return {"name": name, "after": after,
                "argv": ["train/run.py", "--data", str(work / f"goal_{n}"), *DRIVER_FLAGS, *ev,
                         "--total-timesteps", str(budget), "--seed", str(seed), *extra]}

    rows = [run(f"drv_n{n}_s1", n, []) for n in sizes]
    rows += [run(f"drv_n{big}_s2", big, [], seed=2),
             run("drv_mirror", big, ["--env.mirror"]),
             run("drv_w4096", big, [] if dry else ["--num-worlds", "4096"]),
             run("drv_ent", big, ["--ppo.ent-coef", "0.01", "--ppo.ent-coef-final", "0.0"]),
             run("drv_bc_kl", big, ["--init-policy", str(work / "runs/bc/checkpoint.pt"), "--ppo.human-kl", "0.02",
                                    "--ppo.human-policy", str(work / "runs/bc/checkpoint.pt"), "--ppo.value-warmup", "5"],
                 after="bc")]
    return rows


def sim_agent_runs(work: pathlib.Path, budget: int, dry: bool, device: str) -> list[dict]:
    """The sim-agent grid in the sim-agent setting: BC alone, PPO alone, BC-initialised PPO without
    and with the human-KL term (:data:`HUMAN_KL`)."""
    bc = str(work / "runs/bc/checkpoint.pt")
    worlds = ["--num-worlds", "4" if dry else "128"]
    rows = [{"name": "bc", "trainer": False,
             "argv": ["train/bc.py", *SIM_AGENT_FLAGS, "--data", str(work / "sim_train"), "--eval-data",
                      str(work / "sim_val"), "--out", bc, "--device", device, "--seed", "1",
                      "--epochs", "2" if dry else "15"]},
            {"name": "sim_ppo", "argv": ["train/run.py", *SIM_AGENT_FLAGS, "--data", str(work / "sim_train"), *worlds,
                                         "--total-timesteps", str(budget), "--seed", "1"]}]
    for c in (0.0, *HUMAN_KL):
        kl = ["--ppo.human-kl", str(c), "--ppo.human-policy", bc] if c else []
        rows.append({"name": f"sim_hr{c:g}", "after": "bc",
                     "argv": ["train/run.py", *SIM_AGENT_FLAGS, "--data", str(work / "sim_train"), *worlds,
                              "--total-timesteps", str(budget), "--seed", "1", "--init-policy", bc,
                              "--ppo.value-warmup", "5", *kl]})
    return rows


def wosac_dirs(work: pathlib.Path, val_dir: pathlib.Path, held_dir: pathlib.Path, dry: bool) -> tuple:
    """Directories of links: 10 validation scenes with objects to predict (the grid's scenes), and
    every held-out scene with objects to predict (the final table), by the pool's split file."""
    from train.splits import read_splits

    doc = read_splits()
    scenes = doc["scenes"]

    def pick(split, src, dst, n):
        dst.mkdir(parents=True, exist_ok=True)
        names = {f.name.split(".json")[0]: f for f in src.glob("*.json*")}
        chosen = [s for s in doc["splits"][split] if scenes[s]["tracks_to_predict"] > 0 and s in names][:n]
        for s in chosen:
            (dst / names[s].name).symlink_to(names[s].resolve())
        return dst, chosen

    return (pick("validation", val_dir, work / "wosac_val", 1 if dry else 10),
            pick("held_out", held_dir, work / "wosac_held", 1 if dry else 1000))


def score(work, val_dir, held_dir, logs, end, device, dry, t0) -> dict:
    """WOSAC scoring: every sim-agent candidate (and the largest driver) on the 10 validation
    scenes; the best by the validation meta-metric, PPO alone and the baselines on every held-out
    scene with objects to predict. Each policy is its own process; a process still running at the
    deadline is stopped (its JSON is then missing, and the summary says so)."""
    (val, val_ids), (held, held_ids) = wosac_dirs(work, val_dir, held_dir, dry)
    out = work / "score"
    out.mkdir(exist_ok=True)
    rollouts = ["--wosac-rollouts", "2" if dry else "32"]
    base = ["train/evaluate.py", "--mode", "wosac", "--device", device, *rollouts]
    cands = {n: work / "runs" / n / "checkpoint.pt" for n in
             ("bc", "sim_ppo", *(f"sim_hr{c:g}" for c in (0.0, *HUMAN_KL)), "drv_n175_s1" if not dry else "drv_n3_s1")}
    cands = {n: p for n, p in cands.items() if p.is_file()}
    jobs = [Job(f"wosac_val_{n}", [PY, *base, "--policy", str(p), "--data", str(val), "--json",
                                   str(out / f"val_{n}.json")], logs, end) for n, p in cands.items()]
    jobs += [Job(f"wosac_held_{b}", [PY, *base, "--policy", b, "--data", str(held), "--json", str(out / f"held_{b}.json")],
                 logs, end) for b in ("log_replay", "expert", "constant_speed", "random")]
    val_jobs = [j for j in jobs if j.name.startswith("wosac_val_")]
    while any(j.poll() is None for j in val_jobs):
        time.sleep(2)
    metas = {}
    for n in cands:
        f = out / f"val_{n}.json"
        if f.is_file():
            metas[n] = wosac_meta(f)
    log(t0, f"validation meta-metrics: {metas}")
    sim = {n: m for n, m in metas.items() if not n.startswith("drv") and m is not None}
    best = max(sim, key=sim.get) if sim else None
    for n in {best, "sim_ppo"} - {None}:
        if n in cands:
            jobs.append(Job(f"wosac_held_{n}", [PY, *base, "--policy", str(cands[n]), "--data", str(held), "--json",
                                                str(out / f"held_{n}.json")], logs, end))
    while any(j.poll() is None for j in jobs):
        time.sleep(2)
    return {"val_scenes": val_ids, "held_scenes": held_ids, "val_meta": metas, "chosen": best,
            "jobs": {j.name: {"rc": j.rc, "seconds": round(j.seconds, 1)} for j in jobs}}


def wosac_meta(path: pathlib.Path):
    """The meta-metric of an evaluate --mode wosac --json file (its first policy), or None."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return find_key(doc, "metametric")


def find_key(doc, key):
    if isinstance(doc, dict):
        if key in doc and isinstance(doc[key], (int, float)):
            return doc[key]
        for v in doc.values():
            r = find_key(v, key)
            if r is not None:
                return r
    if isinstance(doc, list):
        for v in doc:
            r = find_key(v, key)
            if r is not None:
                return r
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=pathlib.Path, default=REPO / ".gpudata")
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/round"))
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds for everything")
    ap.add_argument("--score-seconds", type=float, default=150.0, help="seconds kept for WOSAC scoring")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget", type=int, default=60_000_000, help="agent-steps per training run (a run still "
                    "going at the deadline is stopped; its last checkpoint stays)")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    t0 = time.time()
    end = t0 + a.deadline
    work, out = a.work, a.out
    if work.exists():
        shutil.rmtree(work)
    (work / "logs").mkdir(parents=True)
    out.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    dry = a.dry_run
    sizes = [2, 3] if dry else [25, 50, 100, 175]
    val_dir, held_dir = a.data / "validation", a.data / "held_out"
    if dry:
        val_dir, held_dir = subset_of(a.data / "validation", 2, work / "val2"), subset_of(a.data / "held_out", 2, work / "held2")
    data = {n: subset(a.data / "train", n, work / f"train{n}") for n in sizes}
    big = sizes[-1]

    # -- 1. packs ---------------------------------------------------------------------------------
    goal_flags: list[str] = []
    sim_flags = SIM_AGENT_FLAGS
    jobs = [pack_job(f"pack_goal_{n}", data[n], goal_flags, work / f"goal_{n}", logs, end, a.device) for n in sizes]
    jobs += [pack_job("pack_goal_val", val_dir, goal_flags, work / "goal_val", logs, end, a.device),
             pack_job("pack_sim_train", data[big], sim_flags, work / "sim_train", logs, end, a.device),
             pack_job("pack_sim_val", val_dir, sim_flags, work / "sim_val", logs, end, a.device)]
    if a.device.startswith("cuda"):  # compile the Triton kernels once, while the packs convert
        warm = ["train/run.py", "--data", "data/womd_sample", "--device", a.device, "--total-timesteps", "20000",
                "--num-worlds", "16", "--log-dir", str(work / "warm"), "--num-threads", "1"]
        jobs += [Job("warm_goal", [PY, *warm, "--env.goal-resample", "--run-name", "g"], logs, end),
                 Job("warm_sim", [PY, *warm, *SIM_AGENT_FLAGS, "--run-name", "s"], logs, end)]
    wait_all(jobs, t0)
    summary = {"device": device_name(a.device), "jobs": {}}

    # -- 2. training runs -------------------------------------------------------------------------
    train_end = end - a.score_seconds
    budget = 20_000 if dry else a.budget
    common = ["--device", a.device, "--log-dir", str(work / "runs"), "--checkpoint-interval", "5", "--num-threads", "1"]
    if dry:
        common += ["--num-worlds", "4"]
    runs = driver_runs(work, sizes, budget, dry) + sim_agent_runs(work, budget, dry, a.device)
    pending = {r["name"]: r for r in runs}
    active: dict[str, Job] = {}
    while pending or any(j.poll() is None for j in active.values()):
        for name, r in list(pending.items()):
            dep = r.get("after")
            if dep and (dep not in active or active[dep].poll() is None):
                continue
            if dep and active[dep].rc != 0:
                log(t0, f"skip {name}: {dep} failed (rc {active[dep].rc})")
                del pending[name]
                continue
            argv = ([PY, r["argv"][0], *common, *r["argv"][1:], "--run-name", name] if r.get("trainer", True)
                    else [PY, *r["argv"]])
            active[name] = Job(name, argv, logs, train_end)
            log(t0, f"start {name}")
            del pending[name]
        for name, j in active.items():
            if j.rc is None and j.poll() is not None:
                log(t0, f"end {name}: rc {j.rc} after {j.seconds:.0f} s")
        time.sleep(2)
    summary["jobs"].update({n: {"rc": j.rc, "seconds": round(j.seconds, 1)} for n, j in active.items()})

    # -- 3. WOSAC scoring -------------------------------------------------------------------------
    summary["scoring"] = score(work, val_dir, held_dir, logs, end, a.device, dry, t0)

    # -- 4. results -------------------------------------------------------------------------------
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    pack_results(work, out)
    log(t0, "done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
