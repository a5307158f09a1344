"""The episode's clocks (gpusim/kernels/clocks.py) and the memory-reset rule (policy/actor.py),
each written once: hand-computed values, and no other module of the simulator, the policy or the
trainer recomputes ``step - trial_start`` or ``step - log_origin(...)`` itself."""

from __future__ import annotations

import ast
import pathlib

import torch

from gpusim.kernels.clocks import log_index, trial_features, trial_time
from policy.actor import memory_reset, resets_at_trial

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_clocks_by_hand():
    step, start = torch.tensor([0, 5, 9], dtype=torch.int32), torch.tensor([0, 3, 9], dtype=torch.int32)
    assert trial_time(step, start).tolist() == [0, 2, 0]
    assert log_index(10, step, start).tolist() == [10, 12, 10]  # every trial replays the log from init_steps
    origin = start - torch.tensor([0, 4, 7], dtype=torch.int32)  # random start: the log runs start_offset ahead
    assert log_index(10, step, origin).tolist() == [10, 16, 17]
    idx, t = trial_features(torch.tensor([0, 1, 2], dtype=torch.int32), step, start, 4, 8)
    assert idx.tolist() == [0.0, 0.25, 0.5] and t.tolist() == [0.0, 0.25, 0.0] and t.dtype == torch.float32


def test_memory_reset_rule():
    term, trunc = torch.tensor([True, False, False]), torch.tensor([False, True, False])
    assert memory_reset(term, trunc, False).tolist() == [True, False, False]
    assert memory_reset(term, trunc, True).tolist() == [True, True, False]
    assert memory_reset(term, None, True).tolist() == [True, False, False]

    class P:  # a policy, and a DDP-style wrapper holding it as .module
        def __init__(self, memory):
            self.config = type("C", (), {"memory": memory})()
    assert resets_at_trial(P("trial")) and not resets_at_trial(P("episode"))
    assert resets_at_trial(type("W", (), {"module": P("trial")})())


def _clock_differences(path: pathlib.Path) -> list:
    """Lines of ``path`` that subtract ``trial_start`` or ``log_origin(...)`` from a step."""
    def name(node):
        if isinstance(node, ast.Call):
            node = node.func
        return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and name(node.left) in ("step", "new_step") \
                and name(node.right) in ("trial_start", "log_origin", "origin"):
            out.append(node.lineno)
    return out


def test_no_module_recomputes_a_clock():
    found = {}
    for pkg in ("gpusim", "policy", "train", "profiling"):
        for path in (ROOT / pkg).rglob("*.py"):
            if path.name != "clocks.py" and (lines := _clock_differences(path)):
                found[str(path.relative_to(ROOT))] = lines
    assert found == {}
