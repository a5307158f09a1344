"""Every Triton kernel of gpusim compiles ahead of time for sm_80 and sm_90, without spilling.

The kernels run under Triton's CPU interpreter everywhere else in the suite, and the interpreter
accepts code the compiler rejects (docs/design.md section 3). Here:

1. the launchers run on small inputs (the env on sample scenarios in four configurations,
   expert actions, metrics, advantage, episode mask) on ``synthetic.KERNEL_DEVICE`` (CPU tensors
   under the interpreter; CUDA tensors and compiled kernels when a GPU exists), with the Triton
   backend and GPU launch sizes (``gpusim.backend.gpu_launch_sizes``), while
   ``gpusim.aot.record_specs`` records each launch's argument types, alignment, constexpr values
   and launch options, as Triton's launcher would specialise them;
2. ``gpusim.aot.compile_specs`` compiles them with ``triton.compile`` for
   ``GPUTarget("cuda", 80, 32)`` and ``(..., 90, 32)`` to cubin (Triton's bundled ``ptxas``; no GPU
   needed) in a subprocess without the interpreter;
3. each kernel found by walking the gpusim sources (``gpusim.aot.kernels``) must have been
   recorded, compile, and report no register spills in ``ptxas -v``.

Default run: the first recorded specialisation of each kernel (the env's default configuration
comes first). ``-m slow``: every distinct recorded specialisation, plus the small-size
configurations of tests/test_backend_e2e.py. The test of the test (a kernel reading a plain float
global) shows that the harness catches what the interpreter hides.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
import triton
import triton.language as tl

from gpusim import aot
from gpusim.backend import gpu_launch_sizes, interpreter_active, use_backend
from synthetic import KERNEL_DEVICE

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() or interpreter_active()),
                                reason="no CUDA and no Triton interpreter to record launches with")

KERNELS = sorted(aot.kernels())

# ----------------------------------------------------------------------------- test of the test
SCALE = 2.0  # a plain float global: fine for the interpreter, a compile error for Triton
SCALE_C: tl.constexpr = tl.constexpr(2.0)


@triton.jit
def _plain_global_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m, other=0.0) * SCALE, mask=m)


@triton.jit
def _constexpr_global_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m, other=0.0) * SCALE_C, mask=m)


def _run_own_kernels():
    """Launch the two test kernels on KERNEL_DEVICE. Under the interpreter both compute 2 * x; a
    compiled launch (CUDA) rejects the plain float global at its first launch (recorded before the
    compile, like every launch) and the constexpr kernel computes 2 * x."""
    x = torch.arange(37, dtype=torch.float32, device=KERNEL_DEVICE)
    for kernel in (_plain_global_kernel, _constexpr_global_kernel):
        out = torch.full_like(x, float("nan"))
        if kernel is _plain_global_kernel and not interpreter_active():
            with pytest.raises(triton.CompilationError, match="SCALE"):
                kernel[(triton.cdiv(37, 32),)](x, out, 37, BLOCK=32)
            continue
        kernel[(triton.cdiv(37, 32),)](x, out, 37, BLOCK=32)
        assert torch.equal(out.cpu(), 2 * x.cpu()), kernel


# ----------------------------------------------------------------------------- exercising the launchers
def _env_configs():
    """(label, EnvConfig, worlds, action kind) in recording order: defaults first."""
    from gpusim.config import EnvConfig
    from train.config import TrainConfig

    trainer = TrainConfig().env
    return [
        ("default", EnvConfig(), 1),
        ("trainer defaults, goal respawn", trainer.replace(goal_behavior="respawn"), 1),
        ("new_goal, continuous", EnvConfig(goal_behavior="new_goal", action_space="continuous"), 1),
        ("trial mode", EnvConfig(goal_behavior="trial", scenario_length=2, k_trials=2), 1),
    ]


def _small_configs():
    """The reduced sizes of tests/test_backend_e2e.py, every goal x contact behaviour (slow run)."""
    from gpusim.config import EnvConfig

    base = dict(max_agents=24, max_controlled=4, num_partners=15, num_roads=32, init_steps=76, scenario_length=3)
    return [(f"small {g}/{c}", EnvConfig(goal_behavior=g, collision_behavior=c, offroad_behavior=c, **base), 2)
            for g in ("respawn", "new_goal", "stop", "trial") for c in ("ignore", "stop", "remove")]


def _exercise(files, configs, steps: int):
    """Run every launcher: env reset/expert_actions/step/metrics per config, then the trainer's
    advantage (GAE and V-trace) and episode mask."""
    from gpusim.data import ScenarioPack
    from gpusim.env import DriveEnv
    from gpusim.kernels.advantage import advantage
    from gpusim.kernels.episode_mask import episode_mask

    packs = {}
    for _, cfg, worlds in configs:
        key = cfg.data_config()
        if key not in packs:
            packs[key] = ScenarioPack.from_json(files, key)
        env = DriveEnv(packs[key], worlds, cfg, seed=0, device=KERNEL_DEVICE)
        env.reset()
        for _ in range(steps):
            env.step(env.expert_actions())
        env.metrics()
    g = torch.Generator().manual_seed(0)  # CPU draws, moved to KERNEL_DEVICE
    B, T = 5, 7
    dev = KERNEL_DEVICE
    r, v = torch.randn(B, T, generator=g).to(dev), torch.randn(B, T, generator=g).to(dev)
    stop = (torch.rand(B, T, generator=g) < 0.2).to(dev)
    advantage(r, v, stop, torch.randn(B, generator=g).to(dev), 0.99, 0.95)
    advantage(r, v, stop, torch.randn(B, generator=g).to(dev), 0.99, 0.95,
              log_rho=0.1 * torch.randn(B, T, generator=g).to(dev))
    episode_mask(stop, (torch.rand(B, T, generator=g) < 0.1).to(dev))


def _record(files, configs, steps):
    with use_backend("triton"), gpu_launch_sizes(), aot.record_specs() as log:
        _exercise(files, configs, steps)
        _run_own_kernels()
    return log


@pytest.fixture(scope="module")
def sample_files(sample_dir):
    files = sorted(sample_dir.glob("*.json*"))[:2]
    if not files:
        pytest.fail("data/womd_sample/ is empty: the bundled scenarios are missing")
    return files


@pytest.fixture(scope="module")
def recorded(sample_files):
    """All specs recorded by the default exercise (in launch order)."""
    t0 = time.perf_counter()
    log = _record(sample_files, _env_configs(), steps=1)
    print(f"\nrecorded {len(log)} launches in {time.perf_counter() - t0:.1f} s")
    return log


def _first_per_kernel(specs):
    first = {}
    for s in specs:
        first.setdefault(s.kernel, s)
    return first


@pytest.fixture(scope="module")
def compiled(recorded):
    """{kernel: [result per capability]} for the first recorded spec of each kernel."""
    specs = list(_first_per_kernel(recorded).values())
    t0 = time.perf_counter()
    results = aot.compile_specs(specs)
    print(f"compiled {len(specs)} kernels x {len(aot.CAPABILITIES)} targets in {time.perf_counter() - t0:.1f} s")
    out = {}
    for res in results:
        out.setdefault(res["kernel"], []).append(res)
    return out


def _check(results):
    assert [r["capability"] for r in results] == list(aot.CAPABILITIES)
    for r in results:
        where = f"{r['kernel']} on sm_{r['capability']}"
        assert r["ok"], f"{where} does not compile:\n{r['error']}"
        assert r["spills"] == 0, (f"{where} spills registers ({r['spill_store_bytes']} B stored, "
                                  f"{r['spill_load_bytes']} B loaded, {r['registers']} registers): "
                                  "use smaller blocks or more warps")


def test_kernels_are_discovered():
    names = {k.split(":")[1] for k in KERNELS}
    # a few kernels that must be among them (the discovery walks subpackages and skips helpers)
    assert {"_bicycle_step_kernel", "_inverse_bicycle_kernel", "_events_kernel", "_advantage_kernel"} <= names
    helpers = set(aot.jit_functions()) - set(KERNELS)
    assert "gpusim.kernels.trimath:atan2" in helpers


def test_every_kernel_is_covered(recorded):
    missing = sorted(set(KERNELS) - {s.kernel for s in recorded})
    assert not missing, f"kernels never launched by the recording exercise (add a launch): {missing}"


@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_compiles_without_spills(kernel, compiled):
    if kernel not in compiled:
        pytest.fail(f"{kernel}: not covered by any recorded launch, so it was not compiled")
    _check(compiled[kernel])


def test_plain_float_global_fails_to_compile(compiled):
    """The interpreter runs both test kernels (checked while recording); the compiler rejects the
    one that reads a plain float global and accepts the constexpr one."""
    plain = compiled[f"{__name__}:_plain_global_kernel"]
    assert [r["ok"] for r in plain] == [False] * len(aot.CAPABILITIES)
    assert all("SCALE" in r["error"] for r in plain), plain[0]["error"]
    _check(compiled[f"{__name__}:_constexpr_global_kernel"])


def test_specs_follow_triton_specialisation(recorded):
    spec = _first_per_kernel(recorded)[f"{__name__}:_plain_global_kernel"]
    assert spec.signature == {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    assert spec.constexprs == {"BLOCK": 32} and spec.attrs == {"x_ptr": "D", "out_ptr": "D", "n": ""}
    # an int equal to 1 and a None argument are specialised away as constexprs, as Triton does
    x = torch.zeros(16)
    s = aot.specialise(_plain_global_kernel, (x, None, 1), {"BLOCK": 16, "num_warps": 2})
    assert s.signature["n"] == "constexpr" and s.constexprs["n"] == 1 and s.constexprs["out_ptr"] is None
    assert s.options == {"num_warps": 2}
    assert aot.Spec.from_dict(dataclasses.asdict(s)).key() == s.key()


def test_parse_ptxas_log():
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
           "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 128 registers, used 1 barriers, 8 bytes cumulative stack size\n")
    assert aot.parse_ptxas_log(log) == dict(registers=128, stack_bytes=8, spill_store_bytes=4, spill_load_bytes=4)
    assert aot.parse_ptxas_log("")["registers"] is None


@pytest.mark.slow
def test_all_recorded_specialisations_compile(sample_files, recorded):
    """Every distinct specialisation: the default exercise with two steps, plus the small sizes."""
    log = list(recorded) + _record(sample_files, _env_configs(), steps=2) + _record(sample_files, _small_configs(), 2)
    specs = [s for s in aot.unique_specs(log) if not s.kernel.endswith(":_plain_global_kernel")]
    results = aot.compile_specs(specs)
    by_kernel = {}
    for r in results:
        by_kernel.setdefault(r["kernel"], []).append(r)
    for kernel, res in by_kernel.items():
        for i in range(0, len(res), len(aot.CAPABILITIES)):
            _check(res[i:i + len(aot.CAPABILITIES)])
    assert set(KERNELS) <= set(by_kernel)
