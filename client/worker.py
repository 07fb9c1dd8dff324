"""The data plane, node side: one persistent worker per node and run.

Started by the ClientApp's ``query.dataplane`` handler (``python -m client.worker``, its own session),
it reads its settings, token included, from stdin (never the command line or logs), imports torch
once, keeps the node's Context (and through it the discriminator cache) in memory, dials the
ServerApp's gRPC server and answers every request with the ClientApp's own handlers. State is
persisted to the node's disk by those handlers, so a restarted worker resumes.

It exits on the server's shutdown, when the stream closes (server gone), and when nothing arrived
for ``idle_s`` seconds (server hung; the server pings every few seconds). A lock file per run and
node makes a second start return "already running".
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from typing import Any

from .worker_files import lock_path, try_lock

PRIVATE_NETWORK_KEY = "dataplane-private-network"


def private_network(node_config: dict) -> bool:
    """Whether this node's operator allows a plaintext data plane beyond loopback (node config
    ``dataplane-private-network=true``): the node decides, never the server's run config."""
    value = node_config.get(PRIVATE_NETWORK_KEY, False)
    return value is True or str(value).strip().lower() in ("true", "1", "yes")


def _channel(address: str, ca: str, private: bool = False):
    import grpc

    from common.io.net import MAX_GRPC_MESSAGE, is_loopback

    options = [
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE),
    ]
    if ca:
        return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=ca.encode()), options)
    if not private and not is_loopback(address.rsplit(":", 1)[0].strip("[]")):
        raise SystemExit(
            f"refusing a plaintext data plane to {address}: beyond loopback it needs TLS "
            f"(or node config {PRIVATE_NETWORK_KEY}=true on a network only the deployment can reach)"
        )
    return grpc.insecure_channel(address, options)


def fragments(envelope):
    """``envelope`` as Envelopes of at most REPLY_FRAGMENT content bytes each, all but the last
    marked ``more``: the server's receive limit is 1 MiB, a paper-scale reply ~15 MB."""
    from common.io.net import REPLY_FRAGMENT

    content = envelope.content
    if len(content) <= REPLY_FRAGMENT:
        return [envelope]
    cuts = range(0, len(content), REPLY_FRAGMENT)
    return [
        type(envelope)(
            seq=envelope.seq,
            message_type=envelope.message_type,
            content=content[start : start + REPLY_FRAGMENT],
            error=envelope.error,
            more=start + REPLY_FRAGMENT < len(content),
        )
        for start in cuts
    ]


class Worker:
    def __init__(self, spec: dict[str, Any]) -> None:
        from flwr.app import Context, RecordDict
        from flwr.supercore.task_identity import TaskIdentity

        from client.app import app

        self.spec = spec
        self.app = app
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = spec["run_id"], spec["node_id"], 1
        self.context = Context(
            run_id=spec["run_id"],
            node_id=spec["node_id"],
            node_config=spec["node_config"],
            state=RecordDict(),
            run_config={},
        )
        self.outbox: queue.Queue = queue.Queue()
        self.last_heard = time.monotonic()

    def run(self) -> str:
        """Serve the stream until it ends; returns why it ended.

        The hello (run, node, token) travels in the call's metadata: the server checks it before the
        stream takes anything, so streams without it (a flood of them) cannot crowd this one out."""
        from common.io.net import HELLO_METADATA_KEY
        from protos import dataplane_pb2 as pb
        from protos import dataplane_pb2_grpc as pb_grpc

        channel = _channel(self.spec["address"], self.spec.get("ca", ""), private_network(self.spec["node_config"]))
        hello = pb.Hello(run_id=self.spec["run_id"], node_id=self.spec["node_id"], token=self.spec["token"])
        call = pb_grpc.DataPlaneStub(channel).Connect(
            self._requests(), metadata=((HELLO_METADATA_KEY, hello.SerializeToString()),)
        )
        threading.Thread(target=self._watchdog, args=(call,), daemon=True).start()
        try:
            for message in call:
                self.last_heard = time.monotonic()
                kind = message.WhichOneof("kind")
                if kind == "shutdown":
                    return f"shutdown: {message.shutdown.reason}"
                if kind == "request":
                    for fragment in fragments(self._answer(message.request)):
                        self.outbox.put(pb.NodeMessage(reply=fragment))
            return "stream closed by the server"
        except Exception as err:  # noqa: BLE001 - grpc.RpcError and friends: the server is gone
            return f"stream ended: {err.details() if hasattr(err, 'details') else err}"
        finally:
            self.outbox.put(None)
            channel.close()

    def _requests(self):
        while (item := self.outbox.get()) is not None:
            yield item

    def _watchdog(self, call) -> None:
        idle_s = float(self.spec["idle_s"])
        while True:
            time.sleep(min(1.0, idle_s / 4))
            if time.monotonic() - self.last_heard > idle_s:
                print(f"fedgan worker: nothing from the server for {idle_s:.0f} s; exiting", flush=True)
                call.cancel()
                return

    def _answer(self, request):
        from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
        from flwr.proto.recorddict_pb2 import RecordDict as RecordDictProto

        from protos import dataplane_pb2 as pb
        from protos.wire import runtime_message

        proto = RecordDictProto()
        proto.ParseFromString(request.content)
        message = runtime_message(recorddict_from_proto(proto), self.spec["node_id"], request.message_type)
        try:
            reply = self.app(message, self.context)
        except Exception as err:  # noqa: BLE001 - reported to the server, which drops this node
            return pb.Envelope(seq=request.seq, message_type=request.message_type, error=f"{type(err).__name__}: {err}")
        if reply.has_error():
            return pb.Envelope(seq=request.seq, message_type=request.message_type, error=reply.error.reason)
        return pb.Envelope(
            seq=request.seq,
            message_type=request.message_type,
            content=recorddict_to_proto(reply.content).SerializeToString(),
        )


def main() -> int:
    # One intra-op thread unless told otherwise: several workers and the ServerApp share the cores,
    # and torch's spinning OpenMP threads slow every process down by an order of magnitude when
    # they contend (measured: 3.3 s instead of 0.26 s per answer with 2 threads on a loaded 2-core box).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("FEDGAN_CLIENT_THREADS", "1")
    spec = json.loads(sys.stdin.read())
    lock = try_lock(lock_path(spec["run_id"], spec["node_id"]))
    if lock is None:
        print("fedgan worker: already running for this run and node", flush=True)
        return 0
    reason = Worker(spec).run()
    print(f"fedgan worker: exiting ({reason})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
