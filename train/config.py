"""Typed configuration of ``python train/run.py`` (parsed with tyro).

Nested groups become flag prefixes: ``--env.*`` (:class:`gpusim.config.EnvConfig`, enum values by
lower-case name, e.g. ``--env.goal-behavior stop``), ``--policy.*`` (:class:`policy.PolicyConfig`)
and ``--ppo.*`` (:class:`train.ppo.PPOConfig`).

The defaults written here are the CPU recipe, tuned for a 2-core CPU (docs/training.md): the
default run takes about 10-13 minutes and learns to drive on ``data/womd_sample``. On a CUDA
device the GPU recipe (:mod:`train.recipes`: 1024 worlds, 40M steps) replaces some of them;
flags given explicitly win over both.
"""

from __future__ import annotations

import dataclasses
import pathlib
import types
import typing
from dataclasses import dataclass, field
from typing import Literal

import torch

from gpusim.config import EnvConfig, NamedEnum, check_finite
from policy.actor_critic import PolicyConfig
from train.ppo import PPOConfig

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


class UserError(Exception):
    """A mistake in the command line, the files it names or the installed packages: the CLIs print
    the message as one line and exit with code 2 (the traceback only with ``--debug``)."""


#: Errors that are the user's to fix: the CLIs (``train/run.py``, ``train/evaluate.py``) print them as
#: one line and exit with code 2 (``ScenarioError`` and ``CheckpointError`` are ValueErrors).
USER_ERRORS = (UserError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, ValueError,
               ImportError)


def one_line(exc: BaseException) -> str:
    """``exc``'s message on one line (first line; the exception type when there is no message)."""
    text = str(exc).strip()
    if isinstance(exc, KeyError) or not text:
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text.splitlines()[0]


def one_line_warnings(debug: bool = False) -> None:
    """Make the CLIs print each warning as one line, ``warning: <message>`` (no source line).

    ``warnings.warn`` normally prints ``file:line: Category: message`` and then the line of source
    that raised it, which reads as a crash to a user. ``train/run.py``, ``train/evaluate.py`` and
    ``train/bc.py`` call this when run as scripts (not in ``main``: the format is process-wide);
    with ``debug`` (``--debug``) the default format stays.
    """
    if debug:
        return
    import warnings

    def fmt(message, category, filename, lineno, line=None):  # noqa: ARG001 (warnings' signature)
        return f"warning: {message}\n"

    warnings.formatwarning = fmt


def default_device() -> str:
    """``cuda`` if a CUDA device is available, else ``cpu``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(device: str) -> torch.device:
    """``torch.device(device)``, refusing a CUDA device when none is available.

    Raises:
        UserError: unknown device string, or ``cuda`` without CUDA (says what to pass instead).
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise UserError(f"--device {device}: not a torch device ({e}); use cpu or cuda") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {device}: no CUDA device is available to torch "
                        f"(torch {torch.__version__}, torch.cuda.is_available() is False); use --device cpu")
    return dev



def keep_best_entry(spec: str, eval_interval: int, eval_mode) -> tuple[str, float]:
    """The periodic-evaluation entry ``--keep-best`` follows and its sign: ``(entry, +1.0)`` when
    higher is better, ``(entry, -1.0)`` for a spec written with a leading ``-``.

    Raises:
        ValueError: one line naming ``--keep-best``: no periodic evaluation (``eval_interval`` 0), an
            entry not of the form ``eval/<mode>/<metric>``, or a mode outside ``eval_mode``.
    """
    sign = -1.0 if spec.startswith("-") else 1.0
    entry = spec[1:] if sign < 0 else spec
    parts = entry.split("/")
    if len(parts) != 3 or parts[0] != "eval" or not parts[2]:
        raise ValueError(f"--keep-best {spec}: expected eval/<mode>/<metric> (e.g. eval/self_play/goal_reached, "
                         "or -eval/self_play/collision_or_offroad when lower is better)")
    if int(eval_interval) <= 0:
        raise ValueError(f"--keep-best {spec}: needs the periodic evaluation; pass --eval-interval N "
                         "(and --eval-data, e.g. the validation split)")
    if parts[1] not in tuple(eval_mode):
        raise ValueError(f"--keep-best {spec}: mode {parts[1]!r} is not evaluated; --eval-mode is "
                         f"{' '.join(eval_mode)}")
    return entry, sign


@dataclass
class TrainConfig:
    """Everything ``train/run.py`` needs.

    Attributes:
        data: scenario directory (WOMD JSON files) or a saved pack (directory with ``pack.pt`` or a
            ``.pt`` file). Relative paths are tried against the current directory, then the
            repository root (so the default works from any cwd).
        env: environment settings. Training defaults differ from ``EnvConfig()`` in two places:
            ``max_controlled=8`` (the sample scenarios have at most 8 controlled agents) and
            ``collision_behavior = offroad_behavior = remove`` (rewards unchanged: a contact costs
            -0.5 once and ends the agent's episode). With ``ignore`` the -0.5 penalty repeats
            on every step in contact, and PPO first learns to slow down, which lowers the goal
            rate for the whole CPU budget (docs/training.md).
        policy: model sizes. ppo: PPO hyper-parameters (entropy coefficient 0.001 by default here:
            with 0.005, three seeds evaluated at goal 0.72 / contacts 0.22 on the sample, with
            0.001 at 0.84 / 0.10; docs/training.md, "Reward shaping and the entropy
            coefficient").
        num_worlds: parallel worlds W (rows per rollout = W * max_controlled).
        pool_size: P > 0 streams the data (``gpusim.data.pool``): worlds draw from a resident pool
            of P scenarios, a quarter of which is replaced every ``resample_every`` episodes by a
            background loader (every scenario enters once per pass over the data); 0 keeps the
            whole dataset on the device. ``data`` may be a sharded pack directory either way.
        resample_every: K >= 1 episodes between pool refreshes (with ``pool_size``).
        total_timesteps: stop after this many controlled-agent steps (active slots x horizon per
            rollout; idle steps of finished agents count, empty slots do not). Default 2M, the CPU recipe's budget
            (1M left the policy far below ``steer_to_goal``). Measured on the bundled sample over
            seeds 1-3: goal 0.837 (0.854 / 0.829 / 0.829), collision + offroad 0.098, against
            ``steer_to_goal``'s goal 0.829; about 10-13 min on 2 CPU cores (docs/training.md,
            "Results").
        learning_rate, anneal_lr: Adam learning rate, linearly annealed to 0 over the run if set.
        adam_eps: Adam epsilon.
        device: ``cuda`` if available else ``cpu``.
        seed: seeds torch, the env and the minibatch permutations.
        log_dir: run directory parent; ``metrics.jsonl`` is written to ``log_dir/run_name``.
        run_name: defaults to ``<date>-<time>-s<seed>``.
        checkpoint_dir: where checkpoints go (default: the run directory).
        checkpoint_interval: save every this many updates (and at the end); 0 = only at the end.
        resume: checkpoint file to continue from (step, weights, optimizer, RNG).
        report_interval: console/JSONL report every this many updates (and at the end).
        experience: experience hook name (``progress``, ``identity``, ``relabel``, ``goal_bonus``,
            ``drop``, or ``MODULE:CLASS``). experience_arg: its ``KEY=VALUE`` arguments. Default
            ``progress``: potential-based shaping toward the goal,
            ``F = 3 * (d_t - gamma * d_{t+1})`` with ``d`` the goal distance / 100 m
            (:class:`train.experience.ProgressShaping`); the env's rewards are unchanged. On the
            bundled sample one 2M-step seed reached goal 0.415 without it and 0.902 with it
            (docs/training.md, "Reward shaping");
            ``--experience identity`` trains on the env's rewards alone. With the memory task
            (``--env.goal-candidates`` >= 2) the default is ``candidate_progress`` (toward the
            nearest candidate) and ``progress`` is refused (it would point at the true goal).
        wandb: also log to Weights & Biases (optional package). wandb_mode: offline unless
            ``online``. wandb_project: project name.
        quiet: no console progress.
        config: a JSON or YAML file of these fields (nested ``env``/``policy``/``ppo`` groups) used
            as the defaults; flags given with it override it. The ``config.json`` a run saves
            replays that run (with a new ``--run-name``: an existing run directory is never
            overwritten). Only read by :func:`parse_args`.
        debug: show the full traceback of an error (otherwise one line, exit code 2).
        num_threads: torch CPU threads (``torch.set_num_threads``); 0 (default) keeps torch's
            default (one per core). On the idle 2-core development machine 2 threads train 1.6x
            faster than 1 (3.5K vs 2.2K agent-steps/s); on a CPU shared with other jobs use 1: under
            load, 2 threads made env and policy steps 15-20x slower (docs/training.md).
        coplayer: partner checkpoints (population play, ``train/coplayer.py``): frozen policies
            driving the co-player slots, one drawn per world per episode. With them the env
            defaults to one ego per world (``--env.ego-slots 1``); without, every slot is an ego.
        coplayer_sample: partners sample their actions (default: argmax, a stationary partner).
        eval_interval: every this many updates (and at the end) evaluate the current policy with
            ``train/evaluate.py``'s sweep in ``eval_mode`` and log ``eval/<mode>/*``; 0 = never.
        eval_mode: ``self_play``, ``coplayer`` (the ``--coplayer`` partners), ``human_replay``.
        eval_data: scenarios of the periodic evaluation (default: ``data``).
        eval_episodes: runs of every scenario in each periodic evaluation (default 1; more where the
            task draws something per episode, e.g. the partner type of ``--env.partner-task``).
        keep_best: an entry of the periodic evaluation, ``eval/<mode>/<metric>`` (e.g.
            ``eval/self_play/goal_reached``; a leading ``-`` when lower is better, e.g.
            ``-eval/self_play/collision_or_offroad``): each time the periodic evaluation improves on
            it, the policy is also written to ``best.pt`` beside ``checkpoint.pt``, so a run is chosen
            at its best evaluation on ``--eval-data`` (e.g. the validation split), not at its last.
            Needs ``--eval-interval`` and ``<mode>`` among ``--eval-mode``. ``best.pt`` is a normal
            checkpoint for evaluation, rendering and shipping; a resume continues ``checkpoint.pt``
            and keeps the best value seen so far.
        cuda_graph: capture the steady-state rollout step (env step + policy) in a CUDA graph
            (``train/graphed_rollout.py``): ``auto`` = on when the device is CUDA and the env runs
            the Triton backend (``GPUSIM_CUDA_GRAPHS=0`` turns it off), ``on`` = wanted (one
            warning with the reason when it cannot be used), ``off``. A failed capture warns once
            and runs eagerly. Same results either way.
        trust_checkpoint_code: import an experience hook (``MODULE:CLASS``, or a ``drop`` hook's
            ``predicate=MODULE:FUNCTION``) that a checkpoint (``--resume``) or a ``--config`` file
            records. Without it such a hook is refused (one line, exit 2) unless ``--experience``
            names it on the command line: a file never makes the trainer import code by itself.
            Command line only: not saved in ``config.json`` or checkpoints, refused in a config file.
        init_policy: a checkpoint (e.g. ``train/bc.py``'s) whose weights start a new run's policy
            (BC initialisation, ``train/human.py``); its action space, dynamics and policy sizes
            must be the run's, and its observation layout too except in the blocks the ego MLP
            reads besides ``ego`` (candidate and style blocks: their input weights start at 0,
            :meth:`policy.ActorCritic.init_from`). Not used when resuming.
        setting: a named env setting (:data:`train.settings.SETTINGS`: ``goal``,
            ``sim_agent``) whose fields become the ``--env.*`` defaults; ``--env.*`` flags given
            win over it. None: :class:`TrainConfig`'s env.
        recipe: the defaults the command line starts from (:mod:`train.recipes`): ``auto`` = the
            GPU recipe on a CUDA device (1024 worlds, 40M steps, reports every 5 updates, the update on
            the non-removed steps only, ``--ppo.pack-removed``; bf16
            autocast and fused Adam stay off), else the CPU recipe (the defaults written here); ``cpu`` / ``gpu`` by
            name. Flags given explicitly win; not applied with ``--config``.
    """

    data: str = "data/womd_sample"
    env: EnvConfig = field(default_factory=lambda: EnvConfig(
        max_controlled=8, collision_behavior="remove", offroad_behavior="remove"))
    policy: PolicyConfig = field(default_factory=lambda: PolicyConfig(d_model=64, n_layers=2, n_heads=4, hidden=64,
                                                                       max_roads=32))
    ppo: PPOConfig = field(default_factory=lambda: PPOConfig(ent_coef=0.001))
    num_worlds: int = 32
    pool_size: int = 0
    resample_every: int = 1
    total_timesteps: int = 2_000_000
    learning_rate: float = 1e-3
    anneal_lr: bool = True
    adam_eps: float = 1e-5
    device: str = field(default_factory=default_device)
    seed: int = 1
    log_dir: str = "runs"
    run_name: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_interval: int = 0
    resume: str | None = None
    report_interval: int = 2
    experience: str = "progress"
    experience_arg: tuple[str, ...] = ()
    wandb: bool = False
    wandb_mode: Literal["offline", "online"] = "offline"
    wandb_project: str = "gpusim"
    quiet: bool = False
    num_threads: int = 0
    config: str | None = None
    debug: bool = False
    coplayer: tuple[str, ...] = ()
    coplayer_sample: bool = False
    eval_interval: int = 0
    eval_mode: tuple[str, ...] = ("self_play",)
    eval_data: str | None = None
    eval_episodes: int = 1
    keep_best: str | None = None
    cuda_graph: Literal["auto", "on", "off"] = "auto"
    recipe: Literal["auto", "cpu", "gpu"] = "auto"
    init_policy: str | None = None
    setting: str | None = None
    trust_checkpoint_code: bool = False

    def __post_init__(self):
        check_finite(self)  # the groups check their own fields
        if int(self.eval_episodes) < 1:
            raise ValueError(f"--eval-episodes {self.eval_episodes}: must be >= 1")
        if self.keep_best is not None:
            keep_best_entry(self.keep_best, self.eval_interval, self.eval_mode)

    def to_dict(self) -> dict:
        """Plain-data view (enums as lower-case names), for checkpoints and logs; without
        ``trust_checkpoint_code`` (a command-line decision, never replayed from a file)."""
        out = _plain(dataclasses.asdict(self))
        out.pop("trust_checkpoint_code", None)
        return out

    @classmethod
    def from_dict(cls, d: dict, source: str = "config") -> "TrainConfig":
        """Inverse of :meth:`to_dict` (also for hand-written files): missing fields keep the
        defaults of :class:`TrainConfig`, groups ``env``/``policy``/``ppo`` are built from their
        sub-dicts (enums by name).

        Raises:
            ValueError: unknown keys (named, with ``source``) or invalid values.
        """
        if not isinstance(d, dict):
            raise ValueError(f"{source}: expected a mapping of TrainConfig fields, got {type(d).__name__}")
        base = cls()
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ValueError(f"{source}: unknown field(s) {', '.join(unknown)} (see python train/run.py --help)")
        if d.get("trust_checkpoint_code"):
            raise ValueError(f"{source}: trust_checkpoint_code is a command-line decision (--trust-checkpoint-code), "
                             "not taken from a file")
        changes = {}
        hints = typing.get_type_hints(cls)
        for k, v in d.items():
            if k in ("env", "policy", "ppo"):
                group = getattr(base, k)
                sub = {f.name for f in dataclasses.fields(group)}
                if not isinstance(v, dict) and v is not None:
                    raise ValueError(f"{source}: {k}: expected a mapping of fields, got {v!r}")
                v = dict(v or {})
                bad = sorted(set(v) - sub)
                if bad:
                    raise ValueError(f"{source}: unknown field(s) {', '.join(k + '.' + b for b in bad)}")
                for name in ("action_factors",):
                    if isinstance(v.get(name), list):
                        v[name] = tuple(v[name])
                try:
                    v = dataclasses.replace(group, **v)
                except (TypeError, ValueError) as e:
                    raise ValueError(f"{source}: {k}: {e}") from e
            else:  # as the command line would: one line naming the file, the field and the value
                _check_type(source, k, v, hints[k])
            if k in ("experience_arg", "coplayer", "eval_mode"):
                v = tuple(v or ())
            elif k == "cuda_graph" and v not in ("auto", "on", "off"):
                raise ValueError(f"{source}: cuda_graph must be 'auto', 'on' or 'off', got {v!r}")
            changes[k] = v
        try:
            return dataclasses.replace(base, **changes)
        except ValueError as e:  # TrainConfig's own checks (a non-finite number)
            raise ValueError(f"{source}: {e}") from e


def _check_type(source: str, name: str, value, hint) -> None:
    """Refuse a config-file value that the command line would refuse for field ``name`` of type
    ``hint`` (int, float, bool, str, ``X | None``, ``Literal[...]``, ``tuple[str, ...]``): one
    line naming the file, the field, the value and the expected type.

    Raises:
        ValueError: ``"<source>: <name>: expected <type>, got <value>"``.
    """
    def ok(v, t) -> bool:
        origin, args = typing.get_origin(t), typing.get_args(t)
        if t is type(None):
            return v is None
        if origin in (typing.Union, types.UnionType):
            return any(ok(v, a) for a in args)
        if origin is Literal:
            return v in args
        if origin is tuple:
            return isinstance(v, (list, tuple)) and all(ok(x, args[0]) for x in v)
        if t is float:
            return isinstance(v, (int, float)) and not isinstance(v, bool)
        if t is int:
            return isinstance(v, int) and not isinstance(v, bool)
        return isinstance(v, t) if isinstance(t, type) else True

    def words(t) -> str:
        origin, args = typing.get_origin(t), typing.get_args(t)
        if t is type(None):
            return "null"
        if origin in (typing.Union, types.UnionType):
            return " or ".join(words(a) for a in args)
        if origin is Literal:
            return "one of " + ", ".join(repr(a) for a in args)
        if origin is tuple:
            return "a list of strings" if args[0] is str else f"a list of {words(args[0])}"
        return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(t, str(t))

    if not ok(value, hint):
        raise ValueError(f"{source}: {name}: expected {words(hint)}, got {value!r}; fix the file or pass "
                         f"--{name.replace('_', '-')}")


def env_config_from_dict(d: dict) -> EnvConfig:
    """The :class:`gpusim.config.EnvConfig` of a saved ``env_config`` dict (a checkpoint's, a
    ``config.json``'s ``env`` group); keys that are not EnvConfig fields (written by an older or newer
    gpusim) are left out, missing ones keep EnvConfig's defaults.

    Raises:
        ValueError: a value EnvConfig refuses (its own message).
    """
    names = {f.name for f in dataclasses.fields(EnvConfig)}
    return EnvConfig(**{k: v for k, v in d.items() if k in names})


def user_set(cfg: TrainConfig, group: str) -> set[str]:
    """Names of the fields of ``cfg.<group>`` (``"env"``, ``"policy"``, ``"ppo"``) that differ from
    :class:`TrainConfig`'s defaults, i.e. the ones the user set."""
    ours, default = getattr(cfg, group), getattr(TrainConfig(), group)
    return {f.name for f in dataclasses.fields(ours) if getattr(ours, f.name) != getattr(default, f.name)}


def flag(group: str, name: str) -> str:
    """The command-line flag of field ``name`` of group ``group``: ``flag("env", "k_trials")`` is
    ``--env.k-trials``."""
    return f"--{group}.{name.replace('_', '-')}"


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, NamedEnum):
        return str(x)
    return x


def resolve_path(path: str) -> pathlib.Path:
    """A relative path as given if it exists from the cwd, else relative to the repository root."""
    p = pathlib.Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    return REPO_ROOT / p


def cli_registry():
    """tyro registry that parses the project's enums by lower-case name (``stop``, ``trial``, ...)."""
    import tyro

    registry = tyro.constructors.ConstructorRegistry()

    @registry.primitive_rule
    def _named_enum(type_info):
        t = type_info.type
        if not (isinstance(t, type) and issubclass(t, NamedEnum)):
            return None
        names = tuple(m.name.lower() for m in t)
        return tyro.constructors.PrimitiveConstructorSpec(
            nargs=1,
            metavar="{" + ",".join(names) + "}",
            instance_from_str=lambda args: t.parse(args[0]),
            is_instance=lambda x: isinstance(x, t),
            str_from_instance=lambda x: [str(x)],
            choices=names,
        )

    return registry


def load_config_file(path) -> TrainConfig:
    """A :class:`TrainConfig` from a ``.json`` or ``.yaml``/``.yml`` file (see ``--config``).

    Raises:
        FileNotFoundError: no such file. ValueError: unreadable file, unknown extension, unknown
            fields or invalid values (the message names the file). ImportError: YAML without PyYAML.
    """
    import json

    p = resolve_path(str(path))
    if not p.is_file():
        raise FileNotFoundError(f"--config {path}: no such file")
    suffix = p.suffix.lower()
    text = p.read_text()
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"--config {p}: not valid JSON ({e})") from e
    elif suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as e:
            raise ImportError(f"--config {p}: YAML needs PyYAML: pip install 'gpusim[yaml]' (or pyyaml), "
                              "or use a .json file") from e
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"--config {p}: not valid YAML ({str(e).splitlines()[0]})") from e
    else:
        raise ValueError(f"--config {p}: unknown extension {suffix!r}; use .json, .yaml or .yml")
    data = dict(data or {})
    data.pop("config", None)  # a saved config names the file it came from; not a further include
    return TrainConfig.from_dict(data, source=f"--config {p}")


def _config_flag(argv: list[str]) -> str | None:
    """Value of ``--config FILE`` / ``--config=FILE`` in ``argv`` (last one wins), else None."""
    found = None
    for i, a in enumerate(argv):
        if a == "--config" and i + 1 < len(argv):
            found = argv[i + 1]
        elif a.startswith("--config="):
            found = a.split("=", 1)[1]
    return found


def parse_args(argv=None, description: str | None = None) -> TrainConfig:
    """Parse the command line into a :class:`TrainConfig` (``argv`` None = ``sys.argv[1:]``).

    With ``--config FILE`` the file's values are the defaults and the other flags override them
    (tyro's ``default=`` instance). Without ``--config`` the defaults are the device's recipe
    (:func:`train.recipes.with_recipe`: the GPU recipe on CUDA, else TrainConfig's own).

    Raises:
        SystemExit: from tyro for unknown/invalid flags (exit code 2). Errors of
        :func:`load_config_file`.
    """
    import sys

    import tyro

    argv = list(sys.argv[1:] if argv is None else argv)
    path = _config_flag(argv)
    default = load_config_file(path) if path else None
    cfg = tyro.cli(TrainConfig, args=argv, registry=cli_registry(), description=description, default=default)
    from train.recipes import with_recipe  # device-aware defaults (the GPU recipe on CUDA); flags win

    cfg = with_recipe(cfg, lambda base: tyro.cli(TrainConfig, args=argv, registry=cli_registry(),
                                                 description=description, default=base), from_file=path is not None)
    cfg = with_setting(cfg, lambda base: tyro.cli(TrainConfig, args=argv, registry=cli_registry(),
                                                  description=description, default=base), default)
    named = any(a == "--experience" or a.startswith("--experience=") for a in argv)
    if path and not named:
        refuse_file_hook(cfg, f"--config {path}")
    return memory_task_experience(cfg, named)


def hook_code(name: str, args=()) -> str | None:
    """The code an experience-hook setting would import (:func:`train.experience.make_hook`): ``name``
    itself when it is a ``MODULE:CLASS`` (the shipped hooks' names hold no colon), or the
    ``predicate=MODULE:FUNCTION`` of the ``drop`` hook among ``args``; None when it imports nothing.
    The trainer imports such code only when the user names it on the command line (or passes
    ``--trust-checkpoint-code``), never because a checkpoint or a config file records it
    (:func:`refuse_file_hook`)."""
    if ":" in str(name):
        return str(name)
    for a in args or ():
        key, _, value = str(a).partition("=")
        if key.strip().replace("-", "_") == "predicate" and ":" in value:
            return value.strip()
    return None


def refuse_file_hook(cfg: TrainConfig, source: str, name: str | None = None, args=None) -> None:
    """Refuse an experience hook read from a file (``source``: ``--config FILE`` or ``--resume
    FILE``) that would import code (:func:`hook_code`), unless
    ``cfg.trust_checkpoint_code``. ``name`` / ``args``: the file's hook (default ``cfg``'s).

    Raises:
        UserError: one line naming the file and the code, and the two ways to allow it.
    """
    name = cfg.experience if name is None else name
    args = tuple(cfg.experience_arg if args is None else args)
    code = hook_code(name, args)
    if code is None or cfg.trust_checkpoint_code:
        return
    again = " ".join(["--experience", name] + [f"--experience-arg {a}" for a in args])
    raise UserError(f"{source} records the experience hook {name!r}, which imports code ({code}); code named in a "
                    f"file is not run. To run it, name it on the command line ({again}) or pass "
                    "--trust-checkpoint-code")


def with_setting(cfg: TrainConfig, reparse, file_default: TrainConfig | None = None) -> TrainConfig:
    """``cfg`` with its ``--setting`` applied: the command line parsed again (``reparse(base)``) on
    the recipe's defaults with the setting's env fields (:func:`train.settings.setting_config`),
    so ``--env.*`` flags given still win. Without ``--setting``, or with a ``--config`` file
    (``file_default``: its env fields, which a saved ``config.json`` records resolved, are the
    defaults): ``cfg``.

    Raises:
        ValueError: an unknown setting name.
    """
    from train.settings import setting_config

    if cfg.setting is None or file_default is not None:
        if cfg.setting is not None:
            setting_config(cfg.env, cfg.setting)  # an unknown name is refused all the same
        return cfg
    from train.recipes import apply_recipe

    base = apply_recipe(TrainConfig(device=cfg.device), cfg.recipe, resuming=bool(cfg.resume))
    env, _ = setting_config(base.env, cfg.setting)
    return dataclasses.replace(reparse(dataclasses.replace(base, env=env)), recipe=cfg.recipe)


def memory_task_experience(cfg: TrainConfig, explicit: bool) -> TrainConfig:
    """With the memory task (``--env.goal-candidates`` >= 2) the default goal-progress shaping is
    replaced by ``candidate_progress`` (shaping toward the nearest candidate,
    :class:`train.experience.CandidateProgressShaping`): the goal-progress shaping would point at
    the true goal before it is reached (docs/trial.md).

    Raises:
        UserError: ``--experience progress`` given explicitly with the memory task.
    """
    if cfg.env.goal_candidates < 2 or cfg.experience != "progress":
        return cfg
    if explicit:
        raise UserError(f"--experience progress: the goal-progress shaping points at the true goal, which the memory "
                        f"task (--env.goal-candidates {cfg.env.goal_candidates}) hides; use --experience "
                        "candidate_progress (toward the nearest candidate, the default there) or identity")
    return dataclasses.replace(cfg, experience="candidate_progress")
