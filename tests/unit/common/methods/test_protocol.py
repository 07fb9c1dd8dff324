"""Every registered method satisfies the written contract (``common/methods/protocol.py``): its
members are there, with the Protocol's signatures, its messages can be refused the one way, its
options are part of the configuration, and its server side is a ``ServerSide``."""

from __future__ import annotations

import dataclasses
import inspect
import typing

import pytest

from common.methods import METHODS, ExperimentConfig
from common.methods.protocol import Method, ServerSide, refusal
from protos import wire


def protocol_members(protocol: type) -> tuple[dict[str, object], dict[str, inspect.Signature]]:
    """The data members (name -> annotation) and the methods (name -> signature) a Protocol requires."""
    data = typing.get_type_hints(protocol)
    methods = {
        name: inspect.signature(value)
        for name, value in vars(protocol).items()
        if inspect.isfunction(value) and not name.startswith("_")
    }
    return data, methods


def check_method(method: object) -> None:
    """``method`` is a ``Method``: what a test of any method (a toy one too) asserts."""
    assert isinstance(method, Method)
    data, methods = protocol_members(Method)
    for name, kind in data.items():
        value = getattr(method, name)
        base = typing.get_origin(kind) or kind
        assert isinstance(value, base), f"{name}: {value!r} is not a {kind}"
    for name, expected in methods.items():
        got = inspect.signature(getattr(method, name))
        assert list(got.parameters) == [p for p in expected.parameters if p != "self"], name
    assert dataclasses.is_dataclass(method.options) and method.options.__dataclass_params__.frozen
    for request, reply in method.messages.values():
        assert "step" in {f.name for f in dataclasses.fields(request)}, request
        refused = wire.decode(reply, wire.encode(refusal(reply, 3, 1, "why")))  # the one way to refuse
        assert (refused.step, refused.refused, refused.reason) == (3, True, "client 1 refuses: why")


@pytest.mark.parametrize("name", list(METHODS))
def test_every_registered_method_satisfies_the_contract(name):
    method = METHODS[name]
    check_method(method)
    assert method.name == name
    fields = {f.name for f in dataclasses.fields(ExperimentConfig)}
    assert {f.name for f in dataclasses.fields(method.options)} <= fields


@pytest.mark.parametrize("name", list(METHODS))
def test_every_server_side_satisfies_its_contract(name):
    cfg = ExperimentConfig(strategy=name, num_clients=3, model="tiny", fedavg_clients_per_round=2)
    side = METHODS[name].server(cfg, 10, None)
    assert isinstance(side, ServerSide)
    _, methods = protocol_members(ServerSide)
    for member, expected in methods.items():
        got = inspect.signature(getattr(side, member))
        assert list(got.parameters) == [p for p in expected.parameters if p != "self"], member


def test_message_types_are_each_one_methods():
    types = [t for m in METHODS.values() for t in m.messages]
    assert len(types) == len(set(types)) and all(t.startswith("train.") for t in types)
