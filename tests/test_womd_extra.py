"""``data/womd_extra``: three real scenes with traffic signals and with pedestrians / cyclists that
the ``all_valid`` control rule hands to the policy. The signal block of the default run's
observations sees their signals, and the agent-type hook of docs/training.md drops their rows."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
import torch

from gpusim.config import EnvConfig, ObjectType
from gpusim.data import ScenarioPack
from gpusim.env import DriveEnv
from policy.actor_critic import ActorCritic, PolicyConfig
from train.config import TrainConfig
from train.experience import hook_context, make_hook
from train.rollout import RolloutBatch, collect_rollout

REPO = pathlib.Path(__file__).resolve().parents[1]
EXTRA = REPO / "data" / "womd_extra"
IDS = ["2a173b334be3d32c", "2d84b1ab55ab81d3", "c9bbd79edc48bbcb"]
#: (pedestrians, cyclists) controlled under control="all_valid" (max_controlled 32), per scene.
ALL_VALID_VRU = {"2a173b334be3d32c": (1, 0), "2d84b1ab55ab81d3": (0, 1), "c9bbd79edc48bbcb": (3, 0)}


@pytest.fixture(scope="module")
def default_pack():
    """The scenes as the default run (train/config.py) builds them."""
    return ScenarioPack.from_json(EXTRA, TrainConfig().env.data_config())


@pytest.fixture(scope="module")
def all_valid_pack():
    return ScenarioPack.from_json(EXTRA, EnvConfig().data_config(control="all_valid"))


def test_files_readme_and_split():
    """The folder holds the three scenes of the README's table (sizes as listed), all in the train
    split, none held out, none in the bundled sample."""
    files = sorted(EXTRA.glob("*.json.xz"))
    assert [f.name.removesuffix(".json.xz") for f in files] == IDS
    readme = (EXTRA / "README.md").read_text()
    assert "Waymo Open Dataset License Agreement for Non-Commercial Use" in readme
    for f in files:
        row = re.search(rf"\| `{re.escape(f.name)}` \| (\d+) \|", readme)
        assert row and int(row.group(1)) == f.stat().st_size
    total = int(re.search(r"Total: (\d+) bytes", readme).group(1))
    assert total == sum(f.stat().st_size for f in files) < 1_200_000  # keep the repository small
    splits = json.loads((REPO / "data" / "splits.json").read_text())
    assert set(IDS) <= set(splits["splits"]["train"]) and set(IDS) <= set(splits["signal_scenarios"])
    assert not set(IDS) & set(splits["splits"]["held_out"]) and not set(IDS) & set(splits["bundled"])


def test_default_run_observes_the_signals(default_pack):
    """With the default run's env config the signal block (16 slots x 11 features) is non-zero:
    each controlled agent sees exactly the stop points within ``road_radius`` (at most 16)."""
    cfg = TrainConfig().env
    assert default_pack.num_signals.tolist() == [12, 16, 14]
    assert default_pack.num_controlled.tolist() == [7, 8, 8]
    env = DriveEnv(default_pack, 3, config=cfg, device="cpu", seed=0)
    obs = env.reset(scenarios=torch.arange(3))
    lay = env.obs_layout
    assert lay.num_signals == 16 and lay.signal_dim == 11
    totals = []
    for _ in range(2):
        sig = obs[..., lay.signals].reshape(3, env.num_slots, lay.num_signals, lay.signal_dim)
        st = env.state
        seen = []
        for w in range(3):
            n = int(default_pack.num_signals[w])
            for c in range(int(default_pack.num_controlled[w])):
                if not bool(st.slot_active[w, c]) or bool(st.removed[w, c]):
                    continue
                d = (default_pack.signal_pos[w, :n] - st.pos[w, c]).norm(dim=-1)
                want = min(16, int((d <= cfg.road_radius).sum()))
                got = sig[w, c, :, -1]
                assert int(got.sum()) == want, (w, c)
                # one state group (unknown / stop / caution / go) per valid slot
                assert torch.equal(sig[w, c, :, 4:8].sum(-1), got)
                seen.append(want)
        totals.append(sum(seen))
        assert max(seen) == 16  # the busy intersection of 2d84b1ab55ab81d3 fills every slot
        for _ in range(10):
            obs = env.step(env.expert_actions()).obs
    assert totals == [260, 249]  # valid signal slots over the controlled agents, steps 0 and 10
    assert (sig[..., 5] == 1).any() and (sig[..., 7] == 1).any()  # stop and go states are both observed


def test_all_valid_controls_pedestrians_and_cyclists(default_pack, all_valid_pack):
    """Under control="all_valid" a pedestrian or cyclist is among each scene's controlled agents;
    under the default rule only vehicles are."""
    for s, sid in enumerate(all_valid_pack.scenario_ids):
        nc = int(all_valid_pack.num_controlled[s])
        types = all_valid_pack.agent_type[s, :nc]
        got = (int((types == int(ObjectType.PEDESTRIAN)).sum()), int((types == int(ObjectType.CYCLIST)).sum()))
        assert got == ALL_VALID_VRU[sid], sid
        dn = int(default_pack.num_controlled[s])
        assert (default_pack.agent_type[s, :dn] == int(ObjectType.VEHICLE)).all()
    assert all_valid_pack.num_controlled.tolist() == [12, 32, 26]


def _rollout(pack, cfg):
    env = DriveEnv(pack, 3, config=cfg, device="cpu", seed=0)
    obs = env.reset(scenarios=torch.arange(3))
    torch.manual_seed(0)
    small = PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16)
    pol = ActorCritic(env.obs_layout, env.num_actions, False, small)
    R, H = env.num_worlds * env.num_slots, env.horizon
    buf = RolloutBatch.empty(R, H, env.obs_dim, False, 1, "cpu")
    _, batch = collect_rollout(env, pol, obs, buf, pol.init_cache(R, H))
    return env, batch


@pytest.mark.parametrize("control", ["all_valid", "vehicles_with_goal"])
def test_drop_hook_drops_pedestrian_rows(control, all_valid_pack, default_pack):
    """``--experience drop --experience-arg agent_type=pedestrian`` (docs/training.md) removes the
    steps of the controlled pedestrians from training: 4 rows under all_valid, none by default."""
    cfg = EnvConfig(scenario_length=12)
    pack = all_valid_pack if control == "all_valid" else ScenarioPack.from_json(EXTRA, cfg.data_config())
    env, batch = _rollout(pack, cfg)
    before = int(batch.loss_mask.sum())
    hook = make_hook("drop", ["agent_type=pedestrian"], hook_context(env, 0.99))
    out, effective = hook.preprocess_unroll_experience(batch)
    ped = batch.agent_type == int(ObjectType.PEDESTRIAN)
    want_rows = 4 if control == "all_valid" else 0
    assert int((ped & batch.slot_active).sum()) == want_rows
    dropped = before - int(effective)
    assert dropped == int(batch.loss_mask[ped].sum())
    assert (dropped > 0) == (want_rows > 0)
    assert not out.loss_mask[ped].any() and torch.equal(out.loss_mask[~ped], batch.loss_mask[~ped])


def test_convert_control_flag_gives_training_packs_with_pedestrians(tmp_path, capsys):
    """``python -m gpusim.data convert data/womd_extra --out DIR --control all_valid`` writes a pack
    whose controlled agents include the pedestrians and the cyclist (``train/run.py --data DIR``
    then trains on them and adopts ``max_controlled`` 32); a bad rule is a one-line error, exit 2."""
    from gpusim.data.__main__ import main as data_main

    out = tmp_path / "extra_all"
    assert data_main(["convert", str(EXTRA), "--out", str(out), "--control", "all_valid", "--no-progress"]) == 0
    pack = ScenarioPack.load(out)
    assert pack.config.control == "all_valid" and pack.num_controlled.tolist() == [12, 32, 26]
    types = torch.cat([pack.agent_type[s, :int(pack.num_controlled[s])] for s in range(3)])
    assert int((types == int(ObjectType.PEDESTRIAN)).sum()) == 4 and int((types == int(ObjectType.CYCLIST)).sum()) == 1
    capsys.readouterr()
    assert data_main(["convert", str(EXTRA), "--out", str(tmp_path / "bad"), "--control", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "all_valid" in err[0]
