"""Typed configuration of ``python train/run.py`` (parsed with tyro).

Nested groups become flag prefixes: ``--env.*`` (:class:`gpusim.config.EnvConfig`, enum values by
lower-case name, e.g. ``--env.goal-behavior stop``), ``--policy.*`` (:class:`policy.PolicyConfig`)
and ``--ppo.*`` (:class:`train.ppo.PPOConfig`).

Defaults are tuned for the 2-core CPU development machine (see docs/training.md): they finish in
well under 15 minutes and visibly learn on ``data/womd_sample``. On a GPU, scale up with flags
(``--num-worlds``, ``--policy.d-model 128``, ``--total-timesteps``).
"""

from __future__ import annotations

import dataclasses
import pathlib
from dataclasses import dataclass, field
from typing import Literal

import torch

from gpusim.config import EnvConfig, _NamedEnum
from policy.actor_critic import PolicyConfig
from train.ppo import PPOConfig

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def default_device() -> str:
    """``cuda`` if a CUDA device is available, else ``cpu``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


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
        policy: model sizes. ppo: PPO hyper-parameters (entropy 0.005 by default here).
        num_worlds: parallel worlds W (rows per rollout = W * max_controlled).
        total_timesteps: stop after this many controlled-agent steps (active slots x horizon per
            rollout; idle steps of finished agents count, empty slots do not).
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
        experience: experience hook name (``identity``, ``relabel``, ``goal_bonus``, ``drop``,
            or ``MODULE:CLASS``). experience_arg: its ``KEY=VALUE`` arguments.
        wandb: also log to Weights & Biases (optional package). wandb_mode: offline unless
            ``online``. wandb_project: project name.
        quiet: no console progress.
        num_threads: torch CPU threads (``torch.set_num_threads``); 0 (default) keeps torch's
            default (one per core). On the idle 2-core development machine 2 threads train 1.6x
            faster than 1 (3.5K vs 2.2K agent-steps/s); on a CPU shared with other jobs use 1: under
            load, 2 threads made env and policy steps 15-20x slower (docs/training.md).
    """

    data: str = "data/womd_sample"
    env: EnvConfig = field(default_factory=lambda: EnvConfig(
        max_controlled=8, collision_behavior="remove", offroad_behavior="remove"))
    policy: PolicyConfig = field(default_factory=lambda: PolicyConfig(d_model=64, n_layers=2, n_heads=4, hidden=64,
                                                                       max_roads=32))
    ppo: PPOConfig = field(default_factory=lambda: PPOConfig(ent_coef=0.005))
    num_worlds: int = 32
    total_timesteps: int = 1_000_000
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
    experience: str = "identity"
    experience_arg: tuple[str, ...] = ()
    wandb: bool = False
    wandb_mode: Literal["offline", "online"] = "offline"
    wandb_project: str = "gpusim"
    quiet: bool = False
    num_threads: int = 0

    def to_dict(self) -> dict:
        """Plain-data view (enums as lower-case names), for checkpoints and logs."""
        return _plain(dataclasses.asdict(self))


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, _NamedEnum):
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
        if not (isinstance(t, type) and issubclass(t, _NamedEnum)):
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


def parse_args(argv=None, description: str | None = None) -> TrainConfig:
    """Parse the command line into a :class:`TrainConfig` (``argv`` None = ``sys.argv[1:]``)."""
    import tyro

    return tyro.cli(TrainConfig, args=argv, registry=cli_registry(), description=description)
