"""What a step returns (:class:`StepResult`, built by :func:`step_result` from the stages'
:class:`~gpusim.sim.context.StepVars`) and the pack/config compatibility check of ``DriveEnv``.

Time alignment is that of docs/contracts.md: ``reward``, ``terminal``, ``truncation`` and
``loss_mask`` are about the actions just taken; ``obs``, ``removed``, ``stopped`` and
``slot_active`` describe the state after the step (after an auto-reset, the new episode's first
state).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gpusim.config import EnvConfig
from gpusim.data.pack import ScenarioPack
from gpusim.sim.context import SimContext, StepVars
from gpusim.state import EnvState


@dataclass
class StepResult:
    """Result of :meth:`DriveEnv.step` (W worlds, C slots, D observation features).

    Attributes:
        obs: [W, C, D] float32 observation of the state after the step.
        reward: [W, C] float32 reward of the action just taken (0 on invalid steps).
        terminal: [W, C] bool, the slot's episode ended with this step (once per active slot).
        truncation: [W, C] bool, trial boundary (trial mode; always False otherwise).
        loss_mask: [W, C] bool, the slot's agent was in play when it acted (train on this step).
        slot_active: [W, C] bool, a controlled agent occupies the slot (after the step).
        removed: [W, C] bool, the slot's agent is removed (after the step).
        stopped: [W, C] bool, the slot's agent is stopped (after the step).
        trial_ended: [W, C] bool, a trial ended (trial mode; always False otherwise).
        info: device tensors: ``goal_reached`` / ``collided`` / ``offroad`` [W, C] bool (events of
            this step, valid steps only), ``truncated`` [W] bool (world truncated early now),
            ``episode_end`` [] bool (this step completed the horizon and reset all worlds; a
            cached constant: do not modify it), ``trial_end`` [W] bool in trial mode.
    """

    obs: torch.Tensor
    reward: torch.Tensor
    terminal: torch.Tensor
    truncation: torch.Tensor
    loss_mask: torch.Tensor
    slot_active: torch.Tensor
    removed: torch.Tensor
    stopped: torch.Tensor
    trial_ended: torch.Tensor
    info: dict = field(default_factory=dict)


def step_result(sim: SimContext, state: EnvState, step: StepVars) -> StepResult:
    """The :class:`StepResult` of a step that left ``state`` and ``step`` (C = ``sim.num_slots``)."""
    C = sim.num_slots
    return StepResult(
        obs=step.obs,
        reward=step.reward,
        terminal=step.terminal,
        truncation=step.truncation,
        loss_mask=step.loss_mask,
        slot_active=state.slot_active,
        removed=state.removed[:, :C],
        stopped=state.stopped[:, :C],
        trial_ended=step.trial_ended,
        info={"goal_reached": step.goal_now[:, :C],
              "collided": step.collided_in_play()[:, :C],
              "offroad": step.offroad_in_play()[:, :C],
              "truncated": step.truncated,
              "episode_end": sim.end_scalars[int(step.episode_end)],
              **step.info},
    )


def check_pack(pack: ScenarioPack, num_worlds: int, config: EnvConfig) -> None:
    """Raise ValueError when ``pack`` cannot run under ``config`` (the message says what to change)."""
    if num_worlds < 1:
        raise ValueError(f"num_worlds must be >= 1, got {num_worlds}")
    if pack.num_scenarios < 1:
        raise ValueError("the scenario pack is empty")
    pc = pack.config
    for name, env_val, pack_val in (
        ("max_agents", config.max_agents, pc.max_agents),
        ("max_controlled", config.max_controlled, pc.max_controlled),
        ("init_steps", config.init_steps, pc.init_steps),
        ("num_roads", config.num_roads, pc.grid_k),
    ):
        if env_val != pack_val:
            pack_name = "grid_k" if name == "num_roads" else name
            raise ValueError(
                f"EnvConfig.{name}={env_val} but the pack was built with DataConfig.{pack_name}={pack_val}; "
                f"set EnvConfig({name}={pack_val}) or rebuild the pack with config.data_config()"
            )
    if pack.max_agents != config.max_agents:
        raise ValueError(f"pack tensors have {pack.max_agents} agent slots, EnvConfig.max_agents={config.max_agents}")
    if pack.num_steps <= config.init_steps:
        raise ValueError(f"pack has {pack.num_steps} logged steps, init_steps={config.init_steps}")
