"""The data plane, server side: per-step messages over one gRPC stream per node, Flower as control plane.

Flower 1.41 starts a ClientApp process per message (seconds each), so in a deployment the ServerApp
opens its own gRPC server and asks every node, with ONE Flower message (``query.dataplane``), to
start a persistent worker that dials back with a per-run, per-node token (HMAC of a secret that
never leaves this process with the run and node ids; it travels inside Flower's message, over TLS
when the deployment uses it, and back in the stream's call metadata, checked before the stream
takes a thread). From then on every message of the round loop (hello, steps, ledgers)
goes over the stream; the contents are the same Flower RecordDicts and their bytes are counted with
the same function, so byte counts and ledgers equal the Flower path's.

Workers never outlive the run: ``close()`` sends a shutdown; if this process dies, their stream
closes; if it hangs, their idle watchdog fires (the server pings every few seconds); and a run
stopped with ``flwr stop`` is noticed by polling the Grid, which ends the run here and so the streams.
"""

from __future__ import annotations

import secrets
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
from flwr.app import Error, Message
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as RecordDictProto

from common.io.codec import PayloadError
from common.io.net import MAX_GRPC_MESSAGE, is_loopback
from common.messages import DATAPLANE, DataplaneReply, DataplaneStart
from protos import dataplane_pb2 as pb
from protos import dataplane_pb2_grpc as pb_grpc
from protos import wire
from protos.wire import runtime_message

from .dataplane_stream import (  # the server's streams; re-exported, they are the data plane's names
    MAX_HELLO_BYTES,
    MAX_REPLY_BYTES,
    MAX_REPLY_FRAGMENTS,
    MAX_WORKER_MESSAGE,
    DataPlaneError,
    DataPlaneServicer,
    Session,
    _Gate,
    node_token,
)
from .session import HELLO_TIMEOUT_S
from .strategy import Outgoing
from .transport import Exchange, FlowerTransport, _collect, _count


@dataclass(frozen=True)
class DataPlaneSettings:
    bind: str = "127.0.0.1"
    port: int = 0
    address: str = ""  # advertised host; empty: the bind address (127.0.0.1 when binding 0.0.0.0)
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    private_network: bool = False  # plaintext beyond loopback allowed: the operator vouches for the network
    idle_s: float = 300.0
    connect_timeout_s: float = 300.0
    reply_timeout_s: float = 300.0


def settings_from(cfg) -> DataPlaneSettings:
    """The data-plane settings of an ExperimentConfig."""
    return DataPlaneSettings(
        bind=cfg.dataplane_bind,
        port=cfg.dataplane_port,
        address=cfg.dataplane_address,
        tls_cert=cfg.dataplane_tls_cert,
        tls_key=cfg.dataplane_tls_key,
        tls_ca=cfg.dataplane_tls_ca,
        private_network=cfg.dataplane_private_network,
        idle_s=cfg.dataplane_idle_s,
        # workers start a process and import torch before they dial: a start-up wait, not a reply's
        connect_timeout_s=max(cfg.reply_timeout_s, HELLO_TIMEOUT_S),
        reply_timeout_s=cfg.reply_timeout_s,
    )


class GrpcTransport:
    """The round loop's transport for deployments: Flower for membership and the kick-off message,
    the gRPC stream for everything else."""

    def __init__(self, control: FlowerTransport, run_id: int, settings: DataPlaneSettings) -> None:
        self.control, self.run_id, self.settings = control, run_id, settings
        self.secret = secrets.token_bytes(32)
        self.servicer: DataPlaneServicer | None = None
        self.server: grpc.Server | None = None
        self.setup_totals = (0, 0)
        self.worker_pids: dict[int, int] = {}
        self.server_port = 0
        self._seq = 0
        self._stopped = threading.Event()
        self._closing = threading.Event()

    # ---- start ----------------------------------------------------------------------------------
    def node_ids(self, expected: int) -> list[int]:
        nodes = self.control.node_ids(expected)
        self._start(nodes)
        return nodes

    def _start(self, nodes: list[int]) -> None:
        s = self.settings
        host = s.address or ("127.0.0.1" if s.bind in ("0.0.0.0", "::") else s.bind)
        if not s.tls_cert and not s.private_network and not (is_loopback(host) and is_loopback(s.bind)):
            raise DataPlaneError(
                f"the data plane would be reachable beyond loopback ({s.bind}, advertised as "
                f"{host}) without TLS: set dataplane-tls-cert/-key/-ca (or, on a network only the "
                "deployment can reach, dataplane-private-network=true)"
            )
        self.servicer = DataPlaneServicer(self.run_id, self.secret, set(nodes))
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=len(nodes) + 8),
            interceptors=[_Gate(self.servicer)],
            options=[
                ("grpc.max_send_message_length", MAX_GRPC_MESSAGE),
                ("grpc.max_receive_message_length", MAX_WORKER_MESSAGE),
            ],
        )
        pb_grpc.add_DataPlaneServicer_to_server(self.servicer, self.server)
        target = f"{s.bind}:{s.port}"
        if s.tls_cert:
            creds = grpc.ssl_server_credentials([(Path(s.tls_key).read_bytes(), Path(s.tls_cert).read_bytes())])
            port = self.server.add_secure_port(target, creds)
        else:
            port = self.server.add_insecure_port(target)
        self.server.start()
        self.server_port = port
        ca = Path(s.tls_ca).read_text() if s.tls_ca else ""
        kickoff = [
            Outgoing(
                n,
                DATAPLANE,
                wire.encode(
                    DataplaneStart(
                        address=f"{host}:{port}",
                        token=node_token(self.secret, self.run_id, n),
                        run_id=self.run_id,
                        ca=ca,
                        idle_s=float(s.idle_s),
                    )
                ),
            )
            for n in nodes
        ]
        exchange = self.control.exchange(kickoff, timeout_s=s.connect_timeout_s)  # start-up: nodes start a process
        self.setup_totals = exchange.totals()
        self.worker_pids = {r.node_id: _pid(r.content) for r in exchange.replies if r.content is not None}
        failed = [f"node {r.node_id}: {r.error}" for r in exchange.replies if r.content is None]
        if failed:
            raise DataPlaneError("nodes could not start their data-plane worker: " + "; ".join(failed))
        self._wait_connected(nodes)
        self._log_peers(host, port)
        threading.Thread(target=self._keepalive, name="dataplane-keepalive", daemon=True).start()

    def _wait_connected(self, nodes: list[int]) -> None:
        deadline = time.monotonic() + self.settings.connect_timeout_s
        with self.servicer.connected:
            while missing := [n for n in nodes if n not in self.servicer.sessions]:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DataPlaneError(
                        f"{len(missing)} of {len(nodes)} data-plane workers did not connect "
                        f"within {self.settings.connect_timeout_s:.0f} s (nodes {missing[:5]})"
                    )
                self.servicer.connected.wait(timeout=left)

    def _log_peers(self, host: str, port: int) -> None:
        """One line per worker in the ServerApp's log (``flwr log``): where its stream came from, so
        an operator (and the cross-host test) sees the data plane cross hosts, or stay on loopback."""
        security = "TLS" if self.settings.tls_cert else "plaintext"
        for node, session in sorted(self.servicer.sessions.items()):
            print(f"data plane: node {node} connected from {session.peer} to {host}:{port} ({security})", flush=True)

    def _keepalive(self) -> None:
        """Ping the workers (their idle watchdog) and poll the Grid: `flwr stop` ends the run here."""
        interval = max(0.5, min(5.0, self.settings.idle_s / 3))
        while not self._closing.wait(interval):
            for session in list(self.servicer.sessions.values()):
                session.outbox.put(pb.ServerMessage(ping=pb.Ping(seq=0)))
            grid = getattr(self.control, "grid", None)  # the in-process control (tests) has none
            try:
                if grid is not None:
                    grid.get_node_ids()
            except Exception:  # noqa: BLE001 - the run is no longer running (stopped) or the link is gone
                self._stopped.set()
                return

    # ---- messages -------------------------------------------------------------------------------
    def exchange(self, outgoing: list[Outgoing], *, timeout_s: float | None = None) -> Exchange:
        if self._stopped.is_set():
            raise DataPlaneError("the run was stopped (flwr stop) or the SuperLink is gone")
        sent: dict[int, tuple[int, Message, Session | None]] = {}
        down = {}
        for o in outgoing:
            message = runtime_message(o.content, o.node_id, o.message_type)
            down[o.node_id] = _count(message)
            self._seq += 1
            session = self.servicer.sessions.get(o.node_id)
            if session is not None and not session.closed.is_set():
                session.expect(self._seq)
                session.outbox.put(
                    pb.ServerMessage(
                        request=pb.Envelope(
                            seq=self._seq,
                            message_type=o.message_type,
                            content=recorddict_to_proto(o.content).SerializeToString(),
                        )
                    )
                )
            sent[o.node_id] = (self._seq, message, session)
        return self._collect(outgoing, sent, down, self.settings.reply_timeout_s if timeout_s is None else timeout_s)

    def _collect(self, outgoing: list[Outgoing], sent, down, timeout_s: float) -> Exchange:
        """The replies as Flower messages (so they are counted like the Flower path's), then the
        transports' shared ``_collect``."""
        deadline = time.monotonic() + timeout_s
        replies, missing = {}, {}
        for o in outgoing:
            seq, request, session = sent[o.node_id]
            envelope, why = self._await(session, seq, deadline, timeout_s)
            if envelope is None:
                missing[o.node_id] = why
            elif envelope.error:
                replies[o.node_id] = Message(Error(code=0, reason=envelope.error), reply_to=request)
            else:
                proto = RecordDictProto()
                proto.ParseFromString(envelope.content)
                replies[o.node_id] = Message(recorddict_from_proto(proto), reply_to=request)
        return _collect(outgoing, replies, down, missing=missing)

    def _await(
        self, session: Session | None, seq: int, deadline: float, timeout_s: float
    ) -> tuple[pb.Envelope | None, str]:
        if session is None:
            return None, "no data-plane worker connected for this node"
        with session.changed:
            while seq not in session.replies:
                if session.closed.is_set():
                    return None, "the node's data-plane stream closed (worker or node gone)"
                left = deadline - time.monotonic()
                if left <= 0:
                    session.forget(seq)  # a late reply is not wanted any more
                    return None, f"no reply within {timeout_s:.0f} s"
                session.changed.wait(timeout=min(left, 1.0))
            return session.replies.pop(seq), ""

    # ---- stop -----------------------------------------------------------------------------------
    def close(self, reason: str = "run finished") -> None:
        """Tell every worker to exit, then stop the server (streams still open are cancelled)."""
        self._closing.set()
        if self.servicer is not None:
            for session in self.servicer.sessions.values():
                session.outbox.put(pb.ServerMessage(shutdown=pb.Shutdown(reason=reason)))
                session.outbox.put(None)
        if self.server is not None:
            self.server.stop(grace=2.0).wait(5.0)


def _pid(content) -> int:
    """The worker's pid a kick-off reply names (-1: "already running", or a reply without one)."""
    try:
        reply = wire.decode(DataplaneReply, content)
    except PayloadError:
        return -1
    return -1 if reply.pid is None else reply.pid


__all__ = [
    "MAX_HELLO_BYTES",
    "MAX_REPLY_BYTES",
    "MAX_REPLY_FRAGMENTS",
    "MAX_WORKER_MESSAGE",
    "DataPlaneError",
    "DataPlaneSettings",
    "GrpcTransport",
    "Session",
    "node_token",
    "settings_from",
]
