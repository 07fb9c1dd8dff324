"""DPGAN's curator on the node's disk: D, G, both optimizers, the schedule, the ledger, the public
RNG and a seeded run's release (the anchor's target and its latents' RNG), written after every
round (tensors and plain data only) and read back at the next; the secret sampler keeps nothing.
A small in-process cache spares reading back the current round."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.io.tensor_files import load_tensors, save_tensors
from common.privacy import PrivacyLedger

from .curator import DpganNode, new_node, seed_anchor

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

_NODES: dict[str, DpganNode] = {}


def node_path(state_dir: str | Path) -> Path:
    return Path(state_dir) / "dpgan-node.pt"


def save_node(node: DpganNode, state_dir: str | Path) -> None:
    path = node_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {
        "D": node.trainer.D.state_dict(),
        "d_opt": node.trainer.optimizer.original_optimizer.state_dict(),
        "G": node.generator.state_dict(),
        "g_opt": node.g_optimizer.state_dict(),
        "schedule": node.schedule.state_dict() if node.schedule else None,
        "n_d": node.n_d,
        "ledger": node.ledger.state_dict(),
        "rng": node.rng.get_state(),
        "rounds": node.rounds,
        "steps_taken": node.trainer.steps_taken,
        "sampler": node.sampler.state_dict(),
        "public_warmed": node.public_warmed,
        "group_bounds": node.trainer.group_bounds,
        "seed_done": node.seed_done,
        "seed_target": node.seed_target,
        "anchor": node.anchor.state_dict() if node.anchor is not None else None,
        **_classifier_blob(node),
    }
    save_tensors(blob, path)
    _NODES[str(state_dir)] = node


def _classifier_blob(node: DpganNode) -> dict[str, Any]:
    C = node.classifier
    if C is None:
        return {}
    return {
        "C": C.C.state_dict(),
        "c_opt": C.optimizer.original_optimizer.state_dict(),
        "c_steps": C.steps_taken,
        "c_ready": node.classifier_ready,
    }


def _load_seed(cfg: ExperimentConfig, node: DpganNode, blob: dict[str, Any]) -> None:
    """A seeded run's release and its anchor, as saved (a file from before seeding: none)."""
    node.seed_done = bool(blob.get("seed_done", True))
    if blob.get("seed_target") is None:
        return
    node.seed_target = blob["seed_target"]
    node.anchor = seed_anchor(cfg, node.seed_target, node.images.device)
    if node.anchor is not None and blob.get("anchor") is not None:
        node.anchor.load_state_dict(blob["anchor"])


def load_ledger(state_dir: str | Path) -> PrivacyLedger:
    """The node's ledger as its file stands (empty before its first round)."""
    path = node_path(state_dir)
    if not path.exists():
        return PrivacyLedger()
    return PrivacyLedger.from_state_dict(load_tensors(path)["ledger"])


def load_node(cfg: ExperimentConfig, state_dir: str | Path, rounds: int) -> DpganNode:
    """The node at ``rounds`` rounds: from memory when current, else from disk, else new."""
    cached = _NODES.get(str(state_dir))
    if cached is not None and cached.rounds == rounds:
        return cached
    node = new_node(cfg)
    path = node_path(state_dir)
    if path.exists():
        blob = load_tensors(path)
        node.trainer.D.load_state_dict(blob["D"])
        node.trainer.optimizer.original_optimizer.load_state_dict(blob["d_opt"])
        node.generator.load_state_dict(blob["G"])
        node.g_optimizer.load_state_dict(blob["g_opt"])
        if node.schedule is not None and blob["schedule"] is not None:
            node.schedule.load_state_dict(blob["schedule"])
        node.n_d, node.rounds = int(blob["n_d"]), int(blob["rounds"])
        node.ledger = PrivacyLedger.from_state_dict(blob["ledger"])
        node.rng.set_state(blob["rng"])
        node.sampler.load_state_dict(blob.get("sampler", {}))
        node.trainer.steps_taken = int(blob["steps_taken"])
        node.public_warmed = bool(blob.get("public_warmed", True))
        if blob.get("group_bounds") and node.trainer.group_bounds is not None:
            node.trainer.optimizer.set_bounds(list(blob["group_bounds"]))
        _load_seed(cfg, node, blob)
        if node.classifier is not None and "C" in blob:
            node.classifier.C.load_state_dict(blob["C"])
            node.classifier.optimizer.original_optimizer.load_state_dict(blob["c_opt"])
            node.classifier.steps_taken, node.classifier_ready = int(blob["c_steps"]), bool(blob["c_ready"])
    _NODES[str(state_dir)] = node
    return node
