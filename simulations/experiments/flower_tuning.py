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

A woken pass also scans only the nodes just pushed to (``_Delivery``): the in-memory store's
``get_message_ins`` checks every stored message for each node it is asked about, so a pass over all
K nodes with M messages in flight costs K·M checks, and a step that asks every client (a hello,
DP-MERF's collection: K = M = 3,400) spent more CPU in the feeder than the clients in their work
(12 clients/s). A pass after a wait that timed out (the fallback for a message pushed without a
wake-up) asks the nodes that have an undelivered message in the in-memory store, read off the store
itself in one cheap pass over its M messages (``_undelivered``), instead of all K: while a sum's 128
messages were in flight, each 0.1 s poll cost K·M validations, 40% of the server's CPU in DP-MERF's
collection from 1,000 clients. A store that does not expose its messages gets Flower's full pass.

Each ClientApp call is timed where the runtime makes it (``ClientAppClock``): the runtime's worker
threads, one per actor, take the next queued message as soon as an actor is free, so a message's
reply deadline (``--reply-timeout-s``) runs from then, not from the push. A client that sleeps holds
its actor; the clients queued behind it wait without being blamed for it (issue 23, item 13).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from flwr.server.superlink.fleet.vce import vce_api

RAY_WORKER_NICENESS = "RAY_worker_niceness"
FEEDER_NAME = "add_messages_to_queue"
FEEDER_PARAMS = ("state", "queue", "nodes_mapping", "f_stop")
WORKER_NAME = "worker"
WORKER_PARAMS = ("messageins_queue", "messageres_queue", "node_info_store", "backend", "f_stop", "metrics")


class _Delivery:
    """Which nodes the feeder's next pass asks for messages: after a wait that timed out (Flower's own
    poll), every node with an undelivered message in the store (every node where the store cannot
    say), else only those pushed to and not yet delivered to. Stands in for the
    feeder's ``nodes_mapping`` (it calls ``keys()`` only) and wraps its ``queue`` (``put``)."""

    def __init__(
        self, nodes_mapping: Any, queue: Any, undelivered: Callable[[], set[int] | None] = lambda: None
    ) -> None:
        self._all, self._queue, self._undelivered = nodes_mapping, queue, undelivered
        self._waiting: set[int] = set()
        self._lock = threading.Lock()
        self.full_pass = True

    def pushed(self, nodes: Iterable[int]) -> None:
        with self._lock:
            self._waiting.update(nodes)

    def keys(self) -> list[int]:
        if self.full_pass:
            self.full_pass = False
            pending = self._undelivered()  # None: the store cannot say, so every node is asked
            return list(self._all.keys()) if pending is None else [n for n in pending if n in self._all]
        with self._lock:
            return list(self._waiting)

    def put(self, message: Any) -> None:
        """The feeder hands a message on: its node has nothing more waiting (one message per node
        per exchange; a second one would be found by the next full pass)."""
        with self._lock:
            self._waiting.discard(message.metadata.dst_node_id)
        self._queue.put(message)


def _undelivered(state: Any) -> Callable[[], set[int] | None]:
    """The nodes with a message waiting in Flower's in-memory store (``InMemoryLinkState``: its
    ``message_ins_store`` and ``lock``), read without the per-message validation that
    ``get_message_ins`` repeats for every node it is asked about; None for a store without them."""
    store, lock = getattr(state, "message_ins_store", None), getattr(state, "lock", None)
    if not isinstance(store, dict) or lock is None:
        return lambda: None

    def nodes() -> set[int]:
        with lock:
            return {m.metadata.dst_node_id for m in store.values() if not m.metadata.delivered_at}

    return nodes


class _WakeOnPush:
    """Stands in for the runtime's stop event inside the feeder loop.

    ``is_set`` is the stop event's; ``wait`` returns as soon as a push is signalled (or after the
    feeder's own timeout, which makes the next pass a full one). The push flag is cleared before the
    feeder's next scan, so a message pushed at any point is found by that scan or wakes the
    following wait: no wake-up is lost.
    """

    def __init__(self, stop: threading.Event, pushed: threading.Event, delivery: _Delivery | None = None) -> None:
        self._stop, self._pushed, self._delivery = stop, pushed, delivery

    def is_set(self) -> bool:
        return self._stop.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        if not self._stop.is_set():
            woken = self._pushed.wait(timeout)
            self._pushed.clear()
            if not woken and self._delivery is not None:
                self._delivery.full_pass = True
        return self._stop.is_set()


@contextmanager
def prompt_message_delivery() -> Iterator[Callable[[Iterable[int]], None]]:
    """For one ``run_simulation`` call, let the runtime's feeder be woken on push.

    Replaces ``vce_api.add_messages_to_queue`` (which ``run_api`` looks up when it starts the feeder
    thread) by a wrapper that runs Flower's own feeder with ``_WakeOnPush`` as its stop event and
    ``_Delivery`` as its view of the nodes and its queue, and restores it on exit. Yields the
    function to call with the destination nodes after each push (``FlowerTransport(on_pushed=)``).
    ``tests/unit/simulations/test_flower_tuning.py`` fails if a Flower upgrade removes this hook point.
    """
    original = getattr(vce_api, FEEDER_NAME)
    pushed = threading.Event()
    deliveries: list[_Delivery] = []

    def feeder(state: Any, queue: Any, nodes_mapping: Any, f_stop: threading.Event) -> None:
        delivery = _Delivery(nodes_mapping, queue, _undelivered(state))
        deliveries.append(delivery)
        original(state, delivery, delivery, _WakeOnPush(f_stop, pushed, delivery))

    def on_pushed(nodes: Iterable[int]) -> None:
        nodes = list(nodes)
        for delivery in deliveries:
            delivery.pushed(nodes)
        pushed.set()

    setattr(vce_api, FEEDER_NAME, feeder)
    try:
        yield on_pushed
    finally:
        setattr(vce_api, FEEDER_NAME, original)


class ClientAppClock:
    """When the runtime started each ClientApp call still running, and when it last started or
    finished one (``server.transport.RuntimeClock``; read by the ServerApp's thread, written by the
    runtime's workers)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, tuple[int, float]] = {}  # message id -> (node, monotonic start)
        self._last_event = time.monotonic()

    def started(self, message_id: str, node: int) -> None:
        with self._lock:
            self._last_event = time.monotonic()
            self._running[message_id] = (node, self._last_event)

    def finished(self, message_id: str) -> None:
        with self._lock:
            self._last_event = time.monotonic()
            self._running.pop(message_id, None)

    def started_at(self, message_id: str) -> float | None:
        """When the ClientApp began on this message; None when it has not (queued) or has finished."""
        with self._lock:
            entry = self._running.get(message_id)
        return None if entry is None else entry[1]

    def last_event(self) -> float:
        with self._lock:
            return self._last_event

    def running(self) -> list[tuple[int, float]]:
        """(node, start) of every ClientApp call in progress."""
        with self._lock:
            return list(self._running.values())


class _TimedBackend:
    """The runtime's backend as its worker threads see it: each ``process_message`` is clocked.
    A worker calls it only when an actor is free (one worker thread per actor), so its start is when
    the ClientApp starts on the message."""

    def __init__(self, backend: Any, clock: ClientAppClock) -> None:
        self._backend, self._clock = backend, clock

    def process_message(self, message: Any, context: Any) -> Any:
        message_id = message.metadata.message_id
        self._clock.started(message_id, message.metadata.dst_node_id)
        try:
            return self._backend.process_message(message, context)
        finally:
            self._clock.finished(message_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


@contextmanager
def clocked_client_apps() -> Iterator[ClientAppClock]:
    """For one ``run_simulation`` call, time every ClientApp call (``FlowerTransport(clock=)``).

    Replaces ``vce_api.worker`` (which ``run_api`` looks up when it starts its worker threads) by a
    wrapper that runs Flower's own worker with ``_TimedBackend`` as its backend, and restores it on
    exit. ``tests/unit/simulations/test_flower_tuning.py`` fails if a Flower upgrade removes this hook.
    """
    original = getattr(vce_api, WORKER_NAME)
    clock = ClientAppClock()

    def worker(
        messageins_queue: Any, messageres_queue: Any, node_info_store: Any, backend: Any, f_stop: Any, metrics: Any
    ) -> None:
        original(messageins_queue, messageres_queue, node_info_store, _TimedBackend(backend, clock), f_stop, metrics)

    setattr(vce_api, WORKER_NAME, worker)
    try:
        yield clock
    finally:
        setattr(vce_api, WORKER_NAME, original)


def run_client_actors_at_normal_priority() -> None:
    """Start Ray's workers, which run the ClientApp, at nice 0 rather than Ray's default 15.

    Ray lowers its workers' priority (its ``worker_niceness`` setting, read from the environment
    when ``ray.init`` starts the raylet) so that they yield to Ray's own daemons; here the worker is
    where each GS-WGAN query is computed, and at nice 15 it yields to any other work on a shared
    machine, while the in-process ClientApp runs at normal priority. A value already set wins.
    """
    os.environ.setdefault(RAY_WORKER_NICENESS, "0")
