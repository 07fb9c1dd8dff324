"""The secure sum end to end in-process: the project's real ClientApp on every node, the server's
driver over ``InProcessTransport``. Dropouts are nodes whose ClientApp fails at a round (the
transport reports them as failed, as it would a crashed node); nothing is mocked but the crash."""

from __future__ import annotations

import re

import numpy as np
import pytest
from scipy import stats

from client.app import app as client_app
from client.secure_sum import deposit_input
from common.secagg import SecAggError, mask_dtype, required_bits
from common.secagg.messages import ADVERTISE, MASK, SHARE, UNMASK, AdvertiseKeys, AdvertiseReply, MaskedInput
from protos import wire
from server.secure_sum import SecureSumResult, secure_sum
from server.strategy import Outgoing
from server.transport import InProcessTransport

STAGE_TYPES = {"advertise": ADVERTISE, "share": SHARE, "mask": MASK, "unmask": UNMASK}
BOUND = 1000


def crashing_at(message_type: str, crashed: set[int]):
    """The real ClientApp, except that the nodes in ``crashed`` fail on ``message_type``."""

    def app(message, context):
        if message.metadata.message_type == message_type and context.node_id in crashed:
            raise RuntimeError("the node crashed")
        return client_app(message, context)

    return app


def cohort(size: int, app=client_app, **kwargs) -> tuple[InProcessTransport, list[int]]:
    transport = InProcessTransport(app, size, **kwargs)
    return transport, transport.node_ids(size)


def deposit(transport: InProcessTransport, session: str, vectors: dict[int, np.ndarray], floor: int = 2) -> None:
    for node, vector in vectors.items():
        deposit_input(transport.contexts[node], session, vector, floor=floor, bound=BOUND)


def inputs(nodes: list[int], length: int, seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {n: rng.integers(-BOUND, BOUND + 1, length) for n in nodes}
    out[nodes[0]][:2] = [BOUND, -BOUND]  # the range's ends are in range
    return out


def run(transport, nodes, vectors, *, threshold: int, session: str = "s1", **kwargs) -> SecureSumResult:
    deposit(transport, session, vectors, floor=max(2, kwargs.get("min_inputs", 0)))
    length = len(next(iter(vectors.values())))
    return secure_sum(transport, nodes, bound=BOUND, length=length, threshold=threshold, session=session, **kwargs)


def plain_sum(vectors: dict[int, np.ndarray], nodes) -> np.ndarray:
    return np.sum([vectors[n] for n in nodes], axis=0)


@pytest.mark.parametrize(("size", "threshold", "degree"), [(3, 2, None), (10, 6, None), (12, 3, 4)])
def test_the_revealed_sum_is_the_plain_sum_exactly(size: int, threshold: int, degree: int | None) -> None:
    transport, nodes = cohort(size)
    vectors = inputs(nodes, 40)
    result = run(transport, nodes, vectors, threshold=threshold, degree=degree)
    assert result.revealed and result.aborted == "" and result.dropouts == {}
    assert result.survivors == nodes and result.bits == required_bits(size, BOUND)
    expected = plain_sum(vectors, nodes)
    np.testing.assert_array_equal(result.sum, expected)
    np.testing.assert_array_equal(result.sum_mod, expected.astype(np.uint64) & np.uint64(2**result.bits - 1))
    assert set(result.bytes_by_stage) == set(STAGE_TYPES) and result.bytes_per_client() > 0


def test_a_masked_vector_the_server_holds_is_indistinguishable_from_uniform() -> None:
    """What crosses the wire in the masking round, for an input far from uniform (every coordinate
    at the range's top): chi-square over 16 bins of the residues' top bits, KS on the residues
    scaled to [0, 1), and the lowest bit. It stays uniform even with every pairwise mask removed
    (what a server learns of a node it declares dropped): the self mask alone hides the input."""
    transport, nodes = cohort(3)
    length, seen, pair_free = 20_000, {}, {}
    spy = transport.exchange

    def recording(outgoing, **kwargs):
        exchange = spy(outgoing, **kwargs)
        if outgoing[0].message_type == MASK:
            seen.update({r.node_id: wire.decode(MaskedInput, r.content).masked for r in exchange.replies})
            pair_free.update({n: without_pair_masks(transport, n, seen[n], "s1") for n in seen})
        return exchange

    transport.exchange = recording
    vectors = {n: np.full(length, BOUND, np.int64) for n in nodes}
    result = run(transport, nodes, vectors, threshold=2)
    assert result.revealed and (result.sum == 3 * BOUND).all() and len(seen) == 3
    assert seen[nodes[0]].dtype == mask_dtype(result.bits)
    for masked in (seen[nodes[0]], pair_free[nodes[0]]):
        assert_uniform(masked.astype(np.uint64), result.bits)
        assert (masked == BOUND).mean() < 1e-3


def without_pair_masks(transport: InProcessTransport, node: int, masked: np.ndarray, session: str) -> np.ndarray:
    """``masked`` less every pairwise mask of ``node``, from the node's own keys (read from its state)."""
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key

    from client.secure_session import load as _load
    from common.secagg import pair_mask, pairwise_sign, private_key_from, public_key_from

    state = _load(transport.contexts[node], session, after="mask")
    total = masked.astype(np.uint64)
    for other in state.neighbour_ids():
        shared = generate_shared_key(
            private_key_from(state.mask_sk), public_key_from(state.public_key(state.mask_keys, other))
        )
        mask = pair_mask(shared, state.length, state.bits, session=session, pair=(node, other))
        total = total - mask if pairwise_sign(node, other) > 0 else total + mask
    return total & np.uint64(2**state.bits - 1)


def assert_uniform(residues: np.ndarray, bits: int) -> None:
    counts = np.bincount((residues >> np.uint64(bits - 4)).astype(np.int64), minlength=16)
    assert stats.chisquare(counts).pvalue > 1e-4, counts
    assert stats.kstest(residues.astype(np.float64) / 2**bits, "uniform").pvalue > 1e-4
    assert stats.binomtest(int((residues & np.uint64(1)).sum()), residues.size).pvalue > 1e-4


@pytest.mark.parametrize("stage", list(STAGE_TYPES))
def test_c_minus_t_dropouts_at_any_round_give_the_exact_sum_and_one_more_aborts(stage: str) -> None:
    size, threshold = 10, 6
    for dropped, revealed in ((size - threshold, True), (size - threshold + 1, False)):
        _, nodes = cohort(size)
        crashed = set(nodes[:dropped])
        transport, _ = cohort(size, app=crashing_at(STAGE_TYPES[stage], crashed))
        vectors = inputs(nodes, 16, seed=dropped)
        result = run(transport, nodes, vectors, threshold=threshold)
        assert set(result.dropouts) == crashed and all(stage in why for why in result.dropouts.values())
        if not revealed:
            assert result.sum is None and result.sum_mod is None
            assert re.search(r"below (the floor|threshold) 6", result.aborted), result.aborted
            continue
        # a node that crashed while unmasking had already sent its masked input: it is in the sum
        in_sum = nodes if stage == "unmask" else [n for n in nodes if n not in crashed]
        assert result.survivors == in_sum and result.aborted == ""
        np.testing.assert_array_equal(result.sum, plain_sum(vectors, in_sum))


def test_a_small_cohort_survives_one_dropout_and_not_two() -> None:
    _, nodes = cohort(3)
    for crashed, revealed in (({nodes[1]}, True), ({nodes[1], nodes[2]}, False)):
        transport, _ = cohort(3, app=crashing_at(MASK, crashed))
        vectors = inputs(nodes, 8)
        result = run(transport, nodes, vectors, threshold=2)
        assert result.revealed is revealed, result.aborted
        if revealed:
            np.testing.assert_array_equal(result.sum, plain_sum(vectors, [nodes[0], nodes[2]]))


def test_a_sparse_graph_recovers_dropouts_after_sharing_exactly() -> None:
    """k = 4 of 16 nodes, t = 3: the masks two dropped nodes share with their neighbours are removed
    with their mask keys, rebuilt from the neighbours' shares."""
    _, nodes = cohort(16)
    crashed = {nodes[0], nodes[8]}
    transport, _ = cohort(16, app=crashing_at(MASK, crashed))
    vectors = inputs(nodes, 12)
    result = run(transport, nodes, vectors, threshold=3, degree=4)
    assert result.revealed, result.aborted
    np.testing.assert_array_equal(result.sum, plain_sum(vectors, [n for n in nodes if n not in crashed]))


def test_an_out_of_range_input_is_refused_by_its_own_node_without_quoting_it() -> None:
    """Refused when deposited; and if it got into the node's state anyway, refused again before
    masking. Neither refusal quotes a value: the input is noisy but private (audit 4, item 4)."""
    transport, nodes = cohort(4)
    vectors = inputs(nodes, 10)
    vectors[nodes[2]][5] = BOUND + 30041
    with pytest.raises(ValueError, match=r"1 coordinate\(s\) outside the range ±1000") as refused:
        deposit_input(transport.contexts[nodes[2]], "s1", vectors[nodes[2]], floor=2, bound=BOUND)
    assert "31041" not in str(refused.value)
    honest = {n: v for n, v in vectors.items() if n != nodes[2]}
    deposit(transport, "s1", honest)
    deposit_input(transport.contexts[nodes[2]], "s1", np.zeros(10, np.int64), floor=2, bound=BOUND)
    record = transport.contexts[nodes[2]].state.array_records["secagg-input.s1"]
    record["x"] = wire.raw_array(vectors[nodes[2]])  # a state written behind the deposit's check
    result = secure_sum(transport, nodes, bound=BOUND, length=10, threshold=3, session="s1")
    assert list(result.dropouts) == [nodes[2]]
    assert "mask: node refuses to mask its input" in result.dropouts[nodes[2]]
    assert "31041" not in result.dropouts[nodes[2]]
    np.testing.assert_array_equal(result.sum, plain_sum(vectors, list(honest)))


@pytest.mark.parametrize(
    ("declared", "why"),
    [
        ({"threshold": 3}, "below the 4 survivors this node's noise share was calibrated for"),
        ({"bound": 2 * BOUND}, "is not the range ±1000 of this node's deposit"),
        ({"length": 9}, "this node deposited 10"),
    ],
)
def test_a_node_refuses_a_sum_other_than_the_one_its_share_was_calibrated_for(declared, why) -> None:
    """Audit 4, item 2: shares calibrated for t survivors; a server declaring a lower floor (within
    every node's default policy) revealed a sum of fewer inputs, whose ε is above the printed one.
    The deposit keeps its plan's floor, range and length; a sum declared otherwise gets no keys."""
    transport, nodes = cohort(5)
    vectors = inputs(nodes, 10)
    deposit(transport, "s1", vectors, floor=4)
    ask = dict(bound=BOUND, length=10, threshold=4) | declared
    result = secure_sum(transport, nodes, session="s1", **ask)
    assert not result.revealed and set(result.dropouts) == set(nodes), result.dropouts
    assert all(why in reason and reason.startswith("advertise") for reason in result.dropouts.values())
    deposit(transport, "s2", vectors, floor=4)
    honest = secure_sum(transport, nodes, session="s2", bound=BOUND, length=10, threshold=4)
    np.testing.assert_array_equal(honest.sum, plain_sum(vectors, nodes))


def test_a_sum_outside_the_range_is_rejected_by_the_server(monkeypatch) -> None:
    """A rogue node that skips its own range check (patched out here, on every node of the process:
    only the rogue's input is out of range) pushes the sum beyond ±n·bound: the server says so and
    reveals no sum."""
    import client.secure_deposit
    import client.secure_sum

    monkeypatch.setattr(client.secure_sum, "input_problem", lambda vector, **_: "")
    monkeypatch.setattr(client.secure_deposit, "input_problem", lambda vector, **_: "")
    transport, nodes = cohort(3)
    vectors = {n: np.zeros(4, np.int64) for n in nodes}
    vectors[nodes[0]][2] = 5 * BOUND
    result = run(transport, nodes, vectors, threshold=2)
    assert result.sum is None and result.dropouts == {}, result.dropouts
    assert f"outside ±{3 * BOUND}" in result.aborted and "coordinate 2" in result.aborted


def test_a_nodes_policy_refuses_a_cohort_or_threshold_below_its_minimum() -> None:
    policies = {0: {"privacy-min-secagg-cohort": 5}, 1: {"privacy-min-secagg-threshold": 3}}
    transport, nodes = cohort(4, node_configs=policies)
    vectors = inputs(nodes, 6)
    result = run(transport, nodes, vectors, threshold=3)
    assert "below the node's minimum cohort 5 [node config]" in result.dropouts[nodes[0]]
    assert nodes[1] not in result.dropouts  # threshold 3 meets its minimum
    np.testing.assert_array_equal(result.sum, plain_sum(vectors, nodes[1:]))
    transport, nodes = cohort(3, node_config={"privacy-min-secagg-threshold": 3})
    result = run(transport, nodes, inputs(nodes, 6), threshold=2)
    assert not result.revealed and "below the floor 2" in result.aborted
    assert all("below the node's minimum threshold 3" in why for why in result.dropouts.values())


def test_a_node_refuses_what_no_honest_server_would_ask() -> None:
    """A threshold that is no majority of the neighbourhood, a modulus that lets sums wrap, a round
    out of order, a session opened twice, an input masked twice: each refused, naming why."""
    transport, nodes = cohort(10)
    bits = required_bits(10, BOUND)
    for session in "abc":
        deposit_input(transport.contexts[nodes[0]], session, np.zeros(3, np.int64), floor=2, bound=BOUND)

    def advertise(**change) -> AdvertiseReply:
        ask = dict(session="x", cohort=10, threshold=6, degree=9, bits=bits, bound=BOUND, length=3) | change
        content = wire.encode(AdvertiseKeys(**ask))
        reply = transport.exchange([Outgoing(nodes[0], ADVERTISE, content)]).replies[0]
        return wire.decode(AdvertiseReply, reply.content)

    assert "not a strict majority" in advertise(session="a", threshold=5).reason
    assert "without wrapping" in advertise(session="b", bits=bits - 1).reason
    assert not advertise(session="c").refused
    assert "already open" in advertise(session="c").reason
    with pytest.raises(SecAggError, match="strict majority"):
        secure_sum(transport, nodes, bound=BOUND, length=3, threshold=5)
    vectors = inputs(nodes, 3)
    assert run(transport, nodes, vectors, threshold=6, session="once").revealed
    again = secure_sum(transport, nodes, bound=BOUND, length=3, threshold=6, session="once")
    assert not again.revealed and all("no input was deposited" in why for why in again.dropouts.values())


def test_a_node_will_not_unmask_for_a_server_that_calls_survivors_dropped() -> None:
    """A server deviating in the last round (every survivor listed as dropped, to get the mask keys
    of nodes whose masked inputs it holds) is refused by every node: fewer than t inputs of its
    neighbourhood would be in the sum."""
    from common.secagg.messages import Unmask

    transport, nodes = cohort(4)
    honest = transport.exchange

    def deviating(outgoing, **kwargs):
        if outgoing[0].message_type == UNMASK:
            for o in outgoing:
                ask = wire.decode(Unmask, o.content)
                both = np.concatenate([ask.survivors, ask.dropped])
                o.content = wire.encode(Unmask(ask.session, ask.survivors[:0], both))
        return honest(outgoing, **kwargs)

    transport.exchange = deviating
    result = run(transport, nodes, inputs(nodes, 5), threshold=3)
    assert not result.revealed and set(result.dropouts) == set(nodes)
    assert all("only 1 inputs of this neighbourhood are in the sum" in why for why in result.dropouts.values())


def test_a_sparse_graph_reveals_no_sum_below_its_declared_floor() -> None:
    """A sparse graph: the threshold is a neighbourhood's (6 of 11 here), but the sum's floor (what
    distributed noise is calibrated for) is declared on its own: 9 of 12 survivors give the exact
    sum, 8 abort although every neighbourhood could still rebuild its secrets (each keeps >= 7)."""
    size, degree, threshold, floor = 12, 10, 6, 9
    for dropped, revealed in ((size - floor, True), (size - floor + 1, False)):
        _, nodes = cohort(size)
        crashed = set(nodes[:dropped])
        transport, _ = cohort(size, app=crashing_at(MASK, crashed))
        vectors = inputs(nodes, 8, seed=dropped)
        result = run(transport, nodes, vectors, threshold=threshold, degree=degree, min_inputs=floor)
        if revealed:
            in_sum = [n for n in nodes if n not in crashed]
            np.testing.assert_array_equal(result.sum, plain_sum(vectors, in_sum))
        else:
            assert not result.revealed and "below the floor 9" in result.aborted, result.aborted


def test_a_node_refuses_a_floor_below_its_policy() -> None:
    transport, nodes = cohort(6, node_config={"privacy-min-secagg-threshold": 5})
    result = run(transport, nodes, inputs(nodes, 6), threshold=4, min_inputs=4)
    assert not result.revealed
    assert all("below the node's minimum threshold 5" in why for why in result.dropouts.values())
    transport, nodes = cohort(6, node_config={"privacy-min-secagg-threshold": 5})
    vectors = inputs(nodes, 6)
    assert np.array_equal(run(transport, nodes, vectors, threshold=4, min_inputs=5).sum, plain_sum(vectors, nodes))
