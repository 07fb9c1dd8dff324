"""Payload validation and the Flower adapter: round trips, bad input, and exact byte counting."""

import numpy as np
import pytest
from flwr.app import Message
from flwr.supercore.task_identity import TaskIdentity

from client.flower_wire import (decode_answer, decode_query, encode_answer, encode_query,
                                message_wire_bytes)
from common.codec import GsAnswer, GsQuery, PayloadError, to_wire, validate_answer, validate_query


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0


def _query(B=4, n_critic=2, step=3):
    rng = np.random.default_rng(0)
    return GsQuery(step=step, batch_size=B,
                   fake=rng.random(((n_critic + 1) * B, 1, 28, 28), dtype=np.float32),
                   labels=rng.integers(0, 10, (n_critic + 1) * B))


def _answer(B=4, step=3, grad=None):
    grad = np.zeros((B, 1, 28, 28), np.float32) if grad is None else grad
    return GsAnswer(step=step, client_id=2, grad=grad, noise_multiplier=0.2, sample_rate=1.0,
                    queries=5, epsilon=1.5, stats={"wasserstein": 0.1})


def test_query_round_trip_with_setup():
    q = _query()
    got, setup = decode_query(encode_query(q, {"config": "{}", "state_dir": "/x"}))
    assert setup == {"config": "{}", "state_dir": "/x"}
    assert got.step == q.step and got.batch_size == q.batch_size
    np.testing.assert_array_equal(got.fake, q.fake)
    np.testing.assert_array_equal(got.labels, q.labels)
    assert decode_query(encode_query(q))[1] is None


def test_answer_round_trip_and_validation():
    a = _answer()
    got = decode_answer(encode_answer(a))
    assert (got.client_id, got.queries, got.epsilon, got.stats) == (2, 5, 1.5, {"wasserstein": 0.1})
    validate_answer(got, batch_size=4, step=3)


@pytest.mark.parametrize("bad, match", [
    (np.zeros((3, 1, 28, 28), np.float32), "shape"),
    (np.full((4, 1, 28, 28), np.nan, np.float32), "NaN"),
    (np.zeros((4096 + 1, 1, 28, 28), np.float32), "exceeds"),
])
def test_bad_answers_are_rejected_with_the_cause(bad, match):
    with pytest.raises(PayloadError, match=match):
        validate_answer(_answer(grad=bad), batch_size=4, step=3)


def test_wrong_step_and_missing_fields():
    with pytest.raises(PayloadError, match="step"):
        validate_answer(_answer(step=2), batch_size=4, step=3)
    content = encode_answer(_answer())
    del content.config_records["scalars"]["epsilon"]
    with pytest.raises(PayloadError, match="malformed"):
        decode_answer(content)


def test_query_validation():
    q = _query()
    validate_query(q, n_critic=2, num_classes=10)
    with pytest.raises(PayloadError, match="fake has shape"):
        validate_query(q, n_critic=3, num_classes=10)
    q.labels[0] = 12
    with pytest.raises(PayloadError, match="labels"):
        validate_query(q, n_critic=2, num_classes=10)


def test_wire_dtype_is_lossy_only_where_asked():
    x = np.random.default_rng(1).normal(size=(4, 1, 28, 28)).astype(np.float32)
    assert to_wire(x, "float32").dtype == np.float32
    assert np.array_equal(to_wire(x, "float32"), x)
    half = to_wire(x, "float16")
    assert half.dtype == np.float16 and np.allclose(half, x, atol=1e-2)


def test_wire_bytes_cover_payload_and_halve_with_float16():
    q = _query(B=32, n_critic=5)
    m32 = Message(encode_query(q), dst_node_id=7, message_type="train.gswgan")
    q.fake = to_wire(q.fake, "float16")
    m16 = Message(encode_query(q), dst_node_id=7, message_type="train.gswgan")
    b32, b16 = message_wire_bytes(m32), message_wire_bytes(m16)
    raw = 6 * 32 * 784
    assert raw * 4 < b32.payload < raw * 4 + 4096   # the float32 samples plus small headers
    assert raw * 2 < b16.payload < raw * 2 + 4096
    assert 100 < b32.envelope < 2000
    # Counting is a pure function of the message: same message, same count.
    assert message_wire_bytes(m32) == b32
