"""The secure sum under Flower's simulation runtime (3 SuperNodes, Ray actors): the same driver and
handlers as in-process, each round's messages through Flower's Grid, each node's secrets in the
Context Flower keeps for it between messages. Exact sum, and the bytes equal the in-process run's."""

from __future__ import annotations

import numpy as np

from client.app import app as client_app
from client.secure_sum import deposit_input
from common.secagg.messages import ADVERTISE, AdvertiseKeys
from protos import wire
from server.secure_sum import secure_sum
from server.transport import InProcessTransport

BOUND, LENGTH, SESSION = 50, 64, "flower-1"


def vector_of(partition: int) -> np.ndarray:
    """Node ``partition``'s input: what a method's answer would deposit on that node."""
    return np.random.default_rng(partition).integers(-BOUND, BOUND + 1, LENGTH)


def depositing_app(message, context):
    """The project's ClientApp, with the node's input deposited when the sum is announced (inside
    the node's own process: the server never sees it)."""
    if message.metadata.message_type == ADVERTISE:
        session = wire.decode(AdvertiseKeys, message.content).session
        deposit_input(context, session, vector_of(int(context.node_config["partition-id"])), floor=2, bound=BOUND)
    return client_app(message, context)


def three_node_sum(transport):
    return secure_sum(transport, transport.node_ids(3), bound=BOUND, length=LENGTH, threshold=2, session=SESSION)


def test_a_secure_sum_under_flowers_simulation_is_exact_and_costs_what_in_process_does() -> None:
    from simulations.experiments.simulate import run_on_transport

    result, error = run_on_transport(3, three_node_sum, "flower", client_app=depositing_app, reply_timeout_s=120)
    assert error is None, error
    assert result.revealed and result.dropouts == {}, (result.aborted, result.dropouts)
    np.testing.assert_array_equal(result.sum, sum(vector_of(p) for p in range(3)))
    inprocess = three_node_sum(InProcessTransport(depositing_app, 3))
    np.testing.assert_array_equal(inprocess.sum, result.sum)
    for stage, sent in result.bytes_by_stage.items():
        local = inprocess.bytes_by_stage[stage]
        assert abs(sent["down"] - local["down"]) <= 3 * 16 and abs(sent["up"] - local["up"]) <= 3 * 16, stage
