"""Import layering (docs/design.md section 2), checked on the source with ``ast`` (no imports run):

* the simulator package ``gpusim`` never imports the trainer (``train``) or the policy (``policy``);
* kernels (``gpusim/kernels``) import nothing of the project but ``gpusim.backend``, the leaf enum
  module ``gpusim.enums`` and other kernels;
* no module of ``gpusim`` imports another module's ``_private`` name;
* no import cycle among the modules of ``gpusim``, ``policy`` and ``train``, counting imports inside
  functions too (a lazy import defers a cycle, it does not remove it: the trainer once had
  ``train.run -> train.coplayer -> train.eval.live -> train.evaluate -> train.run``).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
GPUSIM = ROOT / "gpusim"
#: The packages whose modules may not import each other in a cycle.
LAYERED = ("gpusim", "policy", "train")


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
    reference instead of the C kernels (the step's C sources and observations/cpu.c were missing once)."""
    import fnmatch
    import tomllib

    root = pathlib.Path(__file__).resolve().parents[1]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    sources = [p for ext in ("*.c", "*.h", "*.cu", "*.cuh", "*.cpp") for p in (root / "gpusim").rglob(ext)]
    assert sources
    for src in sources:
        package = ".".join(src.parent.relative_to(root).parts)
        patterns = data.get(package, [])
        assert any(fnmatch.fnmatch(src.name, pat) for pat in patterns), (
            f"{src.relative_to(root)}: add it to [tool.setuptools.package-data] \"{package}\" in pyproject.toml")


# ----------------------------------------------------------------------------------- import cycles
def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    """``train/eval/live.py`` -> ``train.eval.live``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: pathlib.Path = ROOT, packages=LAYERED) -> dict[str, set[str]]:
    """Module -> project modules it imports (anywhere in its body), over ``packages`` under
    ``root``. ``from a.b import c`` points at ``a.b.c`` when that is a module, else at ``a.b``."""
    paths = [p for pkg in packages if (root / pkg).is_dir() for p in sources(root / pkg)]
    names = {module_name(p, root): p for p in paths}
    graph = {}
    for name, path in names.items():
        edges = set()
        for _, mod, imported in imported_modules(path, root=root):
            targets = [f"{mod}.{n}" if f"{mod}.{n}" in names else mod for n in imported] or [mod]
            edges |= {t for t in targets if t in names and t != name}
        graph[name] = edges
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected component of more than one module
    (Tarjan's algorithm, iterative), sorted; ``[]`` when the imports form a DAG."""
    index, low, on_stack, stack, comps, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.add(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    comps.append(comp)
    return sorted(_one_cycle(graph, comp) for comp in comps)


def _one_cycle(graph, comp: set[str]) -> list[str]:
    """A shortest cycle through the first module of ``comp`` (breadth-first inside ``comp``)."""
    first = min(comp)
    prev, frontier = {first: None}, [first]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & comp):
                if child == first:
                    path = [node]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return path[::-1] + [first]
                if child not in prev:
                    prev[child] = node
                    nxt.append(child)
        frontier = nxt
    return sorted(comp)


def _train_tree_graph(root, files: dict[str, str]) -> dict[str, set[str]]:
    """Write ``files`` (path relative to ``root`` -> source) and return the import graph of the
    ``train`` package under ``root``."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return import_graph(root, ("train",))


def test_cycle_finder_sees_lazy_and_from_import_cycles(tmp_path):
    """The finder reports a cycle closed by function-local imports and ``from pkg import module``
    (the shape of the trainer's old cycle), and nothing for the same modules without the back edge."""
    files = {"train/__init__.py": "", "train/eval/__init__.py": "",
             "train/run.py": "from train.coplayer import RunExtras\n",
             "train/coplayer.py": "def f():\n    from train.eval import live\n",
             "train/eval/live.py": "class L:\n    def __init__(self):\n        from train.evaluate import mode_env\n",
             "train/evaluate.py": "import json\ndef g():\n    from train.run import check_device\n",
             "train/config.py": "import torch\n"}
    graph = _train_tree_graph(tmp_path, files)
    assert graph["train.coplayer"] == {"train.eval.live"} and graph["train.config"] == set()
    assert import_cycles(graph) == [["train.coplayer", "train.eval.live", "train.evaluate", "train.run",
                                     "train.coplayer"]]
    (tmp_path / "train/evaluate.py").write_text("def g():\n    from train.config import x\n")
    assert import_cycles(import_graph(tmp_path, ("train",))) == []


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` with every module of a subpackage merged into that subpackage (its first level
    below ``gpusim`` / ``policy`` / ``train``: ``train.eval.modes`` -> ``train.eval``; a top-level
    module such as ``train.coplayer`` stays itself); self-edges dropped."""
    packages = {m for m in graph if m.count(".") == 1 and any(o.startswith(m + ".") for o in graph)}

    def unit(m: str) -> str:
        head = ".".join(m.split(".")[:2])
        return head if head in packages else m

    out = {unit(m): set() for m in graph}
    for m, edges in graph.items():
        out[unit(m)] |= {unit(e) for e in edges} - {unit(m)}
    return out


def test_package_graph_merges_subpackages(tmp_path):
    """A cycle between a top-level module and a subpackage is seen at the package level even when
    the modules themselves form no cycle (``eval.modes -> coplayer -> eval.styles``)."""
    files = {"train/__init__.py": "", "train/eval/__init__.py": "",
             "train/eval/modes.py": "def f():\n    from train.coplayer import make_pool\n",
             "train/eval/styles.py": "import torch\n",
             "train/coplayer.py": "from train.eval.styles import partner_styles\n"}
    graph = _train_tree_graph(tmp_path, files)
    assert import_cycles(graph) == []
    assert package_graph(graph) == {"train": set(), "train.eval": {"train.coplayer"},
                                    "train.coplayer": {"train.eval"}}
    assert import_cycles(package_graph(graph)) == [["train.coplayer", "train.eval", "train.coplayer"]]


def test_coplayer_and_eval_import_one_way():
    """The evaluation package uses the co-player pool (``train.eval.modes`` builds it); the
    co-player module never imports the evaluation package back (``--coplayer PATH@STYLE`` is parsed
    in ``train.coplayer``)."""
    pg = package_graph(import_graph())
    assert "train.coplayer" in pg["train.eval"]
    assert "train.eval" not in pg["train.coplayer"], "train.coplayer imports train.eval: " + ", ".join(
        sorted(e for e in import_graph()["train.coplayer"] if e.startswith("train.eval")))


def test_no_import_cycle_in_gpusim_policy_train():
    graph = import_graph()
    assert {"train.run", "train.evaluate", "policy.actor_critic", "gpusim.env"} <= set(graph)
    cycles = import_cycles(graph)
    assert not cycles, "import cycles (move the shared piece to a module both import): " + "; ".join(
        " -> ".join(c) for c in cycles)


def test_no_package_cycle_in_gpusim_policy_train():
    """No cycle between packages either (:func:`package_graph`: a subpackage such as ``train.eval``
    is one unit): a module used by both a subpackage and the modules it imports belongs outside
    the subpackage (e.g. ``train/settings.py``, read by ``train.config`` and ``train.eval``)."""
    pg = package_graph(import_graph())
    assert {"train.eval", "train.config", "gpusim.kernels", "policy.encoders"} <= set(pg)
    cycles = import_cycles(pg)
    assert not cycles, "package import cycles (move the shared module out of the subpackage): " + "; ".join(
        " -> ".join(c) for c in cycles)
