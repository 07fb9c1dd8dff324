#!/usr/bin/env bash
# Run on the lent GPU machine, in the repo root, after scripts/gpu_bundle.sh built .gpu here:
#
#     device run, carry [".gpu"]:  bash scripts/gpu_run.sh [step|paper|frontier]
#
# Installs the carried wheels into /tmp/site (the image's PyTorch stays), then:
#   step     (default) the CUDA-graph tests, bench/gpu_step.py --device cuda: ms per GS-WGAN step at
#            the paper's networks, eager vs CUDA graphs, and bench/stacked_clients.py: m clients per
#            step, stacked vs one by one (SKIP_STACKED=1 leaves it out)
#   paper    a paper-scale GS-WGAN run on Fashion-MNIST (K = 1,000, --target-epsilon 10) that
#            checkpoints and resumes across calls (10 minutes each; PAPER_LIMIT_S caps one call's
#            training, default 560 s): call again until it is done
#   ceiling  DP-MERF's pooled noiseless fit under the whole dpimagebench-cpu protocol, 4 configurations
#   frontier bench/frontier.py --scale paper --device cuda (many calls' worth; use --reuse)
#   column   issue 26's protocol column: every method at ε 1, 10 and ∞ trained with --protocol-holdout
#            and evaluated under dpimagebench-cpu (no Inception FID: its weights exceed the carry),
#            the methods side by side (COLUMN="dp-merf gswgan ..." picks some; COLUMN_LIMIT_S caps each
#            method's share of the call, default 540 s; a second call while the machine is warm goes on
#            from the finished runs, --reuse); one tarball of frontier tables comes back
#   evaluate runs trained elsewhere, packed here by scripts/gpu_protocol_runs.py into runs/carry (carry it
#            too), each evaluated under $PROTOCOL (default dpimagebench-cpu), all at once; one tarball of
#            their eval.json and logs comes back for gpu_protocol_runs.py unpack
# Everything written under $OUT comes back; checkpoints stay in runs/ on the machine only while it is warm.
set -euo pipefail
cd "$(dirname "$0")/.."
# Once per machine: a second call while it is warm (or a second mode in one call) finds them installed.
if [ ! -f /tmp/site/.fedgan-wheels ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/wheels/*.whl
  touch /tmp/site/.fedgan-wheels
fi
export PYTHONPATH=/tmp/site:$PWD FEDGAN_DATA=$PWD/.gpu/data PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/fedgan-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/nvidia-smi.csv"
case "${1:-step}" in
  step)
    # The CUDA-graph critic phase against the eager one on this GPU first (skipped on CPU-only CI).
    python3 -m pytest -q -p no:cacheprovider tests/unit/common/methods/gswgan/test_critic_graph.py tests/unit/common/methods/gswgan/test_generator_graph.py 2>&1 | tee "$OUT/pytest-critic-graph.txt" || true
    python3 bench/gpu_step.py --device cuda --model paper --out "$OUT/gpu_step-cuda-paper.json"
    python3 bench/gpu_step.py --device cuda --model paper --critic-fakes query --out "$OUT/gpu_step-cuda-paper-query.json"
    if [ "${SKIP_STACKED:-0}" != 1 ]; then
      python3 bench/stacked_clients.py --device cuda --model paper --m 1,8,32 --clients 64 \
        --out "$OUT/stacked_clients-cuda-paper.json"
    fi
    ;;
  paper)
    RUN=runs/paper-gswgan
    if [ -f "$RUN/checkpoint.pt" ]; then
      timeout "${PAPER_LIMIT_S:-560}" python3 -m simulations.cli simulate --resume "$RUN" --no-progress || true
    else
      timeout "${PAPER_LIMIT_S:-560}" python3 -m simulations.cli simulate --transport inprocess --device cuda --model paper \
        --dataset fashion-mnist --partition iid --num-clients 1000 --steps 20000 --warmup-steps 2000 \
        --target-epsilon 10 --no-eval-inception --eval-fid-samples 10000 --checkpoint-every 500 \
        --no-progress --out "$RUN" || true
    fi
    cp "$RUN"/{progress.json,summary.json,eval.json,privacy.json} "$OUT/" 2>/dev/null || true
    ls "$RUN"/samples | tail -1 | xargs -I{} cp "$RUN/samples/{}" "$OUT/"
    ;;
  ceiling)
    # DP-MERF's pooled noiseless fit (~ its ∞ point) under the whole dpimagebench-cpu protocol, four
    # configurations side by side on the one GPU (~6 minutes on an H200): bench/results/one-shot-ceiling.md.
    common="--merf-dct 0 --merf-features 3000 --merf-lengthscale 5 --partition iid --protocol-holdout"
    ceiling() {
      local name=$1 rc=0; shift
      timeout "${CEILING_LIMIT_S:-430}" python3 bench/one_shot_ceiling.py --device cuda --threads 4 \
        --protocol dpimagebench-cpu --out "$OUT/osc-$name.jsonl" -- $common "$@" > "/tmp/osc-$name.log" 2>&1 || rc=$?
      echo "== $name rc $rc"; tail -2 "/tmp/osc-$name.log"
    }
    ceiling A --steps 4000 &
    ceiling B --steps 12000 &
    ceiling C --steps 12000 --model paper &
    ceiling D --steps 12000 --merf-features 10000 &
    wait
    ;;
  frontier)
    timeout 580 python3 bench/frontier.py --scale paper --device cuda --no-inception --reuse --jobs 1 --out "$OUT" || true
    ;;
  column)
    # The settings of the protocol table (docs/frontier-protocol.md), one frontier invocation per method and privacy
    # setting (secure sums refuse σ = 0, so each ∞ point runs without them), all at once.
    merf="--merf-dct 0 --merf-features 3000 --merf-lengthscale 5 --steps 4000"
    secure="--secure-aggregation --secagg-cohort 1000"
    column() {
      local name=$1 only=$2 targets=$3 rc=0; shift 3
      timeout "${COLUMN_LIMIT_S:-540}" python3 bench/frontier.py --only "$only" --targets "$targets" --variants none --reuse \
        --levers-at 0 --jobs 1 --device cuda --no-inception --protocol dpimagebench-cpu --work "runs/column/$name" \
        --out "$OUT/column/$name" -- --protocol-holdout --eval-samples 10000 "$@" > "$OUT/column/$name.log" 2>&1 || rc=$?
      echo "== $name rc $rc"; tail -1 "$OUT/column/$name.log"
    }
    mkdir -p "$OUT/column"
    for m in ${COLUMN:-dp-merf gswgan fedavg-gan dpgan dp-ntk}; do
      case $m in
        dp-merf) column dp-merf-secure dp-merf 1,10 $merf $secure & column dp-merf-inf dp-merf inf $merf & ;;
        gswgan) column gswgan-secure gswgan 1,10 --secure-aggregation --clients-per-step 8 --steps 400 &
                column gswgan-inf gswgan inf --clients-per-step 8 --steps 400 & ;;
        fedavg-gan) column fedavg-secure fedavg-gan 1,10 --secure-aggregation & column fedavg-inf fedavg-gan inf & ;;
        dpgan) column dpgan dpgan 1,10,inf & ;;
        dp-ntk) column dp-ntk dp-ntk 1,10,inf & ;;
        *) echo "gpu_run.sh column: unknown method $m" >&2 ;;
      esac
    done
    wait
    tar -C "$OUT" -czf "$OUT/column.tar.gz" column && rm -rf "$OUT/column"
    ;;
  evaluate)
    # Each process trains its classifiers on the one GPU; its host threads share the 16 cores.
    mkdir -p "$OUT/evaluate"
    for run in runs/carry/*/; do
      name=$(basename "$run")
      ( rc=0
        OMP_NUM_THREADS=2 timeout "${EVAL_LIMIT_S:-540}" python3 -m simulations.cli evaluate "$run" \
          --protocol "${PROTOCOL:-dpimagebench-cpu}" --no-inception --no-progress > "$OUT/evaluate/$name.log" 2>&1 || rc=$?
        echo "== $name rc $rc"; tail -n 2 "$OUT/evaluate/$name.log"
        cp "$run/eval.json" "$OUT/evaluate/$name.eval.json" 2>/dev/null || true ) &
    done
    wait
    tar -C "$OUT" -czf "$OUT/evaluate.tar.gz" evaluate && rm -rf "$OUT/evaluate"
    ;;
  *) echo "usage: gpu_run.sh [step|paper|ceiling|frontier|column|evaluate]" >&2; exit 2 ;;
esac
