"""Periodic evaluation during training (``train/run.py --eval-interval N --eval-mode ...``).

:class:`LiveEvaluator` runs the evaluator's deterministic sweep (:mod:`train.eval.sweep`: every
scenario of ``--eval-data`` once, argmax actions) on the *current* policy, in every mode asked
(``self_play``, ``coplayer`` with the run's ``--coplayer`` partners, ``human_replay``), and returns
the ego means as flat ``eval/<mode>/<metric>`` entries (plus ``eval/<mode>/n``, the agent-episodes)
for the training report (JSONL / wandb). The packs and envs are built once, at the first call.
"""

from __future__ import annotations

import torch

from train.eval.modes import ModeOptions, get_mode, mode_env
from train.settings import evaluation_config
from train.eval.styles import eval_styles, style_env_config
from train.eval.sweep import PolicyDriver, default_num_worlds, ego_rows, make_sweep_env, run_sweep, sweep_plan


class LiveEvaluator:
    """Evaluate a live :class:`policy.ActorCritic` in several modes (module docstring).

    Args:
        env_config: the training env's :class:`~gpusim.config.EnvConfig` (each mode applies its changes;
            training randomisations are dropped, :func:`train.settings.evaluation_config`;
            with reward conditioning the egos drive the ``default`` style, not the training draw).
        data: scenarios (JSON directory or saved pack). modes: mode names.
        coplayer: partner checkpoints (needed by ``coplayer``). device. seed: env and partner draws.
        episodes: runs of every scenario per evaluation (``--eval-episodes``; the draws of the task,
            e.g. the partner type, differ between runs).

    Raises:
        ValueError: unknown mode. UserError: a mode's missing option (``coplayer`` without
            partners), or what :func:`train.eval.modes.mode_env` and the mode's ``prepare`` raise.
    """

    def __init__(self, env_config, data: str, modes, coplayer, device, seed: int = 0, episodes: int = 1):
        self.seed = int(seed)
        self.opts = ModeOptions(coplayer=tuple(coplayer), seed=self.seed, flag="--eval-mode",
                                episodes_per_scenario=int(episodes))
        self.items = []
        env_config = evaluation_config(env_config)[0]  # log start, logged goals (the evaluation rule)
        if env_config.reward_conditioning and env_config.style is None:  # evaluation drives a fixed style
            env_config = style_env_config(env_config, eval_styles(env_config, (), "the run")[0][1])
        for name in modes:
            mode = get_mode(name)
            mode.check(self.opts)
            config, pack, _ = mode_env(mode, env_config, data, device)
            S = pack.num_scenarios
            W = default_num_worlds(S)
            env = make_sweep_env(pack, W, config, device, self.seed)
            self.items.append((mode, env, sweep_plan(S, mode.episodes(self.opts), W), mode.prepare(env, self.opts)))

    @torch.no_grad()
    def run(self, policy) -> dict[str, float]:
        """``{"eval/<mode>/<metric>": mean, "eval/<mode>/n": agent-episodes}`` of the egos."""
        out = {}
        for mode, env, plan, context in self.items:
            driver = mode.drive(PolicyDriver(policy, deterministic=True), context, self.opts)
            env.reset(seed=self.seed)
            agents, worlds = run_sweep(env, driver, plan, egos=mode.egos)
            summary = mode.summarise(ego_rows(agents), worlds, plan.num_scenarios, context, self.opts)["summary"]
            for k, iv in summary.items():
                out[f"eval/{mode.name}/{k}"] = float(iv.mean)
            out[f"eval/{mode.name}/n"] = float(summary["goal_reached"].n)
        return out
