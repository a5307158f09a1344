"""The simulator step as a pipeline of stages (docs/architecture.md).

One module per stage: :mod:`~gpusim.sim.motion` (action decoding, dynamics registry
``DYNAMICS``), :mod:`~gpusim.sim.replay`, :mod:`~gpusim.sim.signals` (traffic signals),
:mod:`~gpusim.sim.contacts`, :mod:`~gpusim.sim.rewards`,
:mod:`~gpusim.sim.goals`, :mod:`~gpusim.sim.trial`, :mod:`~gpusim.sim.accounting`,
:mod:`~gpusim.sim.episode` (initial state, scenario draw, restart), :mod:`~gpusim.sim.observe`;
their order is :data:`~gpusim.sim.pipeline.PIPELINE`. Action validation (sync/async) is
:mod:`~gpusim.sim.actions`.
"""

from gpusim.sim.context import SimContext, StepVars
from gpusim.sim.motion import DYNAMICS, DynamicsModel
from gpusim.sim.pipeline import PIPELINE, Stage, run_pipeline

__all__ = ["DYNAMICS", "DynamicsModel", "PIPELINE", "SimContext", "Stage", "StepVars", "run_pipeline"]
