"""Device-aware training defaults (train/recipes.py): the CPU recipe is TrainConfig's own defaults
bit for bit, the GPU recipe sets its fields, flags given always win, ``--config`` and ``--resume``
keep what they state, and a GPU-recipe run trains on the CPU."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

import pytest
import torch

from train.config import TrainConfig, parse_args
from train.recipes import RECIPES, apply_recipe, flag_of, recipe_overrides, resolve_recipe

REPO = pathlib.Path(__file__).resolve().parents[1]


def _field(cfg, key):
    group, _, name = key.rpartition(".")
    return getattr(getattr(cfg, group) if group else cfg, name)


def test_resolve_recipe_follows_the_device():
    assert resolve_recipe("auto", "cpu") == "cpu"
    assert resolve_recipe("auto", "cuda") == "gpu" and resolve_recipe("auto", "cuda:1") == "gpu"
    assert resolve_recipe("auto", "not-a-device") == "cpu"  # check_device names it later
    assert resolve_recipe("gpu", "cpu") == "gpu" and resolve_recipe("cpu", "cuda") == "cpu"
    with pytest.raises(ValueError, match="--recipe tpu: unknown recipe; use auto, cpu, gpu"):
        resolve_recipe("tpu", "cpu")


def test_cpu_recipe_is_exactly_the_trainconfig_defaults(capsys):
    cfg = parse_args(["--device", "cpu"])
    assert cfg.recipe == "cpu"
    assert dataclasses.replace(cfg, recipe="auto") == TrainConfig(device="cpu")
    assert cfg.ppo.autocast == "off" and cfg.ppo.fused_adam is False and cfg.num_worlds == 32
    assert capsys.readouterr().out == ""  # the CPU recipe prints nothing (CPU output unchanged)


def test_gpu_recipe_sets_its_fields_and_says_so(capsys, monkeypatch):
    cfg = parse_args(["--recipe", "gpu", "--device", "cpu"])
    assert cfg.recipe == "gpu"
    for key, value in RECIPES["gpu"].items():
        assert _field(cfg, key) == value, key
    # bf16 and fused Adam stay off (3% at 4096 worlds, slower at 1024 on an H200); packing the
    # update's kept steps is on (train/recipes.py)
    assert (cfg.num_worlds, cfg.total_timesteps, cfg.ppo.autocast, cfg.ppo.fused_adam) == (1024, 40_000_000, "off",
                                                                                           False)
    assert cfg.ppo.pack_removed and not TrainConfig().ppo.pack_removed
    # everything else is the CPU default
    assert dataclasses.replace(cfg, recipe="auto", num_worlds=32, total_timesteps=2_000_000, report_interval=2,
                               ppo=TrainConfig().ppo) == TrainConfig(device="cpu")
    out = capsys.readouterr().out
    assert out.startswith("recipe gpu (device cpu): --num-worlds 1024 --total-timesteps 40000000")
    assert "--ppo.autocast" not in out and "overridden" not in out
    assert parse_args(["--recipe", "gpu", "--device", "cpu", "--quiet"]).recipe == "gpu"
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("RANK", "1")  # torchrun: the other ranks stay silent
    assert parse_args(["--recipe", "gpu", "--device", "cpu"]).num_worlds == 1024
    assert capsys.readouterr().out == ""


def test_flags_given_win_over_the_recipe_even_at_the_cpu_default(capsys):
    cfg = parse_args(["--recipe", "gpu", "--device", "cpu", "--num-worlds", "32", "--report-interval", "2",
                      "--ppo.num-minibatches", "8"])
    assert (cfg.num_worlds, cfg.report_interval, cfg.ppo.num_minibatches) == (32, 2, 8)
    assert cfg.total_timesteps == 40_000_000  # not given: the recipe's
    out = capsys.readouterr().out
    assert "overridden by flags: --num-worlds 32 --report-interval 2" in out


def test_auto_on_a_cuda_device_string_picks_the_gpu_recipe():
    # parsing needs no GPU: prepare_run refuses a missing CUDA device later, with its own message
    cfg = parse_args(["--device", "cuda", "--quiet"])
    assert cfg.recipe == "gpu" and cfg.num_worlds == 1024 and cfg.total_timesteps == 40_000_000


@pytest.mark.filterwarnings("ignore:The field `recipe`")  # tyro's note on the bad value below
def test_config_file_is_not_overridden_by_a_recipe(tmp_path):
    # a file without a recipe name (written before recipes existed, or by hand): on CUDA, auto
    # would pick the GPU recipe; the file's values stay the defaults instead
    saved = TrainConfig(device="cpu", num_worlds=16).to_dict()
    del saved["recipe"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(saved))
    cfg = parse_args(["--config", str(path), "--device", "cuda", "--quiet"])
    assert cfg.num_worlds == 16 and cfg.ppo.autocast == "off" and cfg.total_timesteps == 2_000_000
    assert cfg.recipe == "auto"
    path.write_text(json.dumps({"recipe": "fast"}))
    with pytest.raises(ValueError, match="recipe: expected one of 'auto', 'cpu', 'gpu', got 'fast'; fix the file or"):
        parse_args(["--config", str(path)])


def test_resumed_run_keeps_worlds_env_and_policy_of_its_checkpoint():
    assert "num_worlds" not in recipe_overrides("gpu", resuming=True)
    assert recipe_overrides("gpu", resuming=True)["total_timesteps"] == 40_000_000
    cfg = parse_args(["--recipe", "gpu", "--device", "cpu", "--resume", "some/checkpoint.pt", "--quiet"])
    assert cfg.num_worlds == TrainConfig().num_worlds  # prepare_run takes the checkpoint's
    assert cfg.policy == TrainConfig().policy and cfg.env == TrainConfig().env
    assert cfg.report_interval == 5 and cfg.total_timesteps == 40_000_000


def test_apply_recipe_and_flag_spelling():
    base = TrainConfig(device="cpu")
    cfg = apply_recipe(base, "gpu")
    assert cfg.recipe == "gpu" and base.num_worlds == 32  # a new config; the base is untouched
    assert apply_recipe(base, "cpu") == dataclasses.replace(base, recipe="cpu")
    assert flag_of("num_worlds", 1024) == "--num-worlds 1024"
    assert flag_of("ppo.fused_adam", True) == "--ppo.fused-adam"
    assert flag_of("ppo.fused_adam", False) == "--ppo.no-fused-adam"


def test_gpu_recipe_run_trains_on_the_cpu(tmp_path):
    """The GPU recipe with the update levers (bf16 autocast, fused Adam requested) runs end to end on the CPU
    (fused Adam falls back to the plain optimizer there) on the bundled scenarios, and the run
    records the recipe and its options."""
    from train.run import train

    cfg = parse_args(["--recipe", "gpu", "--device", "cpu", "--num-worlds", "2", "--total-timesteps", "1",
                      "--num-threads", "1", "--log-dir", str(tmp_path), "--run-name", "g", "--quiet",
                      "--env.scenario-length", "6", "--ppo.autocast", "bf16", "--ppo.fused-adam"])
    out = train(cfg)
    rec = out["reports"][-1]
    assert out["update"] == 1 and rec["optimizer_steps"] == 16
    for k in ("pg_loss", "v_loss", "entropy", "approx_kl", "grad_norm"):
        assert torch.isfinite(torch.tensor(rec[k])), k
    assert rec["entropy"] == pytest.approx(4.51, abs=0.05)  # near-uniform over 91 actions at the start
    saved = json.loads((tmp_path / "g" / "config.json").read_text())
    assert saved["recipe"] == "gpu" and saved["ppo"]["autocast"] == "bf16" and saved["ppo"]["fused_adam"] is True
    ck = torch.load(out["checkpoint"], weights_only=False)
    assert not ck["optimizer"]["param_groups"][0].get("fused")


def test_bench_train_reports_the_recipe_and_levers(capsys):
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from profiling import bench_train

    torch.set_num_threads(1)
    res = bench_train.main(["--iters", "1", "--warmup", "0", "--json", "--", "--recipe", "gpu", "--device", "cpu",
                            "--num-worlds", "2", "--env.scenario-length", "4", "--ppo.num-minibatches", "2",
                            "--ppo.autocast", "bf16", "--ppo.fused-adam"])
    capsys.readouterr()
    meta = res["meta"]
    assert (meta["recipe"], meta["autocast"], meta["fused_adam"], meta["num_minibatches"]) == ("gpu", "bf16", False,
                                                                                              2)
    assert meta["update_epochs"] == 4 and meta["d_model"] == 64 and meta["worlds"] == 2
    assert res["median"]["optimizer_steps"] == 8 and res["median"]["rows_per_minibatch"] >= 1
