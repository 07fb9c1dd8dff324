#!/usr/bin/env bash
# Build the bundle a lent GPU machine needs to run fedgan: it has PyTorch (CUDA) and torchvision but
# not Flower, Opacus or pytorch-fid, and no network. Run HERE (a machine with PyPI), in the repo root:
#
#     bash scripts/gpu_bundle.sh
#
# It writes .gpu/ (git-ignored): .gpu/wheels (the wheels for the GPU machine's Python 3.12, exact
# versions from this checkout's .venv, no dependencies resolved there) and .gpu/data/fashion-mnist
# (Debian's dataset-fashion-mnist, installed here when missing). Then, with the device tool, carry
# ".gpu" and run scripts/gpu_run.sh there (see docs/gpu.md). Ray is not carried
# (too large): runs there use --transport inprocess. The Inception weights (87 MB) exceed one call's
# 64 MiB carry, so FID there is left to the domain FID unless you carry them in parts yourself.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=.gpu
# What the GPU image lacks of what `fedgan simulate --transport inprocess` imports (the image list:
# /work/.library/device/KINDS.md). protobuf and grpcio are pinned to this checkout's versions because
# flwr 1.41 needs protobuf < 7, whatever the image holds.
PACKAGES=(flwr opacus pytorch-fid grpcio grpcio-health-checking grpcio-tools protobuf iterators pycryptodome
          cryptography cffi pycparser tomli tomli-w)
mkdir -p "$OUT/wheels" "$OUT/data"
grep -qx '/.gpu/' .gitignore 2>/dev/null || echo '/.gpu/' >> .gitignore
PLATFORMS=()
for n in 28 27 17; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
for pkg in "${PACKAGES[@]}"; do
  version=$("$PY" -m pip show "$pkg" 2>/dev/null | awk '/^Version:/{print $2}')
  [ -n "$version" ] || { echo "gpu_bundle: $pkg is not installed in $PY's environment (make install first)" >&2; exit 1; }
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${PLATFORMS[@]}" -d "$OUT/wheels" "$pkg==$version"
done
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  apt-get install -y -qq dataset-fashion-mnist >/dev/null
fi
mkdir -p "$OUT/data/fashion-mnist"
cp /usr/share/datasets/fashion-mnist/*-ubyte.gz "$OUT/data/fashion-mnist/"
du -sh "$OUT" | awk '{print "gpu_bundle: " $1 " in '"$OUT"' (the device tool carries at most 64 MiB a call)"}'
