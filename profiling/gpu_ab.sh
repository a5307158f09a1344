#!/usr/bin/env bash
# One short device check: the test suite on CUDA, then the env (GraphedEnv) and trainer throughput of this
# tree against a reference tree, interleaved, on the same GPU in one call (about 8 minutes on an H100/H200).
#
# Usage (repository root, on a CUDA machine; REF is a directory holding the other checkout, e.g. made with
# `git archive <commit> | tar -x -C .head`):
#   OUT=/tmp/out REF=.head bash profiling/gpu_ab.sh
# Wheels the machine lacks may be put in .whl/ (installed to /tmp/site first).
# Writes $OUT/pytest.log, $OUT/env_ab.txt, $OUT/train_ab.txt and prints a short summary last.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_ab}; REF=${REF:-.head}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "editable install failed (running from the tree)"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"

echo "== tests on CUDA"
T0=$(date +%s)
timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -n 14 -p no:cacheprovider -x --timeout 120 ${TESTS:-} >"$OUT/pytest.log" 2>&1
echo "tests rc=$? in $(( $(date +%s) - T0 )) s: $(tail -n 1 "$OUT/pytest.log")"

echo "== env A/B (GraphedEnv)"
: >"$OUT/env_ab.txt"
for round in 1 2; do
  for tree in . "$REF"; do
    (cd "$tree" && PYTHONPATH=$(pwd)${PYTHONPATH:+:$PYTHONPATH} timeout 120 python3 profiling/bench_env.py --backend triton \
      --graphed --worlds 256 1024 4096 --steps 50 --repeats 3 --json) >"$OUT/env_${round}_$(basename "$tree").json" 2>>"$OUT/env_ab.txt"
    echo "round $round tree $tree rc=$?" >>"$OUT/env_ab.txt"
  done
done

echo "== train A/B"
: >"$OUT/train_ab.txt"
# this tree runs the GPU recipe (train/recipes.py; the update levers off); round 1 also runs it with
# one lever on at a time (see the bench calls below), and with the CPU recipe (the reference tree's trainer settings)
bench() {  # bench TREE NAME ROUND [extra trainer flags...]
  local tree=$1 name=$2 round=$3; shift 3
  (cd "$tree" && PYTHONPATH=$(pwd)${PYTHONPATH:+:$PYTHONPATH} timeout 150 python3 profiling/bench_train.py --iters 3 --warmup 1 --json \
    -- --device cuda --num-worlds 1024 "$@") >"$OUT/train_${round}_${name}.json" 2>>"$OUT/train_ab.txt"
  echo "round $round $name ($tree $*) rc=$?" >>"$OUT/train_ab.txt"
}
for round in 1 2; do
  bench . gpu_recipe $round
  bench "$REF" "$(basename "$REF")" $round
  if [ $round = 1 ] && [ -z "${SKIP_LEVERS:-}" ]; then
    bench . cpu_recipe 1 --recipe cpu
    bench . bf16 1 --ppo.autocast bf16
    bench . fused_adam 1 --ppo.fused-adam
  fi
done
python3 - "$OUT" "$REF" <<'EOF'
import json, pathlib, sys
out, ref = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]).name
def load(p):
    try:
        return json.loads(p.read_text())
    except Exception:
        return None
for r in (1, 2):
    for tree in (".", ref):
        d = load(out / f"env_{r}_{tree}.json")
        if d:
            print("env", r, tree, " ".join(f"{x['worlds']}w:{x['agent_steps_per_s']/1e6:.2f}M" for x in d["results"]))
for f in sorted(out.glob("train_*.json")):
    t = load(f)
    if t and t.get("median"):
        m, meta = t["median"], t["meta"]
        print(f"train {f.stem[6:]:<16} sps {m['sps']:>10,.0f}  s/iter {m['seconds']:.3f}  ppo_update {m['ppo_update']:.3f}"
              f"  env_step {m['env_step']:.3f}  policy_rollout {m['policy_rollout']:.3f}  opt_steps {m['optimizer_steps']:.0f}"
              f"  {meta.get('recipe', '-')}/{meta.get('autocast', '-')}/fused={meta.get('fused_adam', '-')}"
              f"  peak {t.get('peak_cuda_mb', 0):.0f} MB")
EOF
