"""GS-WGAN's payloads and the wire encodings of their arrays: round trips, bad input, exact byte counts."""

import zlib

import numpy as np
import pytest
from flwr.app import Message
from flwr.supercore.task_identity import TaskIdentity

from common.io.codec import (
    PayloadError,
    decode_grads,
    decode_labels,
    decode_samples,
    encode_grads,
    encode_labels,
    encode_samples,
    label_dtype,
    quantize_samples,
    to_wire,
)
from common.methods.gswgan.messages import GsAnswer, GsQuery, validate_answer, validate_query
from protos import wire
from protos.wire import message_wire_bytes


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0


def _query(B=4, n_critic=2, step=3):
    rng = np.random.default_rng(0)
    return GsQuery(
        step=step,
        batch_size=B,
        fake=rng.random(((n_critic + 1) * B, 1, 28, 28), dtype=np.float32),
        labels=rng.integers(0, 10, (n_critic + 1) * B),
    )


def _answer(B=4, step=3, grad=None):
    grad = np.zeros((B, 1, 28, 28), np.float32) if grad is None else grad
    return GsAnswer(step=step, grad=grad, noise_multiplier=0.2, stats={"wasserstein": 0.1})


def test_query_round_trip():
    q = _query()
    got = wire.decode(GsQuery, wire.encode(q))
    assert got.step == q.step and got.batch_size == q.batch_size
    np.testing.assert_array_equal(got.fake, q.fake)
    np.testing.assert_array_equal(got.labels, q.labels)


def test_answer_round_trip_and_validation_inside_decode():
    a = _answer()
    got = wire.decode(GsAnswer, wire.encode(a))
    assert (got.step, got.noise_multiplier, got.stats) == (3, 0.2, {"wasserstein": 0.1})
    checked = wire.decode(GsAnswer, wire.encode(a), batch_size=4, step=3)
    assert checked.grad.dtype == np.float32 and checked.grad_encoding == ""
    with pytest.raises(PayloadError, match="step"):
        wire.decode(GsAnswer, wire.encode(a), batch_size=4, step=4)


@pytest.mark.parametrize(
    "bad, match",
    [
        (np.zeros((3, 1, 28, 28), np.float32), "shape"),
        (np.full((4, 1, 28, 28), np.nan, np.float32), "NaN"),
        (np.zeros((4096 + 1, 1, 28, 28), np.float32), "exceeds"),
    ],
)
def test_bad_answers_are_rejected_with_the_cause(bad, match):
    with pytest.raises(PayloadError, match=match):
        validate_answer(_answer(grad=bad), batch_size=4, step=3)


def test_wrong_step_and_missing_fields():
    with pytest.raises(PayloadError, match="step"):
        validate_answer(_answer(step=2), batch_size=4, step=3)
    content = wire.encode(_answer())
    del content.config_records["scalars"]["noise_multiplier"]
    with pytest.raises(PayloadError, match="lacks field 'noise_multiplier'"):
        wire.decode(GsAnswer, content)


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
    m32 = Message(wire.encode(q), dst_node_id=7, message_type="train.gswgan")
    q.fake = to_wire(q.fake, "float16")
    m16 = Message(wire.encode(q), dst_node_id=7, message_type="train.gswgan")
    b32, b16 = message_wire_bytes(m32), message_wire_bytes(m16)
    raw = 6 * 32 * 784
    assert raw * 4 < b32.payload < raw * 4 + 4096  # the float32 samples plus small headers
    assert raw * 2 < b16.payload < raw * 2 + 4096
    assert 100 < b32.envelope < 2000
    # Counting is a pure function of the message: same message, same count.
    assert message_wire_bytes(m32) == b32


# --- lean wire encodings ---------------------------------------------------------------------------
def _samples(n=12, seed=0):
    return np.random.default_rng(seed).random((n, 1, 28, 28), dtype=np.float32)


@pytest.mark.parametrize(
    "encoding, compress, tag",
    [
        ("float32", False, "float32"),
        ("float32", True, "float32+deflate"),
        ("uint8", False, "uint8"),
        ("uint8", True, "uint8+deflate"),
    ],
)
def test_sample_encodings_round_trip_through_the_flower_records(encoding, compress, tag):
    x = _samples()
    x[:, :, :14] = 0.0  # a blank half, so that deflate pays for float32 too
    fake, got_tag = encode_samples(x, encoding, compress=compress)
    assert got_tag == tag
    q = GsQuery(step=1, batch_size=4, fake=fake, fake_encoding=got_tag, labels=encode_labels(np.arange(12) % 10, 10))
    decoded, labels = validate_query(wire.decode(GsQuery, wire.encode(q)), n_critic=2, num_classes=10)
    assert decoded.dtype == np.float32 and decoded.shape == x.shape
    np.testing.assert_array_equal(labels, np.arange(12) % 10)
    if encoding == "float32":
        np.testing.assert_array_equal(decoded, x)
    else:  # 8-bit levels: within half a level, and exactly the dequantized levels
        assert np.abs(decoded - x).max() <= 0.5 / 255 + 1e-7
        np.testing.assert_array_equal(decoded, quantize_samples(x).astype(np.float32) / 255)


@pytest.mark.parametrize(
    "wire_dtype, compress", [("float32", False), ("float32", True), ("float16", False), ("float16", True)]
)
def test_grad_encodings_are_exactly_the_cast(wire_dtype, compress):
    g = np.random.default_rng(2).normal(scale=2.0, size=(4, 1, 28, 28)).astype(np.float32)
    grad, tag = encode_grads(g, wire_dtype, compress=compress)
    assert tag.startswith(wire_dtype) and tag.endswith("+deflate") == compress  # noise still deflates a bit
    answer = wire.decode(
        GsAnswer,
        wire.encode(GsAnswer(step=3, grad=grad, grad_encoding=tag, noise_multiplier=0.2)),
    )
    decoded = validate_answer(answer, batch_size=4, step=3)
    np.testing.assert_array_equal(decoded, g.astype(wire_dtype).astype(np.float32))


def test_float16_overflow_travels_as_float32():
    g = np.full((4, 1, 28, 28), 1e5, np.float32)
    grad, tag = encode_grads(g, "float16", compress=False)
    assert tag == "float32"
    np.testing.assert_array_equal(decode_grads(grad, tag, batch_size=4), g)


def test_labels_use_the_smallest_integer_dtype():
    assert label_dtype(10) == np.uint8 and label_dtype(256) == np.uint8 and label_dtype(257) == np.uint16
    with pytest.raises(PayloadError, match="integer"):
        decode_labels(np.zeros(4, np.float32), count=4, num_classes=10)


def _deflated(raw: bytes) -> np.ndarray:
    return np.frombuffer(zlib.compress(raw, 1), np.uint8)


EXPECTED = 4 * 784  # bytes of 4 uint8 samples


@pytest.mark.parametrize(
    "data, encoding, match",
    [
        (np.zeros((4, 1, 28, 28), np.uint8), "uint4", "unknown encoding"),
        (np.zeros((4, 1, 28, 28), np.uint8), "uint8+gzip", "unknown encoding"),
        (np.zeros((4, 1, 28, 28), np.float32), "uint8", "dtype float32"),
        (np.zeros((4, 1, 28, 28), np.float64), "", "unknown encoding 'float64'"),
        (np.zeros((3, 1, 28, 28), np.uint8), "uint8", "shape"),
        (np.full((4, 1, 28, 28), np.inf, np.float32), "float32", "NaN or infinite"),
        (np.zeros((2, 8), np.uint8), "uint8+deflate", "1-D uint8"),
        (np.zeros(EXPECTED + 1, np.uint8), "uint8+deflate", "oversized"),
        (np.frombuffer(b"not a deflate stream", np.uint8), "uint8+deflate", "corrupt"),
        (_deflated(bytes(EXPECTED))[:-6], "uint8+deflate", "truncated"),
        (_deflated(bytes(EXPECTED - 1)), "uint8+deflate", "truncated"),
        (np.concatenate([_deflated(bytes(EXPECTED)), np.ones(3, np.uint8)]), "uint8+deflate", "trailing"),
        (_deflated(bytes(EXPECTED + 1)), "uint8+deflate", "decompression bomb"),
    ],
)
def test_malformed_samples_are_rejected_with_the_cause(data, encoding, match):
    with pytest.raises(PayloadError, match=match):
        decode_samples(data, encoding, count=4)


def test_a_decompression_bomb_is_stopped_at_the_expected_size():
    bomb = np.frombuffer(zlib.compress(bytes(1 << 26), 9), np.uint8)  # 64 MiB of zeros in ~65 KB
    assert bomb.size < 192 * 784
    with pytest.raises(PayloadError, match="decompression bomb"):
        decode_samples(bomb, "uint8+deflate", count=192)


def test_bad_grad_encodings_are_rejected():
    with pytest.raises(PayloadError, match="unknown encoding 'uint8'"):
        decode_grads(np.zeros((4, 1, 28, 28), np.uint8), "uint8", batch_size=4)
    nan16 = np.full((4, 1, 28, 28), np.nan, np.float16)
    grad, tag = encode_grads(nan16.astype(np.float32), "float32", compress=True)
    with pytest.raises(PayloadError, match="NaN"):
        decode_grads(grad, tag, batch_size=4)
    with pytest.raises(PayloadError, match="decompression bomb"):
        decode_grads(_deflated(bytes(4 * 784 * 2 + 2)), "float16+deflate", batch_size=4)


def test_lean_payload_bytes_at_the_paper_batch():
    """uint8 samples + float16 gradients, uncompressed: the raw arrays plus a few KB of metadata."""
    B, n = 32, 5
    x = _samples((n + 1) * B)
    fake, tag = encode_samples(x, "uint8", compress=False)
    q = GsQuery(step=3, batch_size=B, fake=fake, fake_encoding=tag, labels=encode_labels(np.arange(len(x)) % 10, 10))
    g, gtag = encode_grads(
        np.random.default_rng(0).normal(size=(B, 1, 28, 28)).astype(np.float32), "float16", compress=False
    )
    down = message_wire_bytes(Message(wire.encode(q), dst_node_id=7, message_type="train.gswgan"))
    answer = GsAnswer(step=3, grad=g, grad_encoding=gtag, noise_multiplier=0.2)
    up = message_wire_bytes(Message(wire.encode(answer), dst_node_id=7, message_type="train.gswgan"))
    raw_down, raw_up = (n + 1) * B * 785, B * 784 * 2
    assert raw_down < down.total < raw_down + 2500
    assert raw_up < up.total < raw_up + 2500
