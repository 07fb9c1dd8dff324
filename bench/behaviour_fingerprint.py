"""What every method computes, fingerprinted: the check that a refactor changed no behaviour.

Each method runs a tiny configuration in-process with every random stream seeded (the data, the
clients' noise, the server's sampling), with and without secure sums where it has them: five plain
runs and four secure ones. The fingerprint of a run is its status and steps, each client's releases,
ε and ledger, the server-side figure, and a SHA-256 of the released generator's weights; bytes too for
a plain run (a secure run's key and signature sizes vary by a byte or two from run to run, so its
bytes are not fingerprinted). The masks, keys and shares of a secure sum are fresh randomness, but
they cancel: the revealed sum, hence the generator, is exact. Fed-Avg's secure shares come from the
CSPRNG whatever ``--noise-seed`` says (its noise is no client's debugging option), so that run's
generator is not fingerprinted either.

    python bench/behaviour_fingerprint.py --out bench/results/behaviour-before.json
    python bench/behaviour_fingerprint.py --compare bench/results/behaviour-before.json

``--compare`` exits 1 and prints every difference when any run differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from client.app import app as client_app  # noqa: E402
from common.methods import ExperimentConfig, prepare  # noqa: E402
from server.loop import run_experiment  # noqa: E402
from server.reporting import RunDirectory  # noqa: E402
from server.transport import InProcessTransport  # noqa: E402

BASE = dict(
    num_clients=6,
    model="tiny",
    batch_size=4,
    n_critic=1,
    synthetic_samples_per_writer=40,
    steps=3,
    seed=7,
    noise_seed=11,
    sampling_seed=13,
    progress=False,
    eval=False,
    log_every=1,
    sample_every=100,
    checkpoint_every=100,
)
RUNS = {
    "gswgan": dict(strategy="gswgan", clients_per_step=3, noise_multiplier=2.0),
    "dpgan": dict(strategy="dpgan", dpgan_batch_size=16, dpgan_n_d=2),
    "fedavg-gan": dict(strategy="fedavg-gan", fedavg_clients_per_round=3, local_steps=2, server_g_steps=1),
    "dp-merf": dict(strategy="dp-merf", merf_features=20, merf_batch=4, merf_noise_multiplier=1.0),
    "dp-ntk": dict(strategy="dp-ntk", merf_noise_multiplier=1.0, ntk_width=5, ntk_dct=4),
}
SECURE = {
    "gswgan": dict(secure_aggregation=True),
    "fedavg-gan": dict(secure_aggregation=True, fedavg_noise_multiplier=1.0),
    "dp-merf": dict(secure_aggregation=True, secagg_cohort=3),
    "dp-ntk": dict(secure_aggregation=True, secagg_cohort=3),
}
NODE_POLICY = {"privacy-allow-nonprivate": "true", "privacy-trust-server": "true"}  # seeded noise: a test run


def configs() -> dict[str, dict]:
    out = {name: {**BASE, **changes} for name, changes in RUNS.items()}
    out.update({f"{name}+secure": {**BASE, **RUNS[name], **changes} for name, changes in SECURE.items()})
    return out


def fingerprint(name: str, changes: dict, work: Path) -> dict:
    cfg = prepare(ExperimentConfig(**{**changes, "out": str(work / name)}))
    transport = InProcessTransport(
        client_app,
        cfg.num_clients,
        node_state=work / f"{name}-nodes",
        node_config=NODE_POLICY,
        secagg_identities=cfg.secure_aggregation,
    )
    summary = run_experiment(cfg, RunDirectory.create(cfg), transport, transport_name="inprocess")
    privacy = json.loads((work / name / "privacy.json").read_text())
    generator = RunDirectory.open_existing(cfg.out)[0].load_checkpoint()
    out = {
        "status": summary["status"],
        "steps": summary["steps_completed"],
        "clients": [{k: c.get(k) for k in ("client_id", "queries", "epsilon", "ledger")} for c in privacy["clients"]],
        "beside": {k: privacy["epsilon_amplified"].get(k) for k in ("epsilon", "kind", "steps")},
        "generator_sha256": _weights_digest(generator) if name != "fedavg-gan+secure" else "(unseeded shares)",
    }
    if not cfg.secure_aggregation:
        out["bytes"] = summary["comm"]
    return out


def _weights_digest(checkpoint: dict) -> str:
    """SHA-256 over the released generator's tensors, in key order."""
    digest = hashlib.sha256()
    state = _released(checkpoint)
    for key in sorted(state):
        digest.update(key.encode())
        digest.update(state[key].detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _released(checkpoint: dict) -> dict[str, torch.Tensor]:
    """The released generator's state dict, wherever the method's checkpoint keeps it."""
    if "released_generator" in checkpoint:
        return checkpoint["released_generator"]
    tensors = {}
    stack = [("", checkpoint["strategy"])]
    while stack:
        prefix, node = stack.pop()
        for key, value in node.items():
            if torch.is_tensor(value):
                tensors[prefix + key] = value
            elif isinstance(value, dict):
                stack.append((f"{prefix}{key}.", value))
    return tensors


def differences(before: dict, after: dict, path: str = "") -> list[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        keys = sorted(set(before) | set(after))
        return [d for k in keys for d in differences(before.get(k), after.get(k), f"{path}/{k}")]
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [
            d for i, (a, b) in enumerate(zip(before, after, strict=True)) for d in differences(a, b, f"{path}[{i}]")
        ]
    return [] if before == after else [f"{path}: {str(before)[:120]} -> {str(after)[:120]}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/behaviour-fingerprint.json")
    parser.add_argument("--compare", default="", help="a fingerprint file to compare with (exit 1 on a difference)")
    parser.add_argument("--only", nargs="*", default=None, help="run names (default: all)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {n: c for n, c in configs().items() if args.only is None or n in args.only}
        result = {name: fingerprint(name, changes, Path(tmp)) for name, changes in runs.items()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True, default=str))
    if not args.compare:
        print(f"behaviour fingerprint: {len(result)} runs -> {args.out}")
        return 0
    before = json.loads(Path(args.compare).read_text())
    found = differences({k: before.get(k) for k in result}, json.loads(json.dumps(result, default=str)))
    print(f"behaviour fingerprint: {len(result)} runs, {len(found)} difference(s) against {args.compare}")
    for line in found[:40]:
        print("  " + line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
