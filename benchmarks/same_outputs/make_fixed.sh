#!/usr/bin/env bash
# make_fixed.sh TREE FIXED: a fixed set of rung files of every kind, written by TREE's code
# (a checkout of the commit BEFORE a refactor): the local profile's ladder with small
# convergence rungs (one planted non-learner), an injected OOM, a predicted OOM, a failed
# attempt's note, a second repeat, a truncated (corrupt) rung; plus the tests' seed-shaped
# 60-rung ladder. ~8 min on a 2-core CPU. README.md says how the three scripts go together.
set -euo pipefail
tree=$(cd "$1" && pwd); fixed=$2
venv=${VENV:-$(cd "$(dirname "$0")/../.." && pwd)/.venv}
export PYTHONPATH=$tree/src PATH=$venv/bin:$PATH OMP_NUM_THREADS=1 HDF5_USE_FILE_LOCKING=FALSE
mkdir -p "$fixed/results/converge"
cd "$tree"
SCALELADDER_INJECT_NONLEARNER=bf16-mixed snakemake --profile profiles/local --config \
  'converge={"enabled": true, "strategies": ["single", "ddp"], "precisions": ["fp32", "bf16-mixed"], "steps": 50, "eval_every": 25, "target": 0.2}' \
  > "$fixed/run.log" 2>&1
L="scaleladder spawn --nproc-per-node 2 scaleladder"
r=results/rungs/vit-debug
SCALELADDER_INJECT_OOM=1:3 scaleladder launch --launcher "$L" --spec vit-debug/fsdp-grad-op/fp32/pre-lag/n1/b8 \
  --steps 6 --warmup 2 --out $r/fsdp-grad-op/fp32/pre-lag/n1/b8.h5 >> "$fixed/run.log" 2>&1
scaleladder launch --launcher "sh -c 'kill -TERM \$\$' --" --spec vit-debug/ddp/fp32/pre-lag/n1/b2 --steps 3 --warmup 1 \
  --out $r/ddp/fp32/pre-lag/n1/b2.h5 >> "$fixed/run.log" 2>&1 || true   # the failed attempt: a note, no record
scaleladder launch --launcher "$L" --spec vit-debug/ddp/fp32/pre-lag/n1/b4 --steps 12 --warmup 2 \
  --out $r/ddp/fp32/pre-lag/n1/b4.r1.h5 >> "$fixed/run.log" 2>&1
scaleladder launch --plan-only --plan-device mi250x-gcd --ranks-per-node 8 --spec vit-15b/ddp/bf16-mixed/pre-lag/n1/b32 \
  --steps 12 --warmup 2 --out results/predicted/vit-15b/ddp/bf16-mixed/pre-lag/n1/b32.h5 >> "$fixed/run.log" 2>&1
cp -r results/rungs results/predicted results/failed "$fixed/results/"
cp -r results/converge/rungs "$fixed/results/converge/"
cp $r/fsdp-full/fp32/pre-lag/n1/b4.h5 "$fixed/results/rungs/vit-debug/fsdp-full/fp32/pre-lag/n1/b2.h5"
truncate -s 5000 "$fixed/results/rungs/vit-debug/fsdp-full/fp32/pre-lag/n1/b2.h5"
grep -h "Shell command" .snakemake/log/*.log | grep "scaleladder aggregate" | tail -1 \
  | sed 's/.*--provenance //; s/ results\/rungs.*//' > "$fixed/provenance.arg"
python -c "import sys; sys.path.insert(0, 'tests'); from pathlib import Path; from conftest import seed_like_ladder
seed_like_ladder(Path(sys.argv[1]))" "$fixed/seed"
echo "make_fixed: $(find "$fixed" -name '*.h5' | wc -l) rung files in $fixed"
