"""Training logs: a JSONL metrics file (always), console progress (rich), wandb (optional).

One record per report: ``{"update", "global_step", "time", "sps", <losses>, <env metrics>}``.
wandb is imported lazily only when enabled (it is the optional ``wandb`` extra) and runs in
offline mode unless ``online`` is asked for.
"""

from __future__ import annotations

import json
import math
import pathlib
import shutil
import time

from gpusim.fileio import write_errors, write_text
from train.config import UserError


#: Console width (characters) when the output is not a terminal (a file or a pipe): rich would
#: otherwise fall back to 80 columns and cut table cells short (``policie…``).
PIPE_WIDTH = 250


def make_console(stderr: bool = False):
    """A ``rich.console.Console`` for tables and progress lines: the terminal's width on a
    terminal, :data:`PIPE_WIDTH` columns when written to a file or a pipe (no cut cells)."""
    from rich.console import Console

    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal:
        console = Console(stderr=stderr, highlight=False, width=PIPE_WIDTH)
    return console


def eta_seconds(total_steps: int, step: int, sps: float) -> float:
    """Seconds left to ``total_steps`` at ``sps`` steps per second: 0 once ``step >= total_steps``
    (the last update overshoots the total), NaN when the rate is not a finite number > 0."""
    if step >= total_steps:
        return 0.0
    if not (isinstance(sps, (int, float)) and math.isfinite(sps) and sps > 0):
        return float("nan")
    return (total_steps - step) / sps


def _fmt_eta(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Logger:
    """Writes reports to ``run_dir/metrics.jsonl``, the console and optionally wandb.

    Args:
        run_dir: directory of the run (created).
        config: plain-data config (written to ``run_dir/config.json`` and given to wandb).
        total_steps: for the ETA. quiet: no console output.
        wandb: enable wandb. wandb_mode: ``offline`` | ``online``. wandb_project: project name.
        run_name: display name.

        append: continue an existing ``metrics.jsonl`` (``--resume``). elapsed: seconds already
            run (the ``time`` field continues from it).

    Raises:
        OutputError: ``run_dir``, ``metrics.jsonl`` or ``config.json`` cannot be written (one line).
        UserError: with an install hint if ``wandb=True`` and the package is missing, or when
            ``wandb.init`` fails; nothing is left on disk then (a run directory created here is
            removed again).
    """

    def __init__(self, run_dir, config: dict, total_steps: int, quiet: bool = False, wandb: bool = False,
                 wandb_mode: str = "offline", wandb_project: str = "gpusim", run_name: str | None = None,
                 append: bool = False, elapsed: float = 0.0):
        self.run_dir = pathlib.Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        self.total_steps = total_steps
        self.quiet = quiet
        self.start = time.time() - float(elapsed)
        self._console = None
        if not quiet:
            self._console = make_console()
        self._wandb = None
        created = not self.run_dir.exists()
        with write_errors(self.run_dir, "--log-dir"):
            self.run_dir.mkdir(parents=True, exist_ok=True)
        if wandb:  # before any file is written: a failed start leaves no empty metrics.jsonl behind
            try:
                import wandb as _wandb  # lazy: optional dependency
            except ImportError as e:
                self._remove_if_created(created)
                raise UserError("--wandb needs the wandb package: pip install 'gpusim[wandb]' "
                                  "(or run without --wandb)") from e
            try:
                self._wandb = _wandb.init(project=wandb_project, name=run_name, config=config, mode=wandb_mode,
                                          dir=str(self.run_dir))
            except Exception as e:
                self._remove_if_created(created)
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise UserError(f"--wandb: wandb.init failed ({first}); check --wandb-mode/--wandb-project "
                                   "or run without --wandb") from e
        with write_errors(self.path, "--log-dir"):  # an append-only log, one flushed line per report
            self._file = open(self.path, "a" if append else "w", buffering=1)
        write_text(self.run_dir / "config.json", json.dumps(config, indent=1, default=str), flag="--log-dir")

    def _remove_if_created(self, created: bool) -> None:
        if created:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    @property
    def elapsed(self) -> float:
        """Seconds of this run so far (continued across ``--resume``)."""
        return time.time() - self.start

    def log(self, record: dict) -> None:
        """Write one report (plain floats/ints): one line, flushed to the OS at once.

        Raises:
            OutputError: the line cannot be written (full disk, read-only file system), one line.
        """
        with write_errors(self.path, "--log-dir"):
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        if self._wandb is not None:
            self._wandb.log(record, step=int(record.get("global_step", 0)))
        if self._console is not None:
            step = record.get("global_step", 0)
            sps = record.get("sps", float("nan"))
            eta = eta_seconds(self.total_steps, step, sps)
            parts = [f"[bold]upd {record.get('update', 0):4d}[/bold]", f"step {step:>9,d}", f"SPS {sps:8.0f}"]
            for key, label in (("goal_reached", "goal"), ("collided", "coll"), ("offroad", "offrd"),
                               ("score", "score"), ("episode_return", "ret")):
                if key in record:
                    parts.append(f"{label} {record[key]:.3f}")
            for key, label in (("pg_loss", "pg"), ("v_loss", "vf"), ("entropy", "ent"), ("approx_kl", "kl")):
                if key in record:
                    parts.append(f"{label} {record[key]:.4f}")
            parts.append(f"ETA {_fmt_eta(eta)}")
            self._console.print("  ".join(parts), soft_wrap=True)

    def info(self, text: str) -> None:
        """A console message (not in the JSONL file)."""
        if self._console is not None:
            self._console.print(text)

    def close(self) -> None:
        """Flush and close the file (and finish wandb)."""
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()


def truncate_jsonl(path, last_update: int) -> tuple[int, int]:
    """Keep only the records of ``path`` with ``update <= last_update`` (used by ``--resume``).

    Records written after the checkpoint being resumed (the run was killed between its report and
    its next checkpoint) are dropped, as is a partial last line of a write cut short, so the
    resumed run writes every later update exactly once. Rewritten atomically
    (:func:`gpusim.fileio.write_text`). A missing file is left missing.

    Returns:
        ``(kept, dropped)`` record/line counts.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        return 0, 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
            ok = isinstance(rec, dict) and int(rec.get("update", 0)) <= int(last_update)
        except (json.JSONDecodeError, TypeError, ValueError):
            ok = False
        if ok:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        write_text(path, "".join(k + "\n" for k in kept))
    return len(kept), dropped
