"""Every marked code block of README.md and docs/*.md runs, so the docs cannot go stale.

How to mark a block (the convention for whoever writes docs):

* Put the HTML comment ``<!-- snippet: run -->`` on the line right before the opening fence of a
  block that needs no GPU, no download and no network and finishes in a few seconds on a CPU.
  ``<!-- snippet: run slow -->`` marks one that takes longer (it runs with ``pytest -m slow``).
  Unmarked blocks are not run: commands that need the WOMD download or a GPU, synopses with
  placeholders, fragments, transcripts. Say in the text what such a block needs.
* A ```` ```python ```` block is executed in a fresh namespace (``exec``), in this process.
* A ```` ```bash ```` block runs command by command in a subprocess (``\\``-continued lines joined,
  ``#`` comments dropped, no shell: no pipes, variables or loops); ``python`` is this interpreter.
  Write the commands with small budgets (``--total-timesteps 2000``, ``--steps 5``).
* Both run in a fresh temporary directory that holds links to the repository's ``data``,
  ``policies``, ``train`` and ``profiling`` folders, so paths read as in a checkout
  (``data/womd_sample``, ``python train/evaluate.py``) while whatever a block writes (``runs/``,
  ``eval.json``, ``out.png``) lands in the temporary directory.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!--\s*snippet:\s*run(\s+slow)?\s*-->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
LINKED = ("data", "policies", "train", "profiling")
COMMAND_TIMEOUT_S = 300


def marked_blocks(path: pathlib.Path, root: pathlib.Path = REPO) -> list[tuple[str, int, str, bool]]:
    """``(language, first line number of the code, code, slow)`` of each marked block of ``path``
    (errors name the page relative to ``root``).

    Raises:
        ValueError: a malformed marker, a marker not followed by a fence, a fence without a closing
            one, or a marked block in a language the runner does not know (only ``python`` and
            ``bash``).
    """
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks = []
    for i, line in enumerate(lines):
        m = MARKER.match(line.strip())
        if not m:
            if "<!--" in line and "snippet" in line:
                raise ValueError(f"{path.relative_to(root)}:{i + 1}: malformed snippet marker {line.strip()!r} "
                                 "(write <!-- snippet: run --> or <!-- snippet: run slow -->)")
            continue
        fence = FENCE.match(lines[i + 1].strip()) if i + 1 < len(lines) else None
        where = f"{path.relative_to(root)}:{i + 1}"
        if fence is None:
            raise ValueError(f"{where}: snippet marker not followed by a ``` fence on the next line")
        if fence.group(1) not in ("python", "bash"):
            raise ValueError(f"{where}: marked block in {fence.group(1)!r}: only python and bash blocks can run")
        end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{where}: code block without a closing fence")
        blocks.append((fence.group(1), i + 3, "\n".join(lines[i + 2:end]), m.group(1) is not None))
    return blocks


def bash_commands(code: str) -> list[list[str]]:
    """The argv of each command of a bash block: continuation lines joined, comments dropped.

    Raises:
        ValueError: shell syntax the runner does not support (pipes, redirections, ``;``, ``&&``,
            variables, loops).
    """
    commands, pending = [], ""
    for raw in code.split("\n"):
        line = pending + raw
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        bad = [a for a in argv if a in ("|", "||", "&&", ";", ">", ">>", "<", "for", "do", "done") or "$" in a]
        if bad:
            raise ValueError(f"unsupported shell syntax {bad[0]!r} in: {line.strip()}")
        commands.append(argv)
    return commands


def _params():
    params = []
    for page in PAGES:
        for lang, line, code, slow in marked_blocks(page):
            marks = [pytest.mark.slow] if slow else []
            where = f"{page.relative_to(REPO)}:{line}"
            params.append(pytest.param(lang, code, where, id=where, marks=marks))
    return params


@pytest.fixture()
def sandbox(tmp_path, monkeypatch):
    """A temporary working directory with links to the repository folders snippets read."""
    for name in LINKED:
        (tmp_path / name).symlink_to(REPO / name, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("lang", "code", "where"), _params())
def test_snippet_runs(lang, code, where, sandbox):
    """The block runs without an error (python: no exception; bash: every command exits 0)."""
    if lang == "python":  # tracebacks name the page and the block's first line (add the line shown - 1)
        exec(compile(code, where, "exec"), {"__name__": "__snippet__"})
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    for argv in bash_commands(code):
        if argv[0] in ("python", "python3"):
            argv = [sys.executable, *argv[1:]]
        r = subprocess.run(argv, cwd=sandbox, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        assert r.returncode == 0, f"{where}: {shlex.join(argv)} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"


def test_the_pages_have_runnable_blocks():
    """The marker convention is in use (a typo in every marker would silently run nothing)."""
    counts = {p.name: len(marked_blocks(p)) for p in PAGES}
    assert sum(counts.values()) >= 5, counts
    for name in ("env.md", "data.md", "evaluation.md"):
        assert counts[name] >= 1, f"docs/{name} has no runnable block"


def test_marker_parsing(tmp_path):
    """Markers, line numbers, continuation lines and comments are read as documented."""
    page = tmp_path / "p.md"
    page.write_text("text\n<!-- snippet: run -->\n```python\nx = 1\n```\n<!-- snippet: run slow -->\n```bash\n"
                    "python -c 'print(1)' \\\n    --flag  # note\n```\n```python\nnot marked\n```\n")
    blocks = [(lang, line, code, slow) for lang, line, code, slow in marked_blocks(page, tmp_path)]
    assert blocks == [("python", 4, "x = 1", False), ("bash", 8, "python -c 'print(1)' \\\n    --flag  # note", True)]
    assert bash_commands(blocks[1][2]) == [["python", "-c", "print(1)", "--flag"]]
    with pytest.raises(ValueError, match="unsupported shell syntax"):
        bash_commands("python a.py | head")
    page.write_text("<!-- snippet: run -->\n```\nplain\n```\n")
    with pytest.raises(ValueError, match="only python and bash"):
        marked_blocks(page, tmp_path)
    page.write_text("<!-- snippet: runs -->\n```python\nx = 1\n```\n")
    with pytest.raises(ValueError, match="malformed snippet marker"):
        marked_blocks(page, tmp_path)



#: Old flag spellings (still accepted by the commands) and their current form; docs/cli.md lists
#: them once, every other page uses the current one.
OLD_SPELLINGS = {
    r"--human-replay\b": "--mode human_replay",
    r"--cell-size\b": "--grid-cell-size",
    r"--margin\b": "--grid-margin",
    r"--checkpoint(?![-\w])": "--policy",
    r"--episodes(?![-\w])": "--total-timesteps / --episodes-per-scenario",
}


def test_docs_use_current_flag_spellings():
    """The pages under docs/ (docs/cli.md excepted) write every flag the current way."""
    found = []
    for page in sorted((REPO / "docs").glob("*.md")):
        if page.name == "cli.md":
            continue
        for n, line in enumerate(page.read_text(encoding="utf-8").split("\n"), 1):
            found += [f"docs/{page.name}:{n}: {re.search(old, line).group(0)} -> {new}"
                      for old, new in OLD_SPELLINGS.items() if re.search(old, line)]
    assert not found, "old flag spellings (docs/cli.md lists them):\n" + "\n".join(found)


def test_old_spellings_still_parse():
    """What docs/cli.md promises: the old spellings reach the same option as the current ones."""
    import argparse

    import tyro

    from gpusim.data.__main__ import _add_config_flags
    from train.config import cli_registry
    from train.evaluate import EvalConfig
    from train.render import build_train_parser

    base = ["--data", "d", "--out", "o.png"]
    render = build_train_parser()
    assert render.parse_args([*base, "--policy", "a.pt"]).checkpoint == "a.pt"
    assert render.parse_args([*base, "--checkpoint", "a.pt"]).checkpoint == "a.pt"
    data = argparse.ArgumentParser()
    _add_config_flags(data)
    old = data.parse_args(["--cell-size", "8", "--margin", "30"])
    new = data.parse_args(["--grid-cell-size", "8", "--grid-margin", "30"])
    assert (old.grid_cell_size, old.grid_margin) == (new.grid_cell_size, new.grid_margin) == (8.0, 30.0)
    old = tyro.cli(EvalConfig, args=["--checkpoint", "a.pt", "--human-replay"], registry=cli_registry())
    assert old.checkpoint == "a.pt" and old.human_replay


def test_simulator_renderer_points_a_policy_to_the_trainer(capsys):
    """``python -m gpusim.render --policy X`` (either spelling) names ``python -m train.render``."""
    from gpusim.render.cli import main

    for flag in ("--policy", "--checkpoint", "--policy=a.pt"):
        assert main(["--data", "d", "--out", "o.png", flag, "a.pt"]) == 2
        assert "python -m train.render --policy" in capsys.readouterr().err

