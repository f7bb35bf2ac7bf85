#!/usr/bin/env bash
# The repeat: the same six rungs again, predicted from the first quiet run's bench files and its single
# rung (copied into recs/), so the prediction is that run's and only the measurements are new.
set -euo pipefail
cd /work/main
source .venv/bin/activate
export OMP_NUM_THREADS=1
B=/tmp/b4
bash .ci/slurm-up --nodes 2
port=29761
for s in ddp fsdp-full fsdp-hybrid2; do
  for n in 1 2; do
    port=$((port+1)); uptime
    MASTER_PORT=$port srun -N$n -n$((2*n)) -c1 --kill-on-bad-exit=1 scaleladder run --spec vit-debug-wide/$s/fp32/pre-lag/n$n/b1 \
      --steps 14 --warmup 4 --device cpu --data synthetic --out $B/recs/vit-debug-wide_${s}_fp32_pre-lag_n${n}_b1.h5
  done
done
uptime; date -u
python benchmarks/steptime_two_nodes.py --bench docs/planner-two-nodes --records $B/recs > $B/table.txt
cat $B/table.txt
