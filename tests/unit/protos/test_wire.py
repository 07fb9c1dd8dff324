"""The wire layer's generic codec: every kind of field, what must be there, what it refuses."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from common.io.codec import PayloadError
from common.messages import HelloReply, StateDict, Stats
from common.methods import catalogue
from protos import wire


@dataclass
class Sample:
    step: int
    name: str
    rate: float
    flag: bool
    grid: np.ndarray
    weights: StateDict
    maybe: int | None = None
    extra: np.ndarray | None = None
    stats: Stats = field(default_factory=dict)


def _sample(**changes) -> Sample:
    base = dict(
        step=3,
        name="n",
        rate=0.5,
        flag=True,
        grid=np.arange(6, dtype=np.float16).reshape(2, 3),
        weights={"w": torch.ones(2, 2)},
    )
    return Sample(**{**base, **changes})


@dataclass
class Grid:
    x: np.ndarray


def test_every_kind_of_field_round_trips():
    got = wire.decode(Sample, wire.encode(_sample(stats={"loss": 1.5}, maybe=7)))
    assert (got.step, got.name, got.rate, got.flag, got.maybe, got.stats) == (3, "n", 0.5, True, 7, {"loss": 1.5})
    np.testing.assert_array_equal(got.grid, _sample().grid)
    assert got.grid.dtype == np.float16 and got.extra is None
    assert torch.equal(got.weights["w"], torch.ones(2, 2))


def test_none_and_empty_statistics_stay_off_the_wire():
    content = wire.encode(_sample())
    assert set(content.config_records["scalars"]) == {"step", "name", "rate", "flag"}
    assert "stats" not in content and set(content.array_records["arrays"]) == {"grid"}
    assert "weights" in content.array_records


def test_a_missing_field_a_wrong_type_and_a_missing_record_are_errors():
    content = wire.encode(_sample())
    del content.config_records["scalars"]["rate"]
    with pytest.raises(PayloadError, match="lacks field 'rate'"):
        wire.decode(Sample, content)
    content = wire.encode(_sample())
    content.config_records["scalars"]["step"] = "three"
    with pytest.raises(PayloadError, match="Sample.step must be int"):
        wire.decode(Sample, content)
    with pytest.raises(PayloadError, match="lacks the 'scalars' record"):
        wire.decode(Sample, RecordDict({"other": ConfigRecord({})}))
    with pytest.raises(PayloadError, match="lacks the 'scalars' record"):
        wire.decode(Sample, None)
    content = wire.encode(_sample())
    del content["weights"]
    with pytest.raises(PayloadError, match="lacks field 'weights'"):
        wire.decode(Sample, content)


def test_an_int_where_a_float_goes_is_taken_and_a_bool_is_no_int():
    content = wire.encode(_sample())
    content.config_records["scalars"]["rate"] = 2
    assert wire.decode(Sample, content).rate == 2.0
    content.config_records["scalars"]["step"] = True
    with pytest.raises(PayloadError, match="must be int"):
        wire.decode(Sample, content)


def test_every_message_in_the_catalogue_can_travel():
    for message_type, (request, reply) in catalogue().items():
        assert "." in message_type
        for cls in (request, reply):
            wire._kinds(cls)  # raises for a field that cannot travel
    assert wire.decode(HelloReply, wire.encode(HelloReply(client_id=4))) == HelloReply(client_id=4)


def test_arrays_travel_without_the_npy_header_and_bad_raw_arrays_are_rejected():
    x = np.arange(12, dtype=np.float16).reshape(3, 4)
    arr = wire.raw_array(x)
    assert arr.stype == "raw" and len(arr.data) == x.nbytes  # no 128-byte .npy header
    got = wire.decode(Grid, wire.encode(Grid(x=x))).x
    np.testing.assert_array_equal(got, x)
    assert got.dtype == np.float16 and got.flags.writeable
    legacy = wire.encode(Grid(x=x))
    legacy["arrays"] = ArrayRecord({"x": Array(x)})  # Flower's own .npy serialization still decodes
    np.testing.assert_array_equal(wire.decode(Grid, legacy).x, x)
    for bad, match in [
        (Array(dtype="float16", shape=(3, 5), stype="raw", data=x.tobytes()), "need"),
        (Array(dtype="nonsense", shape=(3, 4), stype="raw", data=x.tobytes()), "unknown dtype"),
        (Array(dtype="object", shape=(3,), stype="raw", data=b"\0" * 24), "numeric"),
    ]:
        content = wire.encode(Grid(x=x))
        content["arrays"] = ArrayRecord({"x": bad})
        with pytest.raises(PayloadError, match=match):
            wire.decode(Grid, content)


def test_lying_or_foreign_arrays_are_payload_errors_never_crashes():
    """Issue 14, item 3: a non-raw Array whose bytes are no .npy file, an unknown stype, a shape whose
    size overflows 64 bits, a negative dimension: each a PayloadError naming the array."""
    x = np.zeros((3, 4), np.float32)
    huge = (2**32, 2**32, 2**32)  # its size wraps to 0 in int64 arithmetic: an empty buffer "fits"
    for bad, match in [
        (Array(dtype="float32", shape=(3, 4), stype="numpy.ndarray", data=b"not an npy file"), "not a valid .npy"),
        (Array(dtype="float32", shape=(3, 4), stype="pickle", data=x.tobytes()), "unknown serialization"),
        (Array(dtype="float32", shape=huge, stype="raw", data=b""), "need"),
        (Array(dtype="float32", shape=(-3, -4), stype="raw", data=x.tobytes()), "invalid shape"),
    ]:
        content = wire.encode(Grid(x=x))
        content["arrays"] = ArrayRecord({"x": bad})
        with pytest.raises(PayloadError, match=match):
            wire.decode(Grid, content)
