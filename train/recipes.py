"""Device-aware defaults of ``python train/run.py``: the CPU recipe and the GPU recipe.

A recipe is a set of :class:`train.config.TrainConfig` defaults. ``--recipe auto`` (the default)
picks the GPU recipe when ``--device`` is a CUDA device (which is the default device when torch
sees one) and the CPU recipe otherwise; ``--recipe cpu`` / ``--recipe gpu`` choose one by name.
The recipe only changes *defaults*: every flag given on the command line wins over it, and a run
started with ``--config FILE`` takes its defaults from the file alone (a saved ``config.json``
records every field, so it replays the run whatever the device).

* ``cpu``: :class:`TrainConfig`'s own defaults, tuned for the 2-core development machine
  (docs/training.md, "CPU defaults"). A CPU run is exactly what it was before
  recipes existed.
* ``gpu``: the values below, chosen from H100 measurements (docs/training.md, "Recipes";
  ``profiling/recipe_sweep.py``, real ``train/run.py`` runs, 2026-11-26). At the CPU defaults (32
  worlds) the GPU trained at 30.8K agent-steps/s. With 1024 worlds the trainer ran at 813K
  agent-steps/s, 2048 at 880K and 4096 at 908K: the update grows with the data, so more worlds
  barely help. What pays is ``--ppo.pack-removed``: the update's forward on the non-removed steps
  only (60% of a trained driver's rollout steps are removed), 948K at 1024 worlds and 1.15M at
  4096 (update 1.40 -> 0.95 s per iteration at 4096); it is on here. bf16 autocast with fused Adam
  added 3% on top at 4096 worlds (1.18M) and made the trainer slower at 1024 on an H200 (358K
  against 447K in ``bench_train``), so both stay off. The world count stays 1024: learning was
  measured there (three seeds reach a training-time goal rate of about 0.76 in 50M steps on the
  52-scenario training split with goal resampling; held-out figures in docs/training.md); 4096
  worlds train 21% faster but make four times fewer updates per step, unmeasured for learning.
  The budget is 40M steps (under a minute), reports every 5 updates instead of 2 (a report reads
  the statistics to the host). Slots (``--env.max-controlled 8``) and the model width (d=64) stay
  as on the CPU.

When resuming (``--resume``), the world count and the env and policy settings come from the
checkpoint, so the recipe leaves them alone.
"""

from __future__ import annotations

import dataclasses
import os

import torch

#: The recipes: ``TrainConfig`` field -> default, ``group.field`` for the ``env`` / ``policy`` /
#: ``ppo`` groups. ``cpu`` is empty: TrainConfig's own defaults are the CPU recipe.
RECIPES: dict[str, dict[str, object]] = {
    "cpu": {},
    "gpu": {
        "num_worlds": 1024,
        "total_timesteps": 40_000_000,
        "report_interval": 5,
        "ppo.pack_removed": True,
    },
}

#: Fields a resumed run takes from its checkpoint (``train.resume``): a recipe does not set them then.
FROM_CHECKPOINT = ("num_worlds", "env.", "policy.")

GROUPS = ("env", "policy", "ppo")


def resolve_recipe(recipe: str, device: str) -> str:
    """The recipe name for ``--recipe recipe`` on ``--device device``.

    Args:
        recipe: ``"auto"``, ``"cpu"`` or ``"gpu"``.
        device: the torch device string of the run (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...); a
            string torch does not parse counts as not CUDA (``train.config.check_device`` refuses
            it later with its own message).

    Returns:
        ``"gpu"`` or ``"cpu"``: ``recipe`` itself unless it is ``"auto"``, which gives ``"gpu"``
        exactly when ``device`` is a CUDA device.

    Raises:
        ValueError: an unknown recipe name (one line naming ``--recipe`` and the choices).
    """
    if recipe != "auto" and recipe not in RECIPES:
        raise ValueError(f"--recipe {recipe}: unknown recipe; use auto, {', '.join(RECIPES)}")
    if recipe != "auto":
        return recipe
    try:
        is_cuda = torch.device(device).type == "cuda"
    except (RuntimeError, ValueError):
        is_cuda = False
    return "gpu" if is_cuda else "cpu"


def recipe_overrides(name: str, resuming: bool = False) -> dict[str, object]:
    """The recipe's fields (``RECIPES[name]``), without the ones a resumed run takes from its
    checkpoint (:data:`FROM_CHECKPOINT`) when ``resuming``.

    Raises:
        KeyError: unknown recipe name (use :func:`resolve_recipe` first).
    """
    items = RECIPES[name].items()
    if resuming:
        items = [(k, v) for k, v in items if not any(k == p or (p.endswith(".") and k.startswith(p))
                                                       for p in FROM_CHECKPOINT)]
    return dict(items)


def apply_recipe(base, name: str, resuming: bool = False):
    """``base`` (a :class:`train.config.TrainConfig`) with the fields of recipe ``name`` set.

    Returns:
        A new TrainConfig (``base`` is not changed) whose ``recipe`` field is ``name``.

    Raises:
        KeyError: unknown recipe name. ValueError: a recipe value its group refuses.
    """
    top, groups = {}, {}
    for key, value in recipe_overrides(name, resuming).items():
        group, _, field = key.rpartition(".")
        if group:
            groups.setdefault(group, {})[field] = value
        else:
            top[field] = value
    for group, fields in groups.items():
        top[group] = dataclasses.replace(getattr(base, group), **fields)
    return dataclasses.replace(base, recipe=name, **top)


def _get(cfg, key: str):
    group, _, field = key.rpartition(".")
    return getattr(getattr(cfg, group) if group else cfg, field)


def flag_of(key: str, value) -> str:
    """The command line that sets recipe key ``key`` to ``value``: ``("num_worlds", 1024)`` ->
    ``--num-worlds 1024``; booleans as tyro spells them: ``("ppo.fused_adam", False)`` ->
    ``--ppo.no-fused-adam``."""
    group, _, field = key.rpartition(".")
    prefix = "--" + (group + "." if group else "")
    if isinstance(value, bool):
        return prefix + ("" if value else "no-") + field.replace("_", "-")
    return f"{prefix}{field.replace('_', '-')} {value}"


def describe(cfg, name: str) -> str:
    """One line naming the recipe of ``cfg`` (a parsed TrainConfig), its values and the ones the
    command line overrode (``cfg`` differs from the recipe there)."""
    keys = recipe_overrides(name, resuming=bool(cfg.resume))
    values = " ".join(flag_of(k, v) for k, v in keys.items())
    changed = [flag_of(k, _get(cfg, k)) for k, v in keys.items() if _get(cfg, k) != v]
    line = f"recipe {name} (device {cfg.device}): {values or 'the CPU defaults'}"
    if changed:
        line += f"; overridden by flags: {' '.join(changed)}"
    return line + " (--recipe cpu gives the CPU defaults; docs/training.md, 'Recipes')"


def with_recipe(cfg, reparse, from_file: bool = False, say=print):
    """The configuration of a command line after its recipe is applied (``train.config.parse_args``).

    Args:
        cfg: the command line parsed on :class:`TrainConfig`'s own defaults (the CPU recipe).
        reparse: ``reparse(default)`` parses the same command line on the TrainConfig ``default``
            (flags given win over it).
        from_file: the command line has ``--config FILE``: its values are the defaults and no
            recipe is applied (``cfg`` is returned after checking its ``recipe`` name).
        say: where the GPU recipe's one-line description goes (unless ``cfg.quiet``; under
            torchrun only on rank 0, ``RANK`` in the environment).

    Returns:
        The TrainConfig to run, its ``recipe`` field set to the recipe used (``"cpu"`` or ``"gpu"``)
        unless ``from_file``. With the CPU recipe every other field is exactly ``cfg``'s.

    Raises:
        ValueError: an unknown ``--recipe`` name.
    """
    name = resolve_recipe(cfg.recipe, cfg.device)
    if from_file:
        return cfg
    if name == "cpu":
        return dataclasses.replace(cfg, recipe="cpu")
    # type(cfg) is TrainConfig (not imported: train.config imports this module)
    base = apply_recipe(type(cfg)(device=cfg.device), name, resuming=bool(cfg.resume))
    out = dataclasses.replace(reparse(base), recipe=name)
    if not out.quiet and os.environ.get("RANK", "0") == "0":  # under torchrun: rank 0 says it once
        say(describe(out, name))
    return out
