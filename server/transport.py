"""How the round loop reaches clients: through Flower's Grid, or by calling the ClientApp in-process.

Both transports build real Flower messages and count their bytes with the same function, so the
byte counts are identical; the in-process one skips Flower's runtime (used by the step-overhead
benchmark and by fast tests).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid

from common.secagg.identity import provision_simulated
from protos.wire import message_wire_bytes, runtime_message

from .strategy import Incoming, Outgoing

# A handler of several nodes' messages of one type at once: each message's reply, or its node's error.
BatchHandler = Callable[[list[Message], list[Context]], list[Message | Exception]]

# Messages of one exchange in Flower's simulation runtime at a time (see ``_send_and_receive``):
# enough to keep every client actor busy, few enough that each delivery pass stays cheap.
MAX_IN_FLIGHT = 64
# Messages queued in Flower's simulation wait for an actor without a deadline of their own; when no
# ClientApp call started or ended for this many reply timeouts, the actors are taken for hung.
STALLED_AFTER_TIMEOUTS = 10


class RuntimeClock(Protocol):
    """When Flower's simulation runtime started each ClientApp call still running
    (``simulations.experiments.flower_tuning.ClientAppClock``)."""

    def started_at(self, message_id: str) -> float | None: ...

    def last_event(self) -> float: ...

    def running(self) -> list[tuple[int, float]]: ...


class SimulationStalled(RuntimeError):
    """Every ClientApp actor of Flower's simulation is held by a call that does not return: the
    clients queued behind it can never run, so the run stops (checkpoint kept) rather than hang."""


@dataclass
class Exchange:
    """Replies of one round plus the bytes each message put on the wire."""

    replies: list[Incoming]
    bytes_down: dict[int, tuple[int, int]]  # node -> (total, envelope)
    bytes_up: dict[int, tuple[int, int]]

    def totals(self) -> tuple[int, int]:
        """(bytes down, bytes up) of the whole exchange."""
        return (sum(t for t, _ in self.bytes_down.values()), sum(t for t, _ in self.bytes_up.values()))


class FlowerTransport:
    """Messages through a Flower Grid (simulation runtime or a real SuperLink)."""

    setup_totals = (0, 0)  # nothing to set up: every message goes through Flower

    def __init__(
        self,
        grid: Grid,
        *,
        timeout_s: float = 600.0,
        wait_nodes_s: float = 120.0,
        on_pushed: Callable[[list[int]], None] | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
        clock: RuntimeClock | None = None,
    ) -> None:
        """``on_pushed`` is called after each push (the simulation runtime's wake-up, see
        ``simulations.experiments.flower_tuning``); without it, exchanges use ``grid.send_and_receive``.
        ``clock`` (with ``on_pushed``): when the simulation's ClientApp started on each message, from
        which its reply deadline runs; without it, from the push."""
        self.grid = grid
        self.timeout_s = timeout_s
        self.wait_nodes_s = wait_nodes_s
        self.on_pushed = on_pushed
        self.max_in_flight = max_in_flight
        self.clock = clock
        if hasattr(grid, "pull_interval"):
            # The in-memory grid polls for replies every 0.1 s by default; GS-WGAN exchanges
            # thousands of small messages, so poll faster.
            grid.pull_interval = 0.002

    def node_ids(self, expected: int) -> list[int]:
        """Wait until ``expected`` nodes are connected (they register asynchronously)."""
        deadline = time.monotonic() + self.wait_nodes_s
        while len(ids := sorted(self.grid.get_node_ids())) < expected:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"only {len(ids)} of {expected} nodes connected after "
                    f"{self.wait_nodes_s:.0f} s; check num_clients against the federation"
                )
            time.sleep(0.05)
        return ids

    def exchange(self, outgoing: list[Outgoing], *, timeout_s: float | None = None) -> Exchange:
        """Send, then wait for the replies up to ``timeout_s`` (default: the transport's own)."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        messages = [Message(o.content, dst_node_id=o.node_id, message_type=o.message_type) for o in outgoing]
        down = {o.node_id: _count(m) for o, m in zip(outgoing, messages, strict=False)}
        replies_by_node: dict[int, Message] = {}
        for reply in self._send_and_receive(messages, timeout_s):
            replies_by_node[reply.metadata.src_node_id] = reply
        return _collect(outgoing, replies_by_node, down, missing=f"no reply within {timeout_s:.0f} s")

    def _send_and_receive(self, messages: list[Message], timeout_s: float) -> Iterable[Message]:
        """``grid.send_and_receive``, with ``on_pushed`` called between each push and the pulls.

        At most ``max_in_flight`` messages are pushed at a time, the next ones as replies come in:
        the simulation runtime's in-memory store scans every stored message for every node on each
        delivery pass (Flower 1.41, ``InMemoryLinkState.get_message_ins``), so pushing all K messages
        of a step that asks every client (a hello, DP-MERF's collection) at once costs O(K²) per
        pass: at K = 3,400 the driver spent more CPU scanning than the clients computing.

        Each message is waited for ``timeout_s`` from when its ClientApp started (``clock``): the
        simulation runs the clients of a step one after the other in its actors, so a deadline for
        the whole exchange blamed the clients queued behind a slow one for its time.
        """
        if self.on_pushed is None:
            return self.grid.send_and_receive(messages, timeout=timeout_s)
        waiting, began = deque(messages), time.monotonic()
        replies: list[Message] = []
        pending: dict[str, float | None] = {}  # pushed message id -> when its ClientApp started (None: queued)
        while waiting or pending:
            if waiting and len(pending) < self.max_in_flight:
                batch = [waiting.popleft() for _ in range(min(len(waiting), self.max_in_flight - len(pending)))]
                pushed_at = None if self.clock is not None else time.monotonic()
                pending.update(dict.fromkeys(self.grid.push_messages(batch), pushed_at))
                self.on_pushed([m.metadata.dst_node_id for m in batch])
            pulled = list(self.grid.pull_messages(list(pending))) if pending else []
            replies += pulled
            for reply in pulled:
                pending.pop(reply.metadata.reply_to_message_id, None)
            self._give_up_overdue(pending, timeout_s)
            if waiting or None in pending.values():
                self._check_stalled(began, timeout_s)
            if pending and not pulled:
                time.sleep(getattr(self.grid, "pull_interval", 0.002))
        return replies

    def _give_up_overdue(self, pending: dict[str, float | None], timeout_s: float) -> None:
        """Note when each queued message's ClientApp started; stop waiting for those started more
        than ``timeout_s`` ago (no reply: the exchange reports them as timed out)."""
        now = time.monotonic()
        for message_id, started in list(pending.items()):
            if started is None and self.clock is not None:
                started = pending[message_id] = self.clock.started_at(message_id)
            if started is not None and now - started > timeout_s:
                del pending[message_id]

    def _check_stalled(self, began: float, timeout_s: float) -> None:
        """Messages still queued wait for an actor however long the ones before them take, unless
        nothing started or ended for ``STALLED_AFTER_TIMEOUTS`` reply timeouts: then every actor is
        held by a call that does not return, and nothing queued will ever run."""
        if self.clock is None:
            return
        quiet_s = time.monotonic() - max(began, self.clock.last_event())
        if quiet_s > STALLED_AFTER_TIMEOUTS * timeout_s:
            held = sorted({node for node, _ in self.clock.running()})
            why = (
                f"its actors are held by node(s) {held[:5]}, which the server already gave up on "
                "(a ClientApp that never returns?)"
                if held
                else "no ClientApp is running either (the runtime lost the messages?)"
            )
            raise SimulationStalled(
                f"Flower's simulation is stuck: no ClientApp call started or ended for {quiet_s:.0f} s "
                f"({STALLED_AFTER_TIMEOUTS} x the {timeout_s:g} s reply timeout) and {why}; the clients "
                "queued for an actor cannot run"
            )


class InProcessTransport:
    """Calls the ClientApp directly with one persistent Context per node (no Flower runtime).

    ``node_config`` is added to every node's own (a privacy policy, e.g. ``privacy-allow-nonprivate``);
    ``node_configs`` maps a partition id to keys for that node only."""

    setup_totals = (0, 0)  # nothing to set up: the nodes live in this process

    def __init__(
        self,
        client_app: ClientApp,
        num_nodes: int,
        run_id: int = (1 << 62) + 7,
        *,
        node_config: dict | None = None,
        node_configs: dict[int, dict] | None = None,
        batch_handlers: dict[str, BatchHandler] | None = None,
        node_state: str | Path | None = None,
        secagg_identities: bool = False,
    ) -> None:
        """``batch_handlers``: message type -> a handler of several nodes' messages at once
        (``client.app.BATCH_HANDLERS``), used when an exchange sends that type to two or more nodes.
        ``node_state``: every node's ``state-dir`` (where it keeps its state and its own ledger, as a
        real node's operator sets it), else ``FEDGAN_NODE_STATE`` decides, as for Flower's nodes.
        ``secagg_identities``: provision the nodes' secure-aggregation identities in ``node_state``
        (``common/secagg_identity.provision_simulated``), as ``fedgan simulate`` does for a secure run;
        the published keys become ``secagg_peers``, what the server checks advertised identities by."""
        self.secagg_peers: frozenset[bytes] | None = None
        if node_state is not None:
            node_config = {"state-dir": str(node_state), **(node_config or {})}
            if secagg_identities:
                self.secagg_peers = provision_simulated(node_state, num_nodes)
        from flwr.supercore.task_identity import TaskIdentity

        # Flower's Message constructor reads the task identity that its runtime normally sets.
        # Ids are 64-bit like the runtime's random ones, so envelopes have realistic sizes.
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, 1, 1
        self.app = client_app
        self.batch_handlers = batch_handlers or {}
        self.contexts = {
            (1 << 62) + i: Context(
                run_id=run_id,
                node_id=(1 << 62) + i,
                node_config={
                    "partition-id": i,
                    "num-partitions": num_nodes,
                    **(node_config or {}),
                    **(node_configs or {}).get(i, {}),
                },
                state=RecordDict(),
                run_config={},
            )
            for i in range(num_nodes)
        }

    def node_ids(self, expected: int) -> list[int]:
        return sorted(self.contexts)

    def exchange(self, outgoing: list[Outgoing], *, timeout_s: float | None = None) -> Exchange:
        """Calls each node's ClientApp in turn, or a batch handler with every node's message of its
        type at once (``timeout_s`` has nothing to bound here)."""
        down, replies, errors = {}, {}, {}
        messages = {o.node_id: runtime_message(o.content, o.node_id, o.message_type) for o in outgoing}
        by_type: dict[str, list[int]] = {}
        for o in outgoing:
            down[o.node_id] = _count(messages[o.node_id])
            by_type.setdefault(o.message_type, []).append(o.node_id)
        for message_type, nodes in by_type.items():
            handler = self.batch_handlers.get(message_type) if len(nodes) > 1 else None
            if handler is not None:
                results = handler([messages[n] for n in nodes], [self.contexts[n] for n in nodes])
            else:
                results = [self._call(messages[n], n) for n in nodes]
            for node, result in zip(nodes, results, strict=True):
                if isinstance(result, Exception):  # a broken client is a failed node, not a failed run
                    errors[node] = f"client error: {type(result).__name__}: {str(result)[:300]}"
                else:
                    replies[node] = result
        return _collect(outgoing, replies, down, missing=errors)

    def _call(self, message: Message, node: int) -> Message | Exception:
        try:
            return self.app(message, self.contexts[node])
        except Exception as err:  # noqa: BLE001 - reported as this node's failure
            return err


def _count(message: Message) -> tuple[int, int]:
    wire = message_wire_bytes(message)
    return wire.total, wire.envelope


def _collect(
    outgoing: list[Outgoing],
    replies: dict[int, Message],
    down: dict[int, tuple[int, int]],
    *,
    missing: str | dict[int, str] = "no reply",
) -> Exchange:
    """Replies (or why there is none: ``missing``, one reason for all or per node) and their bytes."""
    incoming, up = [], {}
    for o in outgoing:
        reply = replies.get(o.node_id)
        if reply is None:
            why = missing if isinstance(missing, str) else missing.get(o.node_id, "no reply")
            incoming.append(Incoming(o.node_id, None, why))
            continue
        if reply.has_error():  # an error reply has no content to count: checked first
            incoming.append(Incoming(o.node_id, None, f"client error: {str(reply.error.reason)[:300]}"))
            continue
        up[o.node_id] = _count(reply)
        incoming.append(Incoming(o.node_id, reply.content))
    return Exchange(incoming, down, up)
