"""Render the Docker Compose deployment (``docker-compose.yml`` + ``docker-compose.tls.yml``).

Compose has no loops, and every SuperNode differs (its ``partition-id``, its state volume, its
ClientApp container), so the files for N clients are generated here and committed for the
default N. ``python -m simulations.deploy.compose --num-clients N --write`` regenerates them (and the files of
a deployment across hosts, ``compose_hosts.py``) and the ``NUM_CLIENTS`` line of ``.env``; a unit
test fails when the committed files are stale.

The text is built from templates rather than dumped from dicts so the files keep the comments
that explain each choice; the tests parse what docker-compose makes of it, so a template typo
fails there.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from . import compose_hosts
from .compose_services import (
    BASE_FILE,
    CERTS_IN_CONTAINER,
    DATAPLANE_HOST,
    DEFAULT_NUM_CLIENTS,
    ENV_FILE,
    ROOT,
    SUPERLINK_IN_COMPOSE,
    SUPERNODE_RUNTIME_PORT,
    TLS_FILE,
    TLS_SUPERLINK_COMMAND,
    node_config,
    plain_run_config,
    render_base,
    render_tls,
    tls_run_config,
)

__all__ = [
    "DEFAULT_NUM_CLIENTS",
    "ROOT",
    "BASE_FILE",
    "TLS_FILE",
    "ENV_FILE",
    "SUPERNODE_RUNTIME_PORT",
    "CERTS_IN_CONTAINER",
    "DATAPLANE_HOST",
    "SUPERLINK_IN_COMPOSE",
    "TLS_SUPERLINK_COMMAND",
    "tls_run_config",
    "plain_run_config",
    "node_config",
    "render_base",
    "render_tls",
    "rendered",
    "with_num_clients",
    "write",
]


def with_num_clients(env_text: str, num_clients: int) -> str:
    """``.env`` text with its ``NUM_CLIENTS`` line set, so `.env` names the generated N."""
    line = f"NUM_CLIENTS={num_clients}"
    if re.search(r"^NUM_CLIENTS=.*$", env_text, flags=re.M):
        return re.sub(r"^NUM_CLIENTS=.*$", line, env_text, flags=re.M)
    return env_text + ("" if env_text.endswith("\n") or not env_text else "\n") + line + "\n"


def rendered(num_clients: int) -> dict[str, str]:
    """File name -> content of every compose file: one host's two, and the two across hosts."""
    if num_clients < 1:
        raise ValueError(f"--num-clients must be at least 1, got {num_clients}")
    return {
        BASE_FILE: render_base(num_clients),
        TLS_FILE: render_tls(num_clients),
        **compose_hosts.rendered(num_clients),
    }


def write(num_clients: int, root: Path = ROOT) -> list[Path]:
    """Write every compose file and update ``.env``; returns the paths written."""
    paths = []
    for name, text in rendered(num_clients).items():
        (root / name).write_text(text)
        paths.append(root / name)
    env = root / ENV_FILE
    env.write_text(with_num_clients(env.read_text() if env.exists() else "", num_clients))
    return paths + [env]


def main(argv: list[str] | None = None) -> None:
    """Print the base file (or, with ``--write``, write both files and ``.env``)."""
    parser = argparse.ArgumentParser(
        prog="python -m simulations.deploy.compose",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--num-clients",
        type=int,
        default=DEFAULT_NUM_CLIENTS,
        help=f"SuperNodes to generate (default {DEFAULT_NUM_CLIENTS}); `flwr run` needs num-clients equal to it",
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help=f"write {BASE_FILE}, {TLS_FILE}, the files across hosts and NUM_CLIENTS in {ENV_FILE} instead of printing",
    )
    args = parser.parse_args(argv)
    if args.num_clients < 1:
        parser.error(f"--num-clients must be at least 1, got {args.num_clients}")
    if args.write:
        for path in write(args.num_clients):
            print(f"wrote {path}")
    else:
        for name, text in rendered(args.num_clients).items():
            print(f"# ---- {name}\n{text}")


if __name__ == "__main__":
    main()
