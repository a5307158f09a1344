"""Import layering (DESIGN.md section 1), checked on the source with ``ast`` (no imports run):

* the simulator package ``gpusim`` never imports the trainer (``train``) or the policy (``policy``);
* kernels (``gpusim/kernels``) import nothing of the project but ``gpusim.backend``, the leaf enum
  module ``gpusim.enums`` and other kernels;
* no module of ``gpusim`` imports another module's ``_private`` name.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
GPUSIM = ROOT / "gpusim"


def imported_modules(path: pathlib.Path, root: pathlib.Path = ROOT):
    """(line, module, names) of every import in ``path`` (also inside functions); relative
    imports are resolved against ``path``'s package under ``root``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg = path.relative_to(root).with_suffix("").parts[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(pkg[: len(pkg) - node.level + 1]) if node.level else []
            mod = ".".join([*base, node.module] if node.module else base)
            out.append((node.lineno, mod, [a.name for a in node.names]))
    return out


def sources(root: pathlib.Path):
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def test_scanner_sees_every_kind_of_import(tmp_path):
    """The scanner finds plain, from-, relative and function-local imports and private names
    (so the checks below cannot pass by missing an import)."""
    p = tmp_path / "gpusim" / "render" / "probe.py"
    p.parent.mkdir(parents=True)
    p.write_text("import train.run\nfrom ..kernels import _x, y\ndef f():\n    from policy.actor_critic import A\n")
    got = {(m, tuple(n)) for _, m, n in imported_modules(p, root=tmp_path)}
    assert got == {("train.run", ()), ("gpusim.kernels", ("_x", "y")), ("policy.actor_critic", ("A",))}


@pytest.mark.parametrize("path", sources(GPUSIM), ids=lambda p: str(p.relative_to(ROOT)))
def test_gpusim_never_imports_train_or_policy(path):
    bad = [(ln, m) for ln, m, _ in imported_modules(path) if m.split(".")[0] in ("train", "policy")]
    assert not bad, f"{path.relative_to(ROOT)} imports the trainer/policy at {bad}"


@pytest.mark.parametrize("path", sources(GPUSIM / "kernels"), ids=lambda p: str(p.relative_to(ROOT)))
def test_kernels_import_only_backend_enums_and_kernels(path):
    allowed = ("gpusim.backend", "gpusim.enums", "gpusim.kernels")
    targets = [  # `from gpusim import backend` imports the module gpusim.backend
        (ln, full)
        for ln, m, names in imported_modules(path)
        for full in ([f"{m}.{n}" for n in names] if m == "gpusim" else [m])
    ]
    bad = [
        (ln, m)
        for ln, m in targets
        if m.split(".")[0] == "gpusim" and not any(m == a or m.startswith(a + ".") for a in allowed)
    ]
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}; kernels may import only {allowed}"


@pytest.mark.parametrize("path", sources(GPUSIM), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_names_imported_across_modules(path):
    bad = [
        (ln, m, n)
        for ln, m, names in imported_modules(path)
        for n in names
        if n.startswith("_") and not n.startswith("__") and m.split(".")[0] == "gpusim"
    ]
    assert not bad, f"{path.relative_to(ROOT)} imports private names {bad}"


def test_every_kernel_source_ships_in_the_wheel():
    """Each C / CUDA source under gpusim/ matches a ``[tool.setuptools.package-data]`` pattern of its
    package: without one, a non-editable install lacks the file and the env silently runs the torch
    reference instead of the C kernels (step_cpu.c and observations/cpu.c were missing once)."""
    import fnmatch
    import tomllib

    root = pathlib.Path(__file__).resolve().parents[1]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    sources = [p for ext in ("*.c", "*.cu", "*.cuh", "*.cpp") for p in (root / "gpusim").rglob(ext)]
    assert sources
    for src in sources:
        package = ".".join(src.parent.relative_to(root).parts)
        patterns = data.get(package, [])
        assert any(fnmatch.fnmatch(src.name, pat) for pat in patterns), (
            f"{src.relative_to(root)}: add it to [tool.setuptools.package-data] \"{package}\" in pyproject.toml")
