"""Which backend runs (gpusim/backend.py; docs/kernels.md, "Backends"): the four names, the default
on CPU and CUDA tensors, the ``"cupy"`` backend without CuPy or without a GPU (one clear error), an
op's ``backend=`` running the named implementation, the env's step choosing its backend once and
handing it down, and the layering that keeps the choice in ``gpusim/backend.py``.

A CUDA tensor cannot be made without a GPU; the resolver reads only a tensor's ``device`` and
``is_cpu``, so its CUDA cases use :func:`cuda_like`, an object with those two attributes."""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import sys
import types

import pytest
import torch

from gpusim import backend
from gpusim.backend import (
    BACKENDS,
    BASE_KERNELS,
    FALLBACK,
    GPU_BACKENDS,
    OP_BACKENDS,
    WITH_C,
    WITH_CUPY,
    backend_for,
    op_backend,
    requested_backend,
    step_backend,
    use_backend,
)
from gpusim.kernels import advantage as adv_mod
from gpusim.kernels import cuda as cuda_mod
from gpusim.kernels import dynamics as dyn_mod
from gpusim.kernels import ema as ema_mod
from gpusim.kernels import episode_mask as mask_mod
from synthetic import KERNEL_DEVICE, backend_device
from test_layering import imported_modules, sources

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `profiling` is a directory of scripts, not an installed package
    sys.path.insert(0, str(REPO))

from profiling import golden  # noqa: E402

NO_CUPY = importlib.util.find_spec("cupy") is None


def cuda_like():
    """Stands in for a CUDA tensor where only the device is read (module docstring)."""
    return types.SimpleNamespace(device=torch.device("cuda", 0), is_cpu=False)


@pytest.fixture
def cupy_usable(monkeypatch):
    """CuPy reported usable (``gpusim.backend.cupy_missing`` returns None)."""
    monkeypatch.setattr(backend, "cupy_missing", lambda: None)


@pytest.fixture
def cupy_absent(monkeypatch):
    """CuPy reported missing, with the message the resolver passes on."""
    monkeypatch.setattr(backend, "cupy_missing", lambda: "CuPy is not importable (ModuleNotFoundError)")


# ---------------------------------------------------------------------------- names and defaults
def test_cupy_is_a_named_backend(monkeypatch):
    assert BACKENDS == OP_BACKENDS == ("torch", "triton", "c", "cupy")
    assert set(FALLBACK) | set(BASE_KERNELS) == set(BACKENDS) and set(FALLBACK.values()) <= set(BASE_KERNELS)
    assert set(GPU_BACKENDS) == {"triton", "cupy"}
    monkeypatch.delenv("GPUSIM_BACKEND", raising=False)
    with use_backend("cupy"):
        assert requested_backend() == "cupy"
    monkeypatch.setenv("GPUSIM_BACKEND", " CuPy ")
    assert requested_backend() == "cupy"
    monkeypatch.setenv("GPUSIM_BACKEND", "cuda")
    with pytest.raises(ValueError, match=r"GPUSIM_BACKEND='cuda': expected one of .*'cupy'"):
        requested_backend()
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        with use_backend("cuda"):
            pass
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        op_backend("cuda", torch.zeros(1))


def test_default_on_cpu_tensors_never_asks_for_cupy(monkeypatch):
    """CPU tensors: the torch reference by default (the env's step: C), whatever CuPy's state; the
    default never imports CuPy there."""
    monkeypatch.delenv("GPUSIM_BACKEND", raising=False)

    def no_cupy_question():
        raise AssertionError("the default on CPU tensors asked about CuPy")

    monkeypatch.setattr(backend, "cupy_missing", no_cupy_question)
    cpu = torch.zeros(2, 3)
    assert backend_for(cpu) == "torch"
    assert step_backend(cpu, cpu_kernels=True) == "c" and step_backend(cpu, cpu_kernels=False) == "torch"
    assert op_backend(None, cpu) == op_backend(None, cpu, WITH_C) == op_backend(None, cpu, WITH_CUPY) == "torch"


def test_default_on_cuda_tensors_is_cupy_where_usable(monkeypatch, cupy_usable):
    """On CUDA: "cupy" when CuPy is usable; an op without a CuPy kernel runs its Triton kernel
    then, so the default runs CuPy exactly for the ops that have a CuPy kernel."""
    monkeypatch.delenv("GPUSIM_BACKEND", raising=False)
    t = cuda_like()
    assert backend_for(t) == "cupy" and step_backend(t, cpu_kernels=True) == "cupy"
    assert op_backend(None, t, WITH_CUPY) == "cupy"
    assert op_backend(None, t) == op_backend(None, t, WITH_C) == "triton"
    with use_backend("triton"):  # forcing Triton turns the CuPy kernels off
        assert backend_for(t) == "triton" and op_backend(None, t, WITH_CUPY) == "triton"
    with use_backend("torch"):
        assert op_backend(None, t, WITH_CUPY) == "torch"


def test_default_on_cuda_tensors_without_cupy_is_triton(monkeypatch, cupy_absent):
    monkeypatch.delenv("GPUSIM_BACKEND", raising=False)
    t = cuda_like()
    assert backend_for(t) == "triton" and step_backend(t, cpu_kernels=True) == "triton"
    assert op_backend(None, t, WITH_CUPY) == "triton"


def test_fallback_of_a_backend_an_op_lacks():
    """Hand-written table: the kernel each op kind runs under each named backend."""
    cpu = torch.zeros(1)
    expect_cpu = {"torch": ("torch", "torch", "torch"), "c": ("torch", "c", "torch"),
                  "triton": ("triton", "triton", "triton")}
    for name, want in expect_cpu.items():
        assert tuple(op_backend(name, cpu, k) for k in (BASE_KERNELS, WITH_C, WITH_CUPY)) == want, name


def test_cupy_fallback_on_cuda(cupy_usable):
    t = cuda_like()
    assert tuple(op_backend("cupy", t, k) for k in (BASE_KERNELS, WITH_C, WITH_CUPY)) == ("triton", "triton", "cupy")


# ---------------------------------------------------------------------------- forcing "cupy" where it cannot run
def test_forcing_cupy_on_cpu_tensors_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("GPUSIM_BACKEND", raising=False)
    cpu = torch.zeros(3)
    with use_backend("cupy"):
        with pytest.raises(RuntimeError, match="GPUSIM_BACKEND=cupy runs CUDA tensors only, got a tensor on cpu"):
            backend_for(cpu)
    with pytest.raises(ValueError, match="backend 'cupy' runs CUDA tensors only, got a tensor on cpu"):
        op_backend("cupy", cpu, WITH_CUPY)
    slots, has = torch.zeros(4, 2), torch.zeros(4, dtype=torch.bool)
    with pytest.raises(ValueError, match="backend 'cupy' runs CUDA tensors only"):
        ema_mod.ema_update(slots, has, torch.ones(4, 2), torch.ones(4, dtype=torch.bool), 0.5, backend="cupy")
    assert not has.any() and torch.equal(slots, torch.zeros(4, 2))  # nothing written
    monkeypatch.setenv("GPUSIM_BACKEND", "cupy")
    with pytest.raises(RuntimeError, match="GPUSIM_BACKEND=cupy runs CUDA tensors only"):
        adv_mod.advantage(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool), torch.zeros(2),
                          0.99, 0.95)


def test_forcing_cupy_without_cupy_names_what_is_missing(monkeypatch, cupy_absent):
    monkeypatch.delenv("GPUSIM_BACKEND", raising=False)
    t = cuda_like()
    with pytest.raises(RuntimeError, match=r"backend 'cupy' needs CuPy with a CUDA device: CuPy is not importable"):
        op_backend("cupy", t, WITH_CUPY)
    with use_backend("cupy"):
        with pytest.raises(RuntimeError, match=r"GPUSIM_BACKEND=cupy needs CuPy with a CUDA device: CuPy is not"):
            backend_for(t)


@pytest.mark.skipif(not NO_CUPY, reason="CuPy is installed: the missing-CuPy message cannot be seen")
def test_missing_cupy_message_says_how_to_install():
    msg = backend.cupy_missing()
    assert msg is not None and msg.startswith("CuPy is not importable") and "gpusim[cuda]" in msg
    assert not backend.cupy_available()


# ---------------------------------------------------------------------------- backend= runs the named implementation
def _spy(monkeypatch, module, name, calls, run=None):
    """Replace ``module.name`` by a function that records ``name`` in ``calls`` and runs ``run``
    (default: the original implementation), so the result is still real."""
    real = getattr(module, name)

    def spy(*a, **k):
        calls.append(name)
        return (run or real)(*a, **k)

    monkeypatch.setattr(module, name, spy)


def _ema_case(dev, backend_name):
    slots = torch.tensor([[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]], device=dev)
    has = torch.tensor([True, True, False], device=dev)
    ep = torch.tensor([[3.0, 0.0], [9.0, 9.0], [5.0, 6.0]], device=dev)
    done = torch.tensor([True, False, True], device=dev)
    ema_mod.ema_update(slots, has, ep, done, 0.5, backend=backend_name)
    # hand-computed: row 0 blends 0.5 * [1, 2] + 0.5 * [3, 0]; row 1 unchanged; row 2 first completion
    assert torch.equal(slots.cpu(), torch.tensor([[2.0, 1.0], [3.0, 4.0], [5.0, 6.0]]))
    assert has.cpu().tolist() == [True, True, True]


def _advantage_case(dev, backend_name):
    r = torch.tensor([[1.0, 2.0]], device=dev)
    v = torch.tensor([[0.5, 0.25]], device=dev)
    stop = torch.tensor([[False, True]], device=dev)
    a, _ = adv_mod.advantage(r, v, stop, torch.tensor([7.0], device=dev), 0.5, 1.0, backend=backend_name)
    # hand-computed: t=1 stops: 2 - 0.25 = 1.75; t=0: 1 + 0.5 * 0.25 - 0.5 + 0.5 * 1.75 = 1.5
    assert torch.allclose(a.cpu(), torch.tensor([[1.5, 1.75]]))


def _mask_case(dev, backend_name):
    terminal = torch.tensor([[False, True, False]], device=dev)
    removed = torch.zeros(1, 3, dtype=torch.bool, device=dev)
    _, position = mask_mod.episode_mask(terminal, removed, backend=backend_name)
    assert position.cpu().tolist() == [[0, 1, 0]]  # a new episode starts after the terminal


def _bicycle_case(dev, backend_name):
    z = torch.zeros(1, 1, device=dev)
    pos, heading, speed = dyn_mod.bicycle_step(torch.zeros(1, 1, 2, device=dev), z, z + 2.0, z + 4.0, z, z,
                                               torch.ones(1, 1, dtype=torch.bool, device=dev), 0.5,
                                               backend=backend_name)
    assert torch.allclose(pos.cpu(), torch.tensor([[[1.0, 0.0]]])) and float(speed) == 2.0  # straight, 2 m/s x 0.5 s


#: op -> (module, {backend: the implementation it must run}, a case with hand-computed numbers)
OPS = {
    "ema_update": (ema_mod, {"torch": "ema_update_reference", "c": "ema_update_reference",
                             "triton": "_ema_update_triton", "cupy": "ema_update_cupy"}, _ema_case),
    "advantage": (adv_mod, {"torch": "advantage_reference", "c": "advantage_reference",
                            "triton": "_advantage_triton", "cupy": "advantage_cupy"}, _advantage_case),
    "episode_mask": (mask_mod, {"torch": "episode_mask_reference", "c": "episode_mask_reference",
                                "triton": "_episode_mask_triton", "cupy": "_episode_mask_triton"}, _mask_case),
    "bicycle_step": (dyn_mod, {"torch": "bicycle_step_reference", "c": "bicycle_step_reference",
                               "triton": "_bicycle_step_triton", "cupy": "_bicycle_step_triton"}, _bicycle_case),
}


@pytest.mark.parametrize("backend_name", ["torch", "c", "triton", "cupy"])
@pytest.mark.parametrize("op", list(OPS))
def test_op_runs_the_named_implementation(monkeypatch, op, backend_name):
    """``backend=`` on the op runs that backend's implementation and no other, whatever the forced
    backend says (here the opposite one). For "cupy" without a GPU the CuPy launch is replaced by
    the reference (the spy records the dispatch; CuPy itself runs in tests/test_ema.py and
    tests/test_advantage.py on a GPU)."""
    module, impl, case = OPS[op]
    calls: list[str] = []
    references = {name: getattr(module, name.replace("_cupy", "_reference")) for name in impl.values()
                  if name.endswith("_cupy")}  # the originals, before any spy replaces them
    for name in set(impl.values()):
        if name.endswith("_cupy"):
            _spy(monkeypatch, cuda_mod, name, calls, run=references[name])
        else:
            _spy(monkeypatch, module, name, calls)
    if backend_name == "cupy" and KERNEL_DEVICE.type != "cuda":  # the device check needs a GPU
        monkeypatch.setattr(backend, "_cupy_problem", lambda tensor: None)
    dev = torch.device("cpu") if backend_name == "c" else backend_device(backend_name)
    with use_backend("torch" if backend_name != "torch" else "c"):
        case(dev, backend_name)
    assert calls == [impl[backend_name]]


# ---------------------------------------------------------------------------- the step chooses once
@pytest.fixture(scope="module")
def packs():
    return golden.load_packs(list(golden.CONFIGS))


@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["c", "torch"])
@pytest.mark.parametrize("config", list(golden.CONFIGS))
def test_a_step_resolves_its_backend_once(monkeypatch, packs, config, cpu_kernels):
    """Every stage hands the step's backend to its ops (real scenes, every golden config, through an
    episode end): one resolution per step, whatever the stages and ops run."""
    from gpusim import DriveEnv, EnvConfig

    kwargs, source = golden.CONFIGS[config]
    cfg = EnvConfig(**kwargs).replace(cpu_kernels=cpu_kernels)
    env = DriveEnv(packs[(source, cfg.data_config())], 3, cfg)
    env.reset(seed=1)
    calls = []
    real = backend.backend_for

    def counting(tensor):
        calls.append(tensor.device)
        return real(tensor)

    for mod in list(sys.modules.values()):  # the resolver and any module holding its own reference
        if getattr(mod, "backend_for", None) is real:
            monkeypatch.setattr(mod, "backend_for", counting)
    gen = torch.Generator().manual_seed(2)
    steps = min(cfg.scenario_length + 2, 14)
    per_step = []
    for _ in range(steps):
        actions = golden.make_actions(env, gen, cfg.has_coplayers)
        calls.clear()
        env.step(actions)
        per_step.append(len(calls))
    assert per_step == [1] * steps
    assert env.step_backend == ("c" if cpu_kernels else "torch")


# ---------------------------------------------------------------------------- layering
#: What a stage may not import: the modules and names of one backend's implementation.
BACKEND_MODULES = ("gpusim.kernels.cuda", "gpusim.kernels.cbuild", "gpusim.kernels.observations.cpu",
                   "gpusim.kernels.observations.launcher", "gpusim.kernels.observations.kernel")
BACKEND_NAME_ENDS = ("_cpu", "_triton", "_cupy", "_kernel")
BACKEND_NAMES = ("LIBRARY", "load_library", "cpu_kernel_available")


def backend_internals(path: pathlib.Path, root: pathlib.Path = REPO) -> list:
    """(line, what) of every import in ``path`` (under ``root``) of a backend's internals."""
    bad = []
    for ln, mod, names in imported_modules(path, root):
        full = [mod] + [f"{mod}.{n}" for n in names]
        if any(f == m or f.startswith(m + ".") for f in full for m in BACKEND_MODULES):
            bad.append((ln, mod))
        bad += [(ln, f"{mod}.{n}") for n in names if n.endswith(BACKEND_NAME_ENDS) or n in BACKEND_NAMES]
    return bad


def resolver_calls(path: pathlib.Path) -> list:
    """(line, what) of every use of ``gpusim.backend``'s ``backend_for`` / ``use_cupy`` in ``path``:
    imported by name, or read as an attribute of the module however it is bound."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module_names, bad = {"gpusim.backend"}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "gpusim.backend":
            bad += [(node.lineno, a.name) for a in node.names if a.name in ("backend_for", "use_cupy")]
        elif isinstance(node, ast.ImportFrom) and node.module == "gpusim":
            module_names |= {a.asname or a.name for a in node.names if a.name == "backend"}
        elif isinstance(node, ast.Import):
            module_names |= {a.asname for a in node.names if a.name == "gpusim.backend" and a.asname}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("backend_for", "use_cupy"):
            if ast.unparse(node.value) in module_names:
                bad.append((node.lineno, ast.unparse(node)))
    return bad


def test_layering_checks_see_what_they_forbid(tmp_path):
    """The two scanners flag each form (so the checks below cannot pass by missing one)."""
    p = tmp_path / "gpusim" / "sim" / "probe.py"
    p.parent.mkdir(parents=True)
    p.write_text("from gpusim.kernels.cbuild import heading_trig\nfrom gpusim.kernels.collision import collisions_cpu\n"
                 "from gpusim.kernels import cuda\nimport gpusim.backend as gb\nfrom gpusim import backend as b\n"
                 "from gpusim.backend import backend_for\nb.use_cupy(x)\ngb.backend_for(x)\n")
    assert [ln for ln, _ in backend_internals(p, tmp_path)] == [1, 2, 3]
    assert [ln for ln, _ in resolver_calls(p)] == [6, 7, 8]


@pytest.mark.parametrize("path", sources(REPO / "gpusim" / "sim"), ids=lambda p: str(p.relative_to(REPO)))
def test_stages_import_no_backend_internals(path):
    bad = backend_internals(path)
    assert not bad, f"{path.relative_to(REPO)} imports a backend's internals {bad}; call the op's dispatcher or bind_*"


CHOOSERS = [p for d in ("gpusim", "train", "policy", "profiling") for p in sources(REPO / d)
            if p != REPO / "gpusim" / "backend.py"]


@pytest.mark.parametrize("path", CHOOSERS, ids=lambda p: str(p.relative_to(REPO)))
def test_only_the_backend_module_chooses_from_tensors(path):
    bad = resolver_calls(path)
    assert not bad, (f"{path.relative_to(REPO)} chooses a backend itself {bad}: take backend= and resolve it with "
                     "gpusim.backend.op_backend (or the step's StepVars.backend)")


def test_cuda_graphs_auto_capture_both_gpu_backends(monkeypatch):
    """``cuda_graph="auto"`` captures a step on either GPU backend (the default on CUDA is "cupy"
    where CuPy is installed) and not one on the torch reference."""
    from gpusim import cuda_graph

    monkeypatch.setattr(cuda_graph, "cuda_graphs_enabled", lambda device=None: True)
    assert cuda_graph.graph_decision("auto", "cuda", "triton") == (True, None)
    assert cuda_graph.graph_decision("auto", "cuda", "cupy") == (True, None)
    enabled, reason = cuda_graph.graph_decision("auto", "cuda", "torch")
    assert not enabled and reason == "the env runs the torch backend (auto captures triton and cupy only)"
