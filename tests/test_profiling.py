"""Smoke tests of the profiling scripts: tiny sweeps, output parses, numbers positive.

No timing is asserted (benchmarks are scripts, docs/design.md section 15)."""

import json
import math
import pathlib
import sys

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `profiling` is a directory of scripts, not an installed package
    sys.path.insert(0, str(REPO))

from profiling import bench_env, bench_train, trace  # noqa: E402
from profiling.timers import KernelTimer, instrument_env  # noqa: E402


@pytest.fixture(scope="module")
def pack8(sample_dir, tmp_path_factory):
    """A saved pack of 3 sample scenarios with max_controlled = 8 (the trainer's default)."""
    from gpusim.config import EnvConfig
    from gpusim.data import ScenarioPack

    files = sorted(sample_dir.glob("*.json*"))[:3]
    path = tmp_path_factory.mktemp("pack8") / "pack"
    ScenarioPack.from_json(files, EnvConfig(max_controlled=8).data_config()).save(path)
    return path


def _positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_bench_env_json(pack8, capsys):
    torch.set_num_threads(1)
    # one repeat: the medians are that repeat's own numbers, so rate == agents / time holds exactly
    # whatever the machine's load (with 2 repeats a loaded machine made the two medians disagree)
    res = bench_env.main(["--data", str(pack8), "--worlds", "1", "3", "--max-controlled", "8", "--steps", "2",
                          "--repeats", "1", "--warmup", "1", "--breakdown", "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert printed["results"] == json.loads(json.dumps(res["results"]))
    assert printed["meta"]["backend"] == "torch" and printed["meta"]["threads"] == 1
    rows = printed["results"]
    assert [r["worlds"] for r in rows] == [1, 3] and all(r["max_controlled"] == 8 for r in rows)
    for r in rows:
        for key in ("agent_steps_per_s", "world_steps_per_s", "ms_per_step", "us_per_agent_step",
                    "agents_per_step", "state_bytes_per_world", "obs_bytes_per_world", "pack_bytes"):
            assert _positive(r[key]), key
        # agent-steps count controlled agents only: at most C per world and step
        assert r["agents_per_step"] <= 8 * r["worlds"]
        assert r["agent_steps_per_s"] == pytest.approx(r["agents_per_step"] / (r["ms_per_step"] / 1000), rel=1e-9)
        bd = r["breakdown_ms"]
        for k in ("observe", "contacts", "rewards", "replay", "motion", "other"):  # stages of PIPELINE
            assert k in bd and bd[k] >= 0
        assert bd["observe"] > 0
        assert sum(bd.values()) == pytest.approx(r["breakdown_total_ms"], rel=1e-6, abs=1e-6)


def test_bench_env_table_and_max_controlled_sweep(sample_dir, tmp_path, capsys):
    src = tmp_path / "json"
    src.mkdir()
    for f in sorted(sample_dir.glob("*.json*"))[:2]:
        (src / f.name).write_bytes(f.read_bytes())
    bench_env.main(["--data", str(src), "--worlds", "2", "--max-controlled", "4", "8", "--steps", "1",
                    "--repeats", "1", "--warmup", "0"])
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[0].split()[:3] == ["worlds", "C", "agents"]
    assert [ln.split()[1] for ln in lines[1:3]] == ["4", "8"]


def test_bench_env_rejects_mismatched_pack(pack8):
    with pytest.raises(SystemExit, match="max_controlled=8"):
        bench_env.main(["--data", str(pack8), "--worlds", "1", "--max-controlled", "32", "--json"])


def test_instrument_env_times_stages_and_restores_the_hook(pack8):
    from gpusim.config import EnvConfig
    from gpusim.data import ScenarioPack
    from gpusim.env import DriveEnv
    from gpusim.sim.pipeline import PIPELINE

    env = DriveEnv(ScenarioPack.load(pack8), 2, EnvConfig(max_controlled=8))
    env.reset()
    timer = KernelTimer(sync_cuda=False)
    with pytest.raises(RuntimeError):
        with instrument_env(timer, env):
            assert env.stage_hook is not None
            env.step(env.expert_actions())
            raise RuntimeError("boom")
    assert env.stage_hook is None
    assert set(timer.calls) == {s.name for s in PIPELINE} | {"expert_actions"}
    assert all(n == 1 for n in timer.calls.values())
    env.step(env.expert_actions())  # no hook: nothing more recorded
    assert all(n == 1 for n in timer.calls.values())


def test_bench_train_json(pack8, capsys):
    torch.set_num_threads(1)
    bench_train.main(["--iters", "1", "--warmup", "0", "--json", "--", "--data", str(pack8), "--num-worlds", "2",
                      "--env.scenario-length", "4", "--device", "cpu"])
    res = json.loads(capsys.readouterr().out)
    med = res["median"]
    assert res["meta"]["horizon"] == 4 and res["meta"]["worlds"] == 2
    assert _positive(med["sps"]) and _positive(med["seconds"]) and _positive(res["peak_rss_mb"])
    for k in bench_train.PHASES:
        assert k in med
    for k in ("env_step", "policy_rollout", "advantage", "ppo_update"):
        assert med[k] > 0, k
    # the phases partition the iteration (rollout_other may be ~0 but not much below)
    assert sum(med[k] for k in bench_train.PHASES) == pytest.approx(med["seconds"], rel=1e-6)
    assert med["agent_steps"] > 0 and med["agent_steps"] % 4 == 0  # active slots x horizon


def test_trace_writes_chrome_json(pack8, tmp_path, capsys):
    out = tmp_path / "t.json"
    res = trace.main(["--data", str(pack8), "--max-controlled", "8", "--worlds", "2", "--steps", "2",
                      "--warmup", "1", "--out", str(out)])
    assert res["out"] == str(out) and out.exists()
    events = json.loads(out.read_text())["traceEvents"]
    names = [e.get("name") for e in events]
    assert names.count("gpusim.step") == 2
    from gpusim.sim.pipeline import PIPELINE

    for stage in PIPELINE:  # every stage of the step is a named range, once per step
        assert names.count(stage.name) == 2, stage.name
    assert "wrote" in capsys.readouterr().out


def test_gpu_check_needs_cuda_or_dry_run(tmp_path, capsys):
    from profiling import gpu_check

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the no-GPU message does not apply")
    with pytest.raises(SystemExit) as e:
        gpu_check.main(["--out", str(tmp_path)])
    assert e.value.code == 2 and "--dry-run" in capsys.readouterr().err


def test_bench_env_triton_without_cuda_is_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the no-GPU message does not apply")
    with pytest.raises(SystemExit) as e:
        bench_env.main(["--backend", "triton"])
    assert e.value.code == 2 and "no CUDA device" in capsys.readouterr().err


def test_graph_doctor_needs_cuda(capsys):
    from profiling import graph_doctor

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the no-GPU message does not apply")
    with pytest.raises(SystemExit) as e:
        graph_doctor.main([])
    assert e.value.code == 2 and "no CUDA device" in capsys.readouterr().err


def test_gpu_check_reads_pytest_closing_line_not_test_output():
    """The tests step's summary is pytest's closing line; a test's printed text that mentions
    "error" (the H100 run picked up a docstring about position error) must not be taken for it."""
    from profiling import gpu_check

    lines = ["p95 position error < 0.1 m (closed loop)", "SKIPPED [1] tests/x.py:3: no GPU",
             "==== 2 failed, 1040 passed, 6 skipped in 160.25s (0:02:40) ====", "trailing warning text"]
    assert next(ln for ln in reversed(lines) if gpu_check.PYTEST_SUMMARY.search(ln)) == lines[2]
    for line in ("1050 passed, 8 skipped, 288 warnings in 136.81s (0:02:16)", "3 errors in 2.0s",
                 "1 failed, 2 passed, 1 error in 2.0s"):
        assert gpu_check.PYTEST_SUMMARY.search(line), line
    assert not gpu_check.PYTEST_SUMMARY.search("the error in 3.5s of replay")


def test_gpu_check_lists_skipped_tests_with_their_reason(tmp_path):
    """The tests step reports each skipped test with its reason (e.g. the cupy backend's cases on a
    GPU without CuPy), not only failures."""
    from profiling import gpu_check

    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\ndef test_ok():\n    pass\n\n"
        "@pytest.mark.skip(reason='needs a CUDA device and CuPy')\ndef test_cupy_case():\n    pass\n")
    report = gpu_check.run_tests([str(tmp_path / "test_skips.py")], dry_run=True, timeout=120)
    assert report["ok"] and "1 passed, 1 skipped" in report["summary"]
    assert len(report["skipped"]) == 1 and report["skipped"][0].endswith("needs a CUDA device and CuPy")


@pytest.fixture(scope="module")
def json2(sample_dir, tmp_path_factory):
    """A directory with 2 sample scenarios as WOMD JSON (any max_controlled can load it)."""
    src = tmp_path_factory.mktemp("json2")
    for f in sorted(sample_dir.glob("*.json*"))[:2]:
        (src / f.name).write_bytes(f.read_bytes())
    return src


def test_gpu_check_dry_run_env_only(json2, tmp_path):
    """The env step of the dry run on its own: JSON and Markdown written, numbers positive."""
    from profiling import gpu_check

    rep = gpu_check.main(["--dry-run", "--out", str(tmp_path), "--skip", "tests", "train", "--worlds", "1",
                          "--data", str(json2)])
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["meta"]["dry_run"] and saved["device"]["device"] == "cpu" and rep["env"]["ok"]
    (row,) = saved["env"]["rows"]
    assert row["worlds"] == 1 and _positive(row["agent_steps_per_s"]) and row["breakdown_ms"]
    md = (tmp_path / "gpu_check.md").read_text()
    assert "DRY RUN" in md and "| 1 |" in md


@pytest.mark.slow
def test_gpu_check_dry_run_end_to_end(json2, tmp_path):
    """Every step of the dry run (a pytest subprocess, the env benchmark, a short training run and
    the bench_train split); ~20 s of CPU, mostly subprocess start-up."""
    from profiling import gpu_check

    rep = gpu_check.main(["--dry-run", "--out", str(tmp_path), "--worlds", "1", "--data", str(json2),
                          "--train-seconds", "120"])
    for name in ("device", "tests", "env", "train"):
        assert rep[name]["ok"], (name, rep[name])
    assert "passed" in rep["tests"]["summary"]
    run = rep["train"]["run"]
    assert run["reports"] >= 1 and not run["stopped_at_time_limit"] and _positive(run["sps_median"])
    assert _positive(rep["train"]["split"]["median"]["sps"])
    md = (tmp_path / "gpu_check.md").read_text()
    assert "## Tests" in md and "## Env only" in md and "## Training" in md and "ppo_update" in md


def test_count_ops_separates_triton_launches_from_torch_kernels():
    from gpusim.backend import use_backend
    from gpusim.kernels import dynamics as D
    from profiling.launches import count_ops

    x = torch.zeros(2, 3)
    with count_ops() as c:
        y = x + 1          # one kernel
        y.view(3, 2)       # a view: no kernel
        torch.empty(4)     # an allocation: no kernel
    assert c["torch"] == 1 and c["torch:add"] == 1 and c["triton"] == 0
    from synthetic import to_kernel_device

    h, pos, length, moving = to_kernel_device(
        (torch.zeros(2, 3), torch.zeros(2, 3, 2), torch.full((2, 3), 4.0), torch.ones(2, 3).bool()))
    with use_backend("triton"), count_ops() as c:
        D.bicycle_step(pos, h, h, length, h, h, moving, 0.1)
    # one launch and its three output allocations; the interpreter's own tensor work is not counted
    assert c["triton"] == 1 and c["torch"] == 0, c


def test_kernel_costs_launch_counts_small(json2):
    from gpusim.config import EnvConfig
    from gpusim.data import ScenarioPack
    from profiling import kernel_costs
    from synthetic import KERNEL_DEVICE

    cfg = EnvConfig(max_agents=24, max_controlled=4, num_partners=15, num_roads=32, scenario_length=5)
    pack = ScenarioPack.from_json(sorted(json2.glob("*.json*")), cfg.data_config())
    res = kernel_costs.launch_counts(pack, cfg, worlds=1, steps=2, device=KERNEL_DEVICE)
    assert len(res["triton"]) == len(res["torch"]) == 2
    assert all(n >= 7 for n in res["triton"]) and all(n > 0 for n in res["torch"])
    assert res["top"] and all(v > 0 for _, v in res["top"])
