"""DP-MERF through secure sums, end to end on the project's real ClientApp (in-process and under
Flower's simulation): the server never receives a summary, the revealed mean is the mean of what the
nodes deposited, both guarantees are reported from ledgers, the node's budget counts the one its
policy names, and the noise of a revealed sum has the calibrated variance."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from client.app import app as client_app
from client.secure_deposit import INPUT_KEY, deposit_input
from common.methods import ExperimentConfig, prepare
from common.methods.dp_merf.messages import MSG_EMBED, MerfRelease
from common.privacy import PrivacyLedger
from common.privacy.node_ledger import read_node_book
from common.secagg.plan import client_vector, coordinate_range
from protos import wire
from server.loop import run_experiment
from server.reporting import RunDirectory
from server.secure_sum import secure_sum
from server.session import NodeRefused
from server.transport import InProcessTransport
from simulations.experiments.simulate import _run_flower
from tests.helpers import secure_plan, tiny_cfg

MERF = dict(strategy="dp-merf", merf_features=20, merf_batch=4, log_every=1, sample_every=100, checkpoint_every=100)
SECURE = dict(secure_aggregation=True, secagg_cohort=4, secagg_threshold=3)


def secure_cfg(out, **changes) -> ExperimentConfig:
    base = dict(num_clients=8, steps=3, merf_noise_multiplier=1.0, **MERF, **SECURE)
    return prepare(tiny_cfg(out, **{**base, **changes}))


def run_inprocess(cfg: ExperimentConfig, app=client_app, **transport_kwargs):
    run = RunDirectory.create(cfg)
    node_state = f"{cfg.out}-nodes"
    transport = InProcessTransport(app, cfg.num_clients, node_state=node_state, **transport_kwargs)
    return transport, run_experiment(cfg, run, transport, transport_name="inprocess")


def recording(seen: list):
    """The real ClientApp, every DP-MERF reply recorded as it leaves the node."""

    def app(message, context):
        reply = client_app(message, context)
        if message.metadata.message_type == MSG_EMBED:
            seen.append(wire.decode(MerfRelease, reply.content, step=0, shape=(10, 41), secure=True))
        return reply

    return app


def test_no_summary_leaves_a_node_and_both_guarantees_come_from_ledgers(tmp_path) -> None:
    cfg = secure_cfg(tmp_path / "run")
    seen: list[MerfRelease] = []
    transport, summary = run_inprocess(cfg, app=recording(seen))
    assert summary["status"] == "completed" and summary["steps_completed"] == 3
    assert len(seen) == 8 and all(r.deposited and r.embedding is None for r in seen)
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    plan = secure_plan(cfg)
    protocol = PrivacyLedger([plan.protocol_event()]).epsilon(delta=cfg.delta)
    own = PrivacyLedger([plan.own_event()]).epsilon(delta=cfg.delta)
    assert [c["epsilon"] for c in privacy["clients"]] == pytest.approx([protocol] * 8, rel=1e-6)
    beside = privacy["epsilon_amplified"]
    assert beside["kind"] == "per client, server deviates from the secure sum"
    assert beside["epsilon"] == pytest.approx(own, rel=1e-6) and own > 1.5 * protocol  # σ/√3 against σ
    assert privacy["epsilon_kind"] == "per client, server runs the secure sum, no colluding client"
    assert "Secure aggregation" in privacy["statement"]
    sums = summary["method"]["dp-merf"]["secure_aggregation"]["sums"]
    assert sorted(s["inputs"] for s in sums) == [4, 4] and not any(s["aborted"] for s in sums)
    # Each node's own ledger counts its share's guarantee (default policy: trust-secure-sum = false).
    state_dir = transport.contexts[transport.node_ids(8)[0]].node_config["state-dir"]
    for client in range(8):
        eps = read_node_book(state_dir, client).ledger.epsilon(delta=cfg.delta)
        assert eps == pytest.approx(own, rel=1e-6)


def test_the_revealed_mean_is_the_mean_of_what_the_nodes_deposited(tmp_path) -> None:
    """With a fixed noise seed (test only), every deposit is recomputable: the generator's target is
    exactly their sum, scaled by γ, over the count."""
    cfg = secure_cfg(tmp_path / "run", noise_seed=7, steps=1)
    deposits: dict[int, np.ndarray] = {}

    def app(message, context):
        reply = client_app(message, context)
        key = next((k for k in context.state.array_records if k.startswith("secagg-input.")), None)
        if key:
            deposits[context.node_id] = wire.array_to_numpy(INPUT_KEY, context.state.array_records[key][INPUT_KEY])
        return reply

    transport, summary = run_inprocess(cfg, app=app, node_config={"privacy-allow-nonprivate": "true"})
    assert summary["status"] == "completed"
    import torch

    target = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["strategy"]["generator"]["target"]
    expected = np.sum(list(deposits.values()), axis=0) * secure_plan(cfg).gamma / len(deposits)
    assert len(deposits) == 8
    np.testing.assert_allclose(target.numpy().reshape(-1), expected, rtol=1e-5, atol=1e-6)


def test_a_node_minimum_noise_counts_its_own_share_unless_it_trusts_the_protocol(tmp_path) -> None:
    """σ = 1, t = 3: the sum carries σ = 1, a node's share σ/√3 ≈ 0.58. A node demanding 0.8 refuses
    by default and takes part when its policy trusts the secure sum, which it may only where it can
    verify its peers (its identity and the federation's published keys: audit 4, item 3)."""
    cfg = secure_cfg(tmp_path / "a")
    with pytest.raises(
        NodeRefused, match=r"noise multiplier 0\.57735 .* below the node's minimum 0\.8 \(its own share"
    ):
        run_inprocess(cfg, node_config={"privacy-min-noise-multiplier": "0.8"})
    trusting = {"privacy-min-noise-multiplier": "0.8", "privacy-trust-secure-sum": "true"}
    with pytest.raises(NodeRefused, match=r"trust-secure-sum = true, but this node cannot verify its peers"):
        run_inprocess(secure_cfg(tmp_path / "b"), node_config=trusting)
    _, ran = run_inprocess(secure_cfg(tmp_path / "c"), node_config=trusting, secagg_identities=True)
    assert ran["status"] == "completed" and all(c["queries"] == 1 for c in ran["clients"])


def test_the_noise_of_a_revealed_sum_has_the_calibrated_variance() -> None:
    """Zero summaries, so each coordinate of the revealed sum is pure noise: the sum of n Sk(μ/t)
    shares, variance 2nμ/t. Measured over 2 sums of 5 nodes × 4,000 coordinates (40,000 draws)."""
    cfg = tiny_cfg(
        "",
        **MERF,
        num_clients=5,
        secure_aggregation=True,
        secagg_cohort=5,
        secagg_threshold=4,
        merf_noise_multiplier=0.5,
    )
    plan = secure_plan(cfg)
    draws = []
    for session in ("v1", "v2"):
        transport = InProcessTransport(client_app, 5)
        nodes = transport.node_ids(5)
        for i, node in enumerate(nodes):
            vector = client_vector(np.zeros(plan.dim), plan, -1, i, 0)
            deposit_input(transport.contexts[node], session, vector, floor=4, bound=coordinate_range(plan))
        result = secure_sum(
            transport, nodes, bound=coordinate_range(plan), length=plan.dim, threshold=4, session=session
        )
        draws.append(result.sum.astype(np.float64))
    draws = np.concatenate(draws)
    expected = 2 * 5 * plan.mu_share
    # the sample variance of 2·dim draws is within 4 standard errors (√(2/n) relative) of 2nμ/t
    assert abs(draws.var() / expected - 1) < 4 * np.sqrt(2 / draws.size), (draws.var(), expected)
    assert abs(draws.mean()) < 4 * np.sqrt(expected / draws.size)


def test_secure_dp_merf_runs_under_flowers_simulation(tmp_path) -> None:
    cfg = secure_cfg(tmp_path / "run", num_clients=6, secagg_cohort=3, secagg_threshold=2, steps=2)
    summary, error = _run_flower(cfg, RunDirectory.create(cfg), False)
    assert error is None, error
    assert summary["status"] == "completed" and [c["queries"] for c in summary["clients"]] == [1] * 6
    sums = summary["method"]["dp-merf"]["secure_aggregation"]["sums"]
    assert sorted(s["inputs"] for s in sums) == [3, 3]


def test_what_no_sum_could_satisfy_is_refused_before_anything_is_charged(tmp_path) -> None:
    """Audit 4, item 12: a cohort larger than the federation, and a node policy whose minimum cohort,
    threshold or colluders the run's sums cannot meet, were refused only at the first secure round,
    after every node had spent its one release. Now: at configuration time, and at the hello."""
    from common.options import ConfigError

    with pytest.raises(ConfigError, match=r"secagg_cohort=50: must be at most the 4 clients taking part"):
        secure_cfg(tmp_path / "big", num_clients=4, secagg_cohort=50)
    for key, value, why in (
        ("privacy-min-secagg-cohort", "10", "below the node's minimum cohort 10"),
        ("privacy-min-secagg-threshold", "4", "below the node's minimum threshold 4"),
        ("privacy-min-secagg-colluders", "1", "calibrated for 0 colluding client(s) of a sum are below"),
    ):
        cfg = secure_cfg(tmp_path / key)
        with pytest.raises(NodeRefused, match=re.escape(why)):
            run_inprocess(cfg, node_config={key: value})
        nodes = tmp_path / f"{key}-nodes"
        assert not list(nodes.glob("node-ledger-*.json")), key  # nothing was charged


def test_colluders_are_named_in_the_headline_and_calibrated_for(tmp_path) -> None:
    """--secagg-colluders 1 satisfies a node asking for it; the headline's kind and the statement name
    the collusion the figure holds against, and what one colluder more would cost."""
    cfg = secure_cfg(tmp_path / "run", secagg_colluders=1)
    _, summary = run_inprocess(cfg, node_config={"privacy-min-secagg-colluders": "1"})
    assert summary["status"] == "completed"
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert privacy["epsilon_kind"] == "per client, server runs the secure sum, ≤ 1 colluding clients"
    statement = privacy["statement"]
    assert "colluding with at most 1 client(s) of each sum" in statement
    assert "t − k = 2 honest survivors of a sum of t = 3 (k = 1)" in statement
    assert "against 2 colluders the most exposed client's ε would be" in statement
    plain = secure_cfg(tmp_path / "plain")
    run_inprocess(plain)
    plain_statement = json.loads((tmp_path / "plain" / "privacy.json").read_text())["statement"]
    assert "colluding with no client of a sum" in plain_statement
    for out, who in (("run", "at most 1 client(s) of each sum"), ("plain", "no client of a sum")):
        release = json.loads((tmp_path / out / "publish" / "release.json").read_text())
        basis = release["epsilon_per_client"]["basis"]  # audit 4, item 8: the secure sum's assumption, stated
        assert f"ran the secure sum (SecAgg+) as specified and colluded with {who}" in basis, basis
        privacy = json.loads((tmp_path / out / "privacy.json").read_text())
        worst = max(c["epsilon"] for c in privacy["clients"])
        assert release["epsilon_per_client"]["epsilon"] == pytest.approx(worst)
