"""CUDA C sources of the CuPy kernels, checked without a GPU (docs/design.md section 3):

(a) every ``.cu`` compiles with ``nvcc -ptx`` for sm_80 and sm_90 with the loader's own options and
    defines the kernels the loader looks up;
(b) a host shared library built from the same ``.cuh`` math (``host_abi.cpp``, g++ or nvcc) and
    called through ctypes matches the torch references (advantage: every mask pattern, odd
    lengths, GAE and V-trace; EMA: update and report);
(c) the lazy CuPy loader imports without CuPy.
"""

from __future__ import annotations

import ctypes
import importlib.util
import pathlib
import re
import shutil
import subprocess

import pytest
import torch

from gpusim.kernels import cuda as cuda_mod
from gpusim.kernels.advantage import advantage_reference
from gpusim.kernels.ema import ema_report_reference, ema_update_reference

CUDA_DIR = cuda_mod.SOURCE_DIR
NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if pathlib.Path("/usr/local/bin/nvcc").exists() else None)
CXX = shutil.which("g++") or shutil.which("c++")

_spec = importlib.util.spec_from_file_location("_adv_tests", pathlib.Path(__file__).with_name("test_advantage.py"))
_adv_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_adv_tests)
make_inputs, PATTERNS = _adv_tests.make_inputs, _adv_tests.PATTERNS


# ------------------------------------------------------------------------------------------------
# (a) nvcc -ptx


def test_every_cu_file_is_registered():
    on_disk = sorted(p.name for p in CUDA_DIR.glob("*.cu"))
    assert on_disk == sorted(src for src, _ in cuda_mod.SOURCES.values())


@pytest.mark.skipif(NVCC is None, reason="nvcc not found on PATH or at /usr/local/bin/nvcc")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", sorted(cuda_mod.SOURCES))
def test_nvcc_ptx_compiles(name, arch, tmp_path):
    src = cuda_mod.source_path(name)
    out = tmp_path / f"{name}_{arch}.ptx"
    proc = subprocess.run([NVCC, "-ptx", f"-arch={arch}", *cuda_mod.compile_options(), str(src), "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"nvcc -ptx {src.name} ({arch}) failed:\n{proc.stderr}"
    ptx = out.read_text()
    entries = set(re.findall(r"\.entry\s+(\w+)", ptx))
    assert set(cuda_mod.SOURCES[name][1]) <= entries, f"kernels missing from PTX: {entries}"


# ------------------------------------------------------------------------------------------------
# (b) host library from the same headers


@pytest.fixture(scope="module")
def hostlib(tmp_path_factory):
    out = tmp_path_factory.mktemp("cuda_host") / "libgpusim_host.so"
    src = CUDA_DIR / "host_abi.cpp"
    if CXX is not None:
        cmd = [CXX, "-O2", "-std=c++17", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", f"-I{CUDA_DIR}",
               str(src), "-o", str(out)]
    elif NVCC is not None:
        cmd = [NVCC, "-O2", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-x", "c++", f"-I{CUDA_DIR}",
               str(src), "-o", str(out)]
    else:
        pytest.skip("neither g++ nor nvcc available to build the host library")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"host library build failed:\n{' '.join(cmd)}\n{proc.stderr}"
    lib = ctypes.CDLL(str(out))
    P, I64, F, I = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_float, ctypes.c_int
    lib.gpusim_advantage_host.argtypes = [P] * 7 + [I64, I64, F, F, F, F, I]
    lib.gpusim_advantage_host.restype = None
    lib.gpusim_ema_update_host.argtypes = [P] * 4 + [I64, I64, F]
    lib.gpusim_ema_update_host.restype = None
    lib.gpusim_ema_report_host.argtypes = [P] * 4 + [I64, I64]
    lib.gpusim_ema_report_host.restype = None
    return lib


def host_advantage(lib, rewards, values, stop, last_value, gamma, lam, log_rho=None, rho_clip=1.0, c_clip=1.0):
    B, T = rewards.shape
    adv = torch.full((B, T), float("nan"))
    ret = torch.full((B, T), float("nan"))
    rho = log_rho if log_rho is not None else rewards
    stop_u8 = stop.contiguous().view(torch.uint8)
    lib.gpusim_advantage_host(rewards.data_ptr(), values.data_ptr(), stop_u8.data_ptr(), last_value.data_ptr(),
                              rho.data_ptr(), adv.data_ptr(), ret.data_ptr(), B, T, gamma, lam, rho_clip, c_clip,
                              int(log_rho is not None))
    return adv, ret


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("B,T,with_rho", [(1, 1, False), (37, 29, False), (37, 29, True), (5, 273, True),
                                          (64, 91, False)])
def test_host_advantage_matches_reference(hostlib, pattern, B, T, with_rho):
    r, v, s, lv, lr = make_inputs(B, T, pattern, seed=3 * B + T, with_rho=with_rho)
    got = host_advantage(hostlib, r, v, s, lv, 0.99, 0.95, lr, 1.3, 0.9)
    want = advantage_reference(r, v, s, lv, 0.99, 0.95, lr, 1.3, 0.9)
    for g, w, what in zip(got, want, ("advantages", "returns")):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=2e-5, msg=lambda m: f"host C {what}: {m}")


def test_host_advantage_zero_log_rho_equals_gae(hostlib):
    r, v, s, lv, _ = make_inputs(13, 41, "episodes", seed=8)
    gae = host_advantage(hostlib, r, v, s, lv, 0.99, 0.95)
    vt = host_advantage(hostlib, r, v, s, lv, 0.99, 0.95, torch.zeros(13, 41), 2.0, 1.0)
    assert torch.equal(gae[0], vt[0]) and torch.equal(gae[1], vt[1])


@pytest.mark.parametrize("N,M", [(1, 1), (37, 5), (300, 7), (1000, 3)])
def test_host_ema_matches_reference(hostlib, N, M):
    g = torch.Generator().manual_seed(N + M)
    s_ref = torch.full((N, M), float("nan"))
    h_ref = torch.zeros(N, dtype=torch.bool)
    s_c, h_c = s_ref.clone(), h_ref.clone()
    for step in range(5):
        done = torch.rand(N, generator=g) < 0.3
        ep = torch.randn(N, M, generator=g)
        ep[~done] = float("nan")
        ema_update_reference(s_ref, h_ref, ep, done, 0.707)
        hostlib.gpusim_ema_update_host(s_c.data_ptr(), h_c.view(torch.uint8).data_ptr(), ep.data_ptr(),
                                       done.view(torch.uint8).data_ptr(), N, M, 0.707)
        assert torch.equal(h_c, h_ref)
        torch.testing.assert_close(s_c, s_ref, rtol=1e-6, atol=1e-6, equal_nan=True)
        mean = torch.full((M,), float("nan"))
        n = torch.full((1,), -1, dtype=torch.int64)
        hostlib.gpusim_ema_report_host(s_c.data_ptr(), h_c.view(torch.uint8).data_ptr(), mean.data_ptr(),
                                       n.data_ptr(), N, M)
        m_ref, n_ref = ema_report_reference(s_ref, h_ref)
        assert int(n) == int(n_ref)
        torch.testing.assert_close(mean, m_ref, rtol=1e-5, atol=1e-6)


def test_host_ema_report_empty(hostlib):
    slots = torch.full((10, 2), float("nan"))
    has = torch.zeros(10, dtype=torch.bool)
    mean = torch.full((2,), float("nan"))
    n = torch.full((1,), -1, dtype=torch.int64)
    hostlib.gpusim_ema_report_host(slots.data_ptr(), has.view(torch.uint8).data_ptr(), mean.data_ptr(),
                                   n.data_ptr(), 10, 2)
    assert int(n) == 0 and torch.equal(mean, torch.zeros(2))


# ------------------------------------------------------------------------------------------------
# (c) loader


def test_report_threads_constant_matches_header():
    header = (CUDA_DIR / "ema.cuh").read_text()
    m = re.search(r"#define\s+GPUSIM_EMA_REPORT_THREADS\s+(\d+)", header)
    assert m and int(m.group(1)) == cuda_mod.EMA_REPORT_THREADS
    assert cuda_mod.EMA_REPORT_THREADS & (cuda_mod.EMA_REPORT_THREADS - 1) == 0  # tree reduction halves it


def test_loader_is_lazy_without_cupy():
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed: the missing-CuPy path cannot be exercised")
    with pytest.raises(ImportError):
        cuda_mod.module("advantage")
    with pytest.raises(KeyError, match="no CUDA source module"):
        cuda_mod.source_path("nope")


_C_POINTER_DTYPES = {"float": (torch.float32,), "unsigned char": (torch.uint8, torch.bool),
                     "gpusim_i64": (torch.int64,)}
_C_SCALAR_TYPES = {"float": "float32", "gpusim_i64": "int64", "int": "int32"}


def kernel_signature(name: str, kernel_name: str) -> list[tuple[str, bool]]:
    """[(C base type, is_pointer)] of an extern "C" __global__ kernel, parsed from its .cu file."""
    src = cuda_mod.source_path(name).read_text()
    src = re.sub(r"//[^\n]*", "", src)
    m = re.search(rf"__global__\s+void\s+{kernel_name}\s*\((.*?)\)\s*{{", src, re.S)
    assert m, f"{kernel_name} not found in {name}.cu"
    params = []
    for p in m.group(1).split(","):
        p = p.replace("const", " ").replace("__restrict__", " ")
        is_ptr = "*" in p
        words = p.replace("*", " ").split()
        params.append((" ".join(words[:-1]), is_ptr))
    return params


def check_args(args, sig):
    assert len(args) == len(sig), f"{len(args)} arguments for {len(sig)} parameters"
    for i, (arg, (ctype, is_ptr)) in enumerate(zip(args, sig)):
        if is_ptr:
            assert isinstance(arg, torch.Tensor) and arg.dtype in _C_POINTER_DTYPES[ctype], (i, ctype, arg)
            assert arg.is_contiguous()
        else:
            assert not isinstance(arg, torch.Tensor) and arg.dtype.name == _C_SCALAR_TYPES[ctype], (i, ctype, arg)


def test_cupy_argument_tuples_match_kernel_signatures(monkeypatch):
    """The launch arguments (order, pointer dtypes, numpy scalar widths) match the C signatures, so
    a GPU launch cannot silently misread an int64 as int32 or a float as double."""
    monkeypatch.setattr(cuda_mod, "as_cupy", lambda t: t.view(torch.uint8) if t.dtype == torch.bool else t)
    r, v, s, lv, lr = make_inputs(3, 5, "random", seed=0, with_rho=True)
    adv, ret = torch.empty_like(r), torch.empty_like(r)
    for rho in (None, lr):
        args = cuda_mod.advantage_args(r, v, s, lv, 0.99, 0.95, rho, 1.0, 1.0, adv, ret)
        check_args(args, kernel_signature("advantage", "gpusim_advantage_kernel"))
        assert int(args[-1]) == int(rho is not None)
    slots, has = torch.zeros(4, 3), torch.zeros(4, dtype=torch.bool)
    check_args(cuda_mod.ema_update_args(slots, has, torch.zeros(4, 3), has.clone(), 0.7),
               kernel_signature("ema", "gpusim_ema_update_kernel"))
    check_args(cuda_mod.ema_report_args(slots, has, torch.zeros(3), torch.zeros(1, dtype=torch.int64)),
               kernel_signature("ema", "gpusim_ema_report_kernel"))
