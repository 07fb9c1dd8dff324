"""Lean wire: bytes per GS-WGAN generator step (CT) per wire encoding and critic-fake variant.

Each variant runs the same configuration for a few steps through the one round loop
(``server.loop.run_experiment``) with the in-process transport, which builds real Flower messages
and counts them with ``protos.wire.message_wire_bytes``, exactly as summary.json's
``comm.bytes_per_step`` does. CT is bytes per generator step per participating client, down + up.
Writes ``bench/results/lean_wire.json`` and prints one line.

    python bench/lean_wire.py [--steps 5] [--model tiny] [--batch-size 32] [--n-critic 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from client.app import app as client_app  # noqa: E402
from common.methods import ExperimentConfig  # noqa: E402
from server.loop import run_experiment  # noqa: E402
from server.reporting import RunDirectory  # noqa: E402
from server.transport import InProcessTransport  # noqa: E402

VARIANTS: dict[str, dict[str, object]] = {
    "float32": dict(wire_samples="float32", wire_dtype="float32", wire_compression="none"),
    "uint8+float16": dict(wire_samples="uint8", wire_dtype="float16", wire_compression="none"),
    "uint8+float16+deflate (default)": dict(wire_samples="uint8", wire_dtype="float16", wire_compression="deflate"),
    "query fakes": dict(critic_fakes="query"),
    "replay fakes": dict(critic_fakes="replay"),
}


def run_variant(cfg: ExperimentConfig) -> dict[str, float]:
    """CT of one short in-process run (bytes per step per participating client)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = cfg.replace(out=str(Path(tmp) / "run"))
        run = RunDirectory.create(cfg)
        summary = run_experiment(cfg, run, InProcessTransport(client_app, cfg.num_clients), transport_name="inprocess")
        return summary["comm"]["bytes_per_step"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--n-critic", type=int, default=5)
    parser.add_argument("--num-clients", type=int, default=3)
    args = parser.parse_args()
    base = ExperimentConfig(
        steps=args.steps,
        model=args.model,
        batch_size=args.batch_size,
        n_critic=args.n_critic,
        num_clients=args.num_clients,
        progress=False,
        log_every=10**6,
        sample_every=10**6,
        checkpoint_every=10**6,
        eval=False,
    )
    results = {name: run_variant(base.replace(**changes)) for name, changes in VARIANTS.items()}
    out = {
        "config": base.to_dict(),
        "variants": {n: {"changes": VARIANTS[n], "bytes_per_step": r} for n, r in results.items()},
        "definition": "CT: serialized Flower message bytes per generator step per participating client "
        "(down + up), counted by protos.wire.message_wire_bytes",
    }
    path = ROOT / "bench" / "results" / "lean_wire.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    cts = ", ".join(f"{name} {r['total']:.4g}" for name, r in results.items())
    print(
        f"lean_wire (B={args.batch_size}, n_critic={args.n_critic}, {args.model}, {args.steps} steps): "
        f"CT bytes/step {cts} -> {path.relative_to(ROOT)}"
    )


if __name__ == "__main__":
    main()
