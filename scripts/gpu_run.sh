#!/usr/bin/env bash
# Run on the lent GPU machine, in the repo root, after scripts/gpu_bundle.sh built .gpu here:
#
#     device run, carry [".gpu"]:  bash scripts/gpu_run.sh [step|paper|frontier]
#
# Installs the carried wheels into /tmp/site (the image's PyTorch stays), then:
#   step     (default) bench/gpu_step.py --device cuda: ms per GS-WGAN step at the paper's networks,
#            and bench/stacked_clients.py: m clients per step, stacked vs one by one
#   paper    a paper-scale GS-WGAN run on Fashion-MNIST (K = 1,000, --target-epsilon 10) that
#            checkpoints and resumes across calls (10 minutes each): call again until it is done
#   frontier bench/frontier.py --scale paper --device cuda (many calls' worth; use --reuse)
# Everything written under $OUT comes back; checkpoints stay in runs/ on the machine only while it is warm.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD FEDGAN_DATA=$PWD/.gpu/data PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/fedgan-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/nvidia-smi.csv"
case "${1:-step}" in
  step)
    python3 bench/gpu_step.py --device cuda --model paper --out "$OUT/gpu_step-cuda-paper.json"
    python3 bench/gpu_step.py --device cuda --model paper --critic-fakes query --out "$OUT/gpu_step-cuda-paper-query.json"
    python3 bench/stacked_clients.py --device cuda --model paper --m 1,8,32 --clients 64 \
      --out "$OUT/stacked_clients-cuda-paper.json"
    ;;
  paper)
    RUN=runs/paper-gswgan
    if [ -f "$RUN/checkpoint.pt" ]; then
      timeout 560 python3 -m simulations.cli simulate --resume "$RUN" --no-progress || true
    else
      timeout 560 python3 -m simulations.cli simulate --transport inprocess --device cuda --model paper \
        --dataset fashion-mnist --partition iid --num-clients 1000 --steps 20000 --warmup-steps 2000 \
        --target-epsilon 10 --no-eval-inception --eval-fid-samples 10000 --checkpoint-every 500 \
        --no-progress --out "$RUN" || true
    fi
    cp "$RUN"/{progress.json,summary.json,eval.json,privacy.json} "$OUT/" 2>/dev/null || true
    ls "$RUN"/samples | tail -1 | xargs -I{} cp "$RUN/samples/{}" "$OUT/"
    ;;
  frontier)
    timeout 580 python3 bench/frontier.py --scale paper --device cuda --no-inception --reuse --jobs 1 --out "$OUT" || true
    ;;
  *) echo "usage: gpu_run.sh [step|paper|frontier]" >&2; exit 2 ;;
esac
