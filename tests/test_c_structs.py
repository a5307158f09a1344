"""The C kernels' entry points take one argument struct whose ctypes Structure and C twin both come
from one Python table (``gpusim.kernels.cbuild.CStruct``): the generated C declaration has the
ctypes layout field by field (compiled and measured here), no exported C function takes more
than a handful of parameters, a call with a missing or unknown field is refused, and an env step
on the C backend really calls the C entry points (``CALL_COUNTS``)."""

from __future__ import annotations

import ctypes
import importlib
import pathlib
import re
import shutil
import subprocess

import pytest
import torch

from gpusim import DriveEnv
from gpusim.config import EnvConfig
from gpusim.kernels import cbuild
from gpusim.kernels.cbuild import CStruct
from train.packs import load_pack

KERNELS = pathlib.Path(cbuild.__file__).parent
SOURCES = sorted(KERNELS.glob("*.c")) + sorted(KERNELS.glob("*/*.c"))
#: the most parameters an exported C function may take (a struct, plus room for a few scalars)
MAX_PARAMS = 8


def _libraries() -> list:
    for src in SOURCES:  # each op module creates its library at import
        importlib.import_module(".".join(src.relative_to(KERNELS.parent.parent).with_suffix("").parts))
    return list(cbuild._LIBRARIES.values())


def test_every_entry_point_takes_one_struct():
    found = 0
    for src in SOURCES:
        text = src.read_text()
        for m in re.finditer(r"^(?:void|int|int64_t)\s+(gpusim_\w+)\s*\(([^)]*)\)\s*\{", text, re.M):
            params = [p for p in m.group(2).split(",") if p.strip() not in ("", "void")]
            assert len(params) <= MAX_PARAMS, f"{src.name}: {m.group(1)} takes {len(params)} parameters"
            found += len(params) == 1 and "Args *args" in m.group(2)
    assert found == 14  # every kernel entry point (the abi / has_openmp probes take none)


def test_generated_structs_have_the_ctypes_layout(tmp_path):
    """Compile each library's generated header with a probe that prints sizeof and every offsetof,
    and compare with the ctypes Structure built from the same table."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    structs = [st for lib in _libraries() for st in lib.structs]
    assert len(structs) == 14
    header = "".join(st.c_declaration() for st in structs)
    (tmp_path / "gen.h").write_text('#include <stdint.h>\n#include <stdio.h>\n#include <stddef.h>\n' + header)
    lines = ['#include "gen.h"', "int main(void) {"]
    for st in structs:
        lines.append(f'printf("{st.name} size %zu\\n", sizeof({st.name}));')
        lines += [f'printf("{st.name} {n} %zu\\n", offsetof({st.name}, {n}));' for n in st.names]
    (tmp_path / "probe.c").write_text("\n".join(lines) + "\nreturn 0; }\n")
    subprocess.run([cc, "-std=c99", "-o", str(tmp_path / "probe"), str(tmp_path / "probe.c")], check=True)
    got = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, check=True).stdout.split("\n")
    want = []
    for st in structs:
        want.append(f"{st.name} size {ctypes.sizeof(st.ctype)}")
        want += [f"{st.name} {n} {getattr(st.ctype, n).offset}" for n in st.names]
    assert got[:-1] == want
    # and the packed bytes of a call put each value at its field's offset
    args = structs[0]
    values = {n: (i + 1 if "*" not in t else 1000 + i) for i, (n, t) in enumerate(args.fields)}
    packed = args.ctype.from_buffer_copy(args(**values))
    assert all(getattr(packed, n) == pytest.approx(v) for n, v in values.items())


def test_struct_call_refuses_missing_or_unknown_fields():
    st = CStruct("ProbeArgs", "const float *pos, float *out, int64_t W, float dt")
    t = torch.zeros(3)
    assert len(st(pos=t, out=None, W=3, dt=0.1)) == ctypes.sizeof(st.ctype)
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'dt'"):
        st(pos=t, out=t, W=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'w'"):
        st(pos=t, out=t, W=3, dt=0.1, w=2)
    with pytest.raises(TypeError, match=r"unknown fields \['w'\]"):
        st.bind(w=2)
    bound = st.bind(out=None, W=3, dt=0.1)  # the fixed fields packed once, the rest per call
    assert bound(pos=t) == st(pos=t, out=None, W=3, dt=0.1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'W'"):
        bound(pos=t, W=4)
    with pytest.raises(ValueError, match="unknown C type"):
        CStruct("BadArgs", "long double x")
    with pytest.raises(ValueError, match="repeated field"):
        CStruct("BadArgs", "int64_t W, int W")
    with pytest.raises(ValueError, match="Python keywords"):
        CStruct("BadArgs", "int64_t lambda")


@pytest.mark.parametrize("cpu_kernels", [True, False])
def test_env_step_calls_the_c_entry_points(sample_dir, cpu_kernels):
    """The C backend calls every step kernel (a silent fallback to torch would call none); the
    torch backend calls none."""
    cfg = EnvConfig(max_controlled=8, cpu_kernels=cpu_kernels)
    env = DriveEnv(load_pack(str(sample_dir), cfg), num_worlds=2, config=cfg, seed=0)
    env.reset()
    cbuild.reset_call_counts()
    for _ in range(3):
        env.step(env.expert_actions())
    calls = cbuild.reset_call_counts()
    if cpu_kernels:
        assert {"EventsArgs", "AccountingArgs", "ObservationsStateArgs", "OffroadArgs", "CollisionsArgs",
                "ReplayStateArgs"} <= set(calls), calls
        assert calls["ObservationsStateArgs"] == 3
    else:
        assert calls == {}
