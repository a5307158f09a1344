"""Scenario data for the trainer and the evaluator: load or convert ``--data`` into a pack, list the
files left out, and reconcile the env settings with the settings a saved pack was built with.

Shared by ``train/run.py`` (through :mod:`train.setup`) and ``train/evaluate.py`` /
:mod:`train.eval` (one copy of each rule); imports nothing of ``train`` but :mod:`train.config`.
"""

from __future__ import annotations

import warnings

from gpusim.config import EnvConfig
from train.config import UserError, flag, resolve_path

#: Fields of EnvConfig that must equal the pack's DataConfig: env field -> (data field, the
#: ``python -m gpusim.data convert`` flag that sets it).
PACK_FIELDS = {"max_agents": ("max_agents", "--max-agents"), "max_controlled": ("max_controlled", "--max-controlled"),
               "init_steps": ("init_steps", "--init-steps"), "num_roads": ("grid_k", "--grid-k"),
               "control": ("control", "--control")}


def load_pack(data: str, env_config: EnvConfig, device="cpu"):
    """Scenario pack from ``data``: a saved pack (``pack.pt`` directory or ``.pt`` file) or a
    sharded pack directory is loaded, anything else is converted from WOMD JSON with
    ``env_config.data_config()``.

    Args:
        data: the ``--data`` value (relative paths: cwd first, then the repository root).
        env_config: settings used to convert JSON. device: where the pack's tensors go.

    Returns:
        a :class:`gpusim.data.ScenarioPack` on ``device``.

    Raises:
        FileNotFoundError: if ``data`` does not exist. UserError: an empty or unreadable pack file
        (named). gpusim.data.ScenarioError: if no scenario in it is usable.
    """
    from gpusim.data import ScenarioPack
    from gpusim.data.shards import ShardedPack, is_sharded

    path = resolve_path(data)
    if not path.exists():
        raise FileNotFoundError(f"--data {data}: no such file or directory (also tried {path})")
    if is_sharded(path):  # a sharded pack directory (python -m gpusim.data convert ... --shard-size N)
        return ShardedPack.open(path).load_all(device)
    if path.suffix == ".pt" or (path.is_dir() and (path / "pack.pt").exists()):
        file = path if path.suffix == ".pt" else path / "pack.pt"
        if file.is_file() and file.stat().st_size == 0:
            raise UserError(f"--data {file}: the pack file is empty (0 bytes); convert the data again")
        try:
            return ScenarioPack.load(path, device=device)
        except (FileNotFoundError, ValueError):
            raise
        except Exception as e:  # torch.load on a truncated/corrupt file (RuntimeError, UnpicklingError, ...)
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            raise UserError(f"--data {file}: not a readable scenario pack ({reason}); convert the data again") from e
    with warnings.catch_warnings():  # skipped files are listed by data_problems() instead
        warnings.simplefilter("ignore")
        return ScenarioPack.from_json(path, env_config.data_config()).to(device)


def data_problems(pack) -> list[str]:
    """Lines listing every file left out of ``pack`` at conversion (``pack.stats["errors"]`` and
    ``["skipped"]``) with its reason, headed by the count; ``[]`` when none was left out."""
    stats = getattr(pack, "stats", None) or {}
    problems = list(stats.get("errors", [])) + list(stats.get("skipped", []))
    if not problems:
        return []
    total = stats.get("files", len(problems) + getattr(pack, "num_scenarios", 0))
    lines = [f"data: {len(problems)} of {total} file(s) skipped, training on {getattr(pack, 'num_scenarios', '?')} "
             "scenario(s):"]
    lines += [f"  skipped {p.get('file', '?')}: {p.get('reason', '?')}" for p in problems]
    return lines


def over_cap(pack, env_config: EnvConfig) -> list[str]:
    """With the ``all_valid`` control rule, one line counting the controllable objects of ``pack``
    beyond ``env_config.max_controlled`` per scenario (``pack.stats["controllable_over_cap"]``; they
    are log-replayed, or left out beyond ``max_agents``); ``[]`` when none is, or with another rule."""
    n = int((getattr(pack, "stats", None) or {}).get("controllable_over_cap", 0) or 0)
    if n <= 0 or env_config.control != "all_valid":
        return []
    max_controlled = env_config.max_controlled
    total = int(pack.stats.get("controllable", 0) or 0)
    return [f"data: {n} of {total} controllable objects are over --env.max-controlled {max_controlled} per scenario: "
            "log-replayed, not controlled"]


def adapt_env_config(env_config: EnvConfig, pack, user_set: set[str] = frozenset(),
                     resuming: bool = False) -> tuple[EnvConfig, list[str]]:
    """Make ``env_config`` match the data config the pack was built with (:data:`PACK_FIELDS`).

    A field the user did not set (not in ``user_set``) takes the pack's value; a field the user
    set to another value is an error naming both ways out. ``resuming``: the values come from the
    checkpoint being resumed (the message says so).

    Returns:
        ``(env_config, notes)``: the adapted config and one note per adopted value.

    Raises:
        UserError: a user-set ``--env.*`` flag contradicts the pack, or the pack's values do not
            fit the rest of the env config.
    """
    data_cfg = getattr(pack, "config", None)
    if data_cfg is None:
        return env_config, []
    changes, notes, clashes = {}, [], []
    for env_field, (data_field, convert_flag) in PACK_FIELDS.items():
        want, have = getattr(env_config, env_field), getattr(data_cfg, data_field, None)
        if have is None or want == have:
            continue
        if env_field in user_set and resuming:
            clashes.append(f"the checkpoint was trained with {env_field}={want} but the pack was built with "
                           f"{data_field}={have} (convert the data with `python -m gpusim.data convert ... "
                           f"{convert_flag} {want}`)")
        elif env_field in user_set:
            clashes.append(f"{flag('env', env_field)} {want} but the pack was built with {data_field}={have} "
                           f"(drop the flag or pass {have}, or convert again with `python -m gpusim.data convert "
                           f"... {convert_flag} {want}`)")
        else:
            changes[env_field] = have
            notes.append(f"data: the pack was built with {data_field}={have}: using {flag('env', env_field)} {have}")
    if clashes:
        raise UserError("--data: " + "; ".join(clashes))
    if changes:
        try:
            env_config = env_config.replace(**changes)
        except ValueError as e:
            raise UserError(f"--data: the pack's settings {changes} do not fit the env config: {e}") from e
    check = getattr(pack, "check_compatible", None)
    if callable(check):
        check(env_config)
    return env_config, notes
