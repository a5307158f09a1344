#!/usr/bin/env bash
# The GPU figures of docs/training.md, docs/benchmarks.md and docs/trial.md in one device call
# (about 9 minutes on one H100; DEADLINE seconds in all, default 545):
#   1. trainer throughput of the GPU recipe and its levers, each run alone on the GPU
#      (profiling/recipe_sweep.py: real train/run.py runs, medians of agent-steps/s and the
#      rollout/update split);
#   2. one PPO update at 4096 worlds under torch.profiler (the ops that cost the time);
#   3. at once on the GPU: three seeds of the generalising driver (train split, goal resampling,
#      periodic evaluation on the held-out split), the memory probe on the memory task, and the
#      test suite on CUDA.
# Usage (repository root, on a CUDA machine):
#   OUT=/tmp/out TRAIN=path/to/train HELD=path/to/held_out bash profiling/gpu_results.sh
# TRAIN / HELD: the splits (python train/splits.py train|held_out --data WOMD_DIR --link DIR; copies,
# not links, when the folder travels to another machine). Wheels the machine lacks may be put in .whl/.
# Writes under $OUT: device.txt, sweep.txt/.json, profile.txt, pytest.log, the runs' checkpoints
# (drv_s1.pt ..., memory_probe.pt) and runs.tgz (metrics, configs and periodic evaluations).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_results}; TRAIN=${TRAIN:-.gpudata/train}; HELD=${HELD:-.gpudata/held_out}
SWEEP_S=${SWEEP_S:-100}; DEADLINE=${DEADLINE:-545}; DRIVER_STEPS=${DRIVER_STEPS:-50000000}; PROBE_STEPS=${PROBE_STEPS:-60000000}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "editable install failed (running from the tree)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"

el "1. throughput sweep"
python3 profiling/recipe_sweep.py --iters 5 --skip 2 --timeout "$SWEEP_S" --log-dir /tmp/sweep --json "$OUT/sweep.json" \
  --setting gpu_recipe= \
  --setting w2048="--num-worlds 2048" \
  --setting w4096="--num-worlds 4096" \
  --setting w4096_bf16_fused="--num-worlds 4096 --ppo.autocast bf16 --ppo.fused-adam" \
  --setting w4096_mb2="--num-worlds 4096 --ppo.num-minibatches 2" \
  -- --data "$TRAIN" --device cuda --num-threads 4 >"$OUT/sweep.txt" 2>"$OUT/sweep.log"
cat "$OUT/sweep.txt"
if ! grep -q "^gpu_recipe .*[0-9]" "$OUT/sweep.txt"; then
  el "the GPU recipe's run failed: stopping here (see sweep.log)"; tail -n 30 "$OUT/sweep.log"; exit 1
fi

el "2. one update at 4096 worlds under the profiler"
timeout 90 python3 profiling/bench_train.py --iters 0 --warmup 1 --profile-update 25 -- \
  --data "$TRAIN" --device cuda --num-worlds 4096 --num-threads 4 >"$OUT/profile.txt" 2>&1
grep -A 30 "one PPO update" "$OUT/profile.txt" | cut -c1-200 | head -34

TRAIN_S=$(( DEADLINE - ($(date +%s) - T0) - 25 )); [ "$TRAIN_S" -lt 120 ] && TRAIN_S=120
el "3. drivers, memory probe and tests, at once, for at most $TRAIN_S s"
rm -rf runs/drv_s* runs/memory_probe_gpu
for s in 1 2 3; do
  timeout "$TRAIN_S" python3 train/run.py --data "$TRAIN" --device cuda --env.goal-resample --num-worlds 1024 \
    --total-timesteps "$DRIVER_STEPS" --checkpoint-interval 10 --eval-interval 10 --eval-data "$HELD" \
    --num-threads 2 --seed $s --run-name drv_s$s >"/tmp/drv_s$s.log" 2>&1 &
done
timeout "$TRAIN_S" python3 train/run.py --data "$TRAIN" --device cuda --env.goal-behavior trial --env.k-trials 2 \
  --env.goal-candidates 2 --num-worlds 1024 --total-timesteps "$PROBE_STEPS" --checkpoint-interval 10 --num-threads 2 \
  --seed 1 --run-name memory_probe_gpu >/tmp/memory_probe_gpu.log 2>&1 &
OMP_NUM_THREADS=1 timeout "$TRAIN_S" python3 -m pytest -q -n 6 -p no:cacheprovider --timeout 200 \
  >"$OUT/pytest.log" 2>&1 &
wait
el "tests: $(tail -n 1 "$OUT/pytest.log")"
for r in drv_s1 drv_s2 drv_s3 memory_probe_gpu; do
  cp "runs/$r/checkpoint.pt" "$OUT/$r.pt" 2>/dev/null || echo "$r: no checkpoint"
  echo "$r: $(tail -n 1 "runs/$r/metrics.jsonl" 2>/dev/null | cut -c1-400)"
done
cp /tmp/drv_s*.log /tmp/memory_probe_gpu.log runs/ 2>/dev/null
tar czf "$OUT/runs.tgz" runs/*.log runs/*/metrics.jsonl runs/*/config.json /tmp/sweep/*/metrics.jsonl 2>/dev/null
ls -la "$OUT"
el "done"
