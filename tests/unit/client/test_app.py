"""The ClientApp is a shell: one handler for every method's step messages, and one way to refuse."""

import os

import pytest

from common.methods import METHODS
from common.privacy.node_ledger import NODE_STATE_ENV, node_ledger_path
from tests.helpers import federation, one_step, tiny_cfg


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_refuses_the_one_way(name, tmp_path, trust_server):
    """A node whose own ledger cannot be read releases nothing, whatever the method: it answers a
    refusal saying why (its node is exhausted, not failed), never an error. Fed-Avg's nodes used to
    raise, and were counted as failed."""
    cfg = tiny_cfg(tmp_path, strategy=name)
    transport, nodes = federation(cfg)
    node_ledger_path(os.environ[NODE_STATE_ENV], 0).write_text("{ not a ledger")
    _, outcome = one_step(cfg, transport, nodes, asked=[0])
    assert outcome.exhausted_nodes == [nodes[0]] and outcome.failed_nodes == []
    note = outcome.notes[0]  # (DP-MERF adds that no summary was accepted)
    assert note.startswith("client 0 refuses: ") and "node-ledger-00000.json" in note, note
