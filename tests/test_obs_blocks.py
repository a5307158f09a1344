"""One observation layout for every writer and reader: a dummy block added to the one block table
(``gpusim.kernels.obs_layout.BLOCKS``) shifts the later blocks, and the env's observe stage (C
kernels and torch references), the policy's encoder, the renderer's decoder and the experience
hooks all follow it, so every real feature keeps its value and meaning, bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch

import gpusim.kernels.obs_layout as obs_layout_mod
from gpusim import DriveEnv
from gpusim.config import EnvConfig
from gpusim.render import decode_ego_observation
from policy.encoders import ObsDims, ObsEncoder
from train.experience import hook_context, make_hook
from train.packs import load_pack

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
TFRECORD = ROOT / "data" / "womd_tfrecord" / "motion_data_one_scenario.tfrecord.gz"
#: every block on: signals, driving styles (reward conditioning), the memory task's candidates
CFG = dict(max_controlled=6, num_partners=5, num_roads=12, num_signals=4, goal_behavior="trial", k_trials=2,
           scenario_length=8, goal_candidates=2, reward_conditioning=True)
DUMMY = 2 * 3  # the dummy block: 2 slots of 3 features


def _with_dummy(monkeypatch, after: str) -> None:
    blocks = {}
    for name, width in obs_layout_mod.BLOCKS.items():
        blocks[name] = width
        if name == after:
            blocks["dummy"] = lambda s: (2, 3)
    monkeypatch.setattr(obs_layout_mod, "BLOCKS", blocks)


def _rollout(pack, cpu_kernels: bool, steps: int = 5):
    env = DriveEnv(pack, num_worlds=2, config=EnvConfig(**CFG, cpu_kernels=cpu_kernels), seed=4)
    gen = torch.Generator().manual_seed(1)
    obs = [env.reset().clone()]
    for _ in range(steps):
        res = env.step(torch.randint(0, env.num_actions, (env.num_worlds, env.num_slots), generator=gen))
        obs.append(res.obs.clone())
    return env, torch.stack(obs)


@pytest.fixture(scope="module")
def packs(sample_dir):
    """The bundled sample (no traffic signal: the C kernel zeroes the signal block) and the bundled
    TFRecord scenario (12 signals: the signal kernel writes the block)."""
    from gpusim.data import ScenarioPack
    cfg = EnvConfig(**CFG)
    return {"sample": load_pack(str(sample_dir), cfg), "tfrecord": ScenarioPack.from_json([str(TFRECORD)], cfg.data_config())}


@pytest.mark.parametrize("after", ["roads", "signals", "style", "candidates"])
def test_dummy_block_every_consumer_follows(monkeypatch, packs, after):
    plain = {(src, ck): _rollout(pk, ck) for src, pk in packs.items() for ck in (True, False)}
    lay0 = plain["sample", True][0].obs_layout
    env0, obs0 = plain["tfrecord", True]
    # the readers built on the layout without the block
    torch.manual_seed(0)
    enc0 = ObsEncoder(ObsDims.from_layout(env0.obs_layout), d_model=16, hidden=8, max_roads=7)
    row = int(torch.nonzero(env0.state.slot_active[0])[0])
    want = decode_ego_observation(obs0[-1, 0, row], env0.obs_layout)
    h0, c0 = make_hook("progress", (), hook_context(env0, 0.99)), hook_context(env0, 0.99)
    _with_dummy(monkeypatch, after)
    for (src, ck), (env0, obs0) in plain.items():
        env, obs = _rollout(packs[src], ck)
        lay = env.obs_layout
        dummy = lay.block("dummy")
        assert lay.obs_dim == lay0.obs_dim + DUMMY and dummy.stop - dummy.start == DUMMY
        assert dummy.start == lay0.block(after).stop  # where the table put it; later blocks shifted
        keep = torch.cat([torch.arange(dummy.start), torch.arange(dummy.stop, lay.obs_dim)])
        # the writers: every real column bit for bit as without the block; nobody writes the block
        assert torch.equal(obs[..., keep], obs0), (src, ck)
        assert (obs[..., dummy] == 0).all()
        assert obs0.abs().sum() > 0 and (obs0[..., lay0.candidates] != 0).any() and (obs0[..., lay0.style] != 0).any()
        if src == "tfrecord":
            assert (obs0[..., lay0.signals] != 0).any()
    env0, obs0 = plain["tfrecord", True]
    env, obs = _rollout(packs["tfrecord"], True)
    # the encoder follows the block: its ego MLP reads it (no set encoder claims it) at its place
    # among the per-agent blocks; with enc0's weights and zero weights on the dummy's columns it
    # gives enc0's tokens, whole and compact (fewer road slots)
    enc = ObsEncoder(ObsDims.from_layout(env.obs_layout), d_model=16, hidden=8, max_roads=7)
    assert enc.dims.obs_dim == env.obs_layout.obs_dim
    ego_blocks = {"roads": ("ego", "dummy", "style", "candidates"), "signals": ("ego", "dummy", "style", "candidates"),
                  "style": ("ego", "style", "dummy", "candidates"), "candidates": ("ego", "style", "candidates", "dummy")}
    assert enc0.ego_blocks == ("ego", "style", "candidates") and enc.ego_blocks == ego_blocks[after]
    lay0, lay = env0.obs_layout, env.obs_layout
    before = ego_blocks[after][:ego_blocks[after].index("dummy")]
    col = sum(lay0.block(n).stop - lay0.block(n).start for n in before)  # the dummy's first ego-MLP input
    state = dict(enc0.state_dict())
    w0 = state["ego.0.weight"]
    w_dummy = torch.randn(w0.shape[0], DUMMY, generator=torch.Generator().manual_seed(3))
    state["ego.0.weight"] = torch.cat([w0[:, :col], torch.zeros_like(w_dummy), w0[:, col:]], dim=1)
    enc.load_state_dict(state)  # (a wider product: equal up to the summation order)
    torch.testing.assert_close(enc(obs), enc0(obs0), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(enc(enc.compact(obs), compact=True), enc0(enc0.compact(obs0), compact=True),
                               rtol=1e-6, atol=1e-6)
    # ... and it reads the dummy's values: a constant x in the block adds w_dummy @ x to the first
    # layer, the same as enc0 with that added to its bias
    state["ego.0.weight"] = torch.cat([w0[:, :col], w_dummy, w0[:, col:]], dim=1)
    enc.load_state_dict(state)
    x = torch.linspace(-1.0, 1.0, DUMMY)
    filled = obs.clone()
    filled[..., lay.block("dummy")] = x
    shifted = copy.deepcopy(enc0)  # (built on the table without the block)
    shifted.load_state_dict({**enc0.state_dict(), "ego.0.bias": enc0.state_dict()["ego.0.bias"] + w_dummy @ x})
    assert not torch.allclose(enc(filled), enc0(obs0), atol=1e-3)
    torch.testing.assert_close(enc(filled), shifted(obs0), rtol=1e-5, atol=1e-5)
    # the renderer's decoder: the same ego, partners and roads
    got = decode_ego_observation(obs[-1, 0, row], env.obs_layout)
    assert got["ego"] == want["ego"]
    for part in ("partners", "roads"):
        for key in want[part]:
            assert (got[part][key] == want[part][key]).all(), (part, key)
    # the experience hooks: the ego goal distance and the candidate columns
    h, c = make_hook("progress", (), hook_context(env, 0.99)), hook_context(env, 0.99)
    assert torch.equal(obs[..., h.column], obs0[..., h0.column])
    assert torch.equal(obs[..., c["candidate_dist_columns"]], obs0[..., c0["candidate_dist_columns"]])


def test_kernel_blocks_must_stay_adjacent(monkeypatch):
    """The kernels write ego, partners and roads in one pass: a block between them is refused."""
    _with_dummy(monkeypatch, "ego")
    with pytest.raises(ValueError, match="must be adjacent"):
        obs_layout_mod.obs_layout(3, 4)


def test_block_sized_by_a_setting_needs_no_other_edit(monkeypatch, tmp_path):
    """A block whose size is an ``EnvConfig`` field, read by name in its ``BLOCKS`` entry alone:
    the env's layout, the policy's sizes (``ObsDims``), the encoder and a checkpoint of it all
    follow; the same policy on an env with another value of the setting is a ``PolicyMismatch``."""
    from policy.actor_critic import ActorCritic, PolicyConfig
    from train.checkpoint import PolicyMismatch, load_checkpoint, policy_from_checkpoint, save_checkpoint

    blocks = dict(obs_layout_mod.BLOCKS)
    blocks["dummy"] = lambda s: (s["k_trials"], 3)  # k_trials slots of 3 features, after every block
    monkeypatch.setattr(obs_layout_mod, "BLOCKS", blocks)
    from gpusim.sim.observe import config_obs_layout
    lay = config_obs_layout(EnvConfig(**CFG))  # k_trials = 2
    plain = lay.block("candidates")
    assert lay.block("dummy") == slice(plain.stop, plain.stop + 2 * 3) and lay.obs_dim == plain.stop + 6
    dims = ObsDims.from_layout(lay)
    assert dims.extra == (("k_trials", 2),) and dims.layout().blocks == lay.blocks and dims.obs_dim == lay.obs_dim
    assert ObsDims.from_layout(config_obs_layout(EnvConfig(**{**CFG, "k_trials": 3}))).extra == (("k_trials", 3),)
    policy = ActorCritic(lay, 91, False, PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=8))
    assert policy.encoder.ego_blocks == ("ego", "style", "candidates", "dummy")
    assert policy.encoder.ego[0].in_features == lay.ego_dim + lay.style_dim + lay.candidate_dim + 6
    # a checkpoint records the size and rebuilds the same policy; another k_trials is refused
    path = save_checkpoint(tmp_path / "p.pt", policy=policy, optimizer=torch.optim.Adam(policy.parameters()),
                           global_step=0, update=0, config={}, env_config={})
    payload = load_checkpoint(path)
    assert payload["policy"]["dims"]["extra"] == (("k_trials", 2),)
    back = policy_from_checkpoint(payload, path, obs_layout=lay, num_actions=91)
    obs = torch.rand(2, 3, lay.obs_dim, generator=torch.Generator().manual_seed(0))
    assert torch.equal(back.encoder(obs), policy.eval().encoder(obs))
    with pytest.raises(PolicyMismatch, match="k_trials"):
        policy_from_checkpoint(payload, path, obs_layout=config_obs_layout(EnvConfig(**{**CFG, "k_trials": 3})))


def test_policy_description_of_todays_blocks_is_unchanged():
    """``extra`` is left out of the description of a policy of today's blocks, so its checkpoint
    reads as before (and a description without it loads)."""
    from policy.actor_critic import ActorCritic

    lay = obs_layout_mod.obs_layout(5, 12, num_signals=4, styles=True, candidates=2)
    dims = ObsDims.from_layout(lay)
    assert dims.extra == () and "extra" not in ActorCritic(lay, 91).describe()["dims"]
    assert ObsDims(**dims.describe()) == dims and dims.layout().blocks == lay.blocks
