"""Evaluation modes: who the evaluated policy (the *ego*) drives and who drives everyone else.

A mode is one :class:`EvalMode` entry in :data:`MODES`, added with :func:`register_mode`; the
evaluator (``train/evaluate.py``) and the periodic evaluation of training (:mod:`train.eval.live`)
run the same sweep for every mode asked (``--mode a b ...``) through the entry's hooks and never
test a mode's name:

* ``env_changes``: ``EnvConfig.replace`` arguments (e.g. one ego per world);
* ``egos(env)``: the slots whose agent-episodes are reported;
* ``check(opts)``: refuse missing flags before anything is loaded;
* ``prepare(env, opts)``: what the mode builds once per env (e.g. the partner pool), its *context*;
* ``drive(driver, context, opts)``: the driver the sweep steps, wrapping the evaluated policy's
  (e.g. partners acting for the co-player slots; a driver clearing the KV cache at trial starts);
* ``describe(context)``: extra fields of the mode's runs in the results (e.g. the partners' labels);
* ``episodes(opts)``: how many times every scenario runs (default ``--episodes-per-scenario``);
* ``summarise(egos, worlds, num_scenarios, context, opts)``: the run's ``summary`` (metric ->
  :class:`train.eval.stats.Interval`) and ``per_scenario`` rows (default: the outcome rates of
  :mod:`train.eval.report`); a mode with other metrics (e.g. realism scores of trajectories its
  ``drive`` wrapper recorded into its context) computes them here.

``opts`` is a :class:`ModeOptions`. A new mode = one :func:`register_mode` call here (plus, if it
reads a new option, a field of :class:`ModeOptions` and the same-named flag of
``train/evaluate.py``'s ``EvalConfig``).

* ``self_play``: the policy drives every controlled slot (all are egos); other agents replay the log.
* ``human_replay``: one ego per world (the first controlled slot: the self-driving car when it
  qualifies), every other agent log-replayed: the env gets ``max_controlled = 1``.
* ``wosac``: WOSAC realism (``train/eval/wosac.py``), a mode with its own ``protocol`` (32 sampled
  rollouts of one scenario per env instead of the sweep) that accepts ``log_replay`` as a policy and
  prints its own ``report``; evaluator only, alone.
* ``coplayer``: one ego per world (``EnvConfig.ego_slots = 1``: the self-driving car where it is
  controllable, else a slot drawn with the env's seeded generator), the other controlled slots
  driven by frozen partner checkpoints (``--coplayer PATH ...``, one drawn per world per episode,
  ``train/coplayer.py``); the egos are the env's role mask ``EnvState.ego``.

Every mode sets the role options itself, so a checkpoint trained with co-players runs
``self_play`` with every slot an ego.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch

from train.config import UserError, resolve_path
from train.eval.report import per_scenario, summarise
from train.packs import adapt_env_config, load_pack


@dataclass(frozen=True)
class ModeOptions:
    """The options a mode's hooks may read.

    Attributes:
        coplayer: partner checkpoint paths (``--coplayer``). coplayer_sample: partners sample their
            actions instead of argmax. seed: env, partner-draw and sampling seed.
        episodes_per_scenario: runs of every scenario. interval, level, resamples: confidence
            intervals (:func:`train.eval.stats.mean_interval`).
        flag: the flag that named the modes (``--mode``, ``--eval-mode``), for messages.
    """

    coplayer: tuple[str, ...] = ()
    coplayer_sample: bool = False
    seed: int = 0
    episodes_per_scenario: int = 1
    interval: str = "normal"
    level: float = 0.95
    resamples: int = 2000
    flag: str = "--mode"

    @classmethod
    def from_config(cls, cfg, **override) -> "ModeOptions":
        """The options of any config object with same-named attributes (``EvalConfig``,
        ``TrainConfig``); missing ones keep the defaults, ``override`` wins."""
        values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls) if hasattr(cfg, f.name)}
        values.update(override)
        return cls(**values)


def _all_active(env) -> torch.Tensor:
    return env.state.slot_active.clone()


def _ego_role(env) -> torch.Tensor:
    return env.state.ego.clone()


def outcome_summary(egos: dict, worlds: dict, num_scenarios: int, context, opts: ModeOptions) -> dict:
    """The default ``summarise`` hook: ``{"summary": {metric: Interval}, "per_scenario": [...]}`` of
    the ego agent-episode columns (goal, collision, offroad, score, return; trial scores in trial
    mode: :func:`train.eval.report.summarise` and :func:`train.eval.report.per_scenario`), and
    ``"repeated_episodes"``: the number of world-episodes that replayed an earlier repetition of
    their scenario exactly and were counted once (:func:`train.eval.report.repeated_episodes`)."""
    repeats: list = []
    summary = summarise(egos, worlds, opts.interval, opts.level, opts.resamples, opts.seed, repeats=repeats)
    return {"summary": summary, "per_scenario": per_scenario(egos, num_scenarios), "repeated_episodes": len(repeats)}


@dataclass(frozen=True)
class EvalMode:
    """One evaluation mode (the hooks of the module docstring).

    Attributes:
        name: CLI name. doc: one line for ``--help`` and reports.
        env_changes: ``EnvConfig.replace`` arguments applied to the evaluation env settings.
        egos: ``egos(env) -> [W, C] bool`` ego slots right after a reset.
        check: ``check(opts)``; raises :class:`UserError` for a missing or bad option.
        prepare: ``prepare(env, opts) -> context`` built once per env (default None).
        drive: ``drive(driver, context, opts) -> driver`` for one evaluated policy (default: as is).
        describe: ``describe(context) -> dict`` extra fields of each run (default none).
        episodes: ``episodes(opts) -> int`` runs of every scenario (default ``opts.episodes_per_scenario``).
        summarise: ``summarise(egos, worlds, num_scenarios, context, opts) -> {"summary",
            "per_scenario"}`` (default :func:`outcome_summary`).
        protocol: a mode with its own protocol instead of the sweep (default None):
            ``protocol(entries, make_driver, base_env_config, cfg, device, progress) -> {"runs",
            "skipped", "notes", ...}``; it runs alone (not with other modes).
        policies: extra ``--policy`` names the mode understands besides the baselines.
        report: ``report(results, console)`` prints a ``protocol`` mode's results (default None).
        options: the :class:`ModeOptions` fields only this mode reads (e.g. ``coplayer``); the
            evaluator refuses one set away from its default when no mode that reads it runs.
    """

    name: str
    doc: str
    env_changes: tuple = ()
    egos: Callable = _all_active
    check: Callable[[ModeOptions], None] = lambda opts: None
    prepare: Callable[[Any, ModeOptions], Any] = lambda env, opts: None
    drive: Callable[[Any, Any, ModeOptions], Any] = lambda driver, context, opts: driver
    describe: Callable[[Any], dict] = lambda context: {}
    episodes: Callable[[ModeOptions], int] = lambda opts: opts.episodes_per_scenario
    summarise: Callable[..., dict] = outcome_summary
    protocol: Callable | None = None
    policies: tuple[str, ...] = ()
    report: Callable | None = None
    options: tuple[str, ...] = ()

    def env_config(self, base):
        """``base`` (an :class:`~gpusim.config.EnvConfig`) with this mode's changes."""
        return base.replace(**dict(self.env_changes)) if self.env_changes else base


#: The registry: mode name -> :class:`EvalMode` (filled by :func:`register_mode`).
MODES: dict[str, EvalMode] = {}


def register_mode(mode: EvalMode) -> EvalMode:
    """Add ``mode`` to :data:`MODES` and return it.

    Raises:
        ValueError: a mode of that name is already registered.
    """
    if mode.name in MODES:
        raise ValueError(f"evaluation mode {mode.name!r} is already registered")
    MODES[mode.name] = mode
    return mode


def get_mode(name: str) -> EvalMode:
    """The mode called ``name``.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if name in MODES:
        return MODES[name]
    raise ValueError(f"--mode {name!r}: unknown mode; known: {', '.join(MODES)}")


def mode_env(mode: EvalMode, base, data: str, device, stream: bool = False) -> tuple:
    """``(env_config, pack, notes)`` of ``mode``: the pack of ``data`` (converted with the mode's
    settings, or loaded; with ``stream`` a sharded pack directory is only opened: a
    :class:`gpusim.data.shards.ShardedPack`, streamed later) and the env settings adapted to a saved
    pack (:func:`train.packs.adapt_env_config`; the mode's own changes count as set by the user).

    Raises:
        UserError: the mode changes ``max_controlled`` and the saved pack was built with another
            value; as :func:`train.packs.load_pack` and :func:`train.packs.adapt_env_config`.
    """
    from gpusim.data.shards import ShardedPack, is_sharded

    env_config = mode.env_config(base)
    path = resolve_path(data)
    pack = ShardedPack.open(path) if stream and is_sharded(path) else load_pack(data, env_config, device)
    changed = {k for k, _ in mode.env_changes}
    built = getattr(getattr(pack, "config", None), "max_controlled", env_config.max_controlled)
    if "max_controlled" in changed and built != env_config.max_controlled:
        raise UserError(f"--mode {mode.name} needs a pack with max_controlled={env_config.max_controlled}, "
                        f"{data} was built with {built}: pass the WOMD JSON directory as --data, or convert "
                        f"with `python -m gpusim.data convert ... --max-controlled {env_config.max_controlled}`")
    env_config, notes = adapt_env_config(env_config, pack, changed)
    return env_config, pack, notes


# ----------------------------------------------------------------------------------- the modes
_NO_ROLES = (("ego_slots", 0), ("ego_fraction", 0.0))


def _needs_partners(opts: ModeOptions) -> None:
    if not opts.coplayer:
        raise UserError(f"{opts.flag} coplayer needs partner checkpoints: --coplayer PATH [PATH ...]")


def _partner_pool(env, opts: ModeOptions):
    from train.coplayer import make_pool

    return make_pool(opts.coplayer, env, env.device, seed=opts.seed, deterministic=not opts.coplayer_sample)


def _with_partners(driver, pool, opts: ModeOptions):
    from train.eval.sweep import CoplayerDriver

    pool.generator.manual_seed(opts.seed)  # the same partner draws for every evaluated policy
    return CoplayerDriver(driver, pool)


register_mode(EvalMode("self_play", "the policy drives every controlled agent", env_changes=_NO_ROLES))
register_mode(EvalMode(
    "coplayer", "one ego per world (the SDC where controllable), the other controlled agents driven by the "
    "--coplayer partners", env_changes=(("ego_slots", 1), ("ego_fraction", 0.0)), egos=_ego_role,
    check=_needs_partners, prepare=_partner_pool, drive=_with_partners,
    describe=lambda pool: {"partners": pool.labels}, options=("coplayer", "coplayer_sample")))
register_mode(EvalMode("human_replay", "one ego per world (first controlled slot), all others log-replayed",
                       env_changes=(("max_controlled", 1),) + _NO_ROLES))


def _wosac(entries, make_driver, base, cfg, device, progress):
    from train.eval.wosac import evaluate_wosac

    return evaluate_wosac(entries, make_driver, base, cfg.data, ModeOptions.from_config(cfg),
                          rollouts=cfg.wosac_rollouts, device=device, progress=progress, export=cfg.export_rollouts,
                          goal=cfg.wosac_goal)


def _evaluator_only(opts: ModeOptions) -> None:
    if opts.flag != "--mode":
        raise UserError(f"{opts.flag} wosac: not available during training; run `python train/evaluate.py "
                        "--policy CHECKPOINT --mode wosac` on a saved checkpoint")


def _print_wosac(results, console):
    from train.eval.wosac import print_wosac

    print_wosac(results, console)


register_mode(EvalMode(
    "wosac", "WOSAC realism (2025 config): 32 sampled rollouts of 80 steps from log step 10 per scenario, "
    "scored against the log (train/eval/wosac.py)", protocol=_wosac, policies=("log_replay",), report=_print_wosac,
    check=_evaluator_only))
