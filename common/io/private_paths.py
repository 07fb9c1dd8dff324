"""Private folders say so themselves: a ``DO_NOT_PUBLISH.txt`` inside each one.

privacy.json's ``do_not_publish`` names them too, but a folder copied, archived or uploaded on its
own travels without privacy.json; the marker travels with it. Marked: a node's state directory
(``clients/`` in a simulation, each node's ``state-dir`` in a deployment: raw partition,
discriminator, ledger), and in ``fedgan deploy --local``'s ``deploy/`` the nodes' disks, their
private keys and the CA's.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CLIENT_STATE", "MARKER", "mark_private"]

MARKER = "DO_NOT_PUBLISH.txt"
CLIENT_STATE = (
    "client state: each client's raw data partition, its un-noised discriminator and optimizer state, "
    "and its privacy ledger (the record of what it released)"
)


def mark_private(folder: str | Path, holds: str) -> Path:
    """Make ``folder`` if missing and put the marker in it (an existing one is kept: one stat per
    call, and every client's hello calls this); returns the marker's path."""
    folder = Path(folder)
    marker = folder / MARKER
    if not marker.exists():
        folder.mkdir(parents=True, exist_ok=True)
        marker.write_text(
            "PRIVATE: never publish, share or upload this folder or anything in it.\n"
            f"It holds {holds}.\n"
            "What may be released: the generator (checkpoint.pt's released_generator), samples/ and the "
            "reports (see privacy.json's do_not_publish and docs/privacy.md, 'What must never be published').\n"
        )
    return marker
