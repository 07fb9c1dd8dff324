"""Flower adapter of the codec: payloads <-> RecordDict, and exact byte counting of Flower messages.

Shared by the ServerApp and the ClientApp (``common/`` may not import flwr). Byte counting
reproduces what Flower 1.41's HTTP runtime sends for a message: the message proto without content
(the envelope, with the 64-hex-digit object id as message id, as the deployment runtime sets it),
its object tree, and every nested object (records, arrays, array chunks) as ``deflate()`` returns
it. The simulation never serializes, so this is computed rather than observed there; the deployment
issue cross-checks it against the SuperLink's own counters.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.app.message import make_message
from flwr.common.serde import message_to_proto
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree

from common.codec import GsAnswer, GsQuery, PayloadError

ARRAYS_KEY = "arrays"
SCALARS_KEY = "scalars"
SETUP_KEY = "setup"
SUPERLINK_NODE_ID = 1  # Flower's fixed node id of the server side
WIDEST_ID = 2**64 - 1
STATS_KEY = "stats"
RAW_STYPE = "raw"  # Array.data is the bare C-order little-endian bytes; dtype and shape are in the Array


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
        return WireBytes(payload=0, envelope=message_to_proto(make_message(metadata=metadata,
                                                                           error=message.error)).ByteSize())
    normalized = make_message(metadata=metadata, content=message.content)
    objects = get_all_nested_objects(normalized)
    payload = sum(len(obj.deflate()) for obj in objects.values())
    envelope_msg = make_message(metadata=metadata, content=RecordDict())
    envelope = message_to_proto(envelope_msg).ByteSize() + get_object_tree(normalized).ByteSize()
    return WireBytes(payload=payload, envelope=envelope)


def runtime_message(content: RecordDict, dst_node_id: int, message_type: str) -> Message:
    """A request as Flower's runtime hands it to a ClientApp: with its message id (the content's
    object id) set, so that replies can name it. For transports that bypass the runtime."""
    message = Message(content, dst_node_id=dst_node_id, message_type=message_type)
    message.metadata.__dict__["_message_id"] = message.object_id
    return message


def encode_records(arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> RecordDict:
    content = RecordDict({SCALARS_KEY: ConfigRecord(dict(scalars))})
    if arrays:
        content[ARRAYS_KEY] = ArrayRecord({name: raw_array(value) for name, value in arrays.items()})
    return content


def decode_records(content: RecordDict) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    if SCALARS_KEY not in content:
        raise PayloadError(f"message lacks the {SCALARS_KEY!r} record")
    arrays = {}
    if ARRAYS_KEY in content:
        arrays = {name: array_to_numpy(name, arr) for name, arr in content.array_records[ARRAYS_KEY].items()}
    return arrays, dict(content.config_records[SCALARS_KEY])


def raw_array(value: np.ndarray) -> Array:
    """A Flower Array holding the bare little-endian bytes (stype ``raw``).

    Flower's default numpy serialization prepends a 128-byte .npy header that repeats the dtype
    and shape the Array already carries; on GS-WGAN's many small messages that is pure overhead.
    """
    little = np.ascontiguousarray(value, dtype=np.asarray(value).dtype.newbyteorder("<"))
    return Array(dtype=little.dtype.name, shape=tuple(little.shape), stype=RAW_STYPE, data=little.tobytes())


def array_to_numpy(name: str, array: Array) -> np.ndarray:
    """Array -> numpy for both serializations (``raw`` and Flower's .npy); PayloadError if malformed."""
    if array.stype != RAW_STYPE:
        return array.numpy()
    try:
        dtype = np.dtype(array.dtype).newbyteorder("<")
    except TypeError as err:
        raise PayloadError(f"{name} has unknown dtype {array.dtype!r}") from err
    if dtype.kind not in "biuf":
        raise PayloadError(f"{name} has dtype {array.dtype!r}; only numeric arrays are accepted")
    expected = int(np.prod(array.shape, dtype=np.int64)) * dtype.itemsize
    if len(array.data) != expected:
        raise PayloadError(f"{name} carries {len(array.data)} bytes, its shape {tuple(array.shape)} and dtype "
                           f"{array.dtype} need {expected}")
    # A writable native-order copy: torch.from_numpy warns on read-only buffers.
    return np.frombuffer(array.data, dtype).reshape(array.shape).astype(dtype.newbyteorder("="))


def encode_query(query: GsQuery, setup: dict[str, Any] | None = None) -> RecordDict:
    content = encode_records(query.arrays(), query.scalars())
    if setup is not None:
        content[SETUP_KEY] = ConfigRecord(setup)
    return content


def decode_query(content: RecordDict) -> tuple[GsQuery, dict[str, Any] | None]:
    arrays, scalars = decode_records(content)
    try:
        query = GsQuery(
            step=int(scalars["step"]),
            batch_size=int(scalars["batch_size"]),
            fake=arrays["fake"],
            labels=arrays["labels"],
            fake_encoding=str(scalars.get("fake_encoding", "")),
        )
    except KeyError as err:
        raise PayloadError(f"query lacks field {err}") from err
    setup = dict(content.config_records[SETUP_KEY]) if SETUP_KEY in content else None
    return query, setup


def encode_answer(answer: GsAnswer) -> RecordDict:
    content = encode_records(answer.arrays(), answer.scalars())
    if answer.stats:
        content[STATS_KEY] = ConfigRecord({k: float(v) for k, v in answer.stats.items()})
    return content


def decode_answer(content: RecordDict) -> GsAnswer:
    arrays, s = decode_records(content)
    stats = dict(content.config_records[STATS_KEY]) if STATS_KEY in content else {}
    try:
        return GsAnswer(
            step=int(s["step"]),
            client_id=int(s["client_id"]),
            refused=bool(s["refused"]),
            reason=str(s["reason"]),
            grad=arrays.get("grad"),
            noise_multiplier=float(s["noise_multiplier"]),
            sample_rate=float(s["sample_rate"]),
            queries=int(s["queries"]),
            epsilon=float(s["epsilon"]),
            stats={k: float(v) for k, v in stats.items()},
            grad_encoding=str(s.get("grad_encoding", "")),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise PayloadError(f"malformed answer: {err!r}") from err
