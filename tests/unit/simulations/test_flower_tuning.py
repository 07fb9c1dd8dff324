"""The simulation runtime's feeder is woken on push, and the hook it relies on still exists in Flower.

If a Flower upgrade breaks one of the first three tests, ``simulations/flower_tuning.py`` silently
stops helping (every step waits for the runtime's 0.1 s poll again): revisit it, do not delete them.
"""

import inspect
import os
import threading
import time
from queue import Queue

import pytest
from flwr.server.superlink.fleet.vce import vce_api

from server.transport import STALLED_AFTER_TIMEOUTS, FlowerTransport, SimulationStalled
from simulations.experiments.flower_tuning import (
    FEEDER_NAME,
    FEEDER_PARAMS,
    WORKER_NAME,
    WORKER_PARAMS,
    ClientAppClock,
    _Delivery,
    _undelivered,
    _WakeOnPush,
    clocked_client_apps,
    prompt_message_delivery,
)


class FakeMessage:
    def __init__(self, node: int = 1) -> None:
        self.metadata = type("Metadata", (), {"dst_node_id": node})()


class FakeState:
    """The one LinkState method the feeder calls: undelivered messages for a node."""

    def __init__(self) -> None:
        self.pending: list[FakeMessage] = []
        self.lock = threading.Lock()
        self.asked: list[int] = []

    def get_message_ins(self, node_id: int, limit: int) -> list[FakeMessage]:
        with self.lock:
            self.asked.append(node_id)
            mine = [m for m in self.pending if m.metadata.dst_node_id == node_id][:limit]
            self.pending = [m for m in self.pending if m not in mine]
        return mine


def test_flower_starts_its_feeder_through_the_module_attribute():
    feeder = getattr(vce_api, FEEDER_NAME)
    assert tuple(inspect.signature(feeder).parameters) == FEEDER_PARAMS
    # run_api resolves the name at call time, so replacing the module attribute takes effect
    assert FEEDER_NAME in vce_api.run_api.__code__.co_names


def test_flower_feeder_sleeps_on_its_stop_event():
    """Our wake-up works by standing in for ``f_stop``: the feeder must still wait on it."""

    class RecordingStop:
        def __init__(self) -> None:
            self.waits: list[float | None] = []

        def is_set(self) -> bool:
            return len(self.waits) >= 2

        def wait(self, timeout: float | None = None) -> bool:
            self.waits.append(timeout)
            return False

    stop = RecordingStop()
    getattr(vce_api, FEEDER_NAME)(FakeState(), Queue(), {1: 0}, stop)
    assert len(stop.waits) == 2 and all(t is not None and t > 0 for t in stop.waits)


def _deliver(state: FakeState, queue: Queue, notify) -> None:
    """Push one message into the store, signal it, and see the feeder hand it on."""
    message = FakeMessage(1)
    with state.lock:
        state.pending.append(message)
    notify([1])
    assert queue.get(timeout=5) is message


def test_a_push_ends_the_feeders_wait_whatever_its_timeout():
    """Deterministic form of "delivered at once": a wait of a minute ends when a push is signalled
    (how fast that is in practice is bench/step_overhead.py's business, not a test's)."""
    stop, pushed = threading.Event(), threading.Event()
    waiting = threading.Thread(target=_WakeOnPush(stop, pushed).wait, args=(60.0,))
    waiting.start()
    pushed.set()
    waiting.join(timeout=10)
    assert not waiting.is_alive()
    assert not pushed.is_set()  # consumed, so the next wait sleeps until the next push


def test_the_wrapped_feeder_delivers_and_the_original_is_restored():
    original = getattr(vce_api, FEEDER_NAME)
    state, queue, stop = FakeState(), Queue(), threading.Event()
    with prompt_message_delivery() as notify:
        feeder = threading.Thread(target=getattr(vce_api, FEEDER_NAME), args=(state, queue, {1: 0}, stop))
        feeder.start()
        for _ in range(3):
            _deliver(state, queue, notify)
        stop.set()
        feeder.join(timeout=5)
    assert not feeder.is_alive()
    assert getattr(vce_api, FEEDER_NAME) is original


def test_a_woken_pass_asks_only_the_nodes_pushed_to_and_a_timed_out_one_asks_all():
    """K = 3,400 nodes with every message in flight made each full pass cost K x M store checks."""
    queue: Queue = Queue()
    delivery = _Delivery({n: n for n in range(1, 1001)}, queue)
    assert len(delivery.keys()) == 1000  # the first pass is a full one
    delivery.pushed([7, 9])
    assert sorted(delivery.keys()) == [7, 9]
    delivery.put(FakeMessage(7))
    assert delivery.keys() == [9] and queue.get_nowait().metadata.dst_node_id == 7
    stop, pushed = threading.Event(), threading.Event()
    _WakeOnPush(stop, pushed, delivery).wait(0.01)  # nothing pushed: Flower's poll timed out
    assert len(delivery.keys()) == 1000
    pushed.set()
    _WakeOnPush(stop, pushed, delivery).wait(5.0)  # woken: the next pass is a targeted one again
    assert delivery.keys() == [9]


def test_a_timed_out_pass_asks_only_the_nodes_with_an_undelivered_message_in_the_store():
    """With a store that exposes its messages, the fallback poll reads them in one pass instead of
    asking all K nodes (each ask validates every stored message); a store that does not gets all."""

    def message(node: int, delivered_at: str = "") -> FakeMessage:
        m = FakeMessage(node)
        m.metadata.delivered_at = delivered_at
        return m

    state = type("Store", (), {})()
    state.lock = threading.RLock()
    state.message_ins_store = {"a": message(5), "b": message(8, delivered_at="2026-12-01T00:00:00"), "c": message(12)}
    delivery = _Delivery({n: n for n in range(1, 1001)}, Queue(), _undelivered(state))
    assert sorted(delivery.keys()) == [5, 12]  # 8's message went out already: it is waiting on its reply
    state.message_ins_store.clear()
    delivery.full_pass = True
    assert delivery.keys() == []
    assert _undelivered(FakeState())() is None  # no store to read: Flower's full pass
    everyone = _Delivery({n: n for n in range(1, 11)}, Queue(), _undelivered(FakeState()))
    assert len(everyone.keys()) == 10


def test_the_feeder_asks_only_pushed_nodes_once_woken():
    state, queue, stop = FakeState(), Queue(), threading.Event()
    with prompt_message_delivery() as notify:
        feeder = threading.Thread(
            target=getattr(vce_api, FEEDER_NAME), args=(state, queue, {n: n for n in range(1, 501)}, stop)
        )
        feeder.start()
        for node in (3, 4):
            message = FakeMessage(node)
            with state.lock:
                state.asked.clear()
                state.pending.append(message)
            notify([node])
            assert queue.get(timeout=5) is message
        stop.set()
        feeder.join(timeout=5)
    assert state.asked[-1] == 4 and len(state.asked) < 500


def test_unwoken_feeder_still_delivers_on_flowers_poll():
    state, queue, stop = FakeState(), Queue(), threading.Event()
    with prompt_message_delivery():
        feeder = threading.Thread(target=getattr(vce_api, FEEDER_NAME), args=(state, queue, {1: 0}, stop))
        feeder.start()
        _deliver(state, queue, lambda nodes: None)
        stop.set()
        feeder.join(timeout=5)
    assert not feeder.is_alive()


class FakeGrid:
    """push/pull as Flower's Grid; replies appear on the second pull."""

    def __init__(self, events: list[str]) -> None:
        self.events, self.pulls, self.pull_interval = events, 0, 0.0

    def push_messages(self, messages):
        self.events.append(f"push {len(messages)}")
        first = self.pushed = getattr(self, "pushed", 0)
        self.pushed += len(messages)
        return [f"id-{first + i}" for i, _ in enumerate(messages)]

    def pull_messages(self, message_ids):
        self.events.append("pull")
        self.pulls += 1
        if self.pulls < 2:
            return []
        return [
            type("Reply", (), {"metadata": type("M", (), {"reply_to_message_id": i})()})() for i in sorted(message_ids)
        ]

    def send_and_receive(self, messages, *, timeout=None):
        raise AssertionError("with on_pushed the transport pushes and pulls itself")


def test_transport_signals_between_push_and_pull():
    events: list[str] = []
    transport = FlowerTransport(FakeGrid(events), on_pushed=lambda nodes: events.append(f"wake {nodes}"))
    replies = transport._send_and_receive([FakeMessage(5), FakeMessage(6)], 5.0)
    assert [r.metadata.reply_to_message_id for r in replies] == ["id-0", "id-1"]
    assert events == ["push 2", "wake [5, 6]", "pull", "pull"]


def test_transport_keeps_at_most_max_in_flight_messages_pushed():
    events: list[str] = []
    transport = FlowerTransport(FakeGrid(events), on_pushed=lambda nodes: None, max_in_flight=2)
    replies = transport._send_and_receive([FakeMessage(n) for n in range(5)], 5.0)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == [f"id-{i}" for i in range(5)]
    assert [e for e in events if e.startswith("push")] == ["push 2", "push 2", "push 1"]


def _global_names(code) -> set[str]:
    """Names a function's code (nested comprehensions included) looks up in its module."""
    nested = [c for c in code.co_consts if inspect.iscode(c)]
    return set(code.co_names).union(*(_global_names(c) for c in nested))


def test_flower_starts_its_workers_through_the_module_attribute_and_they_call_the_backend():
    """The ClientApp clock stands in for the backend that ``run_api`` hands each worker thread."""
    worker = getattr(vce_api, WORKER_NAME)
    assert tuple(inspect.signature(worker).parameters) == WORKER_PARAMS
    assert WORKER_NAME in _global_names(vce_api.run_api.__code__)  # looked up at call time (in a comprehension)
    assert "process_message" in worker.__code__.co_names
    with clocked_client_apps() as clock:
        assert getattr(vce_api, WORKER_NAME) is not worker and isinstance(clock, ClientAppClock)
    assert getattr(vce_api, WORKER_NAME) is worker


def _reply(message_id: str):
    return type("Reply", (), {"metadata": type("M", (), {"reply_to_message_id": message_id})()})()


class OneActorGrid:
    """push/pull as Flower's Grid in front of one simulated ClientApp actor: it runs the pushed
    messages one after the other, message i for ``durations_s[i]`` seconds, clocked as the runtime's
    worker threads are (``clocked_client_apps``)."""

    def __init__(self, clock: ClientAppClock, durations_s: list[float]) -> None:
        self.clock, self.durations_s, self.pull_interval = clock, durations_s, 0.001
        self.queue: Queue = Queue()
        self.replies: dict[str, object] = {}
        self.lock = threading.Lock()
        self.pushed = 0
        threading.Thread(target=self._actor, daemon=True).start()

    def push_messages(self, messages):
        ids = []
        for message in messages:
            ids.append(f"id-{self.pushed}")
            self.queue.put((ids[-1], message))
            self.pushed += 1
        return ids

    def pull_messages(self, message_ids):
        with self.lock:
            return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]

    def _actor(self) -> None:
        while True:
            message_id, message = self.queue.get()
            self.clock.started(message_id, message.metadata.dst_node_id)
            time.sleep(self.durations_s[int(message_id[3:])])
            self.clock.finished(message_id)
            with self.lock:
                self.replies[message_id] = _reply(message_id)


def test_each_reply_deadline_runs_from_when_its_client_app_started():
    """Issue 23, item 13: the deadline bounded the whole exchange, so a client queued behind a slow one
    in the same actor timed out too. The slow one (3 timeouts long) is given up on; the one queued
    behind it starts late, answers at once, and is kept."""
    clock = ClientAppClock()
    transport = FlowerTransport(OneActorGrid(clock, [0.6, 0.0]), on_pushed=lambda nodes: None, clock=clock)
    replies = transport._send_and_receive([FakeMessage(1), FakeMessage(2)], 0.2)
    assert [r.metadata.reply_to_message_id for r in replies] == ["id-1"]


def test_an_actor_held_for_good_stops_the_exchange_with_a_clear_error():
    """Messages queued for an actor have no deadline of their own, but when nothing started or ended
    for STALLED_AFTER_TIMEOUTS reply timeouts the run stops instead of hanging, naming the node."""
    clock = ClientAppClock()
    transport = FlowerTransport(OneActorGrid(clock, [3600.0, 0.0]), on_pushed=lambda nodes: None, clock=clock)
    began = time.monotonic()
    with pytest.raises(SimulationStalled, match=r"held by node\(s\) \[7\]"):
        transport._send_and_receive([FakeMessage(7), FakeMessage(8)], 0.05)
    assert time.monotonic() - began >= STALLED_AFTER_TIMEOUTS * 0.05


def test_client_actors_run_at_normal_priority_unless_told_otherwise(monkeypatch):
    from ray._private import ray_constants

    from simulations.experiments.flower_tuning import (
        RAY_WORKER_NICENESS,
        run_client_actors_at_normal_priority,
    )

    assert ray_constants.RAY_WORKER_NICENESS == RAY_WORKER_NICENESS  # Ray still reads this variable
    monkeypatch.delenv(RAY_WORKER_NICENESS, raising=False)
    run_client_actors_at_normal_priority()
    assert os.environ[RAY_WORKER_NICENESS] == "0"
    monkeypatch.setenv(RAY_WORKER_NICENESS, "5")
    run_client_actors_at_normal_priority()
    assert os.environ[RAY_WORKER_NICENESS] == "5"
