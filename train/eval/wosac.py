"""The evaluator's ``wosac`` mode: Waymo Open Sim Agents Challenge (2025 config) realism scores of
policies driven in :class:`gpusim.env.DriveEnv`, with the log baselines side by side.

Protocol, per scenario WOSAC can score (:func:`gpusim.wosac.sources.load_scenes`; the others are
skipped with a one-line reason and counted):

* a pack of that one scenario with ``init_steps 10`` (history = log steps 0-10, 1.1 s) and every
  object valid at step 10 controlled by the policy, whatever its type, goal or expert mark
  (``DataConfig.control = "all_valid"``; objects not valid at step 10 are absent; ``max_agents``
  / ``max_controlled`` raised to the scenario's object count); each keeps its logged goal (its
  last valid position), however near;
* ``rollouts`` worlds (32 in the challenge) of that scenario in one batch, 80 steps
  (``scenario_length 81``, so no auto-reset lands in the record), actions sampled (checkpoints:
  ``deterministic=False``; each world draws its own samples), torch seeded per scenario;
* contacts and goals neither stop nor remove agents: collisions and offroad ``ignore``; goals
  ``stop`` with a 1 mm radius (at 1 mm only an object that does not move from its logged end
  meets it; the goal behaviour ``continue``, which drives on, gives the same figures for the
  baselines that follow the log or hold their speed, docs/wosac.md);
* positions after every step (x, y, heading; z = the object's z at step 10) are matched to the
  scene's sim agents by :func:`gpusim.wosac.rollouts.assemble_rollouts` and scored by
  :func:`gpusim.wosac.metrics.score`.

No sim agent is log-replayed (``replayed`` / ``evaluated_replayed`` count any that were, e.g. a
scenario whose objects exceed the slot limits). Pedestrians and cyclists move with the env's
vehicle dynamics (the action space of ``base``). An object whose logged goal lies within 1 mm of
its step-10 position and that does not move stops there (it stays put, as in the log).
Goal-conditioned policies (checkpoints, ``steer_to_goal``) see the log's endpoint, future
information: their figures compare with PufferDrive's / GPUDrive's self-play figures, not with the
leaderboard. ``log_replay`` is the logged future itself (no simulator), the upper reference.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from gpusim.wosac import config as C

#: Policies this mode scores straight from the log, without the simulator.
LOG_POLICIES = ("log_replay",)

#: The caveat printed with every wosac table.
CAVEAT = ("every object valid at step 10 is driven by the policy (pedestrians and cyclists with the vehicle "
          "dynamics); goal-conditioned policies use the log's endpoint (future information), so compare with "
          "self-play figures (PufferDrive, GPUDrive), not the leaderboard")


def source_files(sources) -> dict:
    """``{scenario_id: file}`` for every scenario record of ``sources`` (files, directories or
    globs); a TFRecord file maps each of its scenarios to itself."""
    from gpusim.data.convert import expand_sources
    from gpusim.data.proto_export import scenario_payloads
    from gpusim.data.womd_proto import messages

    files, _ = expand_sources(sources)
    out = {}
    for f in files:
        for _, item in scenario_payloads(f):
            if isinstance(item, bytes):
                m = messages()["Scenario"]()
                m.ParseFromString(item)
                out.setdefault(m.scenario_id, str(f))
    return out


def wosac_env_config(base, num_agents: int, num_controlled: int, action_space=None, goal: str = "stop"):
    """``base`` (an :class:`~gpusim.config.EnvConfig`) with the protocol of the module docstring:
    slot limits ``num_agents`` / ``num_controlled``, ``init_steps 10``, 81 steps, contacts ignored,
    goals at 1 mm; ``action_space`` overrides the base's when given. ``goal="continue"``: goals
    ``continue`` at the base's ``goal_radius`` instead of ``stop`` at 1 mm (``--wosac-goal``).

    Raises:
        ValueError: ``goal`` is not ``"stop"`` or ``"continue"``.
    """
    if goal not in ("stop", "continue"):
        raise ValueError(f"--wosac-goal must be stop or continue, got {goal!r}")
    goals = dict(goal_behavior="stop", goal_radius=1e-3) if goal == "stop" else dict(goal_behavior="continue")
    changes = dict(max_agents=num_agents, max_controlled=num_controlled, init_steps=C.CURRENT_TIME_INDEX,
                   scenario_length=C.SIM_STEPS + 1, collision_behavior="ignore", offroad_behavior="ignore",
                   ego_slots=0, ego_fraction=0.0, **goals)
    if action_space is not None:
        changes["action_space"] = action_space
    return base.replace(**changes)


def _track_of_slots(pack, path) -> torch.Tensor:
    """[A] int64: the ``Scenario`` proto track index of every object slot of scenario 0 of ``pack``
    (-1 where none). JSON sources are re-read: their object order differs from the proto's tracks."""
    from gpusim.data.parse import read_scenario
    from gpusim.data.tfrecord import is_tfrecord_file

    src = pack.agent_source_index[0].to(torch.int64).cpu()
    if is_tfrecord_file(path):
        return src
    lookup = {int(v): k for k, v in enumerate(read_scenario(path).source_index)}
    return torch.tensor([lookup.get(int(v), -1) for v in src], dtype=torch.int64)


@torch.no_grad()
def simulate(scene, path, make_driver: Callable, base, rollouts: int = C.N_ROLLOUTS, seed: int = 0,
             device="cpu", goal: str = "stop"):
    """Run ``rollouts`` worlds of ``scene`` for 80 steps (module docstring).

    Args:
        scene: a :class:`~gpusim.wosac.scene.WosacScene`. path: the file it came from (JSON or TFRecord).
        make_driver: ``make_driver(env) -> driver`` with ``begin(env, obs)``, ``act(env, obs)``,
            ``observe(env, result)`` (:mod:`train.eval.sweep`'s drivers).
        base: the :class:`~gpusim.config.EnvConfig` to adapt (a checkpoint's, or the training defaults).
        goal: the goal rule, ``"stop"`` or ``"continue"`` (:func:`wosac_env_config`).

    Returns:
        ``(sim [R, N, 80, 4] float32 (x, y, z, heading; metres, radians), replayed [N] bool numpy
        (sim agents the env log-replayed or left out), seconds of simulation)``.

    Raises:
        ScenarioError: the scenario file cannot be read; UserError: as ``make_driver``.
    """
    from gpusim.data.pack import ScenarioPack
    from gpusim.env import DriveEnv
    from gpusim.wosac.rollouts import assemble_rollouts

    agents = max(64, int(scene.valid.any(axis=1).sum()) + 8)
    cfg = wosac_env_config(base, agents, min(agents, max(scene.num_objects, 1)), goal=goal)
    pack = ScenarioPack.from_json([path], cfg.data_config(goal_min_distance=0.0, control="all_valid"), on_error="raise").to(device)
    env = DriveEnv(pack, rollouts, cfg, seed=seed, device=device)
    driver = make_driver(env)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    obs = env.reset(seed=seed, scenarios=torch.zeros(rollouts, dtype=torch.int64, device=device))
    driver.begin(env, obs)
    states = []
    for _ in range(C.SIM_STEPS):
        res = env.step(driver.act(env, obs))
        driver.observe(env, res)
        obs = res.obs
        states.append(torch.cat([env.state.pos, env.state.heading[..., None]], -1).float())
    seconds = time.perf_counter() - t0
    st = torch.stack(states, dim=2).cpu()  # [R, A, 80, 3]
    controlled = env.state.controlled[0].cpu()
    src = _track_of_slots(pack, path)
    track = torch.where(controlled[: src.shape[0]], src, torch.full_like(src, -1))
    out, filled = assemble_rollouts(scene, track, st, offset=pack.offset[0].cpu().tolist(), fill="log")
    return out, filled.numpy(), seconds


def _log_rollouts(scene, rollouts: int) -> torch.Tensor:
    """[R, N, 80, 4] the logged future of ``scene`` in every rollout (``log_replay``)."""
    from gpusim.wosac.baselines import log_replay
    from gpusim.wosac.scene import stack_scenes

    return log_replay(stack_scenes([scene]), rollouts)[0]


def _summary(rows: list[dict], opts) -> dict:
    """metric -> :class:`train.eval.stats.Interval` over the scenarios' rows (clipped to [0, 1],
    the range of every likelihood). One row per scenario, so each row is its own cluster (the
    interval is the plain one; ``Interval.clusters`` counts the scenarios)."""
    from train.eval.stats import mean_interval

    names = ("metametric", *C.BUCKETS, *C.COMPONENTS)
    scenes = list(range(len(rows)))
    return {n: mean_interval([r[n] for r in rows], opts.interval, opts.level, opts.resamples, opts.seed,
                             bounds=(0.0, 1.0), clusters=scenes)
            for n in names if rows and n in rows[0]}


def _score_row(scene, sim: torch.Tensor, replayed, seconds: float) -> dict:
    """One per-scenario row: meta-metric, buckets and components (floats) and the counts."""
    from gpusim.wosac.metrics import score
    from gpusim.wosac.scene import stack_scenes

    t0 = time.perf_counter()
    res = {k: float(v[0]) for k, v in score(stack_scenes([scene]), sim[None]).items()}
    res.update(scenario=scene.scenario_id, sim_agents=scene.num_objects, evaluated=int(scene.evaluated.sum()),
               replayed=int(replayed.sum()), evaluated_replayed=int((replayed & scene.evaluated).sum()),
               sim_seconds=round(seconds, 3), score_seconds=round(time.perf_counter() - t0, 3))
    return res


def evaluate_wosac(entries: list[dict], make_driver: Callable, base, data: str, opts, *, rollouts: int = C.N_ROLLOUTS,
                   device="cpu", progress=None, export: str | None = None, goal: str = "stop") -> dict:
    """Score every ``--policy`` entry on every scenario of ``data`` WOSAC can score.

    Args:
        entries: ``[{"spec", "label", "kind"}]`` (``train/evaluate.py``'s policies); ``spec`` in
            :data:`LOG_POLICIES` is scored from the log, anything else is driven in the env.
        make_driver: ``make_driver(entry, env) -> driver`` (sampled actions for checkpoints).
        base: the :class:`~gpusim.config.EnvConfig` to adapt (:func:`wosac_env_config`).
        data: scenario files or directory (JSON and/or TFRecord). opts: a
            :class:`train.eval.modes.ModeOptions` (seed, interval settings).
        rollouts: worlds per scenario (32 in the challenge). progress: optional ``rich`` progress.
        export: write the first entry's rollouts here as a ``SimAgentsChallengeSubmission``.
        goal: the goal rule of the simulated env (:func:`wosac_env_config`; ``--wosac-goal``).

    Returns:
        ``{"runs": [{"label", "policy", "mode": "wosac", "scenarios", "summary" {metric: Interval},
        "per_scenario" [row], "seconds" (wall time, simulation and scoring)}], "skipped": [{"file",
        "reason"}], "notes": [...], "num_scenarios", "files", "rollouts", "export"?}``. A row holds
        the meta-metric, buckets and components and the counts ``sim_agents``, ``evaluated``,
        ``replayed``, ``evaluated_replayed``, ``sim_seconds``, ``score_seconds``.

    Raises:
        ScenarioError: no scenario file in ``data``; UserError: no scenario WOSAC can score, or as
        ``make_driver``.
    """
    from gpusim.wosac.sources import load_scenes
    from train.config import UserError, resolve_path

    root = str(resolve_path(data))
    scenes, skipped = load_scenes([root])
    if not scenes:
        raise UserError(f"--data {data}: no scenario WOSAC can score ({len(skipped)} skipped: "
                        f"{skipped[0][1] if skipped else 'none found'})")
    paths = source_files([root])
    out = {"runs": [], "skipped": [{"file": n, "reason": r} for n, r in skipped], "num_scenarios": len(scenes),
           "files": len(scenes) + len(skipped), "notes": [CAVEAT], "rollouts": rollouts, "goal": goal}
    kept = {}
    for entry in entries:
        task = None if progress is None else progress.add_task(f"{entry['label']} (wosac; count = scenarios)",
                                                               total=len(scenes))
        rows, t_run = [], time.perf_counter()
        for i, scene in enumerate(scenes):
            if entry["spec"] in LOG_POLICIES:
                t0 = time.perf_counter()
                sim, replayed = _log_rollouts(scene, rollouts), np.zeros(scene.num_objects, bool)
                sec = time.perf_counter() - t0
            else:
                sim, replayed, sec = simulate(scene, paths[scene.scenario_id], lambda env: make_driver(entry, env),
                                              base, rollouts, seed=opts.seed + i, device=device, goal=goal)
            rows.append(_score_row(scene, sim, replayed, sec))
            if export and entry is entries[0]:
                kept[scene.scenario_id] = (scene.object_id, sim.numpy())
            if task is not None:
                progress.advance(task, 1)
        out["runs"].append({"label": entry["label"], "policy": entry["spec"], "mode": "wosac",
                            "scenarios": [s.scenario_id for s in scenes], "summary": _summary(rows, opts),
                            "per_scenario": rows, "seconds": round(time.perf_counter() - t_run, 2)})
    if export:
        from gpusim.fileio import OutputError

        try:
            out["export"] = write_export(export, kept, entries[0]["label"], len(skipped), rollouts)
        except OutputError as e:  # the scores are finished: report them, and the failed write
            out["export"] = {"file": str(export), "policy": entries[0]["label"], "error": str(e)}
    return out


def write_export(path, rollouts: dict, method: str, skipped: int, per_scenario: int = C.N_ROLLOUTS) -> dict:
    """Write ``rollouts`` ({scenario_id: (object ids [N], [R, N, 80, 4])}) as a
    ``SimAgentsChallengeSubmission`` (:func:`gpusim.data.proto_export.write_submission`, atomic);
    returns ``{"file", "policy", "scenarios", "rollouts" (R, ``per_scenario``), "complete"}``:
    complete only when no scenario was skipped and R is the challenge's
    :data:`gpusim.wosac.config.N_ROLLOUTS` (32).

    Raises:
        OutputError: the file cannot be written (one line naming it and the cause).
    """
    from gpusim.data.proto_export import write_submission

    write_submission(path, rollouts, method=method)
    return {"file": str(path), "policy": method, "scenarios": len(rollouts), "rollouts": per_scenario,
            "complete": skipped == 0 and per_scenario == C.N_ROLLOUTS}


def print_wosac(results: dict, console) -> None:
    """Print the wosac runs of ``results``: skipped scenarios, the caveat, a summary table (metric x
    policy, mean [95% interval] over scenarios), a per-scenario meta-metric table and the export line."""
    from rich.markup import escape
    from rich.table import Table

    from train.eval.report import format_interval

    runs = [r for r in results["runs"] if r["mode"] == "wosac"]
    if results.get("skipped"):
        console.print(f"[yellow]{len(results['skipped'])} scenario(s) skipped:[/yellow]")
        for item in results["skipped"]:
            console.print(escape(f"  skipped {item.get('file', '?')}: {item.get('reason', '?')}"), soft_wrap=True)
    for note in results.get("notes", []):
        console.print(escape(note), soft_wrap=True)
    level = int(round(100 * results["level"]))
    title = (f"WOSAC (2025 config) on {results['data']}: {results['num_scenarios']} scenario(s) x "
             f"{results.get('rollouts', '?')} rollouts, 80 steps from log step {C.CURRENT_TIME_INDEX}"
             + (f", sampling temperature {results['temperature']:g}" if results.get("temperature", 1.0) != 1.0 else "")
             + f"; mean [{level}% CI] over scenarios")
    table = Table(title=escape(title), title_justify="left")
    table.add_column("metric")
    for r in runs:
        table.add_column(escape(r["label"]), justify="right")
    for name in runs[0]["summary"] if runs else ():
        table.add_row(name, *[format_interval(r["summary"][name]) for r in runs])
    table.add_row("seconds (simulation + scoring)", *[f"{r['seconds']:.1f}" for r in runs], style="dim")
    table.add_row("sim agents log-replayed by the env", *[str(sum(x["replayed"] for x in r["per_scenario"]))
                                                           for r in runs], style="dim")
    console.print(table)
    per = Table(title="per scenario: metametric (replayed / sim agents)", title_justify="left")
    per.add_column("scenario")
    for r in runs:
        per.add_column(escape(r["label"]), justify="right")
    for s, sid in enumerate(runs[0]["scenarios"] if runs else ()):
        per.add_row(escape(sid), *[f"{r['per_scenario'][s]['metametric']:.4f} ({r['per_scenario'][s]['replayed']}"
                                   f"/{r['per_scenario'][s]['sim_agents']})" for r in runs])
    console.print(per)
    exp = results.get("export")
    if exp and exp.get("error"):
        console.print(escape(f"error: rollouts of {exp['policy']} NOT written: {exp['error']}"), soft_wrap=True)
    elif exp:
        problems = ([f"{len(results['skipped'])} scenario(s) skipped"] if results["skipped"] else []) + (
            [f"{exp.get('rollouts')} rollout(s) per scenario, the challenge requires {C.N_ROLLOUTS}"]
            if exp.get("rollouts", C.N_ROLLOUTS) != C.N_ROLLOUTS else [])
        state = "complete" if exp["complete"] else "INCOMPLETE submission: " + "; ".join(problems)
        console.print(escape(f"rollouts of {exp['policy']} written to {exp['file']} ({exp['scenarios']} "
                             f"scenario(s), {state})"), soft_wrap=True)
