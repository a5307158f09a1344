"""``python train/evaluate.py --policy PATH|steer_to_goal|constant_speed|expert|random [...]``:
evaluate trained policies and baselines side by side on every scenario of ``--data``.

Every scenario runs ``--episodes-per-scenario`` times in a fixed order (a deterministic sweep, not
draws with replacement), for every policy and every ``--mode``, under the same env settings and
seed. Printed: the scenarios that were skipped (with reasons), a summary table (goal, collision,
offroad, score, episode return, each a mean over agent-episodes with a confidence interval; in
trial mode also per-trial scores and ``ada_delta_trial_k_minus_0``) and a per-scenario table.
``--json PATH`` writes all of it as JSON. Details and measured baselines: docs/evaluation.md.

A sharded pack directory as ``--data`` (``python -m gpusim.data convert ... --shard-size N``) is
streamed: whole shards in chunks of at most ``--chunk-size`` scenarios are on the device
one at a time (the next read on a background thread), each scenario still runs exactly
``--episodes-per-scenario`` times, and the report is the same as for the data held in memory.

Env settings: those of the first checkpoint in ``--policy`` (the policy was trained for them),
else the training defaults of ``train/run.py`` (``TrainConfig().env``); ``--k-trials K`` switches
to trial mode with K trials; ``--mode human_replay`` controls one agent per world; ``--mode coplayer``
controls one ego per world and lets frozen partner checkpoints (``--coplayer PATH ...``) drive the
other controlled agents (population play). Reported figures are the egos'.

Examples::

    python train/evaluate.py --policy steer_to_goal constant_speed expert random
    python train/evaluate.py --policy runs/<name>/checkpoint.pt steer_to_goal --json eval.json
    python train/evaluate.py --policy runs/<name>/checkpoint.pt --k-trials 2 --mode self_play human_replay
    python train/evaluate.py --policy runs/ego/checkpoint.pt --k-trials 2 --mode self_play coplayer human_replay \
        --coplayer runs/partner/checkpoint.pt --records records.jsonl
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import pathlib
import sys
import warnings
from dataclasses import dataclass, field
from typing import Literal

if __package__ in (None, ""):  # `python train/evaluate.py` from a checkout without `pip install -e .`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch
from rich.markup import escape

from train.baselines import BASELINES, PARTNER_BASELINES, make_baseline
from train.config import (USER_ERRORS, UserError, check_device, default_device, env_config_from_dict, one_line,
                          resolve_path)
from gpusim.data.errors import PackFileError
from gpusim.fileio import OutputError, atomic_write, check_output_path, write_text
from gpusim.data.parse import is_scenario_file, scenario_stem
from gpusim.sim.candidates import LEFT_OUT, env_task_pool, left_out_message
from gpusim.data.shards import ShardedPack
from train.eval.modes import MODES, ModeOptions, get_mode, mode_env
from train.eval.report import scenario_table, summary_table
from train.eval.sweep import (CallableDriver, PolicyDriver, default_num_worlds, ego_rows, make_sweep_env, run_sweep,
                              sweep_plan)
from train.eval.streaming import first_pack, local_records, streaming_sweep
from train.settings import evaluation_config, setting_config
from train.eval.styles import eval_styles, partner_styles, style_env_config
from train.coplayer import partner_file


@dataclass
class EvalConfig:
    """Arguments of ``train/evaluate.py``.

    Attributes:
        policy: what to evaluate, several side by side: checkpoint files of ``train/run.py`` (or
            run directories holding a ``checkpoint.pt``) and/or baseline names
            (``steer_to_goal``, ``constant_speed``, ``expert``, ``random``). ``A.pt+B.pt[+...]``
            is one policy: the ensemble of those checkpoints, their action distributions mixed
            (:class:`policy.ensemble.PolicyEnsemble`; discrete actions; the env settings are the
            first one's).
        checkpoint: one more checkpoint (same as adding it to ``--policy``; kept for old scripts).
        data: scenarios (WOMD JSON directory, saved pack or sharded pack directory; default
            ``data/womd_sample``, relative to the cwd or the repository root). A sharded pack is
            evaluated by streaming (module docstring).
        chunk_size: sharded ``--data`` only: at most this many scenarios on the device at a time
            (whole shards; a larger shard is a chunk of its own).
        mode: evaluation modes, side by side: ``self_play`` (the policy drives every controlled
            agent), ``coplayer`` (one ego per world, the other controlled agents driven by the
            ``--coplayer`` partners) and/or ``human_replay`` (one ego per world, others log-replayed);
            or ``wosac`` alone (WOSAC realism, ``train/eval/wosac.py``; ``log_replay`` is a policy there).
        coplayer: partner checkpoints of ``--mode coplayer`` (one drawn per world per episode;
            refused without that mode, a missing path named before any work);
            ``PATH@STYLE`` gives a conditioned partner its driving style (the distinct styles
            form the partners' style table, one drawn per world per episode; docs/styles.md).
        style: driving styles (names of ``gpusim.styles.STYLES`` or R comma-separated weights) to
            evaluate a reward-conditioned checkpoint under, one run per style labelled by it
            (default: ``default``); refused for a checkpoint trained without conditioning.
        coplayer_sample: partners sample their actions (default argmax).
        human_replay: same as ``--mode human_replay`` (kept for old scripts).
        episodes_per_scenario: how many times every scenario runs (a deterministic policy in a
            deterministic env repeats itself exactly, so > 1 matters for ``random``,
            ``--stochastic``, NEW_GOAL/RESPAWN goals and the memory task, whose candidate goals are
            drawn again every episode, only).
        num_worlds: worlds per batch (0 = up to 32, spread evenly over the batches).
        k_trials: > 0: trial mode with this many trials per episode (0 = as trained).
        stochastic: sample the policies' actions instead of argmax / mean.
        temperature: the sampling temperature of checkpoints' sampled actions (``--stochastic`` and
            ``--mode wosac``, which samples): softmax(logits / T) for a discrete head, the standard
            deviation times T for a continuous one; 1 (default) = the policy's own distribution.
        decode: how a checkpoint's deterministic action is taken from its discrete head (not with
            ``--stochastic``): ``argmax`` (the joint argmax, the default) or ``mean`` (per action
            dimension the expected grid index, rounded; ``policy.ActorCritic.sample``: better for a
            policy whose entropy is still high, docs/evaluation.md).
        ensemble_draw: how an ensemble ``--policy A+B`` uses its members: ``step`` (default): the
            mixture of their action distributions at every step; ``agent``: every agent acts as one
            member, drawn uniformly when its memory starts (:class:`policy.ensemble.PolicyEnsemble`).
            Refused without an ensemble.
        memory: ``trial``: the exact memoryless control, every checkpoint's KV cache cleared at
            every trial start and the ``trial_index`` observation column zeroed
            (``EnvConfig.zero_trial_index``), so trial k differs from trial 0 only by chance
            (sampled actions, partners), never by memory (docs/trial.md); ``episode``: kept across the trials of an episode;
            default: as each checkpoint was trained (``--policy.memory``). Checkpoints only;
            ``trial`` is refused when the evaluation runs no trials (pass ``--k-trials K``).
        partner_task: ``crossing``: evaluate on the partner task (``EnvConfig.partner_task``,
            docs/trial.md; one controlled agent per world), e.g. the scripted references
            ``partner_ceiling`` and ``partner_floor``; default: as the first checkpoint was trained.
        partner_type_prob: the non-yielder probability of the partner task (default: as trained,
            else 0.5).
        seed: env generator, ``random`` baseline and sampling seed (the same for every policy).
        device: ``cuda`` if available else ``cpu``.
        num_threads: torch CPU threads (0 = torch's default, capped at the CPU cores available).
        interval: ``normal`` (mean +- 1.96 cluster-robust standard errors, default) or ``bootstrap``
            (percentile, scenarios resampled); both clustered by scenario (train/eval/stats.py).
        level: confidence level of the intervals.
        resamples: bootstrap resamples (``--interval bootstrap``).
        wosac_rollouts: ``--mode wosac``: rollouts (worlds) per scenario (32 in the challenge).
        wosac_goal: ``--mode wosac``: what an object's logged goal does. ``stop`` (default): goals
            stop at a 1 mm radius, so only an object already standing on its logged end stays
            put; ``continue``: the goal behaviour of the sim-agent setting (the agent drives on;
            the checkpoint's goal radius), nothing is held still (docs/wosac.md).
        setting: evaluate in a named setting instead of the first checkpoint's own
            (:data:`train.settings.SETTINGS`: ``goal`` or ``sim_agent``; its env fields
            replace the checkpoint's, with a note); None: as trained.
        export_rollouts: ``--mode wosac``: write the first ``--policy``'s rollouts to this file as a
            ``SimAgentsChallengeSubmission`` binproto (incomplete when scenarios were skipped: said).
        json: also write the results as JSON to this file.
        records: also write one JSON line per agent-episode (policy, mode, role, scenario, slot,
            metrics, per-trial scores and goal steps) to this file, for offline analysis.
        per_scenario: print the per-scenario table.
        quiet: print nothing (use with ``--json``).
        debug: show tracebacks of user errors.
    """

    policy: tuple[str, ...] = ()
    checkpoint: str | None = None
    data: str = "data/womd_sample"
    chunk_size: int = 64
    mode: tuple[str, ...] = ("self_play",)
    coplayer: tuple[str, ...] = ()
    coplayer_sample: bool = False
    style: tuple[str, ...] = ()
    human_replay: bool = False
    episodes_per_scenario: int = 1
    num_worlds: int = 0
    k_trials: int = 0
    stochastic: bool = False
    temperature: float = 1.0
    decode: Literal["argmax", "mean"] = "argmax"
    ensemble_draw: Literal["step", "agent"] = "step"
    memory: Literal["episode", "trial"] | None = None
    partner_task: Literal["none", "crossing"] | None = None
    partner_type_prob: float | None = None
    seed: int = 12345
    device: str = field(default_factory=default_device)
    num_threads: int = 0
    interval: Literal["normal", "bootstrap"] = "normal"
    level: float = 0.95
    resamples: int = 2000
    wosac_rollouts: int = 32
    wosac_goal: Literal["stop", "continue"] = "stop"
    setting: str | None = None
    export_rollouts: str | None = None
    json: str | None = None
    records: str | None = None
    per_scenario: bool = True
    quiet: bool = False
    debug: bool = False


def available_cores() -> int:
    """CPU cores this process may run on (affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def apply_num_threads(requested: int) -> int:
    """Set torch's intra-op threads: ``requested``, or (0) torch's default capped at the cores.

    Raises:
        UserError: ``requested < 0``.
    """
    if requested < 0:
        raise UserError(f"--num-threads must be >= 0, got {requested}")
    n = requested or min(torch.get_num_threads(), available_cores())
    torch.set_num_threads(n)
    return n


def ensemble_parts(spec: str) -> list[str]:
    """The member paths of a ``--policy`` spec: ``A.pt+B.pt`` gives both; a spec that is itself an
    existing path (a file or folder whose name holds a ``+``) or a baseline name is one part."""
    if spec in BASELINES or "+" not in spec or resolve_path(spec).exists():
        return [spec]
    return spec.split("+")


def _policy_label(spec: str, taken: set) -> str:
    label = spec
    if spec not in BASELINES:  # a file as its directory/name; an ensemble's members joined by "+"
        paths = [pathlib.Path(part) for part in ensemble_parts(spec)]
        label = "+".join(f"{p.parent.name}/{p.name}" if p.parent.name else p.name for p in paths)
    base, i = label, 2
    while label in taken:
        label, i = f"{base}#{i}", i + 1
    taken.add(label)
    return label


def _load_policies(specs: list[str], device, extra: tuple = ()) -> list[dict]:
    """``[{"spec", "label", "kind": "baseline"|"checkpoint", "ckpt"}]`` (checkpoints loaded);
    ``extra``: more names than the baselines that the modes understand (kind ``baseline``)."""
    from train.checkpoint import load_checkpoint

    out, taken = [], set()
    for spec in specs:
        entry = {"spec": spec, "label": _policy_label(spec, taken), "kind": "baseline", "ckpt": None}
        owner = [m.name for m in MODES.values() if spec in m.policies]
        if owner and spec not in extra:
            raise UserError(f"--policy {spec}: only with --mode {owner[0]}")
        if spec not in BASELINES and spec not in extra:
            members = [load_checkpoint(_checkpoint_path(part, spec)) for part in ensemble_parts(spec)]
            entry.update(kind="checkpoint", ckpt=members[0], members=members)
        out.append(entry)
    return out


def _members(entry: dict) -> list[dict]:
    """The loaded checkpoints of a checkpoint entry: an ensemble's members, else its one checkpoint."""
    return entry.get("members") or [entry["ckpt"]]


def _checkpoint_path(part: str, spec: str) -> pathlib.Path:
    """The checkpoint file of one ``--policy`` path (a run directory gives its ``checkpoint.pt``).

    Raises:
        UserError: no such file, naming the whole ``spec`` (an ensemble member: which one).
    """
    path = resolve_path(part)
    if path.is_dir() and (path / "checkpoint.pt").is_file():  # a run directory
        path = path / "checkpoint.pt"
    if not path.exists():
        member = f" (member {part})" if part != spec else ""
        raise UserError(f"--policy {spec}{member}: no such checkpoint file, and not a baseline "
                        f"({', '.join(BASELINES)})")
    return path


def base_env_config(policies: list[dict], cfg: EvalConfig) -> tuple:
    """``(env_config, notes)``: the env settings of the first checkpoint under the evaluation rule
    (:func:`train.settings.evaluation_config`: training randomisations dropped, with a note),
    else the training defaults, with ``--k-trials`` applied; a note for every later checkpoint
    trained with other settings (it is evaluated under the first one's); in trial mode, a note for
    every checkpoint trained outside it (its trial-clock weights are untrained)."""
    from train.config import TrainConfig
    from train.human import unseen_clock_columns

    ckpts = [p for p in policies if p["kind"] == "checkpoint"]
    env_config = env_config_from_dict(ckpts[0]["ckpt"]["env_config"]) if ckpts else TrainConfig().env
    env_config, notes = evaluation_config(env_config)
    others = [(p["label"] if len(_members(p)) < 2 else f"{p['label']} (member {i + 1})", c)
              for p in ckpts for i, c in enumerate(_members(p))][1:]  # ensembles: each member
    for label, other in others:
        theirs = evaluation_config(env_config_from_dict(other["env_config"]))[0]
        diff = [f"{f.name}={getattr(theirs, f.name)}" for f in dataclasses.fields(env_config)
                if getattr(theirs, f.name) != getattr(env_config, f.name)]
        if diff:
            notes.append(f"note: {label} was trained with {', '.join(diff)}; evaluated with "
                         f"{ckpts[0]['label']}'s env settings like every policy here")
    env_config, setting_notes = setting_config(env_config, cfg.setting)
    notes += setting_notes
    if cfg.k_trials > 0:
        env_config = env_config.replace(goal_behavior="trial", k_trials=cfg.k_trials)
    for p in ckpts:
        if unseen := unseen_clock_columns(env_config, p["ckpt"]["env_config"]):
            notes.append(f"note: {p['label']} was trained outside trial mode: its input weights for the trial "
                         f"clock ({', '.join(unseen)}) were never trained, and in trial mode they add noise "
                         "(--init-policy zeroes them when a trial-mode run starts from it)")
    return env_config, notes


def _check_policies(policies: list[dict], env, cfg: EvalConfig) -> None:
    """Build every checkpoint's driver once against ``env``, so that an observation-size, action
    count or action-space mismatch is named before any sweep runs (not after the first policy's).

    Raises:
        UserError: as :func:`_make_driver`.
    """
    for entry in policies:
        if entry["kind"] == "checkpoint":
            _make_driver(entry, env, cfg)


def _make_driver(entry: dict, env, cfg: EvalConfig):
    """The driver of one ``--policy`` entry: a baseline, or the checkpoint's policy
    (:func:`train.checkpoint.policy_from_checkpoint`, the one policy loader; an ensemble's
    members mixed by :class:`policy.ensemble.PolicyEnsemble`) acting through a
    :class:`train.eval.sweep.PolicyDriver` (``--decode``, argmax by default, unless ``--stochastic``).

    Raises:
        UserError: the checkpoint's observation layout, action count or action space is not the env's;
            an ensemble's members cannot be mixed (continuous actions, different memory rules).
    """
    if entry["kind"] == "baseline":
        return CallableDriver(make_baseline(entry["spec"], seed=cfg.seed))
    from gpusim.config import ActionSpace
    from train.checkpoint import PolicyMismatch, policy_from_checkpoint

    continuous = int(env.config.action_space) == int(ActionSpace.CONTINUOUS)
    try:
        policies = [policy_from_checkpoint(c, entry["spec"], env.obs_layout, env.num_actions, continuous)
                    for c in _members(entry)]
    except PolicyMismatch as e:
        raise UserError(f"--policy {entry['spec']}: {e.detail} (the env settings are the first checkpoint's); "
                        "evaluate it on its own or first") from None
    if len(policies) == 1:
        policy = policies[0]
    else:
        from policy.ensemble import PolicyEnsemble

        try:
            policy = PolicyEnsemble(policies, draw=cfg.ensemble_draw)
        except ValueError as e:
            raise UserError(f"--policy {entry['spec']}: {e}") from None
    return PolicyDriver(policy.to(env.device), deterministic=False if cfg.stochastic else cfg.decode, memory=cfg.memory,
                        temperature=cfg.temperature)


def _check(cfg: EvalConfig) -> list[str]:
    specs = list(cfg.policy) + ([cfg.checkpoint] if cfg.checkpoint else [])
    if not specs:
        raise UserError(f"nothing to evaluate: pass --policy PATH and/or a baseline ({', '.join(BASELINES)})")
    for name, value, low in (("--episodes-per-scenario", cfg.episodes_per_scenario, 1), ("--k-trials", cfg.k_trials, 0),
                             ("--num-worlds", cfg.num_worlds, 0), ("--resamples", cfg.resamples, 1),
                             ("--chunk-size", cfg.chunk_size, 1)):
        if value < low:
            raise UserError(f"{name} must be >= {low}, got {value}")
    if not 0.0 < cfg.level < 1.0:
        raise UserError(f"--level must be in (0, 1), got {cfg.level}")
    for name, value in (("--json", cfg.json), ("--records", cfg.records), ("--export-rollouts", cfg.export_rollouts)):
        if value:  # before any work: a finished evaluation is never lost to an unwritable output
            check_output_path(value, name)
    if cfg.ensemble_draw != "step" and not any(len(ensemble_parts(s)) > 1 for s in specs):
        raise UserError(f"--ensemble-draw {cfg.ensemble_draw}: no ensemble to draw from; join checkpoints with '+' "
                        "in --policy (e.g. --policy a.pt+b.pt)")
    if cfg.memory is not None and any(s in BASELINES for s in specs):
        raise UserError(f"--memory {cfg.memory}: {next(s for s in specs if s in BASELINES)} is a baseline without a "
                        "KV-cache memory; pass --memory with checkpoints only")
    return specs


def _check_modes(modes: list, cfg: EvalConfig, opts: ModeOptions):
    """Run every mode's ``check``; return the mode with its own protocol among ``modes`` (None if none).

    Raises:
        UserError: a mode's check; an option only other modes read (``--coplayer`` without
            ``--mode coplayer``); a protocol mode beside others, ``--export-rollouts`` without one,
            ``--wosac-rollouts`` < 1.
    """
    for mode in modes:
        mode.check(opts)
    default, read = ModeOptions(), {o for m in modes for o in m.options}
    for name in sorted({o for m in MODES.values() for o in m.options} - read):
        if getattr(opts, name) != getattr(default, name):  # a flag that would do nothing
            owners = " / ".join(m.name for m in MODES.values() if name in m.options)
            raise UserError(f"--{name.replace('_', '-')} is read by --mode {owners} only: add that mode, or drop the flag")
    own = [m for m in modes if m.protocol is not None]
    if own and len(modes) > 1:
        raise UserError(f"--mode {own[0].name} runs alone: evaluate the other modes in a separate call")
    if cfg.export_rollouts and not own:
        raise UserError("--export-rollouts needs --mode wosac")
    if cfg.wosac_goal != "stop" and not own:
        raise UserError("--wosac-goal needs --mode wosac")
    if own and cfg.wosac_rollouts < 1:
        raise UserError(f"--wosac-rollouts must be >= 1, got {cfg.wosac_rollouts}")
    if not (math.isfinite(cfg.temperature) and cfg.temperature > 0):
        raise UserError(f"--temperature must be a finite number > 0, got {cfg.temperature}")
    if cfg.temperature != 1.0 and not cfg.stochastic and not own:
        raise UserError(f"--temperature {cfg.temperature}: actions are not sampled here; add --stochastic "
                        "(or use --mode wosac, which samples)")
    return own[0] if own else None


def _run_protocol(mode, policies: list[dict], base, base_notes: list, cfg: EvalConfig, device, threads: int,
                  progress) -> dict:
    """Run a mode with its own protocol (checkpoints sample their actions) and add the run settings
    to its results (the keys :func:`evaluate` documents that such a mode has)."""
    sampled = dataclasses.replace(cfg, stochastic=True)
    res = mode.protocol(policies, lambda entry, env: _make_driver(entry, env, sampled), base, cfg, device, progress)
    res.update(data=cfg.data, device=str(device), num_threads=threads, seed=cfg.seed, deterministic=False,
               temperature=cfg.temperature, ensemble_draw=cfg.ensemble_draw, interval=cfg.interval, level=cfg.level,
               notes=base_notes + res.get("notes", []))
    return res


@torch.no_grad()
def evaluate(cfg: EvalConfig, progress=None) -> dict:
    """Run the evaluation (module docstring) and return the results as plain data.

    Args:
        cfg: :class:`EvalConfig`.
        progress: optional ``rich.progress.Progress`` to advance (one task per policy and mode).

    Returns:
        ``{"data", "device", "num_threads", "seed", "deterministic", "interval", "level",
        "episodes_per_scenario", "num_worlds", "k_trials", "env", "skipped" (+ ``shard_scenarios`` for a
        shard), "notes", "files", "num_scenarios", "runs"}``;
        each run is ``{"label", "policy", "mode", "scenarios" (ids, pack order), "summary" {metric:
        Interval} (trial logs included in trial mode), "per_scenario" [...], "records" (the per
        agent-episode columns of :func:`train.eval.sweep.run_sweep`), "global_step"?}`` (a mode with
        its own ``protocol``: what it returns, e.g. :func:`train.eval.wosac.evaluate_wosac`). Use
        :func:`to_json` for a JSON-ready copy (without the records), :func:`write_records` for the records.

    Raises:
        UserError, FileNotFoundError, ValueError (incl. ``ScenarioError`` and ``CheckpointError``):
        bad flags, files or data, with a one-line message.
    """
    specs = _check(cfg)
    coplayers, partner_table = partner_styles(cfg.coplayer)
    for path in coplayers:  # named before any work, whatever the modes
        partner_file(path)
    cfg = dataclasses.replace(cfg, coplayer=tuple(coplayers))
    modes = [get_mode(m) for m in (("human_replay",) if cfg.human_replay else cfg.mode)]
    opts = ModeOptions.from_config(cfg)
    own = _check_modes(modes, cfg, opts)
    threads = apply_num_threads(cfg.num_threads)
    device = check_device(cfg.device)
    policies = _load_policies(specs, device, tuple(n for m in modes for n in m.policies))
    base, base_notes = base_env_config(policies, cfg)
    if cfg.partner_task is not None or cfg.partner_type_prob is not None:
        task = dict(partner_task=cfg.partner_task or base.partner_task, max_controlled=1)
        if cfg.partner_type_prob is not None:
            task["partner_type_prob"] = cfg.partner_type_prob
        if task["partner_task"] == "none":
            raise UserError("--partner-type-prob needs the partner task: add --partner-task crossing")
        try:
            base = base.replace(**task)
        except ValueError as e:
            raise UserError(f"--partner-task / --partner-type-prob: {one_line(e)}") from None
    refs = [e["spec"] for e in policies if e["kind"] == "baseline" and e["spec"] in PARTNER_BASELINES]
    if refs and base.partner_task == "none":  # without the task both references are log tracking
        raise UserError(f"--policy {refs[0]}: a reference of the partner task, which this evaluation does not run; "
                        f"add --partner-task crossing")
    if cfg.memory == "trial" and not base.trial_mode:  # no trial start to clear at: it would change nothing
        raise UserError(f"--memory trial: this evaluation runs no trials (goal behaviour {base.goal_behavior}, as the "
                        "first checkpoint was trained), so clearing the memory at trial starts changes nothing and the "
                        "figures would be the policy's as trained; pass --k-trials K")
    if cfg.memory == "trial" and base.trial_mode and not base.zero_trial_index:  # the exact memoryless control
        base = base.replace(zero_trial_index=True)
        base_notes.append("note: --memory trial: the trial_index observation column is zeroed "
                          "(--env.zero-trial-index), so every trial starts with the same observation")
    if own is not None:  # a mode with its own protocol (e.g. wosac: sampled actions, one scenario per batch)
        base_notes = training_scene_notes(policies, cfg.data) + base_notes  # its scenes are loaded there
        return _run_protocol(own, policies, base, base_notes, cfg, device, threads, progress)
    styles = eval_styles(base, cfg.style, policies[0]["label"])
    if partner_table is not None:
        if not base.reward_conditioning:
            raise UserError("--coplayer PATH@STYLE: the evaluated policy was trained without reward conditioning")
        base = base.replace(partner_styles=partner_table)
    out = {"data": cfg.data, "device": str(device), "num_threads": threads, "seed": cfg.seed,
           "deterministic": not cfg.stochastic, "decode": None if cfg.stochastic else cfg.decode,
           "ensemble_draw": cfg.ensemble_draw,
           "temperature": cfg.temperature if cfg.stochastic else None, "memory": cfg.memory or "as trained", "interval": cfg.interval,
           "level": cfg.level, "episodes_per_scenario": cfg.episodes_per_scenario,
           "k_trials": base.k_trials if base.trial_mode else 0,
           "env": _plain(dataclasses.asdict(base)), "skipped": [], "notes": base_notes, "runs": []}
    for (style, values), mode in [(st, m) for st in styles for m in modes]:
        env_config, pack, notes = mode_env(mode, style_env_config(base, values), cfg.data, device, stream=True)
        scene_notes = training_scene_notes(policies, cfg.data, pack)  # first lines: what the scenes are
        out["notes"][:0] = [n for n in scene_notes if n not in out["notes"]]
        out["notes"] += [n for n in notes if n not in out["notes"]]
        stats = getattr(pack, "stats", {}) or {}
        out["files"] = stats.get("files", pack.num_scenarios)
        for item in list(stats.get("errors", [])) + list(stats.get("skipped", [])):
            if item not in out["skipped"]:
                out["skipped"].append(dict(item))
        sharded = pack if isinstance(pack, ShardedPack) else None
        S, N = pack.num_scenarios, mode.episodes(opts)
        W = cfg.num_worlds or default_num_worlds(min(S, cfg.chunk_size if sharded else S) * N)
        out["num_worlds"], out["num_scenarios"] = W, S
        with warnings.catch_warnings():
            if sharded is None:  # the note below says it (a streamed chunk's own warning stays)
                warnings.filterwarnings("ignore", message=f".*{LEFT_OUT}")
            env = make_sweep_env(first_pack(sharded) if sharded else pack, W, env_config, device, cfg.seed)
        if int(env_config.goal_candidates) >= 2 and sharded is None:  # memory-task agents not counted, said once
            said = left_out_message(env.pack, env_task_pool(env.sim)[1], int(env_config.goal_candidates))
            out["notes"] += [f"note: {said}"] if said is not None and f"note: {said}" not in out["notes"] else []
        _check_policies(policies, env, cfg)  # before any sweep
        context = mode.prepare(env, opts)  # what the mode builds once per env (the partner pool, ...)
        for entry in policies:
            driver = mode.drive(_make_driver(entry, env, cfg), context, opts)
            torch.manual_seed(cfg.seed)
            env.reset(seed=cfg.seed)
            task = None
            if progress is not None:
                task = progress.add_task(escape(f"{entry['label']} ({mode.name})"), total=S * N)
            on_batch = (lambda n, t=task: progress.advance(t, n)) if task is not None else None
            if sharded is None:
                agents, worlds = run_sweep(env, driver, sweep_plan(S, N, W), egos=mode.egos, on_batch=on_batch)
                ids = list(pack.scenario_ids)
            else:
                agents, worlds, ids = _stream(env, driver, sharded, cfg.chunk_size, N, mode, on_batch, out["skipped"])
            label = entry["label"] if len(modes) == 1 else f"{entry['label']} ({mode.name})"
            label = label if style is None else f"{label} [{style}]"
            run = {"label": label, "policy": entry["spec"], "mode": mode.name, "style": style, "scenarios": ids,
                   **mode.summarise(ego_rows(agents), worlds, len(ids), context, opts), "records": agents}
            run.update(mode.describe(context))
            if entry["kind"] == "checkpoint":
                run["global_step"] = int(entry["ckpt"].get("global_step", 0))
            out["runs"].append(run)
    return out


def _stream(env, driver, sharded, chunk_size: int, episodes: int, mode, on_batch,
            skipped: list) -> tuple[dict, dict, list[str]]:
    """The streaming sweep of a sharded pack (:func:`train.eval.streaming.streaming_sweep`):
    ``(agents, worlds, scenario ids run)`` with record ``scenario`` = index into those ids (as the
    in-memory sweep); an unreadable shard is added to ``skipped`` (file, reason).

    Raises:
        PackFileError: no shard could be read.
    """
    agents, worlds, run = streaming_sweep(env, driver, sharded, episodes=episodes, chunk_size=chunk_size,
                                          egos=mode.egos, on_batch=on_batch)
    done = set(run)
    for i in range(sharded.num_shards):
        left = [g for g in sharded.shard_scenarios(i) if g not in done]
        item = {"file": str(sharded.shard_file(i)), "reason": f"unreadable shard, {len(left)} scenario(s) left out",
                "shard_scenarios": len(left)}
        if left and item not in skipped:
            skipped.append(item)
    if not run:
        raise PackFileError(sharded.path, "", "no readable shard; convert the data again")
    agents, worlds = local_records(agents, worlds, run, sharded.num_scenarios)
    return agents, worlds, [sharded.scenario_ids[g] for g in run]


def _plain(x):
    if isinstance(x, enum.Enum):
        return str(x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def to_json(results: dict) -> dict:
    """A JSON-ready copy of :func:`evaluate`'s results (intervals as ``{mean, lo, hi, n}``, NaN as null)."""
    res = dict(results)
    res["runs"] = [{**{k: v for k, v in r.items() if k != "records"},
                    "summary": {k: iv.to_dict() for k, iv in r["summary"].items()}} for r in results["runs"]]
    return _plain(res)


def write_records(results: dict, path) -> int:
    """Write one JSON line per evaluated agent-episode to ``path``: ``policy`` (run label),
    ``mode``, ``role`` (``ego`` or ``coplayer``), ``scenario`` (id), ``scenario_index``,
    ``repetition``, ``world``, ``slot`` and the metric columns (``goal_reached``, ``collided``,
    ``offroad``, ``score``, ``episode_return``, ``episode_length``; in trial mode
    ``trial_k_score`` and ``trial_k_clean_score`` per trial k, 0/1, and ``trial_k_goal_step``,
    the step within trial k at which the goal was reached, null if not), through the atomic writer.
    Returns the number of lines.

    Raises:
        OutputError: the file cannot be written (one line naming it and the cause).
    """
    n = 0
    with atomic_write(path, "w", flag="--records") as f:
        for run in [r for r in results["runs"] if "records" in r]:
            cols = {k: v.tolist() for k, v in run["records"].items()}
            ids = run["scenarios"]
            for i in range(len(cols["scenario"])):
                ego = cols["ego"][i] > 0 if "ego" in cols else True
                row = {"policy": run["label"], "mode": run["mode"], "role": "ego" if ego else "coplayer",
                       "scenario": ids[int(cols["scenario"][i])], "scenario_index": int(cols["scenario"][i])}
                row.update({k: v[i] for k, v in cols.items() if k not in ("scenario", "ego")})
                for k in [k for k in row if k.endswith("_goal_step")]:
                    row[k] = None if row[k] < 0 else row[k]
                if "time_to_goal" in row and row["time_to_goal"] != row["time_to_goal"]:
                    row["time_to_goal"] = None  # not reached (NaN is not JSON)
                f.write(json.dumps(row) + "\n")
                n += 1
    return n


def skipped_header(results: dict) -> str:
    """The line above the skipped items: source files left out at conversion (of the files
    converted) and unreadable shards (with the scenarios they held, of the dataset's)."""
    shards = [s for s in results["skipped"] if "shard_scenarios" in s]
    n, files = len(results["skipped"]) - len(shards), results.get("files", "?")
    lost = sum(s["shard_scenarios"] for s in shards)
    parts = ([f"{n} of {files} file(s) skipped"] if n else []) + (
        [f"{len(shards)} unreadable shard(s), {lost} of {results.get('num_scenarios', '?')} scenario(s) left out"]
        if shards else [])
    return "data: " + "; ".join(parts) + ":"


#: The summary title's words for ``--memory`` (what was run, with the flag that runs it again).
MEMORY_TITLES = {
    "trial": "memoryless control (--memory trial: KV cache cleared at every trial start); ",
    "episode": "memory kept across the trials (--memory episode); ",
}


def training_scene_notes(policies: list[dict], data: str, pack=None) -> list[str]:
    """A warning for every checkpoint evaluated on scenes it was trained on.

    What the scenes are is compared, not where they lie: a checkpoint that records the scenario ids
    it trained on (``extra[train.checkpoint.TRAINING_SCENES_KEY]``, :func:`train.run._save`) is
    compared by id with ``pack``'s scenes (a copy of the training scenes in another directory is
    still warned about). An older checkpoint records only its training ``--data``
    (``ckpt["config"]["data"]``: a path, or a list of paths): when those directories still exist
    and hold scenario files, their file stems are compared with the ids and file stems of
    ``pack``'s scenes; otherwise (or without ``pack``) the recorded path is compared with ``data``
    (after :func:`train.config.resolve_path` and ``Path.resolve``; a recorded path that no longer
    exists as written).

    Args:
        policies: :func:`_load_policies` entries. data: the evaluation's ``--data``.
        pack: the evaluated :class:`~gpusim.data.ScenarioPack` or
            :class:`~gpusim.data.shards.ShardedPack` (None: compare paths only).

    Returns:
        One line per such checkpoint (empty when none): ``warning: LABEL was trained on DATA: these
        are its training scenes ...`` when every evaluated scene is one, ``warning: LABEL: n of m
        scenes evaluated here are among its training scenes ...`` when some are.
    """
    from train.checkpoint import TRAINING_SCENES_KEY

    here = resolve_path(data).resolve()
    scenes = None  # per evaluated scene, the names it may have been recorded under: its id and file stem
    if pack is not None:
        files = list(getattr(pack, "source_files", None) or [None] * len(pack.scenario_ids))
        scenes = [{i} | ({scenario_stem(f)} if f else set()) for i, f in zip(pack.scenario_ids, files)]
    out = []
    checkpoints = [(entry, member) for entry in policies if entry["kind"] == "checkpoint"
                   for member in _members(entry)]  # an ensemble: each member's scenes
    for p, ckpt in checkpoints:
        trained = (ckpt.get("config") or {}).get("data")
        paths = [trained] if isinstance(trained, str) else [str(x) for x in trained or []]
        src = ", ".join(paths) or "(not recorded)"
        all_of = (f"warning: {p['label']} was trained on {src}: these are its training scenes, so its figures here "
                  "are not held-out figures (docs/data.md: the split)")
        known = (ckpt.get("extra") or {}).get(TRAINING_SCENES_KEY)
        if known is None and scenes is not None:
            dirs = [resolve_path(x) for x in paths]
            if dirs and all(d.is_dir() for d in dirs):  # an older checkpoint: the scene files still there
                known = [scenario_stem(f) for d in dirs for f in d.iterdir() if is_scenario_file(f)] or None
        if known is not None and scenes is not None:
            known = set(known)
            n = sum(bool(names & known) for names in scenes)
            if n and n == len(scenes):
                out.append(all_of)
            elif n:
                out.append(f"warning: {p['label']}: {n} of {len(scenes)} scenes evaluated here are among its training "
                           f"scenes ({src}), so its figures here are not held-out figures (docs/data.md: the split)")
            continue
        if any(resolve_path(x).resolve() == here for x in paths):
            out.append(all_of)
    return list(dict.fromkeys(out))  # an ensemble's members may repeat a line


def print_results(results: dict, console, per_scenario_table: bool = True) -> None:
    """The skipped files, the summary table and (optionally) the per-scenario table(s)."""
    reports = {get_mode(r["mode"]).report for r in results["runs"]} - {None}
    if reports:  # modes with their own protocol print their own results
        for report in reports:
            report(results, console)
        return
    if results["skipped"]:
        console.print(f"[yellow]{escape(skipped_header(results))}[/yellow]")
        for item in results["skipped"]:
            console.print(f"  skipped {item.get('file', '?')}: {item.get('reason', '?')}", soft_wrap=True)
    for note in results.get("notes", []):
        console.print(note, soft_wrap=True)
    runs = results["runs"]
    for r in runs:
        if r.get("repeated_episodes"):
            console.print(escape(f"{r['label']}: {r['repeated_episodes']} repeated episode(s) identical to an earlier "
                                 "repetition of their scenario counted once (a deterministic policy in a "
                                 "deterministic env replays itself; docs/evaluation.md)"), soft_wrap=True)
        if r.get("partners"):
            console.print(escape(f"{r['label']}: co-players driven by {', '.join(r['partners'])} (one drawn per "
                                 "world per episode); figures are the egos'"), soft_wrap=True)
    env = results["env"]
    level = int(round(100 * results["level"]))
    method = "cluster-robust normal" if results["interval"] == "normal" else "cluster bootstrap"
    title = (f"{results['data']}: {len(runs[0]['scenarios'])} scenarios x {results['episodes_per_scenario']} "
             f"episode(s); goal {env['goal_behavior']}, collision {env['collision_behavior']}, offroad "
             f"{env['offroad_behavior']}{', %d trials' % results['k_trials'] if results['k_trials'] else ''}; "
             f"{(results.get('decode') or 'argmax') if results['deterministic'] else 'sampled'} actions; "
             f"{MEMORY_TITLES.get(results.get('memory'), '')}{level}% CI of the mean over "
             f"agent-episodes, clustered by scenario ({method})")
    console.print(summary_table(runs, title))
    by_ids: dict = {}
    for r in runs:
        by_ids.setdefault(tuple(r["scenarios"]), []).append(r)
    for ids, group in by_ids.items():
        if per_scenario_table:
            console.print(scenario_table(group, list(ids), "per scenario"))
        else:
            console.print(escape(f"scenarios run ({results['episodes_per_scenario']} episode(s) each): "
                                 + ", ".join(ids)), soft_wrap=True)


def main(argv=None) -> int:
    """CLI entry point: returns 0, or 2 after a one-line message for a user error (tracebacks
    only with ``--debug``)."""
    import tyro
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from train.config import cli_registry
    from train.logger import make_console

    cfg = tyro.cli(EvalConfig, args=argv, registry=cli_registry(), description=__doc__.split("\n\n")[0])
    err = Console(stderr=True, highlight=False)
    try:
        if cfg.quiet:
            results = evaluate(cfg)
        else:
            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("world-episodes"), TimeElapsedColumn())
            with Progress(*columns, console=err, transient=False) as progress:
                results = evaluate(cfg, progress)
    except USER_ERRORS as e:
        if cfg.debug:
            raise
        print(f"error: {one_line(e)}  (--debug shows the traceback)", file=sys.stderr)
        return 2
    if not cfg.quiet:  # the table first: a write that fails after the checks still shows it
        console = make_console()  # the terminal's width, or wide enough for a file or pipe (no cut cells)
        print_results(results, console, cfg.per_scenario)
    try:
        if cfg.json:
            write_text(cfg.json, json.dumps(to_json(results), indent=1), flag="--json")
        if cfg.records:
            write_records(results, cfg.records)
    except OutputError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    if cfg.json and not cfg.quiet:
        console.print(f"results written to {cfg.json}")
    if (results.get("export") or {}).get("error"):
        if cfg.quiet:
            print(f"error: {results['export']['error']}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from train.config import one_line_warnings

    one_line_warnings("--debug" in sys.argv)  # here, not in main(): the format is process-wide
    sys.exit(main())
