"""Payloads exchanged between server and clients, their wire encodings, and their validation.

The payloads are plain dataclasses of numpy arrays and scalars so they can travel over any
transport (Flower messages in simulation, the project's own stream in deployment). Everything that
arrives from the other side is validated here before it touches a model: a wrong shape or dtype, a
NaN, an oversized or corrupt payload becomes a ``PayloadError`` naming the field and the cause,
never a crash deep inside autograd.

Wire encodings (the "lean wire", DESIGN.md §5), each named by a tag that travels with the array:

- ``uint8``: generated samples quantized to 8-bit levels ``round(255 x)``. The generator's output
  is public, so quantizing it is no privacy question; the client computes its gradient w.r.t. the
  dequantized image it actually used.
- ``float16``: noisy gradients, cast only *after* the client added its noise (post-processing, so
  the privacy ledger is untouched); a gradient that would overflow float16 travels as float32.
- ``float32``: exact (the opt-out for both).
- ``<dtype>+deflate``: the array's bytes, byte-shuffled (all first bytes of each element, then all
  second bytes, ...: float16 sign/exponent bytes compress, mantissa bytes hardly) and deflated at
  level 1, sent as a 1-D uint8 array. Lossless; used only when it is smaller than the raw array.
  The receiver inflates at most the expected size, so a decompression bomb is a ``PayloadError``.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass, field

import numpy as np

WIRE_NUMPY = {"float32": np.float32, "float16": np.float16}
SAMPLE_ENCODINGS = ("uint8", "float32")  # what the generated samples may travel as
GRAD_ENCODINGS = ("float16", "float32")  # what the noisy gradients may travel as
DEFLATE = "deflate"
DEFLATE_LEVEL = 1  # level 1 gets nearly all of level 9's gain on these arrays, several times faster
PIXEL_LEVELS = 255
IMAGE_SHAPE = (1, 28, 28)
# A generous upper bound on one answer: B x 784 float32 for B up to 4096.
MAX_ANSWER_BYTES = 4096 * 28 * 28 * 4


class PayloadError(ValueError):
    """A payload from the other side is malformed; the message names the field and the problem."""


@dataclass
class GsQuery:
    """Server -> client, one generator step of GS-WGAN.

    ``fake`` holds the generated images in the wire encoding ``fake_encoding`` ("" = a raw array of
    its own dtype): (n_critic + 1) * B of them with fresh critic fakes (the first n_critic batches
    train the client's discriminator, the last batch is the one whose generator gradient is
    returned), or only the query batch of B when the client reuses fakes for its critic steps.
    ``labels`` are drawn uniformly by the server (never from a client's label histogram).
    """

    step: int
    batch_size: int
    fake: np.ndarray
    labels: np.ndarray
    fake_encoding: str = ""

    def decoded(self, *, n_critic: int, num_classes: int, critic_fakes: str = "fresh") -> GsQuery:
        """The query with its samples as float32 images and its labels as int64, validated against
        what the client's configuration expects (``validate_query``)."""
        fakes, labels = validate_query(self, n_critic=n_critic, num_classes=num_classes, critic_fakes=critic_fakes)
        return dataclasses.replace(self, fake=fakes, labels=labels, fake_encoding="")


@dataclass
class GsAnswer:
    """Client -> server: the sanitized per-sample gradients of one query, or a refusal.

    ``grad`` is in the wire encoding ``grad_encoding`` ("" = a raw array of its own dtype).
    ``noise_multiplier`` is the Gaussian mechanism's the client ran (its ledger entry): the server
    charges the smaller of it and what it asked for. Who answered is the node the reply came from,
    never a field of the payload.
    """

    step: int
    refused: bool = False
    reason: str = ""
    grad: np.ndarray | None = None
    noise_multiplier: float = 0.0
    stats: dict[str, float] = field(default_factory=dict)
    grad_encoding: str = ""

    def decoded(self, *, batch_size: int, step: int, coords: int = 0) -> GsAnswer:
        """The answer with its gradients as float32 (None for a refusal), validated against the
        query it answers (``validate_answer``); ``coords`` > 0: gradients of that many coordinates
        per sample (``--grad-dct``) instead of pixels."""
        grad = validate_answer(self, batch_size=batch_size, step=step, coords=coords)
        return dataclasses.replace(self, grad=grad, grad_encoding="")


# --- casts ----------------------------------------------------------------------------------------
def to_wire(array: np.ndarray, wire_dtype: str) -> np.ndarray:
    """Cast a float array to the wire dtype (call only on already-sanitized data)."""
    return np.ascontiguousarray(array, dtype=WIRE_NUMPY[wire_dtype])


def from_wire(array: np.ndarray) -> np.ndarray:
    return np.asarray(array, dtype=np.float32)


def quantize_samples(samples: np.ndarray) -> np.ndarray:
    """[0, 1] images -> uint8 levels ``round(255 x)`` (clipped: a sigmoid output never needs it)."""
    return np.clip(np.rint(np.asarray(samples, np.float32) * PIXEL_LEVELS), 0, PIXEL_LEVELS).astype(np.uint8)


def dequantize_samples(levels: np.ndarray) -> np.ndarray:
    """uint8 levels -> the float32 images the client trains on and differentiates at."""
    return levels.astype(np.float32) / PIXEL_LEVELS


def label_dtype(num_classes: int) -> np.dtype:
    """The smallest unsigned integer dtype that holds every label (uint8 up to 256 classes)."""
    return np.min_scalar_type(max(num_classes - 1, 0))


def samples_per_query(batch_size: int, n_critic: int, critic_fakes: str) -> int:
    """Samples one query carries: (n_critic + 1) * B with fresh critic fakes, else the B queried."""
    return (n_critic + 1) * batch_size if critic_fakes == "fresh" else batch_size


# --- encoding -------------------------------------------------------------------------------------
def encode_samples(samples: np.ndarray, encoding: str, *, compress: bool) -> tuple[np.ndarray, str]:
    """Generated samples -> (wire array, its encoding tag)."""
    if encoding not in SAMPLE_ENCODINGS:
        raise ValueError(f"unknown sample encoding {encoding!r}, expected one of {SAMPLE_ENCODINGS}")
    wire = quantize_samples(samples) if encoding == "uint8" else to_wire(samples, "float32")
    return pack_array(wire, compress=compress)


def encode_grads(noisy: np.ndarray, wire_dtype: str, *, compress: bool) -> tuple[np.ndarray, str]:
    """Already-noised gradients -> (wire array, its encoding tag); every step here is post-processing.

    A value beyond float16's range would become inf and the server would reject the answer, so such
    an answer travels as float32 instead (the choice depends on the released values only).
    """
    with np.errstate(over="ignore"):
        wire = to_wire(noisy, wire_dtype)
    if not np.all(np.isfinite(wire)):
        wire = to_wire(noisy, "float32")
    return pack_array(wire, compress=compress)


def encode_labels(labels: np.ndarray, num_classes: int) -> np.ndarray:
    return np.ascontiguousarray(labels, dtype=label_dtype(num_classes))


def pack_array(wire: np.ndarray, *, compress: bool) -> tuple[np.ndarray, str]:
    """Deflate ``wire`` when asked and when that is smaller; returns (array to send, tag)."""
    tag = wire.dtype.name
    if compress:
        blob = zlib.compress(_shuffle_bytes(wire), DEFLATE_LEVEL)
        if len(blob) < wire.nbytes:
            return np.frombuffer(blob, np.uint8), f"{tag}+{DEFLATE}"
    return np.ascontiguousarray(wire), tag


def _shuffle_bytes(array: np.ndarray) -> bytes:
    """Little-endian bytes grouped by position within the element (identity for 1-byte dtypes)."""
    little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return np.frombuffer(little.tobytes(), np.uint8).reshape(-1, array.dtype.itemsize).T.tobytes()


def _unshuffle_bytes(raw: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    planes = np.frombuffer(raw, np.uint8).reshape(dtype.itemsize, -1)
    little = dtype.newbyteorder("<")
    return np.ascontiguousarray(planes.T).view(little).reshape(shape).astype(dtype.newbyteorder("="))


# --- decoding and validation ----------------------------------------------------------------------
def unpack_array(
    name: str, data: np.ndarray, encoding: str, *, shape: tuple[int, ...], allowed: tuple[str, ...]
) -> np.ndarray:
    """Wire array + tag -> the array in the tagged dtype and the expected shape, or PayloadError."""
    dtype_name, _, compression = (encoding or np.asarray(data).dtype.name).partition("+")
    if dtype_name not in allowed or compression not in ("", DEFLATE):
        raise PayloadError(
            f"{name} has unknown encoding {encoding or dtype_name!r}; expected one of "
            f"{', '.join(allowed)}, optionally +{DEFLATE}"
        )
    dtype = np.dtype(dtype_name)
    if compression:
        return _inflate(name, data, dtype, shape)
    if data.dtype != dtype:
        raise PayloadError(f"{name} has dtype {data.dtype}, its encoding says {dtype_name}")
    _check_shape(name, data, shape)
    return data


def _inflate(name: str, blob: np.ndarray, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Inflate at most the expected byte count: more is a decompression bomb, less is truncation."""
    expected = int(np.prod(shape)) * dtype.itemsize
    if blob.dtype != np.uint8 or blob.ndim != 1:
        raise PayloadError(
            f"{name}: a {DEFLATE} payload must be a 1-D uint8 array, got {blob.dtype} of shape {tuple(blob.shape)}"
        )
    if blob.size > expected:
        raise PayloadError(
            f"{name}: compressed payload of {blob.size} bytes exceeds the {expected} bytes of the raw array (oversized)"
        )
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(blob.tobytes(), expected + 1)
    except zlib.error as err:
        raise PayloadError(f"{name}: corrupt {DEFLATE} stream ({err})") from err
    if len(raw) > expected or inflater.unconsumed_tail:
        raise PayloadError(
            f"{name}: {DEFLATE} payload inflates beyond the expected {expected} bytes "
            "(rejected as a decompression bomb)"
        )
    if len(raw) < expected or not inflater.eof or inflater.unused_data:
        raise PayloadError(
            f"{name}: {DEFLATE} payload inflates to {len(raw)} bytes, expected exactly "
            f"{expected} in one complete stream (truncated or trailing data)"
        )
    return _unshuffle_bytes(raw, dtype, shape)


def decode_samples(data: np.ndarray, encoding: str, *, count: int) -> np.ndarray:
    """Wire samples -> float32 images (count, 1, 28, 28), validated."""
    array = unpack_array("fake", data, encoding, shape=(count, *IMAGE_SHAPE), allowed=SAMPLE_ENCODINGS)
    if array.dtype == np.uint8:
        return dequantize_samples(array)
    _check_finite("fake", array)
    return from_wire(array)


def decode_grads(data: np.ndarray, encoding: str, *, batch_size: int, coords: int = 0) -> np.ndarray:
    """Wire gradients -> float32 (B, 1, 28, 28), or (B, coords) when ``coords`` > 0, validated."""
    if data.nbytes > MAX_ANSWER_BYTES:
        raise PayloadError(f"grad payload of {data.nbytes} bytes exceeds {MAX_ANSWER_BYTES}")
    shape = (batch_size, coords) if coords else (batch_size, *IMAGE_SHAPE)
    array = unpack_array("grad", data, encoding, shape=shape, allowed=GRAD_ENCODINGS)
    _check_finite("grad", array)
    return from_wire(array)


def decode_labels(labels: np.ndarray, *, count: int, num_classes: int) -> np.ndarray:
    """Wire labels (any integer dtype) -> int64, validated."""
    if labels.dtype.kind not in "iu":
        raise PayloadError(f"labels have dtype {labels.dtype}, expected an integer dtype")
    _check_shape("labels", labels, (count,))
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise PayloadError(f"labels must lie in [0, {num_classes}), got range [{labels.min()}, {labels.max()}]")
    return labels.astype(np.int64)


def validate_query(
    query: GsQuery, *, n_critic: int, num_classes: int, critic_fakes: str = "fresh"
) -> tuple[np.ndarray, np.ndarray]:
    """Check a query against what the client's configuration expects.

    Returns the decoded (float32 samples, int64 labels), so that the client trains and
    differentiates at exactly the images the server encoded.
    """
    count = samples_per_query(query.batch_size, n_critic, critic_fakes)
    fakes = decode_samples(query.fake, query.fake_encoding, count=count)
    return fakes, decode_labels(query.labels, count=count, num_classes=num_classes)


def validate_answer(answer: GsAnswer, *, batch_size: int, step: int, coords: int = 0) -> np.ndarray | None:
    """Check a client's answer before the server backpropagates it through G.

    Returns the decoded float32 gradients (None for a refusal).
    """
    if answer.step != step:
        raise PayloadError(f"answer is for step {answer.step}, expected step {step}")
    if answer.refused:
        return None
    if answer.grad is None:
        raise PayloadError("answer carries no 'grad' array")
    grad = decode_grads(answer.grad, answer.grad_encoding, batch_size=batch_size, coords=coords)
    if not answer.noise_multiplier >= 0:
        raise PayloadError(f"invalid privacy event: noise_multiplier={answer.noise_multiplier}")
    return grad


def _check_shape(name: str, array: np.ndarray, expected: tuple[int, ...]) -> None:
    if tuple(array.shape) != tuple(expected):
        raise PayloadError(f"{name} has shape {tuple(array.shape)}, expected {tuple(expected)}")


def _check_finite(name: str, array: np.ndarray) -> None:
    if not np.all(np.isfinite(array)):
        raise PayloadError(f"{name} contains NaN or infinite values")
