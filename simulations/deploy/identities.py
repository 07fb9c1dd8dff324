"""Secure-aggregation identities for a Docker Compose deployment's nodes (``common/secagg/identity.py``
says what they are for): one folder per node, ``<out>/node-<i>/``, with that node's identity key
and the federation's published keys, which the TLS overlay mounts read-only at ``/app/secagg`` in
``clientapp-<i>`` and names in ``supernode-<i>``'s node config. Existing keys are kept.

    python -m simulations.deploy.identities --out deploy/certs/out/secagg --num-nodes 3 [--owner 49999]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from common.secagg.identity import identity_path, peers_path, provision

SECAGG_IN_CONTAINER = "/app/secagg"
FLOWER_UID = 49999  # the ClientApp image's user: it must read its own key
MAX_NODES = 10_000


def node_folder(out: Path, node: int) -> Path:
    """Node ``node``'s folder (1-based, as the compose services are named)."""
    return out / f"node-{node}"


def node_files(node: int) -> tuple[str, str]:
    """(identity key, published keys) as ``clientapp-<node>`` sees them: its client is node - 1."""
    inside = Path(SECAGG_IN_CONTAINER)
    return str(identity_path(inside, node - 1)), str(peers_path(inside))


def make(out: Path, num_nodes: int, *, owner: int | None = None) -> list[Path]:
    """Every node's folder: its identity and the published keys; ``owner`` (a uid) then owns them."""
    if not 1 <= num_nodes <= MAX_NODES:
        raise ValueError(f"invalid --num-nodes {num_nodes}: must be between 1 and {MAX_NODES:,}")
    folders = {i - 1: node_folder(out, i) for i in range(1, num_nodes + 1)}
    provision(folders)
    for folder in folders.values():
        for path in (folder, *folder.iterdir()):
            if owner is not None:
                os.chown(path, owner, owner)
    return list(folders.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulations.deploy.identities", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="the folder (node-<i>/ is made in it)")
    parser.add_argument("--num-nodes", type=int, required=True, help="SuperNodes (NUM_CLIENTS in .env)")
    parser.add_argument(
        "--owner", type=int, default=None, help=f"chown the files to this uid (the image's: {FLOWER_UID})"
    )
    args = parser.parse_args(argv)
    try:
        for folder in make(args.out, args.num_nodes, owner=args.owner):
            print(f"wrote {folder}")
    except (ValueError, OSError) as err:
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
