#!/usr/bin/env bash
# render.sh TREE FIXED OUT: every output a refactor must keep, made by TREE's code from the fixed
# rung files (make_fixed.sh): aggregate, plots, convergence and planner charts, report, compare,
# the ladder's attributes; models, plan; every profile's dry run and budget. ~1.5 min.
set -uo pipefail
tree=$(cd "$1" && pwd); fixed=$(cd "$2" && pwd); out=$(realpath -m "$3")
venv=${VENV:-$(cd "$(dirname "$0")/../.." && pwd)/.venv}
rm -rf "$out"; mkdir -p "$out"
export PYTHONPATH=$tree/src PATH=$venv/bin:$PATH OMP_NUM_THREADS=1 HDF5_USE_FILE_LOCKING=FALSE MPLBACKEND=Agg
w=$out/work; mkdir -p "$w"; cp -r "$fixed/results" "$w/"
cd "$w"
files=$(cd "$w" && find results/rungs results/predicted -name "*.h5" | sort)
prov=$(cat $fixed/provenance.arg)
run() { local name=$1; shift; { echo "\$ $*"; "$@"; echo "rc=$?"; } > "$out/$name.txt" 2>&1; }
run aggregate bash -c "scaleladder aggregate --out results/ladder.h5 --provenance $prov $(echo $files)"
run plots scaleladder plots --ladder results/ladder.h5 --out-dir results/plots
run convplots scaleladder converge-plots --out-dir results/plots $(find results/converge/rungs -name "*.h5" | sort)
run planfits scaleladder plan --fits-chart results/plots/fits.png --device mi250x-gcd --nodes 1 --gpus-per-node 8
run planvs scaleladder plan --vs-measured results/plots/vs.png --device mi250x-gcd --ladder results/ladder.h5
run report scaleladder report --ladder results/ladder.h5 --plots results/plots --html results/report.html --md results/report.md --converge $(find results/converge/rungs -name "*.h5" | sort)
run compare scaleladder compare results/ladder.h5 results/ladder.h5
clean=$(echo "$files" | grep -v "/b2.h5")
run agg-clean bash -c "scaleladder aggregate --out results/clean.h5 $(echo $clean)"
run agg-less bash -c "scaleladder aggregate --out results/less.h5 $(echo "$clean" | grep -v "flava-debug/ddp\|r1.h5")"
run compare-clean scaleladder compare results/less.h5 results/clean.h5
run compare-fig scaleladder compare --figure results/plots/compare.png results/less.h5 results/clean.h5
run ls python -c "import h5py,sys
def show(n,o):
    print(n, sorted((k, str(v)) for k,v in o.attrs.items() if k not in ('created_utc','aggregated_utc')))
with h5py.File('results/ladder.h5') as f: f.visititems(show); print(sorted(f.attrs.keys()))"
# the seed-shaped synthetic ladder
mkdir -p seed && cp -r $fixed/seed/results seed/
(cd seed && run seed-aggregate bash -c "scaleladder aggregate --out results/ladder.h5 $(cd seed 2>/dev/null; find results/rungs -name '*.h5' | sort | tr '\n' ' ')" \
  && run seed-plots scaleladder plots --ladder results/ladder.h5 --out-dir results/plots \
  && run seed-report scaleladder report --ladder results/ladder.h5 --plots results/plots --html results/report.html --md results/report.md \
  && run seed-compare scaleladder compare results/ladder.h5 "$w/results/ladder.h5")
cp -r results/plots "$out/plots"; cp results/report.md results/report.html "$out/"
cp -r seed/results/plots "$out/seed-plots"; cp seed/results/report.md "$out/seed-report.md"; cp seed/results/report.html "$out/seed-report.html"
run models scaleladder models
run fits scaleladder plan --fits-table --device mi250x-gcd --nodes 2 --gpus-per-node 8
run planspec scaleladder plan --spec flava-10b/fsdp-full-ac/bf16-mixed/pre-lag/n2/b16 --device a100-80gb
# dry runs of every profile, from a copy of the tree's workflow
wf=$out/wf; mkdir -p "$wf"; cp -r "$tree"/{Snakefile,workflow,config,profiles} "$wf/"
for p in local slurm-localhost frontier a100; do
  (cd "$wf" && SCALELADDER_SLURM_ACCOUNT=abc123 snakemake --profile "profiles/$p" -n -p > "$out/dry-$p.txt" 2>&1; echo "rc=$?" >> "$out/dry-$p.txt")
  (cd "$wf" && SCALELADDER_SLURM_ACCOUNT=abc123 scaleladder budget --profile "$p" > "$out/budget-$p.txt" 2>&1; echo "rc=$?" >> "$out/budget-$p.txt")
done
