"""Flower's simulation runtime, tuned for many small messages: prompt delivery, fair CPU priority.

GS-WGAN sends one small message per generator step, thousands of times, and Flower's simulation
runtime hands a pushed message to the ClientApp only when its feeder thread next polls the message
store: ``add_messages_to_queue`` in ``flwr/server/superlink/fleet/vce/vce_api.py`` (Flower 1.41,
lines 168-180, started by ``run_api`` at line 223) scans every node, then sleeps with
``f_stop.wait(0.1)``. That costs 50 ms per step on average (a third of a CPU ``small`` step) and no
setting changes it. Polling faster would cost a scan of all K nodes per poll (milliseconds at
K=1000), so instead the feeder is woken when a message is pushed: it runs Flower's own loop, only its
wait returns early. Flower's 0.1 s poll stays as the fallback, so a message pushed without a wake-up
is delivered exactly as before.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from flwr.server.superlink.fleet.vce import vce_api

RAY_WORKER_NICENESS = "RAY_worker_niceness"
FEEDER_NAME = "add_messages_to_queue"
FEEDER_PARAMS = ("state", "queue", "nodes_mapping", "f_stop")


class _WakeOnPush:
    """Stands in for the runtime's stop event inside the feeder loop.

    ``is_set`` is the stop event's; ``wait`` returns as soon as a push is signalled (or after the
    feeder's own timeout). The push flag is cleared before the feeder's next scan, so a message
    pushed at any point is found by that scan or wakes the following wait: no wake-up is lost.
    """

    def __init__(self, stop: threading.Event, pushed: threading.Event) -> None:
        self._stop, self._pushed = stop, pushed

    def is_set(self) -> bool:
        return self._stop.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        if not self._stop.is_set():
            self._pushed.wait(timeout)
            self._pushed.clear()
        return self._stop.is_set()


@contextmanager
def prompt_message_delivery() -> Iterator[Callable[[], None]]:
    """For one ``run_simulation`` call, let the runtime's feeder be woken on push.

    Replaces ``vce_api.add_messages_to_queue`` (which ``run_api`` looks up when it starts the feeder
    thread) by a wrapper that runs Flower's own feeder with ``_WakeOnPush`` as its stop event, and
    restores it on exit. Yields the function to call after each push (``FlowerTransport(on_pushed=)``).
    ``tests/unit/simulations/test_flower_tuning.py`` fails if a Flower upgrade removes this hook point.
    """
    original = getattr(vce_api, FEEDER_NAME)
    pushed = threading.Event()

    def feeder(state: Any, queue: Any, nodes_mapping: Any, f_stop: threading.Event) -> None:
        original(state, queue, nodes_mapping, _WakeOnPush(f_stop, pushed))

    setattr(vce_api, FEEDER_NAME, feeder)
    try:
        yield pushed.set
    finally:
        setattr(vce_api, FEEDER_NAME, original)


def run_client_actors_at_normal_priority() -> None:
    """Start Ray's workers, which run the ClientApp, at nice 0 rather than Ray's default 15.

    Ray lowers its workers' priority (its ``worker_niceness`` setting, read from the environment
    when ``ray.init`` starts the raylet) so that they yield to Ray's own daemons; here the worker is
    where each GS-WGAN query is computed, and at nice 15 it yields to any other work on a shared
    machine, while the in-process ClientApp runs at normal priority. A value already set wins.
    """
    os.environ.setdefault(RAY_WORKER_NICENESS, "0")
