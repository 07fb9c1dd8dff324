"""Silence exactly two Flower notices a `fedgan simulate` run cannot act on, and nothing else.

- "DEPRECATED FEATURE: The `run_simulation` function ...": printed twice per run. fedgan drives
  Flower's simulation runtime from its own CLI so that the configuration is resolved (and bad input
  refused) before Flower starts; `flwr run` remains available (docs/deployment/local.md, "Flower's own CLI").
- "Manually terminating ClientAppActor": printed by every Ray actor at a normal shutdown.

A logging filter on Flower's logger, installed in the server process (``_quiet_flower``) and in each
client process (imported with the ClientApp); every other Flower warning still shows.
"""

from __future__ import annotations

import logging

NOTICES = ("DEPRECATED FEATURE: The `run_simulation` function", "Manually terminating ClientAppActor")


class DropKnownNotices(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot format is not ours to judge
            return True
        return not any(notice in message for notice in NOTICES)


def quiet_known_notices() -> None:
    """Install the filter on Flower's logger (once per process)."""
    logger = logging.getLogger("flwr")
    if not any(isinstance(f, DropKnownNotices) for f in logger.filters):
        logger.addFilter(DropKnownNotices())
