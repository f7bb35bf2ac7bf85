#!/usr/bin/env bash
set -euo pipefail
cd /work/main
source .venv/bin/activate
export OMP_NUM_THREADS=1
B=/tmp/b3
bash .ci/slurm-up --nodes 2
uptime
MASTER_PORT=29731 srun -N1 -n2 -c1 python benchmarks/bench_comm.py --out $B/intra.json --overlap
uptime
MASTER_PORT=29733 srun -N2 -n4 -c1 python benchmarks/bench_comm.py --out $B/four.json
uptime
MASTER_PORT=29732 srun -N1 -n1 -c1 --kill-on-bad-exit=1 scaleladder run --spec vit-debug-wide/single/fp32/pre-lag/n1/b1 \
    --steps 14 --warmup 4 --device cpu --data synthetic --out $B/recs/vit-debug-wide_single_fp32_pre-lag_n1_b1.h5
python benchmarks/steptime_two_nodes.py --bench $B --records $B/recs --links-yaml --write-calibration $B/cpu_wide.json > $B/prediction.txt
date -u; cat $B/prediction.txt
port=29741
for s in ddp fsdp-full fsdp-hybrid2; do
  for n in 1 2; do
    port=$((port+1)); uptime
    MASTER_PORT=$port srun -N$n -n$((2*n)) -c1 --kill-on-bad-exit=1 scaleladder run --spec vit-debug-wide/$s/fp32/pre-lag/n$n/b1 \
      --steps 14 --warmup 4 --device cpu --data synthetic --out $B/recs/vit-debug-wide_${s}_fp32_pre-lag_n${n}_b1.h5
  done
done
uptime; date -u
python benchmarks/steptime_two_nodes.py --bench $B --records $B/recs > $B/table.txt
cat $B/table.txt
