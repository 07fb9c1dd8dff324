"""Fuzzing the boundaries (issue 14): whatever arrives — a message from a node, a config mapping, a
TOML file — decoding either succeeds or fails with the project's own error (``PayloadError`` for
messages, ``ConfigError`` for configuration), never with anything else."""

from __future__ import annotations

import dataclasses

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.config import ConfigError
from common.io.codec import PayloadError
from common.methods import ExperimentConfig, catalogue
from common.methods.gswgan.messages import GsAnswer
from protos import wire

CLASSES = sorted({cls for pair in catalogue().values() for cls in pair}, key=lambda c: c.__name__)
SCALARS = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.booleans(),
    st.binary(max_size=30),
)
DTYPES = st.sampled_from(["float32", "float16", "uint8", "int64", "object", "<U3", "nonsense", "", "V8", "complex64"])
ARRAYS = st.builds(
    lambda dtype, shape, stype, data: Array(dtype=dtype, shape=shape, stype=stype, data=data),
    DTYPES,
    st.lists(st.integers(-3, 2**40), max_size=4).map(tuple),
    st.sampled_from(["raw", "numpy.ndarray", "pickle", ""]),
    st.binary(max_size=200),
)


def _names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)] + ["junk"]


@st.composite
def contents(draw, cls: type) -> RecordDict:
    """A RecordDict shaped like a message of ``cls``: its field names (and others) with any values."""
    names = _names(cls)
    content = RecordDict()
    if draw(st.booleans()):
        keys = draw(st.lists(st.sampled_from(names), max_size=len(names), unique=True))
        content["scalars"] = ConfigRecord({k: draw(SCALARS) for k in keys})
    if draw(st.booleans()):
        keys = draw(st.lists(st.sampled_from(names), max_size=3, unique=True))
        content["arrays"] = ArrayRecord({k: draw(ARRAYS) for k in keys})
    if draw(st.booleans()):
        content[draw(st.sampled_from(names))] = ConfigRecord({"x": draw(SCALARS)})
    return content


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_message_decodes_or_is_a_payload_error(data):
    cls = data.draw(st.sampled_from(CLASSES))
    content = data.draw(contents(cls))
    try:
        wire.decode(cls, content)
    except PayloadError:
        pass


@settings(max_examples=60, deadline=None)
@given(content=contents(GsAnswer), batch=st.integers(1, 8), step=st.integers(0, 3), coords=st.sampled_from([0, 4]))
def test_any_answer_checked_against_its_query_is_valid_or_a_payload_error(content, batch, step, coords):
    try:
        answer = wire.decode(GsAnswer, content, batch_size=batch, step=step, coords=coords)
    except PayloadError:
        return
    if not answer.refused:
        assert answer.grad.dtype == np.float32 and answer.grad.shape[0] == batch


FIELDS = [f.name for f in dataclasses.fields(ExperimentConfig)]


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from([*FIELDS, "nonsense-key"]), SCALARS, max_size=6))
def test_any_config_mapping_builds_or_is_a_config_error(values):
    try:
        ExperimentConfig.from_mapping(values, source="fuzz")
    except ConfigError:
        pass


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_any_toml_file_loads_or_is_a_config_error(tmp_path, text):
    path = tmp_path / "fuzz.toml"
    path.write_bytes(text)
    try:
        ExperimentConfig.from_toml(path)
    except ConfigError:
        pass


def test_the_toml_cases_the_review_found_are_clear_errors(tmp_path):
    cases = {
        b"steps = 3\n[experiment]\nseed = 1\n": "outside the [experiment] table",
        b"experiment = 5\n": "must be a table",
        b"steps = 3\n# \xff\xfe\n": "not UTF-8",
    }
    for i, (text, words) in enumerate(cases.items()):
        path = tmp_path / f"c{i}.toml"
        path.write_bytes(text)
        try:
            ExperimentConfig.from_toml(path)
        except ConfigError as err:
            assert words in str(err) and str(path) in str(err)
        else:
            raise AssertionError(f"{text!r} was accepted")


def test_a_huge_num_clients_is_a_config_error_not_a_list_of_a_billion_ids():
    """The fuzz test found it in CI: num_clients=10**9 built ``list(range(10**9))`` while validating and
    the worker was killed for memory; 1e308 overflowed inside ``range``."""
    for value in (10**9, 2**63 - 1, 1e308):
        try:
            ExperimentConfig.from_mapping({"num_clients": value}, source="fuzz")
        except ConfigError as err:
            assert "num_clients" in str(err) and "at most 1,000,000" in str(err)
        else:
            raise AssertionError(f"num_clients={value!r} was accepted")
