"""A secure sum's peers are who they say, and one rogue cannot stop a run (audit 4, items 3 and 10).

Real ClientApps on the in-process transport, with the identities ``fedgan simulate`` provisions.
A rogue is a wrapper around the real ClientApp on one partition: it answers one round of the
protocol as the audit's attacker did (a forged key, garbage ciphertexts, altered unmask shares, a
replay, an out-of-range input). A malicious server is the real driver handed another cohort.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Message

from client.app import app as client_app
from client.secure_deposit import deposit_input
from common.methods import prepare
from common.privacy import PrivacyLedger
from common.secagg import new_private_key, public_key_bytes
from common.secagg.identity import identity_path, peers_path, provision, provision_simulated
from common.secagg.messages import ADVERTISE, MASK, SHARE, UNMASK, AdvertiseReply, MaskedInput, ShareReply, UnmaskReply
from common.secagg.plan import release_events
from protos import wire
from server.loop import run_experiment
from server.reporting import RunDirectory
from server.secure_sum import secure_sum
from server.transport import InProcessTransport
from tests.helpers import secure_plan, tiny_cfg

ROGUE = 1
GS = dict(
    strategy="gswgan", model="tiny", batch_size=4, n_critic=1, log_every=1, sample_every=100, checkpoint_every=100
)


# --- item 3: peers a node can verify ----------------------------------------------------------------
def test_a_server_cannot_fill_a_sum_with_keys_of_its_own(tmp_path) -> None:
    """Audit 4, item 3: a node joined a sum whose other members were keys the server made, and the
    server recovered its deposit exactly. Node 0 holds an identity the federation published; nodes 1
    to 4 are the server's (real handlers, identities of the server's own, published nowhere but in
    their own files). Node 0 refuses at round 2, naming them; its deposit is in no revealed sum."""
    honest, sybils = tmp_path / "honest", tmp_path / "sybils"
    provision_simulated(honest, 1)  # the federation: one published identity, node 0's
    provision(dict.fromkeys(range(1, 5), sybils))  # the server's: valid keys, in their own "registry"
    configs = {
        i: {"secagg-identity": str(identity_path(sybils, i)), "secagg-peers": str(peers_path(sybils))}
        for i in range(1, 5)
    }
    transport = InProcessTransport(client_app, 5, node_state=honest, node_configs=configs)
    nodes = transport.node_ids(5)
    vectors = {n: np.full(8, 7 if n == nodes[0] else 0, np.int64) for n in nodes}
    for node, vector in vectors.items():
        deposit_input(transport.contexts[node], "s1", vector, floor=3, bound=100)
    result = secure_sum(transport, nodes, bound=100, length=8, threshold=3, session="s1")
    assert nodes[0] in result.dropouts and "not among the federation's published keys" in result.dropouts[nodes[0]]
    assert nodes[0] not in result.survivors
    assert not result.revealed or not (result.sum == 7).any()  # never its deposit, alone or summed with zeros


def test_two_node_ids_under_one_identity_are_named(tmp_path) -> None:
    """A client posing as two nodes (one identity, two node ids) is named at round 1, both ids."""
    twin = {4: {"secagg-identity": str(tmp_path / "twin.pem"), "secagg-peers": str(peers_path(tmp_path))}}
    transport = InProcessTransport(client_app, 5, node_state=tmp_path, node_configs=twin, secagg_identities=True)
    from client.secure_deposit import node_identity
    from common.secagg.identity import _write_private

    identity, _ = node_identity({"state-dir": str(tmp_path)}, str(tmp_path), 3)
    _write_private(tmp_path / "twin.pem", identity.key)  # node 4 holds node 3's identity
    nodes = transport.node_ids(5)
    for node in nodes:
        deposit_input(transport.contexts[node], "s1", np.ones(4, np.int64), floor=3, bound=10)
    result = secure_sum(transport, nodes, bound=10, length=4, threshold=3, session="s1", peers=transport.secagg_peers)
    assert set(result.culprits) == {nodes[3], nodes[4]} and "also node(s)" in result.culprits[nodes[4]]
    assert result.revealed and (result.sum == 3).all()


# --- item 10: one rogue client ----------------------------------------------------------------------
def _forged_key(message: Message, context, reply: Message) -> Message:
    """A valid point in place of its mask key, which its identity never signed."""
    answer = wire.decode(AdvertiseReply, reply.content)
    answer.mask_key = np.frombuffer(public_key_bytes(new_private_key()), np.uint8).copy()
    return wire.reply(answer, message)


def _garbage_ciphertexts(message: Message, context, reply: Message) -> Message:
    answer = wire.decode(ShareReply, reply.content)
    answer.ciphertexts = np.random.default_rng(0).integers(0, 256, answer.ciphertexts.size, dtype=np.uint8)
    return wire.reply(answer, message)


def _altered_shares(message: Message, context, reply: Message) -> Message:
    """Every share it returns for its neighbours' seeds altered (its own left alone)."""
    answer = wire.decode(UnmaskReply, reply.content)
    if not answer.refused:
        answer.seed_shares[1:] ^= np.uint8(0x5A)
    return wire.reply(answer, message)


class Replay:
    """Its first answer to a round, sent again at every later session."""

    def __init__(self, reply_cls: type) -> None:
        self.reply_cls, self.first = reply_cls, None

    def __call__(self, message: Message, context, reply: Message) -> Message:
        if self.first is None:
            self.first = wire.decode(self.reply_cls, reply.content)
            return reply
        return wire.reply(self.first, message)


def _out_of_range(message: Message, context, reply: Message) -> Message:
    """A masked input whose input lies far outside its range: its self mask re-derived from the
    node's own state, the input swapped (the node's range check skipped, as a modified client would)."""
    from client import secure_sum as node_side
    from common.secagg import mask_dtype, modulus_mask

    answer = wire.decode(MaskedInput, reply.content)
    if answer.refused:
        return reply
    session = wire.decode(node_side.MaskInput, message.content).session
    state = node_side.load(context, session, after="mask")
    vector = node_side.live_input(context, state.deposit, session)
    shift = (np.full(state.length, 50 * state.bound, np.int64) - vector).astype(np.uint64)
    masked = (answer.masked.astype(np.uint64) + shift) & modulus_mask(state.bits)
    answer.masked = masked.astype(mask_dtype(state.bits))
    return wire.reply(answer, message)


ROGUES = {
    "forged key": (ADVERTISE, lambda: _forged_key, "not signed by its identity"),
    "replayed keys": (ADVERTISE, lambda: Replay(AdvertiseReply), "not signed by its identity"),
    "garbage ciphertexts": (SHARE, lambda: _garbage_ciphertexts, "does not open to its shares"),
    # to another cohort its replay names other recipients (malformed); to the same one, old keys
    "replayed ciphertexts": (SHARE, lambda: Replay(ShareReply), ("answered malformed", "does not open to its shares")),
    "altered unmask shares": (UNMASK, lambda: _altered_shares, "did not sign"),
    "replayed masked vector": (MASK, lambda: Replay(MaskedInput), "replayed a masked vector"),
    "out-of-range input": (MASK, lambda: _out_of_range, "an out-of-range input spoiled"),
}


def rogue_app(kind: str):
    message_type, make, _ = ROGUES[kind]
    behaviour = make()

    def app(message, context):
        reply = client_app(message, context)
        if context.node_config["partition-id"] == ROGUE and message.metadata.message_type == message_type:
            return behaviour(message, context, reply)
        return reply

    return app


def secure_run(out, app, **changes):
    base = dict(num_clients=6, clients_per_step=4, steps=6, noise_multiplier=2.0, secure_aggregation=True, **GS)
    cfg = prepare(tiny_cfg(out, **{**base, **changes}))
    transport = InProcessTransport(app, cfg.num_clients, node_state=f"{out}-nodes", secagg_identities=True)
    return cfg, run_experiment(cfg, RunDirectory.create(cfg), transport, transport_name="inprocess")


@pytest.mark.parametrize("kind", list(ROGUES))
def test_one_rogue_is_named_and_the_run_completes_without_charging_the_honest_for_it(tmp_path, kind) -> None:
    """Audit 4, item 10: one rogue aborted every sum, the honest nodes were recorded as the dropouts,
    and the step was retried with it for good (ε 556 after 35 retries). Now the rogue is named and
    never asked again, the run completes every step, and each honest client's ε is what its answers
    in the sums cost: one charge per step it took part in (a sum aborted by the rogue is re-formed
    from the same deposits), except where nothing can say whose input spoiled a sum (out of range:
    those sums are lost and charged, until the sums it spoiled narrow down to it)."""
    cfg, summary = secure_run(tmp_path / "run", rogue_app(kind))
    assert summary["status"] == "completed" and summary["steps_completed"] == cfg.steps, summary.get("notes")
    rogue = summary["clients"][ROGUE]
    assert rogue["status"] == "failed", kind
    whys = ROGUES[kind][2] if isinstance(ROGUES[kind][2], tuple) else (ROGUES[kind][2],)
    assert any(why in rogue["failure"] for why in whys), (kind, rogue["failure"])
    if kind != "out-of-range input":  # attributable: no sum is lost, so no step is given up
        assert not any("given up" in note for note in summary["notes"]), summary["notes"]
    protocol, _ = release_events(secure_plan(cfg))
    honest = [c for c in summary["clients"] if c["client_id"] != ROGUE]
    for client in honest:
        expected = (
            PrivacyLedger([protocol.times(client["queries"])]).epsilon(delta=cfg.delta) if client["queries"] else 0
        )
        assert client["epsilon"] == pytest.approx(expected, rel=1e-6)
    sums = summary["method"]["gswgan"]["secure_aggregation"]["sums"]
    # every deposit belongs to one sum (re-formed sums reuse them): m charges per sum, none more
    assert sum(c["queries"] for c in summary["clients"]) == cfg.clients_per_step * len(sums)
    if kind != "out-of-range input":
        assert not any(s["aborted"] for s in sums) and len(sums) == cfg.steps, sums


def test_a_dropout_is_named_by_its_client(tmp_path) -> None:
    """Audit 4, item 13: dropouts were handled but never named. A node that crashes while masking is
    a dropout (not a culprit: a crash is no evidence of bad faith), named by its client id in the
    notes, and the sums hold the rest."""

    def crashing(message, context):
        if context.node_config["partition-id"] == ROGUE and message.metadata.message_type == MASK:
            raise RuntimeError("the node crashed")
        return client_app(message, context)

    cfg, summary = secure_run(tmp_path / "run", crashing, steps=3)
    assert summary["status"] == "completed" and summary["steps_completed"] == 3
    notes = " ".join(summary["notes"])
    assert summary["clients"][ROGUE]["queries"] > 0  # least-used first: every client is drawn in 2 steps
    assert f"client {ROGUE} (mask:" in notes, notes


def test_a_rogue_in_a_dp_merf_cohort_costs_the_honest_members_nothing(tmp_path) -> None:
    """Audit 4, item 10 (DP-MERF): a rogue aborted its whole cohort, and its honest members' one-shot
    releases were charged and lost. Now the cohort is re-formed without it from the same deposits:
    every honest summary is in a revealed sum, each client charged once."""
    merf = dict(strategy="dp-merf", merf_features=20, merf_batch=4, log_every=1, sample_every=100)
    base = dict(num_clients=8, steps=2, merf_noise_multiplier=1.0, secure_aggregation=True, secagg_cohort=4, **merf)
    cfg = prepare(tiny_cfg(tmp_path / "run", **{**base, "secagg_threshold": 3}))
    transport = InProcessTransport(
        rogue_app("garbage ciphertexts"), 8, node_state=tmp_path / "nodes", secagg_identities=True
    )
    summary = run_experiment(cfg, RunDirectory.create(cfg), transport, transport_name="inprocess")
    assert summary["status"] == "completed", summary["notes"]
    assert summary["clients"][ROGUE]["status"] == "failed"
    assert "does not open to its shares" in summary["clients"][ROGUE]["failure"]
    sums = summary["method"]["dp-merf"]["secure_aggregation"]["sums"]
    assert sum(s["inputs"] for s in sums) == 7, sums  # every honest summary, once
    assert all(c["queries"] == 1 for c in summary["clients"])
