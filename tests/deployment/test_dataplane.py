"""The gRPC data plane with real worker processes, Flower's control plane replaced by the in-process
transport (the deployment tests run it under a real SuperLink): same results as the Flower path,
tokens, TLS, and every way a worker must end (shutdown, stream closed, idle, stopped run)."""

import time

import pytest

from client.app import app
from server.dataplane import (
    DataPlaneError,
    DataPlaneSettings,
    GrpcTransport,
    node_token,
)
from server.loop import run_experiment
from server.reporting import RunDirectory
from server.transport import InProcessTransport
from simulations.deploy import pki
from simulations.deploy.processes import alive, identity
from tests.helpers import tiny_cfg, wait_until

pytestmark = pytest.mark.slow
CHANGES = dict(
    num_clients=2,
    synthetic_samples_per_writer=24,
    sample_every=10**6,
    # deflate's output size depends on the samples, and float sums on thread counts: compare
    # byte counts on fixed-size encodings
    wire_compression="none",
    # the server's sampling repeated (testing flag), so that two runs ask the same clients
    sampling_seed=1,
)


def gone(pid: int, within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        proc = identity(pid)
        if proc is None or not alive(proc):
            return True
        time.sleep(0.2)
    return False


def control_for(n: int, node_state=None) -> InProcessTransport:
    return InProcessTransport(app, n, run_id=(1 << 62) + time.monotonic_ns() % 10**9, node_state=node_state)


def run_id_of(control: InProcessTransport) -> int:
    return next(iter(control.contexts.values())).run_id


def test_same_bytes_and_ledgers_as_the_flower_path_and_workers_exit_at_the_end(tmp_path):
    cfg = tiny_cfg(steps=4, **CHANGES)
    plain = run_experiment(
        cfg.replace(out=str(tmp_path / "a")),
        RunDirectory.create(cfg.replace(out=str(tmp_path / "a"))),
        InProcessTransport(app, 2, node_state=tmp_path / "a" / "clients"),
        transport_name="inprocess",
    )
    control = control_for(2, node_state=tmp_path / "b" / "clients")  # nodes of their own, as the first run's
    grpc_cfg = cfg.replace(out=str(tmp_path / "b"))
    transport = GrpcTransport(control, run_id_of(control), DataPlaneSettings(idle_s=30))
    try:
        viagrpc = run_experiment(grpc_cfg, RunDirectory.create(grpc_cfg), transport, transport_name="grpc")
    finally:
        transport.close()
    assert viagrpc["status"] == "completed"
    for a, b in zip(plain["clients"], viagrpc["clients"], strict=False):
        for key in ("client_id", "queries", "epsilon", "bytes_down", "bytes_up"):
            assert a[key] == b[key], key
    assert viagrpc["comm"]["bytes_per_step"] == plain["comm"]["bytes_per_step"]
    assert viagrpc["comm"]["control_bytes_down_total"] > plain["comm"]["control_bytes_down_total"]  # the kick-off
    assert len(transport.worker_pids) == 2
    assert all(gone(pid) for pid in transport.worker_pids.values())


def started(tmp_path, n=1, **settings) -> tuple[GrpcTransport, InProcessTransport]:
    control = control_for(n)
    transport = GrpcTransport(control, run_id_of(control), DataPlaneSettings(**settings))
    transport.node_ids(n)
    return transport, control


def hello_metadata(hello) -> tuple:
    """The call metadata a worker sends: its Hello, serialized (``hello``: a pb.Hello or raw bytes)."""
    from common.io.net import HELLO_METADATA_KEY

    return ((HELLO_METADATA_KEY, hello if isinstance(hello, bytes) else hello.SerializeToString()),)


def refusal(transport: GrpcTransport, hello=None, messages=(), timeout_s: float = 30):
    """The status code the data plane refuses a stream with (fails if it accepts it): ``hello`` in
    its metadata (None: no metadata), then ``messages``."""
    import grpc

    from protos import dataplane_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{transport.server_port}")
    metadata = None if hello is None else hello_metadata(hello)
    try:
        with pytest.raises(grpc.RpcError) as err:
            next(pb_grpc.DataPlaneStub(channel).Connect(iter(messages), metadata=metadata, timeout=timeout_s))
        return err.value.code()
    finally:
        channel.close()


def test_a_second_start_says_already_running(tmp_path):
    transport, control = started(tmp_path, idle_s=30)
    try:
        node = next(iter(control.contexts))
        from common.messages import DATAPLANE, DataplaneReply, DataplaneStart
        from protos import wire
        from server.strategy import Outgoing

        start = DataplaneStart(address="127.0.0.1:1", token="x", run_id=run_id_of(control), ca="", idle_s=30.0)
        again = control.exchange([Outgoing(node, DATAPLANE, wire.encode(start))])
        assert wire.decode(DataplaneReply, again.replies[0].content).status == "already running"
    finally:
        transport.close()


def test_worker_exits_when_the_stream_closes(tmp_path):
    transport, _ = started(tmp_path, idle_s=60)
    transport._closing.set()
    transport.server.stop(grace=0)  # the ServerApp is gone without a goodbye
    assert all(gone(pid, 20) for pid in transport.worker_pids.values())


def test_worker_exits_when_the_server_goes_quiet(tmp_path):
    transport, _ = started(tmp_path, idle_s=3)
    transport._closing.set()  # no more pings: a hung server
    try:
        assert all(gone(pid, 20) for pid in transport.worker_pids.values())
    finally:
        transport.server.stop(grace=0)


def test_a_stopped_run_ends_the_exchange(tmp_path):
    class StoppedGrid:
        def get_node_ids(self):
            raise RuntimeError("run is not running")

    transport, control = started(tmp_path, idle_s=1.5)
    control.grid = StoppedGrid()
    try:
        wait_until(transport._stopped.is_set, timeout_s=30, what="the keepalive noticing the stopped run")
        with pytest.raises(DataPlaneError, match="stopped"):
            transport.exchange([])
    finally:
        transport.close()
    assert all(gone(pid, 20) for pid in transport.worker_pids.values())


def test_tls_data_plane_and_refusals(tmp_path):
    tls = pki.make_tls(tmp_path / "ca", hosts=["127.0.0.1", "localhost"])
    rogue = pki.make_tls(tmp_path / "rogue", hosts=["127.0.0.1", "localhost"])
    transport, control = started(
        tmp_path, tls_cert=str(tls.server_cert), tls_key=str(tls.server_key), tls_ca=str(tls.ca_cert), idle_s=30
    )
    try:
        node = next(iter(control.contexts))
        assert node in transport.servicer.sessions  # connected over TLS with the deployment's CA
        import grpc

        from protos import dataplane_pb2 as pb
        from protos import dataplane_pb2_grpc as pb_grpc

        port = transport.server_port
        hello = pb.Hello(
            run_id=run_id_of(control), node_id=node, token=node_token(transport.secret, run_id_of(control), node)
        )
        for channel in (
            grpc.insecure_channel(f"127.0.0.1:{port}"),
            grpc.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(rogue.ca_cert.read_bytes())),
        ):
            with pytest.raises(grpc.RpcError) as err:
                next(pb_grpc.DataPlaneStub(channel).Connect(iter([]), metadata=hello_metadata(hello), timeout=10))
            assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    finally:
        transport.close()


def test_a_wrong_token_is_refused(tmp_path):
    import grpc

    from protos import dataplane_pb2 as pb

    transport, control = started(tmp_path, idle_s=30)
    try:
        node = next(iter(control.contexts))
        hello = pb.Hello(run_id=run_id_of(control), node_id=node, token="0" * 64)
        assert refusal(transport, hello) == grpc.StatusCode.UNAUTHENTICATED
        # a token that is not ASCII is a wrong token too (hmac.compare_digest raises on such a str)
        assert refusal(transport, pb.Hello(run_id=run_id_of(control), node_id=node, token="é" * 64)) == (
            grpc.StatusCode.UNAUTHENTICATED
        )
    finally:
        transport.close()


def test_a_token_opens_one_session_per_run(tmp_path):
    """Issue 14, item 7: a node's token stayed valid for the whole run after its worker left, so
    anyone who saw it once could take the node's place. The right token is refused while its worker
    is connected, and still after the worker's stream has closed."""
    import os
    import signal

    import grpc

    from protos import dataplane_pb2 as pb

    transport, control = started(tmp_path, idle_s=30)
    try:
        node = next(iter(control.contexts))
        token = node_token(transport.secret, run_id_of(control), node)
        hello = pb.Hello(run_id=run_id_of(control), node_id=node, token=token)
        session = transport.servicer.sessions[node]
        assert refusal(transport, hello) == grpc.StatusCode.PERMISSION_DENIED
        assert transport.servicer.sessions[node] is session and not session.closed.is_set()
        os.kill(transport.worker_pids[node], signal.SIGKILL)
        wait_until(session.closed.is_set, timeout_s=30, what="the killed worker's stream to close")
        assert refusal(transport, hello) == grpc.StatusCode.PERMISSION_DENIED
        assert transport.servicer.sessions[node] is session  # nobody took the node's place
    finally:
        transport.close()


def test_plaintext_beyond_loopback_is_refused(tmp_path):
    control = control_for(1)
    transport = GrpcTransport(control, run_id_of(control), DataPlaneSettings(bind="0.0.0.0", address="10.1.2.3"))
    with pytest.raises(DataPlaneError, match="without TLS"):
        transport.node_ids(1)


def test_plaintext_beyond_loopback_needs_both_sides_to_call_the_network_private(tmp_path):
    """Issue 15, item 4: on a compose network only the deployment reaches, the operator may allow a
    plaintext data plane: the server with dataplane-private-network=true in the run config, each node
    with the same key in its node config (a server alone cannot talk a node into plaintext)."""
    from client.worker import _channel, private_network

    assert not private_network({}) and not private_network({"dataplane-private-network": "no"})
    assert private_network({"dataplane-private-network": True})
    assert private_network({"dataplane-private-network": "true"})
    with pytest.raises(SystemExit, match="needs TLS"):
        _channel("10.1.2.3:9400", "", private=False)
    _channel("10.1.2.3:9400", "", private=True).close()
    transport, _ = started(tmp_path, bind="0.0.0.0", private_network=True, idle_s=30)
    transport.close()


def test_a_worker_that_dies_is_dropped_and_the_run_goes_on(tmp_path):
    import os
    import signal

    cfg = tiny_cfg(tmp_path / "run", steps=3, clients_per_step=2, **CHANGES)
    control = control_for(2)
    transport = GrpcTransport(control, run_id_of(control), DataPlaneSettings(idle_s=30, reply_timeout_s=30))
    exchange, steps = transport.exchange, []

    def kill_after_first_step(outgoing, **kwargs):
        result = exchange(outgoing, **kwargs)
        if outgoing and outgoing[0].message_type == "train.gswgan" and not steps:
            steps.append(1)
            os.kill(transport.worker_pids[sorted(control.contexts)[1]], signal.SIGKILL)
        return result

    transport.exchange = kill_after_first_step
    try:
        summary = run_experiment(cfg, RunDirectory.create(cfg), transport, transport_name="grpc")
    finally:
        transport.close()
    assert summary["status"] == "completed" and summary["steps_completed"] == 3
    assert summary["failed_clients"] == [1]
    assert "stream closed" in summary["clients"][1]["failure"]
    # Client 1 answered step 0; the query of step 1 went to its dead worker and stays charged: the
    # server cannot know it was never answered (a late answer would have been charged on the client).
    assert summary["clients"][0]["queries"] == 3 and summary["clients"][1]["queries"] == 2


def test_streams_without_a_valid_hello_in_their_metadata_are_refused_at_once(tmp_path):
    """Issue 14, item 7 (silent connections held the pool of nodes+8 threads) and issue 23, item 16
    (they then held the six pre-authentication slots): a stream whose metadata holds no valid hello
    is refused before it takes a thread, whatever it sends or does not send, and the worker stays."""
    import threading

    import grpc

    from protos import dataplane_pb2 as pb

    transport, control = started(tmp_path, idle_s=30)
    forever = threading.Event()

    def silent():
        forever.wait()
        yield from ()

    try:
        node = next(iter(control.contexts))
        token = node_token(transport.secret, run_id_of(control), node)
        in_message = pb.NodeMessage(hello=pb.Hello(run_id=run_id_of(control), node_id=node, token=token))
        for hello, messages in (
            (None, silent()),  # no hello, nothing sent
            (None, [in_message]),  # the hello as a first message is not the protocol
            (b"\xff" * 100, silent()),  # not a Hello
            (pb.Hello(run_id=run_id_of(control), node_id=1, token="x" * 5000), silent()),  # too large
        ):
            assert refusal(transport, hello, messages, timeout_s=20) == grpc.StatusCode.UNAUTHENTICATED
        assert not transport.servicer.sessions[node].closed.is_set()
    finally:
        forever.set()
        transport.close()


def test_replies_nobody_asked_for_are_dropped():
    from protos import dataplane_pb2 as pb
    from server.dataplane import Session

    session = Session()
    assert not session.deliver(pb.Envelope(seq=7, content=b"x" * 1000))  # unsolicited
    session.expect(8)
    assert session.deliver(pb.Envelope(seq=8)) and not session.deliver(pb.Envelope(seq=8))  # once only
    assert list(session.replies) == [8]


def test_the_server_reads_at_most_1_mib_per_message_from_any_stream(tmp_path):
    """Issue 14, item 7: the 256 MiB limit applied before authentication (8 × 250 MiB hellos took the
    ServerApp from 250 MiB to 2.26 GiB). gRPC has one limit per server, so workers send replies in
    512 KiB fragments and the limit is 1 MiB; a stream without the token has nothing read at all."""
    import grpc

    from protos import dataplane_pb2 as pb
    from protos import dataplane_pb2_grpc as pb_grpc

    transport, control = started(tmp_path, idle_s=30)
    try:
        big = pb.NodeMessage(reply=pb.Envelope(seq=1, content=b"x" * (1100 * 1024)))
        assert refusal(transport, None, [big]) == grpc.StatusCode.UNAUTHENTICATED
        spare = 12345  # an expected node without a worker: this test speaks for it
        transport.servicer.nodes.add(spare)
        hello = pb.Hello(
            run_id=run_id_of(control), node_id=spare, token=node_token(transport.secret, run_id_of(control), spare)
        )
        channel = grpc.insecure_channel(f"127.0.0.1:{transport.server_port}")
        try:
            call = pb_grpc.DataPlaneStub(channel).Connect(iter([big]), metadata=hello_metadata(hello), timeout=30)
            with pytest.raises(grpc.RpcError) as err:
                for _ in call:
                    pass
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            channel.close()
    finally:
        transport.close()


def test_large_replies_travel_in_fragments_and_are_bounded():
    """A ~3 MiB reply (a Flower RecordDict) is cut into fragments under the 1 MiB limit and joined
    back byte for byte; fragments adding up to more than MAX_REPLY_BYTES become an error reply."""
    import numpy as np
    from flwr.app import ArrayRecord, RecordDict
    from flwr.common.serde import recorddict_to_proto

    from client.worker import fragments
    from protos import dataplane_pb2 as pb
    from server import dataplane
    from server.dataplane import Session

    content = recorddict_to_proto(
        RecordDict({"w": ArrayRecord([np.random.default_rng(0).standard_normal(800_000).astype("float32")])})
    ).SerializeToString()
    parts = fragments(pb.Envelope(seq=3, message_type="train.dpgan", content=content))
    assert len(parts) == 7 and all(p.ByteSize() < dataplane.MAX_WORKER_MESSAGE for p in parts)
    assert [p.more for p in parts] == [True] * 6 + [False]
    session = Session()
    session.expect(3)
    assert all(session.deliver(p) for p in parts)
    assert session.replies[3].content == content and not session.replies[3].error and not session.partial

    session.expect(4)
    chunk = pb.Envelope(seq=4, content=b"x" * (8 << 20), more=True)
    for _ in range(dataplane.MAX_REPLY_BYTES // (8 << 20)):
        assert session.deliver(chunk) and 4 not in session.replies
    assert session.deliver(chunk)  # one fragment too many
    assert "larger than 64 MiB" in session.replies[4].error and not session.partial
    assert not session.deliver(chunk)  # the rest of it is unsolicited

    session.expect(5)  # a reply the server gave up on (timed out) mid-way: its fragments are freed
    assert session.deliver(pb.Envelope(seq=5, content=b"x" * 100, more=True)) and 5 in session.partial
    session.forget(5)
    assert not session.partial and not session.deliver(pb.Envelope(seq=5, content=b"x"))


def test_hello_less_streams_cannot_lock_a_worker_out(tmp_path):
    """Issue 23, item 16: eight attackers re-opening hello-less streams held the six pre-authentication
    slots, and the worker with the right token was refused for all 12 of its retries (81 s). The
    token now travels in the call's metadata and is checked before a stream takes anything, so the
    attackers are refused at once and the worker gets in while they keep trying."""
    import threading

    import grpc

    from protos import dataplane_pb2_grpc as pb_grpc

    control = control_for(1)
    transport = GrpcTransport(control, run_id_of(control), DataPlaneSettings(idle_s=30, connect_timeout_s=30))
    kickoff, stop, refused = control.exchange, threading.Event(), []

    def silent():
        stop.wait()
        yield from ()

    def attacker():
        channel = grpc.insecure_channel(f"127.0.0.1:{transport.server_port}")
        while not stop.is_set():
            try:
                next(pb_grpc.DataPlaneStub(channel).Connect(silent(), timeout=20))
            except grpc.RpcError:
                refused.append(1)
            time.sleep(0.01)
        channel.close()

    def kickoff_under_attack(outgoing, **kwargs):
        for _ in range(8):
            threading.Thread(target=attacker, daemon=True).start()
        wait_until(lambda: len(refused) >= 8, timeout_s=30, what="the attackers being turned away")
        return kickoff(outgoing, **kwargs)

    control.exchange = kickoff_under_attack
    try:
        transport.node_ids(1)  # the worker connects within connect_timeout_s, or this raises
        node = next(iter(control.contexts))
        assert not transport.servicer.sessions[node].closed.is_set()
    finally:
        stop.set()
        transport.close()


def test_a_reply_in_endless_empty_fragments_is_cut_off_at_the_fragment_cap():
    """Issue 23, item 16: an authenticated worker could send empty ``more`` fragments forever (34,715
    buffered, the list re-summed under the lock for each). A reply in more fragments than an honest
    one of MAX_REPLY_BYTES needs becomes an error reply naming the cause; nothing of it stays."""
    from protos import dataplane_pb2 as pb
    from server import dataplane
    from server.dataplane import Session

    session = Session()
    session.expect(9)
    empty = pb.Envelope(seq=9, message_type="train.gswgan", more=True)
    for _ in range(dataplane.MAX_REPLY_FRAGMENTS):
        assert session.deliver(empty) and 9 not in session.replies
    assert session.deliver(empty)  # one fragment too many
    assert f"more than {dataplane.MAX_REPLY_FRAGMENTS} fragments" in session.replies[9].error
    assert not session.partial
    assert not any(session.deliver(empty) for _ in range(10_000))  # the rest is unsolicited: dropped
    assert not session.partial and list(session.replies) == [9]
