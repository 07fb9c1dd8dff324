"""The ClientApp is a shell: one handler for every method's step messages, and one way to refuse."""

import os

import pytest

from client.node import STATE_KEY, run_config
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


def test_the_nodes_of_one_process_share_one_parsed_copy_of_the_run_configuration(tmp_path):
    """K simulated nodes in one process each kept their own copy of the run's configuration (2.5 kB
    each) and parsed and validated it at the hello and again at every message."""
    cfg = tiny_cfg(tmp_path, num_clients=5)
    run_config.cache_clear()
    transport, nodes = federation(cfg)
    texts = [context.state.config_records[STATE_KEY]["config"] for context in transport.contexts.values()]
    assert all(text is texts[0] for text in texts)
    assert run_config.cache_info().misses == 1
    _, outcome = one_step(cfg, transport, nodes, asked=[0, 1])
    assert outcome.took_step and run_config.cache_info().misses == 1
