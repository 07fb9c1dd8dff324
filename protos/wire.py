"""The wire layer, shared by server and client: payload dataclasses <-> Flower records, and bytes.

One generic codec (``encode``/``decode``) serves every message of ``common/messages.py`` and the
methods' slices. A payload field travels by its annotation: scalars in the ``scalars``
ConfigRecord (None is left out, and only a field that may be None may be missing), numpy arrays as
raw little-endian bytes in the ``arrays`` ArrayRecord, a torch state dict (``StateDict``) as its own
ArrayRecord, statistics (``Stats``) as their own ConfigRecord when not empty. ``decode`` checks
every field's presence and type, and, given what the message must match, the payload's own
``decoded(**expect)``: anything wrong is a ``PayloadError``.

Byte counting reproduces what Flower 1.41's HTTP runtime sends for a message: the message proto
without content (the envelope, with the 64-hex-digit object id as message id, as the deployment
runtime sets it), its object tree, and every nested object (records, arrays, array chunks) as
``deflate()`` returns it. The simulation never serializes, so this is computed rather than observed
there; the deployment tests cross-check it against the SuperLink's own counters.

This module imports flwr and ``common`` (never the other way): server and client both use it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.app.message import make_message
from flwr.common.serde import message_to_proto
from flwr.supercore.inflatable.inflatable_object import (
    get_all_nested_objects,
    get_object_tree,
    no_object_id_recompute,
)

from common.io.codec import PayloadError

SCALARS_KEY = "scalars"
ARRAYS_KEY = "arrays"
SUPERLINK_NODE_ID = 1  # Flower's fixed node id of the server side
WIDEST_ID = 2**64 - 1
RAW_STYPE = "raw"  # Array.data is the bare C-order little-endian bytes; dtype and shape are in the Array
NUMPY_STYPE = "numpy.ndarray"  # Flower's own serialization: an .npy file (header included)
P = TypeVar("P")


# --- the generic codec ----------------------------------------------------------------------------
@functools.cache
def _kinds(cls: type) -> dict[str, tuple[str, type]]:
    """field -> (how it travels, its Python type), from the dataclass's annotations."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        base = args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) else hint
        if base is np.ndarray:
            out[name] = ("array", base)
        elif typing.get_origin(base) is dict:
            out[name] = ("state" if typing.get_args(base)[1] is torch.Tensor else "stats", base)
        elif base in (int, float, str, bool):
            out[name] = ("scalar", base)
        else:
            raise TypeError(f"{cls.__name__}.{name}: {hint} cannot travel on the wire")
    return out


def encode(payload: Any) -> RecordDict:
    """A payload dataclass as a RecordDict (see the module docstring for where each field goes)."""
    scalars: dict[str, Any] = {}
    arrays: dict[str, Array] = {}
    records: dict[str, Any] = {}
    for name, (kind, _) in _kinds(type(payload)).items():
        value = getattr(payload, name)
        if value is None:
            continue
        if kind == "scalar":
            scalars[name] = value
        elif kind == "array":
            arrays[name] = raw_array(value)
        elif kind == "state":
            records[name] = ArrayRecord(value)
        elif value:  # stats
            records[name] = ConfigRecord({k: float(v) for k, v in value.items()})
    content = RecordDict({SCALARS_KEY: ConfigRecord(scalars)})
    if arrays:
        content[ARRAYS_KEY] = ArrayRecord(arrays)
    for name, record in records.items():
        content[name] = record
    return content


def decode(cls: type[P], content: RecordDict | None, **expect: Any) -> P:
    """The payload ``cls`` from ``content``, checked field by field; given ``expect`` (what the caller
    knows the message must match: the step, the batch size), also checked and decoded by
    ``cls.decoded(**expect)``. ``PayloadError`` names what is wrong."""
    if content is None or SCALARS_KEY not in content:
        raise PayloadError(f"{cls.__name__}: the message lacks the {SCALARS_KEY!r} record")
    try:
        scalars = dict(content.config_records[SCALARS_KEY])
        arrays = (
            {n: array_to_numpy(n, a) for n, a in content.array_records[ARRAYS_KEY].items()}
            if ARRAYS_KEY in content
            else {}
        )
        kwargs = {
            name: _field(cls, name, kind, py, content, scalars, arrays) for name, (kind, py) in _kinds(cls).items()
        }
        kwargs = {k: v for k, v in kwargs.items() if v is not dataclasses.MISSING}
        payload = cls(**kwargs)
    except PayloadError:
        raise
    except Exception as err:  # noqa: BLE001 - at the boundary, any failure to decode is a malformed message
        raise PayloadError(f"{cls.__name__}: malformed message ({type(err).__name__}: {str(err)[:200]})") from err
    return payload.decoded(**expect) if expect else payload


def _field(cls: type, name: str, kind: str, py: type, content: RecordDict, scalars: dict, arrays: dict) -> Any:
    if kind == "scalar":
        value = scalars.get(name, dataclasses.MISSING)
        value = value if value is dataclasses.MISSING else _scalar(cls, name, py, value)
    elif kind == "array":
        value = arrays.get(name, dataclasses.MISSING)
    elif kind == "state":
        value = content.array_records[name].to_torch_state_dict() if name in content else dataclasses.MISSING
    else:
        value = {k: float(v) for k, v in content.config_records[name].items()} if name in content else {}
    if value is dataclasses.MISSING and _required(cls, name):
        raise PayloadError(f"{cls.__name__} lacks field {name!r}")
    return value


@functools.cache
def _required(cls: type, name: str) -> bool:
    """Every field must be on the wire but those that may be None (left out when they are) and
    statistics (left out when empty): a default is for building a payload, never for a missing field."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default is not None and f.default_factory is dataclasses.MISSING


def _scalar(cls: type, name: str, py: type, value: Any) -> Any:
    """A scalar of the annotated type; a float field takes an int, nothing else is converted."""
    if py is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, py) or (py is int and isinstance(value, bool)):
        raise PayloadError(f"{cls.__name__}.{name} must be {py.__name__}, got {type(value).__name__}")
    return value


# --- arrays without Flower's .npy header ------------------------------------------------------------
def raw_array(value: np.ndarray) -> Array:
    """A Flower Array holding the bare little-endian bytes (stype ``raw``).

    Flower's default numpy serialization prepends a 128-byte .npy header that repeats the dtype
    and shape the Array already carries; on GS-WGAN's many small messages that is pure overhead.
    """
    little = np.ascontiguousarray(value, dtype=np.asarray(value).dtype.newbyteorder("<"))
    return Array(dtype=little.dtype.name, shape=tuple(little.shape), stype=RAW_STYPE, data=little.tobytes())


def array_to_numpy(name: str, array: Array) -> np.ndarray:
    """Array -> numpy for both serializations (``raw`` and Flower's .npy); PayloadError if malformed."""
    if array.stype == NUMPY_STYPE:
        try:  # Flower's .npy serialization (np.load without pickles)
            value = array.numpy()
        except Exception as err:  # noqa: BLE001 - whatever the bytes make np.load raise, the array is malformed
            raise PayloadError(f"{name} is not a valid .npy array ({type(err).__name__}: {err})") from err
        if value.dtype.kind not in "biuf":
            raise PayloadError(f"{name} has dtype {value.dtype}; only numeric arrays are accepted")
        return value
    if array.stype != RAW_STYPE:
        raise PayloadError(
            f"{name} has unknown serialization {array.stype!r} (expected {RAW_STYPE!r} or {NUMPY_STYPE!r})"
        )
    try:
        dtype = np.dtype(array.dtype).newbyteorder("<")
    except (TypeError, ValueError) as err:
        raise PayloadError(f"{name} has unknown dtype {array.dtype!r}") from err
    if dtype.kind not in "biuf":
        raise PayloadError(f"{name} has dtype {array.dtype!r}; only numeric arrays are accepted")
    shape = tuple(array.shape)
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        raise PayloadError(f"{name} has an invalid shape {shape}")
    expected = math.prod(shape) * dtype.itemsize  # Python integers: a lying shape cannot overflow
    if len(array.data) != expected:
        raise PayloadError(
            f"{name} carries {len(array.data)} bytes, its shape {tuple(array.shape)} and dtype "
            f"{array.dtype} need {expected}"
        )
    # A writable native-order copy: torch.from_numpy warns on read-only buffers.
    return np.frombuffer(array.data, dtype).reshape(array.shape).astype(dtype.newbyteorder("="))


# --- messages and their bytes ---------------------------------------------------------------------
@dataclass(frozen=True)
class WireBytes:
    """Bytes of one serialized message: payload objects and envelope (metadata + object tree)."""

    payload: int
    envelope: int

    @property
    def total(self) -> int:
        return self.payload + self.envelope


def message_wire_bytes(message: Message) -> WireBytes:
    """Bytes Flower's runtime puts on the wire for ``message`` (HTTP framing not included).

    The envelope is normalised to what the sender transmits in a deployment, whichever runtime
    carried the message here: message ids are 64-hex-digit object ids (the simulation uses shorter
    UUIDs), run and node ids are counted at their widest, and ``delivered_at``, stamped by the
    receiving side, is not counted.
    """
    metadata = copy.copy(message.metadata)
    fields = metadata.__dict__
    fields["_message_id"] = "0" * 64
    if fields.get("_reply_to_message_id"):
        fields["_reply_to_message_id"] = "0" * 64
    fields["_delivered_at"] = ""
    # Run, node and task ids are random 64-bit integers in a deployment, so their varints vary by
    # a byte or two from run to run; count every id at its widest (10 bytes) so that counts are
    # identical across runtimes and never below what was sent. The SuperLink's node id (1) is fixed.
    for key in ("_run_id", "_src_node_id", "_dst_node_id", "_src_task_id", "_dst_task_id"):
        fixed = (None, 0, SUPERLINK_NODE_ID) if key.endswith("node_id") else (None, 0)
        if fields.get(key) not in fixed:
            fields[key] = WIDEST_ID
    if not message.has_content():  # an error reply: its envelope carries the error, no payload objects
        return WireBytes(
            payload=0, envelope=message_to_proto(make_message(metadata=metadata, error=message.error)).ByteSize()
        )
    normalized = make_message(metadata=metadata, content=message.content)
    # Each object's id (the SHA-256 of its deflated bytes) computed once for the whole count, as
    # Flower's own runtime does when it sends a message: recomputed at every level, the ids of a
    # secure sum's round of 1,000 messages took more time than the round's cryptography.
    with no_object_id_recompute():
        objects = get_all_nested_objects(normalized)
        payload = sum(len(obj.deflate()) for obj in objects.values())
        tree = get_object_tree(normalized).ByteSize()
    envelope_msg = make_message(metadata=metadata, content=RecordDict())
    envelope = message_to_proto(envelope_msg).ByteSize() + tree
    return WireBytes(payload=payload, envelope=envelope)


def runtime_message(content: RecordDict, dst_node_id: int, message_type: str) -> Message:
    """A request as Flower's runtime hands it to a ClientApp: with its message id (the content's
    object id) set, so that replies can name it. For transports that bypass the runtime."""
    message = Message(content, dst_node_id=dst_node_id, message_type=message_type)
    message.metadata.__dict__["_message_id"] = message.object_id
    return message


def reply(payload: Any, request: Message) -> Message:
    """The ClientApp's reply to ``request`` carrying ``payload``."""
    return Message(encode(payload), reply_to=request)
