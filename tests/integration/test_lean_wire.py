"""Lean wire end to end (in-process transport, tiny model): CT at B=32, n_critic=5, and privacy unchanged.

CT is summary.json's comm.bytes_per_step.total: serialized Flower message bytes per generator step per
participating client, down + up, counted by ``protos.wire.message_wire_bytes``.
"""

import pytest

from client.app import app as client_app
from server.loop import run_experiment
from server.reporting import RunDirectory
from server.transport import InProcessTransport
from tests.helpers import ALLOW_NONPRIVATE, tiny_cfg

FLOAT32 = dict(wire_samples="float32", wire_dtype="float32", wire_compression="none")
VARIANTS = {
    "float32": FLOAT32,
    "default": {},
    "query": dict(critic_fakes="query"),
    "replay": dict(critic_fakes="replay"),
}


@pytest.fixture(scope="module")
def summaries(tmp_path_factory):
    """One 1-step run per variant, same seeds (noise and sampling included: testing flags)."""
    out = {}
    for name, changes in VARIANTS.items():
        cfg = tiny_cfg(
            tmp_path_factory.mktemp(name) / "run",
            num_clients=2,
            steps=1,
            batch_size=32,
            n_critic=5,
            noise_seed=1,
            sampling_seed=1,
            log_every=1,
            sample_every=100,
            checkpoint_every=100,
            **changes,
        )
        run = RunDirectory.create(cfg)
        transport = InProcessTransport(client_app, 2, node_config=ALLOW_NONPRIVATE, node_state=run.state_dir)
        out[name] = run_experiment(cfg, run, transport, transport_name="inprocess")
    return out


def _ct(summary) -> float:
    return summary["comm"]["bytes_per_step"]["total"]


def test_default_lean_wire_meets_the_fresh_fakes_target(summaries):
    assert _ct(summaries["float32"]) > 7.0e5  # (n_critic + 1) B float32 samples down, B float32 grads up
    assert _ct(summaries["default"]) <= 2.0e5
    assert summaries["default"]["method"]["gswgan"]["wire_dtype"] == "float16"


@pytest.mark.parametrize("variant", ["query", "replay"])
def test_reused_critic_fakes_meet_the_one_batch_target(summaries, variant):
    assert _ct(summaries[variant]) <= 1.0e5


def test_encodings_leave_the_privacy_accounting_alone(summaries):
    """Same releases recorded whatever the encoding (the fixed noise seed voids the ε themselves)."""
    ref = summaries["float32"]
    for name in ("default", "query", "replay"):
        got = summaries[name]
        assert [(c["queries"], c["epsilon"], c["epsilon_reason"]) for c in got["clients"]] == [
            (c["queries"], c["epsilon"], c["epsilon_reason"]) for c in ref["clients"]
        ], name
        assert got["epsilon_amplified"] == ref["epsilon_amplified"] and got["not_private"] == ref["not_private"]
