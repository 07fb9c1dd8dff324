"""What a run may publish (publish/) apart from what only its operator may read, and which ε each
reader may rely on (server/release.py)."""

import json

import torch

from common.learning.models import build_generator
from simulations.cli import main
from tests.helpers import TRUST_SERVER_POLICY, tiny_flags


def run(tmp_path, name, *extra, **changes):
    out = tmp_path / name
    assert main(["simulate", *tiny_flags(num_clients=4, clients_per_step=2, steps=3, out=out, **changes), *extra]) == 0
    return out, json.loads((out / "publish" / "release.json").read_text())


def test_publish_holds_nothing_per_client_or_per_step(tmp_path):
    """Audit: summary.json and privacy.json list each client's answers, metrics.jsonl the clients of
    each step, notes name clients per step, and nothing said the amplified ε does not hold against
    their readers (with its rounds known a Fed-Avg client's ε was 9.02, not the printed 7.50)."""
    out, release = run(tmp_path, "budget", target_epsilon=50)
    keys = set(_keys(release))
    for leak in ("clients", "clients_sampled", "client_id", "queries", "notes", "ledger", "failed_clients"):
        assert leak not in keys, leak
    assert release["readers"].startswith("publishable")
    assert release["epsilon_per_client"]["epsilon"] == 50  # the budget every node enforced, whatever the sampling
    assert release["epsilon_amplified"]["epsilon"] > 0 and "assumption" in release["epsilon_amplified"]
    for name in ("summary.json", "privacy.json"):
        assert json.loads((out / name).read_text())["readers"].startswith("operator only")
    assert "Publish only publish/" in (out / "PRIVATE.txt").read_text()
    generator = build_generator("tiny")
    generator.load_state_dict(torch.load(out / "publish" / "generator.pt", weights_only=True))
    assert (out / "publish" / "samples.png").stat().st_size > 100


def test_without_a_budget_the_per_client_epsilon_is_withheld_and_fedavg_says_unbounded(tmp_path):
    _, release = run(tmp_path, "nobudget")
    assert release["epsilon_per_client"]["epsilon"] is None
    assert "how often each client was sampled" in release["epsilon_per_client"]["basis"]
    _, fedavg = run(
        tmp_path, "fedavg", "--node-policy", str(TRUST_SERVER_POLICY), strategy="fedavg-gan", fedavg_clients_per_round=2
    )
    assert fedavg["epsilon_per_client"]["epsilon"] is None and "unbounded" in fedavg["epsilon_per_client"]["basis"]
    assert fedavg["epsilon_amplified"]["epsilon"] > 0  # user-level, for a reader who never saw the rounds
    _, merf = run(tmp_path, "merf", strategy="dp-merf", merf_noise_multiplier=2.0)
    assert merf["epsilon_per_client"]["epsilon"] > 0  # nobody is sampled: nothing to keep secret


def _keys(obj):
    """Every key of a JSON document, at any depth."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield key
            yield from _keys(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _keys(value)
