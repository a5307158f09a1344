"""The C kernels of the stages ``rewards``, ``signals``, ``motion``, ``accounting`` and ``replay``
(``events_cpu``, ``red_light_cpu``, ``kernels/motion.py``, ``accumulate_cpu``, ``replay_state_cpu``) against their torch references, and the env with and without them.

Kernel cases: real scenarios (the bundled sample, the bundled TFRecord scenario with 12 signals)
with random and forced events (goals, collisions, offroad, hits, already stopped / removed agents,
done worlds and slots) for every goal and contact behaviour, garbage-free new outputs, crossings of
red and other signals, out-of-range log indices. Env cases: ``cpu_kernels`` True vs False over 30+
steps for ignore / remove / stop contacts with respawn / new_goal / stop goals and trial mode, and
a crafted red-light crossing with a penalty. Equality is exact (floats bit for bit).
"""

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from gpusim.config import ContactBehavior, EnvConfig, GoalBehavior
from gpusim.data import ScenarioPack
from gpusim.enums import SignalState
from gpusim.env import DriveEnv
from gpusim.kernels import dynamics
from gpusim.kernels.accounting import accumulate_cpu as accounting_cpu
from gpusim.kernels.cbuild import step_kernels_status
from gpusim.kernels.events import bind_events, events_cpu, events_reference
from gpusim.kernels.motion import bicycle_slots_cpu, discrete_motion_tables, in_play_cpu, motion_discrete_cpu
from gpusim.kernels.replay import replay_reference, replay_state_cpu
from gpusim.kernels.signals import red_light_cpu, red_light_violation_reference
from gpusim.state import in_play
from tests.synthetic import driver, lane, small_config, synthetic_pack, to_cpu, to_kernel_device

TFRECORD = Path(__file__).resolve().parents[1] / "data" / "womd_tfrecord" / "motion_data_one_scenario.tfrecord.gz"


@pytest.fixture(scope="module")
def pack(sample_dir):
    cfg = EnvConfig(max_controlled=8)
    return ScenarioPack.from_json(sorted(sample_dir.glob("*.json*")), cfg.data_config())


@pytest.fixture(scope="module")
def signal_pack():
    return ScenarioPack.from_json([str(TFRECORD)])


def bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def assert_same(got, want):
    for name, x, y in zip(want._fields, got, want):
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert torch.equal(bits(x), bits(y)), name


def event_inputs(env, g):
    """Inputs of ``events`` from the env's state with random flags; a third of the goals moved
    onto (or just outside the radius of) the agents, so goals are reached and missed narrowly."""
    st = env.state
    W, A = st.present.shape
    C = env.num_slots
    rnd = lambda p, *shape: torch.rand(*(shape or (W, A)), generator=g) < p  # noqa: E731
    near = st.pos + torch.randn(W, A, 2, generator=g) * 1.5
    goal = torch.where(rnd(0.35)[..., None], near, st.goal).contiguous()
    goal[0, 0] = st.pos[0, 0] + torch.tensor([2.0, 0.0])  # exactly on the default radius
    return dict(pos=st.pos.contiguous(), goal=goal, speed=st.speed.contiguous(), controlled=st.controlled,
                in_play=rnd(0.8) & st.present, present=st.present, collided=rnd(0.15), offroad=rnd(0.1),
                hit=rnd(0.1), stopped=rnd(0.1), contact_stopped=rnd(0.2), removed=rnd(0.05),
                world_done=rnd(0.2, W), episode_end=rnd(0.3, W), slot_active=st.slot_active.contiguous(),
                slot_done=rnd(0.1, W, C))


def test_library_has_the_stage_kernels():
    st = step_kernels_status()
    assert st["available"], st["reason"]


@pytest.mark.parametrize("worlds", [1, 7, 33])
def test_events_match_reference_every_behaviour(pack, worlds):
    """Every goal x collision x offroad behaviour, several radii, rewards and truncation
    fractions, over states of a random-action rollout: identical outputs; events do occur."""
    cfg = EnvConfig(max_controlled=8, num_signals=0, scenario_length=12, cpu_kernels=False)
    env = DriveEnv(pack, worlds, cfg, seed=worlds)
    g = torch.Generator().manual_seed(worlds)
    seen = torch.zeros(4, dtype=torch.int64)
    for t in range(6):
        inp = event_inputs(env, g)
        W, C = inp["slot_active"].shape
        wide = torch.rand(W, inp["present"].shape[1], generator=g) < 0.5  # other columns: noise
        wide[:, :C] = inp["slot_active"]
        view = wide[:, :C]
        for gb in GoalBehavior:
            for cb in ContactBehavior:
                for ob in ContactBehavior:
                    kw = dict(goal_radius=(2.0, 0.7, 3.3)[t % 3], reward_goal=1.0, reward_collision=-0.35,
                              reward_offroad=(-0.2, 0.0, -1.0 / 3.0)[t % 3], goal_behavior=int(gb),
                              collision_behavior=int(cb), offroad_behavior=int(ob),
                              stop_truncate_fraction=(0.5, 1.0 / 3.0, 1.0)[t % 3])
                    want = events_reference(**inp, **kw)
                    assert_same(events_cpu(**inp, **kw), want)
                    # unchecked: slot_active may be the row-strided view controlled[:, :C] (read in place)
                    assert_same(events_cpu(**dict(inp, slot_active=view), **kw, check=False), want)
                    # the bound call (the env's): slot_active as the wide tensor whose first C columns count
                    if t == 0:
                        for backend, check in (("c", False), ("c", True), ("torch", True)):
                            args = dict(inp, slot_active=wide)
                            assert_same(bind_events(backend, check, **kw)(*args.values()), want)
                    seen += torch.stack([want.goal_now.sum(), want.truncated.sum(), want.terminal.sum(),
                                         (want.removed & ~inp["removed"]).sum()])
        env.step(torch.randint(0, 91, (worlds, env.num_slots), generator=g))
    assert (seen > 0).all(), seen


def crossings(pack, W, C, g):
    """Slots whose step crosses (or nearly crosses) a real signal's stop line, headings around
    the lane direction, red and other states, log indices partly outside the log."""
    S, T, L = pack.signal_state.shape
    s = torch.randint(0, S, (W,), generator=g)
    n = pack.num_signals[s].clamp(min=1).to(torch.int64)
    pick = (torch.rand(W, C, generator=g) * n[:, None]).to(torch.int64)
    sp, sd = pack.signal_pos[s[:, None], pick], pack.signal_dir[s[:, None], pick]
    perp = torch.stack([-sd[..., 1], sd[..., 0]], -1)
    lat = torch.rand(W, C, 1, generator=g) * 5 - 2.5
    a = sp + perp * lat - sd * torch.rand(W, C, 1, generator=g) * 2
    b = sp + perp * lat + sd * (torch.rand(W, C, 1, generator=g) * 2 - 0.5)
    heading = torch.atan2(sd[..., 1], sd[..., 0]) + torch.rand(W, C, generator=g) * 2.4 - 1.2
    return dict(pos_before=a.contiguous(), pos=b.contiguous(), heading=heading.contiguous(),
                moving=torch.rand(W, C, generator=g) > 0.1, scenario=s,
                log_index=torch.randint(-3, T + 3, (W,), generator=g).to(torch.int32),
                signal_pos=pack.signal_pos, signal_dir=pack.signal_dir, signal_state=pack.signal_state,
                signal_valid=pack.signal_valid, num_signals=pack.num_signals)


@pytest.mark.parametrize("W,C", [(1, 1), (5, 7), (31, 8)])
def test_red_light_matches_reference_on_real_signals(signal_pack, W, C):
    g = torch.Generator().manual_seed(W * 100 + C)
    p = signal_pack
    hits = 0
    for code in (SignalState.STOP, SignalState.ARROW_STOP, SignalState.GO, None):
        state = p.signal_state if code is None else torch.full_like(p.signal_state, int(code))
        args = crossings(p, W, C, g)
        args["signal_state"] = state
        want = red_light_violation_reference(**args)
        got = red_light_cpu(**args, out=torch.ones(W, C, dtype=torch.bool))
        assert torch.equal(got, want), code
        hits += int(want.sum())
        if code == SignalState.GO:
            assert not want.any()
    if W * C > 30:
        assert hits > 0


def test_red_light_bad_inputs_raise(signal_pack):
    args = crossings(signal_pack, 2, 3, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="red_light: heading"):
        red_light_cpu(**dict(args, heading=args["heading"].double()))
    with pytest.raises(ValueError, match="red_light: log_index"):
        red_light_cpu(**dict(args, log_index=args["log_index"].float()))
    with pytest.raises(ValueError, match="red_light: scenario indices"):
        red_light_cpu(**dict(args, scenario=torch.tensor([0, 5])))


def test_events_bad_inputs_raise(pack):
    env = DriveEnv(pack, 2, EnvConfig(max_controlled=8, num_signals=0), seed=0)
    inp = event_inputs(env, torch.Generator().manual_seed(0))
    kw = dict(goal_radius=2.0, reward_goal=1.0, reward_collision=-1.0, reward_offroad=-1.0, goal_behavior=0,
              collision_behavior=0, offroad_behavior=0, stop_truncate_fraction=0.5)
    with pytest.raises(ValueError, match="events: hit"):
        events_cpu(**dict(inp, hit=inp["hit"].int()), **kw)


@pytest.mark.parametrize("worlds,C", [(1, 8), (13, 8), (40, 3)])
def test_bicycle_slots_match_reference(pack, worlds, C):
    """Real states, discrete and continuous controls, headings near +-pi (wrapping), tiny lengths,
    speeds near the clamps, NaN in a non-moving slot: the C motion equals the reference on the
    first C columns bit for bit and copies the other columns."""
    env = DriveEnv(pack, worlds, EnvConfig(max_controlled=8, num_signals=0), seed=worlds)
    g = torch.Generator().manual_seed(worlds)
    st = env.state
    W, A = st.present.shape
    for t in range(8):
        heading = st.heading + torch.randn(W, A, generator=g) * t
        heading[:, 0] = math.pi - 1e-3 * t
        speed = torch.where(torch.rand(W, A, generator=g) < 0.3, torch.rand(W, A, generator=g) * 0.3,
                            st.speed + 99.0 * (t == 7))
        length = st.length.clone()
        length[:, -1] = 0.05
        length[:, 1] = 0.05 if C > 1 else length[:, 1]
        kind = t % 2
        acts = (torch.randint(0, dynamics.NUM_ACTIONS, (W, C), generator=g) if kind == 0
                else torch.rand(W, C, 2, generator=g) * 2.2 - 1.1)
        accel, steer = dynamics.decode_actions(acts, kind)
        moving = torch.rand(W, C, generator=g) < 0.8
        moving[0, 0] = False
        pos = st.pos.clone()
        pos[0, 0] = float("nan")
        args = dict(pos=pos, heading=heading.contiguous(), speed=speed.contiguous(), length=length)
        got = bicycle_slots_cpu(**args, accel=accel.contiguous(), steer=steer.contiguous(), moving=moving, dt=0.1)
        want = dynamics.bicycle_step_reference(**{k: v[:, :C].contiguous() for k, v in args.items()},
                                               accel=accel, steer=steer, moving=moving, dt=0.1)
        for x, y, full in zip(got, want, args.values()):
            assert torch.equal(bits(x[:, :C]), bits(y)) and torch.equal(bits(x[:, C:]), bits(full[:, C:]))
        assert (got[1][:, :C] != heading[:, :C]).any()


@pytest.mark.parametrize("action_space", [0, 1])
@pytest.mark.parametrize("backend", ["torch", "triton", "c"])  # every backend of the op
def test_move_slots_every_backend_and_bound_call(pack, backend, action_space):
    """``move_slots`` (stage motion's op) on each backend, and its bound form (``bind_move_slots``,
    unchecked on C: the direct kernel calls), equal the torch reference: in-play flags, the loss
    mask and the moved poses (bit for bit on C; within float32 rounding on Triton, whose
    transcendental functions are its own), experts' columns copied."""
    from gpusim.backend import use_backend
    from gpusim.kernels.motion import bind_move_slots, move_slots

    env = DriveEnv(pack, 5, EnvConfig(max_controlled=8, num_signals=0, action_space=action_space), seed=2)
    g = torch.Generator().manual_seed(7)
    st, C = env.state, env.num_slots
    W, A = st.present.shape
    acts = (torch.randint(0, dynamics.NUM_ACTIONS, (W, C), generator=g) if action_space == 0
            else torch.rand(W, C, 2, generator=g) * 2 - 1)
    stopped = torch.rand(W, A, generator=g) < 0.2
    args = (st.controlled, st.present, stopped, st.removed, st.world_done, st.pos, st.heading, st.speed, st.length,
            acts)
    want = move_slots(*args, action_space, 0.1, backend="torch")
    assert want[1].any() and not want[1].all()  # some slots in play, some not
    if backend == "triton":  # forced, so the model's own dispatcher runs its Triton kernel too
        with use_backend("triton"):
            got = to_cpu(move_slots(*to_kernel_device(args), action_space, 0.1, backend="triton"))
        for x, y in zip(got, want):
            torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-5)
        return
    for got in (move_slots(*args, action_space, 0.1, backend=backend),
                bind_move_slots(backend, False, action_space, 0.1)(*args)):
        for x, y in zip(got, want):
            assert torch.equal(bits(x), bits(y))


@pytest.mark.parametrize("worlds,C", [(1, 8), (13, 8), (40, 3)])
def test_motion_discrete_matches_reference(pack, worlds, C):
    """The discrete motion (two C passes, per-action tables) equals ``state.in_play`` and
    ``bicycle_step_reference`` on the decoded actions, moving the in-play slots, bit for bit: random
    flags on real states, every action index (and out-of-range ones, clamped as ``decode_actions``
    clamps them), headings near +-pi, tiny lengths, speeds near the clamps, NaN in a slot not in play."""
    if discrete_motion_tables() is None:
        pytest.skip("torch's tan/atan/cos depend on the element's position on this machine: no tables")
    env = DriveEnv(pack, worlds, EnvConfig(max_controlled=8, num_signals=0), seed=worlds)
    g = torch.Generator().manual_seed(100 + worlds)
    st = env.state
    W, A = st.present.shape
    turned = 0
    for t in range(8):
        rnd = lambda p, *shape: torch.rand(*(shape or (W, A)), generator=g) < p  # noqa: E731
        flags = dict(controlled=rnd(0.7), present=rnd(0.9), stopped=rnd(0.15), removed=rnd(0.1))
        world_done = rnd(0.1, W)
        flags["controlled"][0, 0], flags["present"][0, 0] = False, True  # not in play: NaN pose stays
        heading = (st.heading + torch.randn(W, A, generator=g) * t).contiguous()
        heading[:, 0] = math.pi - 1e-3 * t
        speed = torch.where(rnd(0.3), torch.rand(W, A, generator=g) * 0.3, st.speed + 99.0 * (t == 7)).contiguous()
        length = st.length.clone()
        length[:, -1] = 0.05
        pos = st.pos.clone()
        pos[0, 0] = float("nan")
        acts = torch.randint(-2 if t == 5 else 0, dynamics.NUM_ACTIONS + (3 if t == 5 else 0), (W, C), generator=g)
        acts.view(-1)[: min(acts.numel(), dynamics.NUM_ACTIONS)] = torch.arange(min(acts.numel(), dynamics.NUM_ACTIONS))
        play, mask, *got = motion_discrete_cpu(**flags, world_done=world_done, pos=pos, heading=heading, speed=speed,
                                               length=length, actions=acts, dt=0.1)
        want_play = in_play(dataclasses.replace(st, **flags, world_done=world_done))
        assert torch.equal(play, want_play) and torch.equal(mask, want_play[:, :C])
        accel, steer = dynamics.decode_actions(acts, 0)
        args = dict(pos=pos, heading=heading, speed=speed, length=length)
        want = dynamics.bicycle_step_reference(**{k: v[:, :C].contiguous() for k, v in args.items()},
                                               accel=accel, steer=steer, moving=want_play[:, :C], dt=0.1)
        for x, y, full in zip(got, want, args.values()):
            assert torch.equal(bits(x[:, :C]), bits(y)) and torch.equal(bits(x[:, C:]), bits(full[:, C:]))
        turned += int((got[1][:, :C] != heading[:, :C]).sum())
    assert turned > 0  # some agents in play did turn
    with pytest.raises(ValueError, match="motion_discrete: actions"):
        motion_discrete_cpu(**flags, world_done=world_done, pos=pos, heading=heading, speed=speed, length=length,
                            actions=acts.int(), dt=0.1)


@pytest.mark.parametrize("W,A,C", [(1, 64, 8), (13, 7, 3), (5, 33, 33)])
def test_accounting_matches_torch(W, A, C):
    """The C accounting pass equals the torch expressions of stage ``accounting`` bit for bit (NaN
    and infinite returns included), returns the contacts of agents in play and counts terminals."""
    g = torch.Generator().manual_seed(W * A + C)
    rnd = lambda p, *shape: torch.rand(*shape, generator=g) < p  # noqa: E731
    ep_return = torch.randn(W, C, generator=g) * 1e3
    ep_return.view(-1)[0] = float("nan")
    ep_return.view(-1)[-1] = float("inf")
    inp = dict(ep_return=ep_return, reward=torch.randn(W, C, generator=g),
               ep_length=torch.randint(0, 2 ** 31 - 2, (W, C), generator=g, dtype=torch.int32),
               loss_mask=rnd(0.5, W, C), goal_reached=rnd(0.2, W, A), goal_now=rnd(0.1, W, A),
               in_play=rnd(0.7, W, A), collided=rnd(0.2, W, A), offroad=rnd(0.2, W, A),
               ever_collided=rnd(0.1, W, A), ever_offroad=rnd(0.1, W, A), ever_red_light=rnd(0.1, W, C),
               red_light_now=rnd(0.1, W, C), terminal=rnd(0.2, W, C))
    for check in (True, False):
        changes, col_ip, off_ip, n = accounting_cpu(**inp, check=check)
        want_c, want_o = inp["in_play"] & inp["collided"], inp["in_play"] & inp["offroad"]
        want = {"ep_return": inp["ep_return"] + inp["reward"], "ep_length": inp["ep_length"] + inp["loss_mask"],
                "goal_reached": inp["goal_reached"] | inp["goal_now"], "ever_collided": inp["ever_collided"] | want_c,
                "ever_offroad": inp["ever_offroad"] | want_o,
                "ever_red_light": inp["ever_red_light"] | inp["red_light_now"]}
        assert changes.keys() == want.keys()
        for k, v in want.items():
            assert changes[k].dtype == v.dtype and torch.equal(bits(changes[k]), bits(v)), k
        assert torch.equal(col_ip, want_c) and torch.equal(off_ip, want_o)
        assert n == int(inp["terminal"].sum())
    with pytest.raises(ValueError, match="accounting: ep_length"):
        accounting_cpu(**dict(inp, ep_length=inp["ep_length"].long()))


def test_motion_tables_equal_per_agent_ops():
    """Each table value equals the per-agent op chain of the reference (tan of the clamped steering,
    atan of half of it, its cosine) on the decoded steering, inside a large [W, C] tensor."""
    tables = discrete_motion_tables()
    if tables is None:
        pytest.skip("torch's tan/atan/cos depend on the element's position on this machine: no tables")
    k = torch.randint(0, dynamics.NUM_ACTIONS, (333, 7), generator=torch.Generator().manual_seed(3))
    accel, steer = dynamics.decode_actions(k, 0)
    tan_d = torch.tan(steer.clamp(-dynamics.MAX_STEER, dynamics.MAX_STEER))
    beta = torch.atan(0.5 * tan_d)
    for name, per_agent in (("accel_of", accel), ("tan_of", tan_d), ("beta_of", beta), ("cos_b_of", torch.cos(beta))):
        assert torch.equal(bits(tables[name][k]), bits(per_agent)), name


@pytest.mark.parametrize("worlds,C", [(1, 8), (13, 8), (40, 3)])
def test_in_play_and_replay_state_match_reference(pack, worlds, C):
    """Random flags on real states, logs past their end and before their start: ``in_play_cpu``
    equals ``state.in_play`` (and its first C columns), ``replay_state_cpu`` equals the reference
    replay with ``replayed = ~controlled & ~removed`` and ``log_index = init + step - trial_start``."""
    env = DriveEnv(pack, worlds, EnvConfig(max_controlled=8, num_signals=0), seed=worlds)
    g = torch.Generator().manual_seed(worlds)
    st = env.state
    W, A = st.present.shape
    T = pack.traj_valid.shape[-1]
    for t in range(6):
        rnd = lambda p, *shape: torch.rand(*(shape or (W, A)), generator=g) < p  # noqa: E731
        flags = dict(controlled=rnd(0.6), present=rnd(0.8), stopped=rnd(0.2), removed=rnd(0.15))
        world_done = rnd(0.3, W)
        play, mask = in_play_cpu(**flags, world_done=world_done, num_slots=C)
        want = in_play(dataclasses.replace(st, **flags, world_done=world_done))
        assert torch.equal(play, want) and torch.equal(mask, want[:, :C]) and mask.is_contiguous()
        step = torch.randint(-3, T + 5, (W,), generator=g, dtype=torch.int32)
        trial_start = torch.randint(0, 4, (W,), generator=g, dtype=torch.int32)
        common = dict(pos=st.pos, heading=st.heading, speed=st.speed + t, present=flags["present"],
                      scenario=st.scenario)
        traj = dict(traj_pos=pack.traj_pos, traj_heading=pack.traj_heading, traj_vel=pack.traj_vel,
                    traj_valid=pack.traj_valid)
        got = replay_state_cpu(**common, controlled=flags["controlled"], removed=flags["removed"], step=step,
                               trial_start=trial_start, init_steps=10, **traj)
        ref = replay_reference(**common, replayed=~flags["controlled"] & ~flags["removed"],
                               log_index=10 + (step - trial_start), **traj)
        for x, y in zip(got, ref):
            assert torch.equal(bits(x), bits(y))
    with pytest.raises(ValueError, match="in_play: world_done"):
        in_play_cpu(**flags, world_done=world_done.int(), num_slots=C)
    with pytest.raises(ValueError, match="replay: step"):
        replay_state_cpu(**common, controlled=flags["controlled"], removed=flags["removed"], step=step.long(),
                         trial_start=trial_start, init_steps=10, **traj)


# ----------------------------------------------------------------------------- env level
def test_env_skips_checks_only_on_a_state_it_checked(pack):
    """The C kernels skip their argument checks only on the state the previous built-in step
    returned (``StepVars.checked``). A state set from outside with a non-contiguous field that every
    stage carries over unchanged (``controlled``, which the kernels' checks copy) keeps the checks on
    at every step and steps exactly like the contiguous one; a wrong dtype set after checked steps
    raises."""
    cfg = EnvConfig(max_controlled=8, num_signals=0)
    a, b = DriveEnv(pack, 5, cfg, seed=3), DriveEnv(pack, 5, cfg, seed=3)
    wide = torch.stack([b.state.controlled, ~b.state.controlled], -1)  # [W, A, 2]
    b.state = b.state.replace(controlled=wide[..., 0])
    assert not b.state.controlled.is_contiguous()
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        act = torch.randint(0, 91, (5, 8), generator=g)
        ra, rb = a.step(act), b.step(act)
        assert torch.equal(bits(ra.obs), bits(rb.obs))
        for name, t in a.state.tensors().items():
            assert torch.equal(bits(t), bits(getattr(b.state, name))), name
    assert a.sim.step_checked(a.state) and not b.sim.step_checked(b.state)
    a.state = a.state.replace(width=a.state.width.double())
    with pytest.raises(ValueError, match="width"):
        a.step(act)


def run_env(pack, config, worlds, steps, seed=5):
    env = DriveEnv(pack, worlds, config, seed=seed)
    g = torch.Generator().manual_seed(seed)
    out = [env.reset().clone()]
    for _ in range(steps):
        if int(config.action_space) == 1:  # continuous
            act = torch.rand(worlds, env.num_slots, 2, generator=g) * 2 - 1
        else:
            act = torch.randint(0, 91, (worlds, env.num_slots), generator=g)
        res = env.step(act)
        st = env.state
        out.append([res.obs.clone(), res.reward.clone(), res.terminal.clone(), res.truncation.clone()]
                   + [t.clone() for t in st.tensors().values()])
    return out, env.metrics(kind="mean")


@pytest.mark.parametrize("goal,contact,space", [
    ("respawn", "ignore", "discrete"), ("new_goal", "remove", "discrete"), ("stop", "stop", "continuous"),
    ("respawn", "remove", "continuous"), ("trial", "stop", "discrete"), ("trial", "remove", "continuous")])
def test_env_stage_kernels_equal_reference(pack, goal, contact, space):
    """cpu_kernels True vs False: every StepResult tensor and every state field after each of 36
    steps (episode ends, trial restarts), and the metrics, are identical; rewards and dones occur."""
    config = EnvConfig(max_controlled=8, scenario_length=12, num_signals=0, goal_behavior=goal, k_trials=2,
                       collision_behavior=contact, offroad_behavior=contact, goal_radius=4.0,
                       stop_truncate_fraction=0.4, action_space=space)
    a, ma = run_env(pack, config, 9, 36)
    b, mb = run_env(pack, dataclasses.replace(config, cpu_kernels=False), 9, 36)
    torch.testing.assert_close(a[0], b[0], rtol=3e-7, atol=0)  # C observation kernel: last bit
    for x, y in zip(a[1:], b[1:]):
        for u, v in zip(x[1:], y[1:]):
            assert torch.equal(bits(u), bits(v))
        torch.testing.assert_close(x[0], y[0], rtol=3e-7, atol=0)  # C observation kernel: last bit
    assert ma == mb
    assert any(x[1].ne(0).any() for x in a[1:]) and any(x[2].any() for x in a[1:])


def test_env_red_light_penalty_equal_reference():
    """A car crossing a red stop line (crafted scene, expert actions, penalty set): the C signals
    and rewards stages flag it at the same step with the same reward as the references."""
    cfg = small_config()
    scene = synthetic_pack([{"agents": [driver(-20.0, 0.0, 0.0, 8.0, (50.0, 0.0)),
                                        driver(-20.0, 40.0, 0.0, 0.0, (-20.0, 40.0))],
                             "num_controlled": 1, "roads": lane(-60, 100, 0.0) + lane(-60, 100, 40.0)}], cfg)
    T = scene.traj_pos.shape[2]
    scene.signal_lane = torch.tensor([[7]], dtype=torch.int32)
    scene.signal_pos = torch.zeros(1, 1, 2)
    scene.signal_dir = torch.tensor([[[1.0, 0.0]]])
    scene.signal_state = torch.full((1, T, 1), int(SignalState.STOP), dtype=torch.int8)
    scene.signal_valid = torch.ones(1, T, 1, dtype=torch.bool)
    scene.num_signals = torch.ones(1, dtype=torch.int32)
    scene.validate()
    runs = []
    for ck in (True, False):
        config = EnvConfig(max_agents=cfg.max_agents, max_controlled=cfg.max_controlled, num_roads=cfg.grid_k,
                           num_partners=2, goal_behavior="respawn", scenario_length=40, reward_red_light=-0.75,
                           cpu_kernels=ck)
        env = DriveEnv(scene, num_worlds=2, config=config, seed=0)
        env.reset()
        rows = []
        for _ in range(config.horizon):
            r = env.step(env.expert_actions())
            rows.append((r.reward.clone(), env.state.red_light_now.clone()))
        runs.append(rows)
    assert sum(int(x[1].sum()) for x in runs[0]) == 2  # both worlds, once
    for (r1, f1), (r2, f2) in zip(*runs):
        assert torch.equal(bits(r1), bits(r2)) and torch.equal(f1, f2)


def test_c_backend_only_for_cpu_tensors():
    """``use_backend("torch")`` on a CUDA env must run the torch reference, not hand CUDA tensors to
    the C kernels (a GPU run raised "tensors must be on the CPU"); ``meta`` stands in for CUDA here.
    An op asked for ``"c"`` on such tensors says so, and an unknown backend name is refused."""
    from gpusim.backend import op_backend, step_backend, use_backend
    from gpusim.kernels.collision import collisions

    meta = torch.zeros(1, 1, 2, device="meta")
    with use_backend("torch"):
        assert step_backend(torch.zeros(1, 1, 2), cpu_kernels=True) == "c"
        assert step_backend(torch.zeros(1, 1, 2), cpu_kernels=False) == "torch"
        assert step_backend(meta, cpu_kernels=True) == "torch"
    with pytest.raises(ValueError, match="backend 'c' runs CPU tensors only"):
        op_backend("c", meta)
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        z = torch.zeros(1, 2)
        collisions(torch.zeros(1, 2, 2), z, z, z, z.bool(), 1.0, backend="cuda")
