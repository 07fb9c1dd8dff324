# Stand-in for Flower's `flwr/base` image (Flower's framework/docker/base/ubuntu/Dockerfile), built
# offline for machines that cannot pull from a registry: the same layout the flwr/superlink,
# flwr/supernode and flwr/superexec images give our compose files and Dockerfile — flwr in a
# virtual environment at /python/venv (first on PATH), a non-root user `app` (uid 49999) whose home
# and working directory is /app, and the same Python environment variables. Differences: the
# Python is Debian bookworm's 3.11 (Flower builds its own), and the root filesystem is an
# `mmdebstrap` tarball imported with `docker import` (deploy/offline/build-images.sh).
ARG DEBIAN_IMAGE=fedgan-offline/debian-python:bookworm
FROM ${DEBIAN_IMAGE}

ARG FLWR_VERSION=1.41.0
# The wheel index pip reads (a local one served by build-images.sh, or PyPI's).
ARG INDEX=https://pypi.org/simple

# /etc/pip.conf names the index for every later build on this image (the project's Dockerfile
# too); nothing is installed at run time (runtime dependency installation is off).
RUN printf '[global]\nindex-url = %s\n' "${INDEX}" > /etc/pip.conf \
    && python3 -m venv /python/venv \
    && /python/venv/bin/pip install --no-cache-dir "flwr==${FLWR_VERSION}" \
    && useradd --no-create-home --home-dir /app -c "" --uid 49999 app \
    && mkdir -p /app \
    && chown -R app:app /app /python/venv

ENV PATH=/python/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONIOENCODING=UTF-8 \
    LANG=C.UTF-8 \
    LC_ALL=C.UTF-8
WORKDIR /app
USER app
ENV HOME=/app
