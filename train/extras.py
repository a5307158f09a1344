"""What a training run adds around its loop: population play (partners driving the co-player
slots), trial logs, and the periodic evaluation (``--eval-interval``), behind three calls of
:class:`RunExtras` in :func:`train.run.train`.

This sits above both :mod:`train.coplayer` (the partners) and :mod:`train.eval` (the evaluator),
which therefore never import each other through the trainer.
"""

from __future__ import annotations

import torch

from train.coplayer import describe, make_pool, report_metrics


class RunExtras:
    """What ``train/run.py`` adds for population play, trial logs and periodic evaluation, behind
    three calls (so the trainer's own loop stays as it is):

    * construction (after the env and the logger exist): loads the partners (:func:`make_pool`),
      a :class:`train.rollout.TrialLog` in trial mode, says which partners are used;
    * :meth:`after_update` (every update): runs the periodic evaluation when due
      (``--eval-interval``; :class:`train.eval.live.LiveEvaluator`) and keeps its ``eval/<mode>/*``
      means for the next report;
    * :meth:`report` (every report): ``ego/*``, ``coplayer/*``, ``trial_log/*`` and pending
      ``eval/*`` entries for the JSONL/wandb record. Under ``torchrun`` these are rank 0's own
      figures (not reduced over ranks, unlike the plain metric keys).

    Args:
        cfg: :class:`train.config.TrainConfig`. env: the training env. device. say: console printer.
    """

    def __init__(self, cfg, env, device, say=print):
        from train.rollout import TrialLog

        self.cfg = cfg
        self.pool = make_pool(cfg.coplayer, env, device, seed=cfg.seed + 7919, deterministic=not cfg.coplayer_sample)
        trial = bool(getattr(env.config, "trial_mode", False))  # (test envs may have a minimal config)
        self.trial_log = TrialLog(env.num_worlds, env.config.scenario_length, device) if trial else None
        self.env = env
        self.device = device
        self.say = say
        self.pending: dict[str, float] = {}
        self._live = None
        if self.pool is not None:
            say(describe(self.pool) + f"; {env.config.ego_slots or env.config.ego_fraction} ego slot(s) per world "
                f"({env.config.ego_choice})")

    def after_update(self, update: int, last: bool, policy) -> None:
        """Run the periodic evaluation when ``update`` is a multiple of ``--eval-interval`` or ``last``."""
        n = int(self.cfg.eval_interval)
        if n <= 0 or not (update % n == 0 or last):
            return
        if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank():
            return  # torchrun: rank 0 alone evaluates (and logs)
        from train.eval.live import LiveEvaluator

        if self._live is None:
            from train.settings import evaluation_config

            for note in evaluation_config(self.env.config)[1]:  # the evaluation rule, said once
                self.say(f"periodic evaluation: {note}")
            self._live = LiveEvaluator(self.env.config, self.cfg.eval_data or self.cfg.data, self.cfg.eval_mode,
                                       self.cfg.coplayer, self.device, seed=self.cfg.seed,
                                       episodes=self.cfg.eval_episodes)
        self.pending.update(self._live.run(policy))
        policy.eval()

    def report(self) -> dict[str, float]:
        """Entries for one report record (and clears the pending evaluation)."""
        out = report_metrics(self.env, self.pool)
        if self.trial_log is not None:
            out.update(self.trial_log.report())
        out.update(self.pending)
        self.pending = {}
        return out
