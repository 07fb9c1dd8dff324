"""A node's own privacy policy: what it refuses whatever the server asks, and where it comes from."""

from __future__ import annotations

import pytest

from common.methods import ExperimentConfig, run_terms
from common.privacy import (
    NodePolicy,
    PolicyError,
    PrivacyEvent,
    PrivacyLedger,
    load_policy,
)
from common.privacy.policy import POLICY_ENV, policy_from_file


def refusals(policy: NodePolicy, cfg: ExperimentConfig) -> list[str]:
    """Why a node with ``policy`` refuses a run configured as ``cfg``, as its shell asks: with what
    the run's method says of its releases."""
    return policy.violations(cfg, run_terms(cfg))


def test_defaults_forbid_every_non_private_option() -> None:
    policy = NodePolicy()
    assert refusals(policy, ExperimentConfig()) == []
    for change, word in [
        (dict(noise_seed=3), "noise seed"),
        (dict(client_stats=True), "statistics"),
        (dict(noise_multiplier=0.0), "without noise"),
        (dict(strategy="dpgan", sampling_seed=1), "DP-SGD batches"),
    ]:
        (reason,) = refusals(policy, ExperimentConfig(**change))
        assert word in reason and "allow-nonprivate" in reason
    # The server's own sampling seed only voids the server-side (amplified) figure: allowed.
    assert refusals(policy, ExperimentConfig(sampling_seed=1)) == []
    assert refusals(NodePolicy(allow_nonprivate=True), ExperimentConfig(noise_seed=3, client_stats=True)) == []


def test_a_server_asking_for_less_noise_a_larger_budget_or_delta_is_refused() -> None:
    policy = NodePolicy(min_noise_multiplier=1.0, max_epsilon=50.0, delta=1e-6)
    asks = dict(noise_multiplier=0.8, batch_size=1, client_epsilon_budget=80.0, delta=1e-5)  # B = 1: σ/√B = σ
    reasons = refusals(policy, ExperimentConfig(**asks))
    assert len(reasons) == 3
    assert "0.8 of each release is below the node's minimum 1" in reasons[0]
    assert "80 exceeds the node's maximum 50" in reasons[1]
    assert "delta 1e-05 is larger than the node's delta 1e-06" in reasons[2]
    fine = ExperimentConfig(noise_multiplier=1.2, batch_size=1, client_epsilon_budget=10.0, delta=1e-7)
    assert refusals(policy, fine) == []
    fedavg = refusals(policy, ExperimentConfig(strategy="fedavg-gan", delta=1e-6))
    assert any("raw discriminator updates" in r for r in fedavg)
    dpgan = ExperimentConfig(strategy="dpgan", dpgan_noise_multiplier=0.5, delta=1e-6)
    assert "0.5 of each release is below" in refusals(policy, dpgan)[0]


def test_both_budgets_are_enforced_each_at_its_own_delta() -> None:
    cfg = ExperimentConfig(client_epsilon_budget=30.0, delta=1e-7)
    policy = NodePolicy(max_epsilon=40.0, delta=1e-5)
    assert policy.budgets(cfg) == [(30.0, 1e-7), (40.0, 1e-5)]
    query = PrivacyEvent(noise_multiplier=0.5)
    ledger = PrivacyLedger()
    while not policy.over_budget(ledger, query, cfg):
        ledger.record(query)
    assert ledger.epsilon(delta=1e-7) <= 30.0 and ledger.epsilon(delta=1e-5) <= 40.0
    assert "budget 30 at delta 1e-07" in policy.over_budget(ledger, query, cfg)
    assert NodePolicy().budgets(ExperimentConfig()) == []


def test_sources_in_order_node_config_file_environment(tmp_path) -> None:
    file = tmp_path / "policy.toml"
    file.write_text("min-noise-multiplier = 2\nmax-epsilon = 9.5\nallow-nonprivate = true\n")
    assert load_policy({}, {}) == NodePolicy()
    from_env = load_policy({}, {POLICY_ENV: str(file)})
    assert (from_env.min_noise_multiplier, from_env.max_epsilon, from_env.allow_nonprivate) == (2.0, 9.5, True)
    assert load_policy({"privacy-policy": str(file)}, {}).source.endswith("policy.toml")
    inline = load_policy({"privacy-max-epsilon": 3, "privacy-allow-nonprivate": "false", "partition-id": 0}, {})
    assert (inline.max_epsilon, inline.allow_nonprivate, inline.source) == (3.0, False, "node config")
    same = load_policy({"privacy-policy": str(file)}, {POLICY_ENV: str(file)})  # one file, named twice
    assert same.max_epsilon == 9.5
    (tmp_path / "table.toml").write_text("[policy]\ndelta = 1e-6\n")
    assert policy_from_file(tmp_path / "table.toml").delta == 1e-6


@pytest.mark.parametrize(
    "text, words",
    [
        ("max-epsilon = -1", "max-epsilon"),
        ("min-noise = 1", "unknown key"),
        ("delta = 2.0", "delta"),
        ("allow-nonprivate = 1", "true or false"),
        ("max-epsilon = [", "not valid TOML"),
    ],
)
def test_a_bad_policy_is_an_error_naming_the_file_and_field(tmp_path, text: str, words: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=words) as err:
        policy_from_file(path)
    assert str(path) in str(err.value)
    with pytest.raises(PolicyError, match="cannot be read"):
        policy_from_file(tmp_path / "missing.toml")


def test_two_sources_or_a_key_outside_the_table_refuse_everything_naming_both(tmp_path) -> None:
    """Audit: a top-level max-epsilon beside [policy] was ignored (releases up to ε 15.3 against a
    budget of 1), an inline privacy-* key silently discarded the whole file, `policy = 5` was a
    traceback. Each is now an error naming the file and the key: the node refuses everything."""
    file = tmp_path / "p.toml"
    file.write_text("max-epsilon = 1.0\n[policy]\nmin-noise-multiplier = 1.0\n")
    with pytest.raises(PolicyError, match=r"max-epsilon outside the \[policy\] table") as err:
        policy_from_file(file)
    assert str(file) in str(err.value)
    for bad in ("policy = 5", "policy = [1, 2]", 'policy = "strict"'):
        file.write_text(bad + "\n")
        with pytest.raises(PolicyError, match="policy must be a table"):
            policy_from_file(file)
    file.write_text("max-epsilon = 1.0\n")
    for where in ({"privacy-policy": str(file)}, {}):
        environ = {} if where else {POLICY_ENV: str(file)}
        with pytest.raises(PolicyError, match="privacy-min-noise-multiplier and .* names the policy file"):
            load_policy({"privacy-min-noise-multiplier": 2, **where}, environ)
    other = tmp_path / "q.toml"
    other.write_text("max-epsilon = 5.0\n")
    with pytest.raises(PolicyError, match="two policy files"):
        load_policy({"privacy-policy": str(file)}, {POLICY_ENV: str(other)})


def test_the_minimum_noise_bounds_each_releases_own_multiplier() -> None:
    """Audit: GS-WGAN compared min-noise-multiplier with σ while each answer's multiplier is σ/√B and
    the server picks B (σ 1, B 100: multiplier 0.1, ε 96 for one answer, accepted under a minimum of
    1.0); Fed-Avg was exempt from the noise and the non-private checks (raw deltas went out)."""
    policy = NodePolicy(min_noise_multiplier=1.0)
    (reason,) = refusals(policy, ExperimentConfig(noise_multiplier=1.0, batch_size=100))
    assert "noise multiplier 0.1 of each release is below the node's minimum 1" in reason
    assert refusals(policy, ExperimentConfig(noise_multiplier=10.0, batch_size=100)) == []
    # the release itself is checked too, whatever the hello said
    ledger, query = PrivacyLedger(), PrivacyEvent(noise_multiplier=0.1)
    assert "below the node's minimum 1" in policy.release_refusal(ledger, query, ExperimentConfig(), "one more answer")
    # Fed-Avg's clients add no noise (0): below any minimum, and sent only to a server the node trusts
    fedavg = ExperimentConfig(strategy="fedavg-gan")
    assert any("below the node's minimum" in r for r in refusals(policy, fedavg))
    assert any("trust-server = true" in r for r in refusals(NodePolicy(), fedavg))
    assert refusals(NodePolicy(trust_server=True), fedavg) == []
