"""policies/: every committed checkpoint is under the size cap, has a complete card, loads with the
project's loader and drives the bundled scenarios for a few steps; the checks themselves are
exercised on hand-made checkpoints (a good one, an oversized one, one without a card)."""

import pathlib
import re
import shutil

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
POLICIES = REPO / "policies"
TEMPLATE = POLICIES / "CARD_TEMPLATE.md"
#: The size cap of a checkpoint in policies/ (policies/README.md).
MAX_BYTES = 5_000_000
STEPS = 5


def policy_files(folder: pathlib.Path = POLICIES) -> list[pathlib.Path]:
    """The checkpoints of ``folder``: ``*.pt``, sorted."""
    return sorted(folder.glob("*.pt"))


def check_size(path: pathlib.Path, cap: int = MAX_BYTES) -> int:
    """The size of ``path`` in bytes.

    Raises:
        ValueError: over ``cap``, naming the file, its size and the cap.
    """
    size = path.stat().st_size
    if size > cap:
        raise ValueError(f"{path.name}: {size:,} bytes, over the {cap:,}-byte cap of policies/ "
                         f"(policies/README.md: publish it elsewhere and link it from a card)")
    return size


def card_sections(text: str) -> list[str]:
    """The ``## `` headings of a markdown text, in order."""
    return [line[3:].strip() for line in text.splitlines() if line.startswith("## ")]


def check_card(path: pathlib.Path) -> pathlib.Path:
    """The card ``NAME.md`` of checkpoint ``NAME.pt``.

    Raises:
        ValueError: no card, a section of ``CARD_TEMPLATE.md`` missing, or a ``TODO`` left.
    """
    card = path.with_suffix(".md")
    if not card.is_file():
        raise ValueError(f"{path.name}: no card {card.name}; copy policies/CARD_TEMPLATE.md and fill it in")
    text = card.read_text()
    missing = [s for s in card_sections(TEMPLATE.read_text()) if s not in card_sections(text)]
    if missing:
        raise ValueError(f"{card.name}: section(s) of the template missing: {', '.join(missing)}")
    if "TODO" in text:
        raise ValueError(f"{card.name}: {text.count('TODO')} TODO left; fill in every section")
    return card


def _env_config(payload: dict):
    """The EnvConfig a checkpoint was trained for (unknown keys left out)."""
    import dataclasses

    from gpusim import EnvConfig

    names = {f.name for f in dataclasses.fields(EnvConfig)}
    return EnvConfig(**{k: v for k, v in payload["env_config"].items() if k in names})


def _load(path: pathlib.Path, env):
    """The checkpoint's policy, checked against ``env``: the project's ``load_policy`` where it
    exists, else the checkpoint reader and the policy's own description."""
    from train import checkpoint

    if hasattr(checkpoint, "load_policy"):
        policy, _ = checkpoint.load_policy(path, device=env.device, obs_layout=env.obs_layout,
                                           num_actions=env.num_actions,
                                           continuous=env.config.action_space.name.lower() == "continuous")
        return policy
    from policy.actor_critic import ActorCritic

    payload = checkpoint.load_checkpoint(path)
    policy = ActorCritic.from_description(payload["policy"])
    policy.load_state_dict(payload["model"])
    return policy.eval()


@torch.no_grad()
def drive_a_few_steps(path: pathlib.Path, sample_dir: pathlib.Path, steps: int = STEPS) -> dict:
    """Load checkpoint ``path`` and let it drive 2 worlds of the bundled scenarios for ``steps``
    steps (argmax actions, KV cache as in evaluation). Returns counts of the run."""
    from gpusim import DriveEnv, ScenarioPack
    from train.checkpoint import load_checkpoint
    from train.eval.sweep import PolicyDriver

    config = _env_config(load_checkpoint(path))
    files = sorted(sample_dir.glob("*.json*"))[:2]
    env = DriveEnv(ScenarioPack.from_json([str(f) for f in files], config.data_config()), 2, config, seed=0)
    driver = PolicyDriver(_load(path, env), deterministic=True)
    obs = env.reset(seed=0)
    driver.begin(env, obs)
    active, moved = int(env.state.slot_active.sum()), 0
    start = env.state.pos[:, : env.num_slots].clone()
    for _ in range(steps):
        result = env.step(driver.act(env, obs))
        driver.observe(env, result)
        obs = result.obs
        assert torch.isfinite(result.reward).all() and torch.isfinite(obs).all()
    moved = int(((env.state.pos[:, : env.num_slots] - start).norm(dim=-1) > 0)[env.state.slot_active].sum())
    return {"active": active, "moved": moved}


def check_policy(path: pathlib.Path, sample_dir: pathlib.Path) -> dict:
    """Every rule of policies/README.md for one checkpoint; returns :func:`drive_a_few_steps`'s counts.

    Raises:
        ValueError: as :func:`check_size`, :func:`check_card`; the loader's errors.
    """
    check_size(path)
    check_card(path)
    return drive_a_few_steps(path, sample_dir)


def test_folder_has_readme_and_template():
    readme = (POLICIES / "README.md").read_text()
    assert "python train/evaluate.py --policy policies/NAME.pt" in readme and "5 MB" in readme
    sections = card_sections(TEMPLATE.read_text())
    for want in ("Checkpoint", "Data and split", "Training command", "Hardware, steps and wall time",
                 "Held-out results", "Limitations", "Licence"):
        assert want in sections
    text = TEMPLATE.read_text()
    assert "95% intervals" in text and "steer_to_goal" in text and "data/splits.json" in text


@pytest.mark.parametrize("path", policy_files() or [None], ids=lambda p: p.name if p else "none")
def test_committed_policy(path, sample_dir):
    if path is None:
        pytest.skip("no checkpoint in policies/ yet (the checks run on a hand-made one below)")
    counts = check_policy(path, sample_dir)
    assert counts["active"] > 0 and counts["moved"] > 0  # the policy drives: someone left the start


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A hand-made checkpoint of a small random-init policy (training defaults' env settings) in a
    folder of its own, with a filled-in card."""
    from gpusim.kernels.observations import obs_layout
    from policy.actor_critic import ActorCritic, PolicyConfig
    from train.checkpoint import save_checkpoint
    from train.config import TrainConfig

    folder = tmp_path_factory.mktemp("policies")
    env = TrainConfig().env
    torch.manual_seed(0)
    pol = ActorCritic(obs_layout(env.num_partners, env.num_roads, env.num_signals), 91, False,
                      PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16))
    env_dict = TrainConfig().to_dict()["env"]
    path = save_checkpoint(folder / "tiny.pt", policy=pol, optimizer=torch.optim.Adam(pol.parameters()),
                           global_step=0, update=0, config={"env": env_dict}, env_config=env_dict)
    path.with_suffix(".md").write_text(re.sub(r"TODO", "n/a", TEMPLATE.read_text()))
    return path


def test_checks_pass_on_a_good_checkpoint(tiny_checkpoint, sample_dir):
    assert policy_files(tiny_checkpoint.parent) == [tiny_checkpoint]
    counts = check_policy(tiny_checkpoint, sample_dir)
    assert counts["active"] > 0 and counts["moved"] > 0


def test_oversized_checkpoint_is_rejected(tmp_path):
    big = tmp_path / "big.pt"
    with open(big, "wb") as f:
        f.truncate(MAX_BYTES + 1)  # a sparse file: no 5 MB written
    with pytest.raises(ValueError, match=r"big\.pt: 5,000,001 bytes, over the 5,000,000-byte cap"):
        check_size(big)
    exact = tmp_path / "exact.pt"
    with open(exact, "wb") as f:
        f.truncate(MAX_BYTES)
    assert check_size(exact) == MAX_BYTES


def test_card_rules(tiny_checkpoint, tmp_path):
    pt = tmp_path / "nocard.pt"
    shutil.copy(tiny_checkpoint, pt)
    with pytest.raises(ValueError, match=r"nocard\.pt: no card nocard\.md"):
        check_card(pt)
    card = pt.with_suffix(".md")
    card.write_text(TEMPLATE.read_text())  # copied, not filled in
    with pytest.raises(ValueError, match="TODO left"):
        check_card(pt)
    card.write_text(tiny_checkpoint.with_suffix(".md").read_text().replace("## Held-out results", "## Results"))
    with pytest.raises(ValueError, match="section.* missing: Held-out results"):
        check_card(pt)


def test_default_policy_checkpoint_fits_the_cap(tmp_path):
    """The README's size figure: a checkpoint of the training defaults' policy with its Adam state."""
    from gpusim.kernels.observations import obs_layout
    from policy.actor_critic import ActorCritic, PolicyConfig
    from train.checkpoint import save_checkpoint
    from train.config import TrainConfig

    cfg = TrainConfig()
    env, pc = cfg.env, cfg.to_dict()["policy"]
    pol = ActorCritic(obs_layout(env.num_partners, env.num_roads, env.num_signals), 91, False,
                      PolicyConfig(**{k: v for k, v in pc.items() if k != "action_factors"}))
    opt = torch.optim.Adam(pol.parameters())
    sum(p.sum() for p in pol.parameters()).backward()
    opt.step()  # Adam's moments exist after a step only: a trained checkpoint holds them
    path = save_checkpoint(tmp_path / "default.pt", policy=pol, optimizer=opt, global_step=0, update=0,
                           config=cfg.to_dict(), env_config=cfg.to_dict()["env"])
    print(f"default checkpoint: {path.stat().st_size:,} bytes")
    assert 1_000_000 < check_size(path) < 2_500_000
