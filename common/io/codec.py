"""Wire encodings of arrays, and their validation.

Payloads (``common/messages.py``, each method's ``messages.py``) are plain dataclasses of numpy
arrays and scalars so they can travel over any transport. Every array that arrives from the other
side is decoded and validated here before it touches a model: a wrong shape or dtype, a NaN, an
oversized or corrupt payload becomes a ``PayloadError`` naming the field and the cause, never a
crash deep inside autograd.

Encodings (the "lean wire", docs/methods/gswgan.md), each named by a tag that travels with the array:

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

import zlib

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


def _check_shape(name: str, array: np.ndarray, expected: tuple[int, ...]) -> None:
    if tuple(array.shape) != tuple(expected):
        raise PayloadError(f"{name} has shape {tuple(array.shape)}, expected {tuple(expected)}")


def _check_finite(name: str, array: np.ndarray) -> None:
    if not np.all(np.isfinite(array)):
        raise PayloadError(f"{name} contains NaN or infinite values")
