"""The data plane's gRPC server: one authenticated stream per node (``dataplane.py`` drives it).

A worker's hello (run, node, token: an HMAC of a secret that never leaves this process) travels in
the stream's call metadata and is checked by an interceptor before the stream takes a thread or has
a message read, so a stream without a valid one holds nothing. Replies come in fragments of at most
``REPLY_FRAGMENT`` bytes, joined up to ``MAX_REPLY_BYTES`` in at most ``MAX_REPLY_FRAGMENTS``; what
the server did not ask for is dropped.
"""

from __future__ import annotations

import hashlib
import hmac
import queue
import threading
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import DecodeError

from common.io.net import HELLO_METADATA_KEY, REPLY_FRAGMENT
from protos import dataplane_pb2 as pb
from protos import dataplane_pb2_grpc as pb_grpc


class DataPlaneError(RuntimeError):
    """Workers did not connect, a token was wrong, or the run was stopped from outside."""


def node_token(secret: bytes, run_id: int, node_id: int) -> str:
    """The token node ``node_id`` must present: an HMAC, so it is worthless for any other run or node."""
    return hmac.new(secret, f"{run_id}:{node_id}".encode(), hashlib.sha256).hexdigest()


@dataclass
class Session:
    """One connected worker: what to send it, and the replies it sent back by sequence number."""

    outbox: queue.Queue[pb.ServerMessage | None] = field(default_factory=queue.Queue)
    replies: dict[int, pb.Envelope] = field(default_factory=dict)
    # Sequence numbers the server asked this node and is still waiting for: a reply to anything else
    # (unsolicited, repeated) is dropped, so an authenticated worker cannot fill the server's memory.
    pending: set[int] = field(default_factory=set)
    # Fragments of replies still arriving (``more`` set), by sequence number; their number and total
    # size are bounded.
    partial: dict[int, Fragments] = field(default_factory=dict)
    closed: threading.Event = field(default_factory=threading.Event)
    changed: threading.Condition = field(default_factory=threading.Condition)
    peer: str = ""  # where the worker's stream came from, as gRPC names it ("ipv4:10.0.0.2:41234")

    def expect(self, seq: int) -> None:
        with self.changed:
            self.pending.add(seq)

    def deliver(self, envelope: pb.Envelope) -> bool:
        """Keep a reply (or a fragment of one) the server is waiting for; False (dropped) for any
        other. Only a reply in several fragments touches ``partial``: the common one-message reply
        goes straight to ``replies``."""
        with self.changed:
            if envelope.seq not in self.pending:
                return False
            if envelope.more or envelope.seq in self.partial:
                envelope = self._join(envelope)
                if envelope is None:
                    return True
            self.pending.discard(envelope.seq)
            self.replies[envelope.seq] = envelope
            self.changed.notify_all()
            return True

    def _join(self, fragment: pb.Envelope) -> pb.Envelope | None:
        """Add a fragment (under the lock): None while more are to come, else the whole reply. One
        whose fragments add up to more than MAX_REPLY_BYTES, or come in more than
        MAX_REPLY_FRAGMENTS (empty ones cost a list entry each), becomes an error reply, so the node
        is marked failed with the cause and nothing more of it is buffered."""
        joined = self.partial.setdefault(fragment.seq, Fragments())
        joined.add(fragment.content)
        refusal = joined.refusal()
        if not refusal and fragment.more:
            return None
        del self.partial[fragment.seq]
        if refusal:
            return pb.Envelope(seq=fragment.seq, message_type=fragment.message_type, error=refusal)
        return pb.Envelope(
            seq=fragment.seq, message_type=fragment.message_type, content=b"".join(joined.parts), error=fragment.error
        )

    def forget(self, seq: int) -> None:
        """The server stopped waiting for ``seq`` (timed out): a late reply is dropped, and the
        fragments of it that did arrive are freed."""
        with self.changed:
            self.pending.discard(seq)
            self.partial.pop(seq, None)

    def close(self) -> None:
        self.closed.set()
        self.outbox.put(None)
        with self.changed:
            self.changed.notify_all()


MAX_HELLO_BYTES = 4096  # a hello is a run id, a node id and a 64-character token
# gRPC has one receive limit per server, so workers send replies in fragments of at most
# REPLY_FRAGMENT (common/io/net.py) bytes and the limit stays small.
MAX_WORKER_MESSAGE = 1024 * 1024
# A whole reply, its fragments joined: the largest honest one is a paper-scale DPGAN generator
# (3.8M float32 weights, ~15 MB); only replies the server asked for are buffered.
MAX_REPLY_BYTES = 64 * 1024 * 1024
# Fragments of one reply: what a worker needs to send MAX_REPLY_BYTES (every fragment but the last is full).
MAX_REPLY_FRAGMENTS = -(-MAX_REPLY_BYTES // REPLY_FRAGMENT)
assert REPLY_FRAGMENT + 4096 < MAX_WORKER_MESSAGE  # a fragment and its envelope fit in one message


@dataclass
class Fragments:
    """The fragments of one reply so far, and their running size (never re-summed)."""

    parts: list[bytes] = field(default_factory=list)
    size: int = 0

    def add(self, content: bytes) -> None:
        self.parts.append(content)
        self.size += len(content)

    def refusal(self) -> str:
        """Why the reply is refused ("": not, so far)."""
        if self.size > MAX_REPLY_BYTES:
            return f"reply larger than {MAX_REPLY_BYTES >> 20} MiB; refused"
        if len(self.parts) > MAX_REPLY_FRAGMENTS:
            return f"reply in more than {MAX_REPLY_FRAGMENTS} fragments; refused"
        return ""


def hello_of(metadata) -> pb.Hello | None:
    """The Hello a stream's call metadata carries (``HELLO_METADATA_KEY``), or None."""
    raw = next((value for key, value in metadata or () if key == HELLO_METADATA_KEY), None)
    if not isinstance(raw, bytes) or len(raw) > MAX_HELLO_BYTES:
        return None
    try:
        return pb.Hello.FromString(raw)
    except DecodeError:
        return None


def _refuse(request_iterator, context) -> None:
    context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown node or wrong token for this run")


class _Gate(grpc.ServerInterceptor):
    """Refuses a stream whose metadata holds no valid hello before it is handed a thread.

    gRPC calls interceptors on its serving thread, with the call's metadata and before the handler
    is queued on the thread pool or any message is read; a refused stream then takes a pool thread
    only for the instant its refusal takes. So streams without the token (silent ones, garbage) can
    neither hold the threads the workers need nor make the server buffer anything (issue 23, item 16).
    """

    def __init__(self, servicer: DataPlaneServicer) -> None:
        self.servicer = servicer
        self.refused = grpc.stream_stream_rpc_method_handler(_refuse)

    def intercept_service(self, continuation, handler_call_details):
        hello = hello_of(handler_call_details.invocation_metadata)
        if hello is None or not self.servicer.authentic(hello):
            return self.refused
        return continuation(handler_call_details)


class DataPlaneServicer(pb_grpc.DataPlaneServicer):
    """Accepts one stream per expected node whose call metadata carries a hello with the right
    token, once per run; ``_Gate`` refuses every other stream before it takes a thread."""

    def __init__(self, run_id: int, secret: bytes, nodes: set[int]) -> None:
        self.run_id, self.secret, self.nodes = run_id, secret, nodes
        self.sessions: dict[int, Session] = {}
        self.connected = threading.Condition()

    def authentic(self, hello: pb.Hello) -> bool:
        """Whether ``hello`` is an expected node's, with its token for this run (compared as bytes:
        ``hmac.compare_digest`` raises on a non-ASCII str)."""
        expected = node_token(self.secret, self.run_id, hello.node_id)
        return (
            hello.run_id == self.run_id
            and hello.node_id in self.nodes
            and hmac.compare_digest(hello.token.encode(), expected.encode())
        )

    def Connect(self, request_iterator, context):  # noqa: N802 - gRPC's method name
        hello = hello_of(context.invocation_metadata())
        if hello is None or not self.authentic(hello):  # the gate let it through: checked again all the same
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown node or wrong token for this run")
        session = Session(peer=context.peer())
        with self.connected:
            if hello.node_id in self.sessions:
                # A token opens one session per run: a second stream (while the worker is connected,
                # or after it left) is refused, so a token seen once is worth nothing afterwards.
                context.abort(grpc.StatusCode.PERMISSION_DENIED, "this node's token was already used in this run")
            self.sessions[hello.node_id] = session
            self.connected.notify_all()
        threading.Thread(target=self._read, args=(request_iterator, session), daemon=True).start()
        context.add_callback(session.close)
        while (item := session.outbox.get()) is not None:
            yield item

    @staticmethod
    def _read(request_iterator, session: Session) -> None:
        try:
            for message in request_iterator:
                if message.WhichOneof("kind") == "reply":
                    session.deliver(message.reply)
        except grpc.RpcError:
            pass
        finally:
            session.close()
