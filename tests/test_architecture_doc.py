"""docs/architecture.md's stage diagram is the step as it runs: the stages of
``gpusim.sim.pipeline.PIPELINE`` in order, each in the module the diagram names (a stage added to
the pipeline and not to the diagram, or moved, fails here)."""

from __future__ import annotations

import inspect
import pathlib
import re

from gpusim.sim.pipeline import PIPELINE

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: a stage box of the diagram: "│ <stage> <module path> │"
BOX = re.compile(r"│ (\w+)\s+(sim/\w+\.py)\s*│")


def diagram_stages(text: str) -> list[tuple[str, str]]:
    """``(stage name, module path)`` of every stage box of the first diagram in ``text``."""
    diagram = text.split("```")[1]
    return BOX.findall(diagram)


def test_diagram_lists_the_pipeline_in_order_with_its_modules():
    boxes = diagram_stages((ROOT / "docs" / "architecture.md").read_text())
    assert [name for name, _ in boxes] == [s.name for s in PIPELINE]
    for (name, path), stage in zip(boxes, PIPELINE):
        module = inspect.getsourcefile(stage.run)
        assert pathlib.Path(module) == ROOT / "gpusim" / path, (name, module)


def test_diagram_parser_sees_a_missing_stage():
    text = "```\n│ motion      sim/motion.py    │ who acts\n│ replay      sim/replay.py    │ clock\n```\n"
    assert diagram_stages(text) == [("motion", "sim/motion.py"), ("replay", "sim/replay.py")]
    assert [n for n, _ in diagram_stages(text)] != [s.name for s in PIPELINE]


#: a numbered stage item of a prose list: "1. **motion**: ..." or "1. `motion`: ..."
ITEM = re.compile(r"^\d+\. (?:\*\*|`)(\w+)(?:\*\*|`)", re.M)


def prose_stages(text: str, heading: str) -> list[str]:
    """The stage names of the first numbered list after ``heading`` in ``text``."""
    after = text.split(heading, 1)[1]
    block = after[after.index("\n1. "):].split("\n\n", 1)[0]
    return ITEM.findall(block)


def test_prose_stage_lists_follow_the_pipeline():
    """The numbered stage lists of design.md section 6 and env.md name the pipeline's stages, in order."""
    want = [s.name for s in PIPELINE]
    docs = ROOT / "docs"
    assert prose_stages((docs / "design.md").read_text(), "## 6. The step") == want
    assert prose_stages((docs / "env.md").read_text(), "Then the stages of `PIPELINE`") == want


def test_prose_parser_sees_a_missing_stage():
    text = "## 6. The step\n\nruns:\n\n1. `motion`: moves.\n   more.\n2. **replay**: clock.\n\nAfter.\n3. `x`: no"
    assert prose_stages(text, "## 6. The step") == ["motion", "replay"]
