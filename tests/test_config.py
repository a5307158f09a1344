"""EnvConfig / DataConfig validation and the backend selector."""

import pytest
import torch

from gpusim import backend
from gpusim.config import ContactBehavior, DataConfig, EnvConfig, GoalBehavior


def test_enum_fields_accept_lower_case_names():
    cfg = EnvConfig(goal_behavior="new_goal", collision_behavior="remove", offroad_behavior="Stop")
    assert cfg.goal_behavior is GoalBehavior.NEW_GOAL
    assert cfg.collision_behavior is ContactBehavior.REMOVE
    assert cfg.offroad_behavior is ContactBehavior.STOP
    assert str(cfg.goal_behavior) == "new_goal"


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"goal_behavior": "fly"}, "respawn"),
        ({"max_controlled": 65}, "max_controlled"),
        ({"init_steps": 95}, "init_steps"),
        ({"stop_truncate_fraction": 0.0}, "stop_truncate_fraction"),
        ({"k_trials": 0}, "k_trials"),
        ({"num_partners": 64}, "num_partners"),
        ({"goal_radius": -1.0}, "goal_radius"),
    ],
)
def test_invalid_configs_say_what_to_change(changes, words):
    with pytest.raises(ValueError, match=words):
        EnvConfig(**changes)


def test_scenario_length_and_horizon():
    assert EnvConfig().scenario_length == 91
    assert EnvConfig(init_steps=10).scenario_length == 81
    trial = EnvConfig(goal_behavior="trial", k_trials=3, scenario_length=40)
    assert trial.trial_mode and trial.horizon == 120
    assert EnvConfig(scenario_length=40).horizon == 40


def test_data_config_matches_env_config():
    cfg = EnvConfig(max_agents=40, max_controlled=8, init_steps=5, num_roads=64)
    data = cfg.data_config(grid_cell_size=8.0)
    assert (data.max_agents, data.max_controlled, data.init_steps, data.grid_k) == (40, 8, 5, 64)
    assert data.grid_cell_size == 8.0
    with pytest.raises(ValueError):
        DataConfig(max_agents=4, max_controlled=5)


def test_backend_selection_and_override(monkeypatch):
    cpu = torch.zeros(1)
    monkeypatch.delenv("GPUSIM_BACKEND", raising=False)
    assert backend.backend_for(cpu) == "torch"
    with backend.use_backend("triton"):
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        assert backend.backend_for(cpu) == "triton"
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
            backend.backend_for(cpu)
    monkeypatch.setenv("GPUSIM_BACKEND", "torch")
    assert backend.backend_for(cpu) == "torch"
    monkeypatch.setenv("GPUSIM_BACKEND", "cuda-magic")
    with pytest.raises(ValueError, match="GPUSIM_BACKEND"):
        backend.backend_for(cpu)
    with pytest.raises(ValueError):
        with backend.use_backend("numpy"):
            pass
