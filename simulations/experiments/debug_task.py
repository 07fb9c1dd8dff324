"""``fedgan debug-task``: the debugging task of Augenstein et al. (2020), end to end.

A fraction of clients have all their images inverted (a "bug" in their pipeline the modeller cannot
see). The modeller ships a classifier trained on clean data; every client measures its accuracy
on-device and releases it through a Gaussian mechanism (recorded in its ledger). Clients below a
threshold are "suspect". One private generator is trained on the suspects, one on the rest, from
the same shared client state (so each client's ε covers its selection query and its training). The
inverted glyphs show in the suspects' generator: the output says so with a number, the fraction of
generated samples whose mean intensity exceeds the background level.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.data import data_root, invert_clients, num_classes_for
from common.evaluation.domain_classifier import load_or_train_domain_classifier
from common.evaluation.grids import side_by_side
from common.learning.models import build_generator, sample_latent
from common.messages import ACCURACY, AccuracyQuery, AccuracyReply
from common.methods import ExperimentConfig, method
from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.events import VOID_NOISE_SEED
from protos import wire
from server.loop import run_experiment
from server.reporting import RunDirectory, atomic_write_json, next_run_dir
from server.session import hello
from server.strategy import Outgoing, PriorReleases

from .simulate import RayPlacement, run_on_transport

BRIGHT_LEVEL = 0.5  # mean intensity of an upright digit is ~0.13, of an inverted one ~0.87


def select_suspects(
    cfg: ExperimentConfig, classifier: torch.nn.Module, transport, *, noise_multiplier: float
) -> dict[int, dict[str, Any]]:
    """Ask every client for its noisy on-device accuracy of ``classifier``."""
    nodes = transport.node_ids(cfg.num_clients)
    mapping = hello(cfg, transport, nodes).mapping
    content = wire.encode(AccuracyQuery(noise_multiplier=noise_multiplier, classifier=classifier.state_dict()))
    result = {}
    for reply in transport.exchange([Outgoing(node, ACCURACY, content) for node in nodes]).replies:
        if reply.content is None:
            raise RuntimeError(f"node {reply.node_id} failed the selection query: {reply.error}")
        answer = wire.decode(AccuracyReply, reply.content)
        result[mapping[reply.node_id]] = {
            "accuracy_noisy": None if answer.refused else answer.accuracy,
            "reason": answer.reason,
        }
    return dict(sorted(result.items()))


def selection_prior(
    cfg: ExperimentConfig, selection: dict[int, dict[str, Any]], noise_multiplier: float
) -> PriorReleases:
    """The selection query as both group runs must account for it: one Gaussian release (noise
    multiplier σ_sel on an accuracy of client-level sensitivity 1) by every client that answered,
    and for the amplified figure one unsampled release of the whole federation."""
    event = PrivacyEvent(noise_multiplier=noise_multiplier, void=VOID_NOISE_SEED if cfg.noise_seed >= 0 else "")
    answered = [c for c, s in selection.items() if s["accuracy_noisy"] is not None]
    return PriorReleases(
        clients={c: PrivacyLedger([event]) for c in answered},
        server=[event] if answered else [],
        description=(
            f"Both generators of the debugging task depend on every client's selection release (its "
            f"noisy on-device accuracy, noise multiplier {noise_multiplier:g} on a sensitivity of 1: "
            "per client), which every figure above includes, for clients outside this group too."
        ),
    )


@torch.no_grad()
def bright_fraction(run: RunDirectory, cfg: ExperimentConfig, num_samples: int) -> float:
    """Fraction of the released generator's samples whose mean intensity exceeds BRIGHT_LEVEL."""
    ckpt = run.load_checkpoint()
    gen = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes_for(cfg))
    gen.load_state_dict(ckpt["released_generator"])
    gen.eval()
    labels = torch.arange(num_samples) % num_classes_for(cfg)
    images = gen(sample_latent(num_samples, cfg.z_dim, generator=torch.Generator().manual_seed(0)), labels)
    return float((images.flatten(1).mean(dim=1) > BRIGHT_LEVEL).float().mean())


def debug_task(
    cfg: ExperimentConfig,
    *,
    threshold: float,
    selection_noise: float,
    transport: str,
    num_samples: int = 1000,
    node_state: str | Path | None = None,
) -> dict[str, Any]:
    """Run the whole task; returns (and writes) ``debug_task.json``. ``node_state``: where the
    simulated nodes keep their state and ledgers (default: the task's clients/)."""
    if not method(cfg.strategy).accepts_prior_releases:
        raise ValueError(
            f"the debugging task needs a method that accounts for the selection release made "
            f"before its runs (gswgan), not {cfg.strategy}"
        )
    out = Path(cfg.out) if cfg.out else next_run_dir("runs", cfg, label="debug-task")
    out.mkdir(parents=True, exist_ok=False)
    state_dir = Path(node_state) if node_state else out / "clients"
    classifier, clf_meta = load_or_train_domain_classifier(
        cfg.dataset,
        data_dir=cfg.data_dir,
        emnist_split=cfg.emnist_split,
        cache_dir=data_root(cfg.data_dir) / ".fedgan-cache",
        seed=cfg.seed,
        # The modeller's classifier is trained on clean data of its own; for the synthetic set,
        # at least 50 writers x 100 images whatever the federation's size, so that it is accurate.
        synthetic_writers=max(cfg.synthetic_writers or cfg.num_clients, 50),
        synthetic_samples_per_writer=max(cfg.synthetic_samples_per_writer, 100),
        progress=cfg.progress,
    )
    selection, error = run_on_transport(
        cfg.num_clients,
        lambda t: select_suspects(cfg, classifier, t, noise_multiplier=selection_noise),
        transport,
        reply_timeout_s=cfg.reply_timeout_s,
        ray=RayPlacement.of(cfg),
        node_state=state_dir,
    )
    if error is not None:
        raise error
    truth = invert_clients(cfg.num_clients, cfg.invert_prob, seed=cfg.seed)
    suspects = [c for c, s in selection.items() if s["accuracy_noisy"] is not None and s["accuracy_noisy"] < threshold]
    rest = [c for c, s in selection.items() if s["accuracy_noisy"] is not None and c not in suspects]
    prior = selection_prior(cfg, selection, selection_noise)
    groups = {}
    for name, members in (("suspect", suspects), ("rest", rest)):
        groups[name] = _train_group(cfg, out, name, members, state_dir, transport, num_samples, prior)
    result = _result(cfg, out, selection, truth, suspects, rest, groups, clf_meta, threshold, selection_noise)
    if all(g.get("samples_png") for g in groups.values()):
        side_by_side(
            Path(groups["suspect"]["samples_png"]),
            Path(groups["rest"]["samples_png"]),
            out / "side_by_side.png",
            titles=(f"suspect clients ({len(suspects)})", f"other clients ({len(rest)})"),
        )
        result["side_by_side_png"] = str(out / "side_by_side.png")
    atomic_write_json(out / "debug_task.json", result)
    return result


def _train_group(
    cfg: ExperimentConfig,
    out: Path,
    name: str,
    members: list[int],
    state_dir: Path,
    transport: str,
    num_samples: int,
    prior: PriorReleases,
) -> dict[str, Any]:
    if not members:
        return {"clients": [], "note": f"no {name} clients: nothing to train"}
    group_cfg = cfg.replace(
        client_subset=",".join(map(str, members)),
        out=str(out / name),
        clients_per_step=min(cfg.clients_per_step, len(members)),
    )
    run = RunDirectory.create(group_cfg, state_dir=state_dir)
    summary, error = run_on_transport(
        cfg.num_clients,
        lambda t: run_experiment(group_cfg, run, t, transport_name=transport, prior=prior),
        transport,
        reply_timeout_s=cfg.reply_timeout_s,
        ray=RayPlacement.of(cfg),
        node_state=run.state_dir,
    )
    if error is not None:
        raise error
    samples = sorted((run.path / "samples").glob("step-*.png"))
    # Every client, member or not: the selection release of each decided this group.
    eps = {c["client_id"]: c["epsilon"] for c in summary["clients"]}
    return {
        "clients": members,
        "run_dir": str(run.path),
        "steps_completed": summary["steps_completed"],
        "epsilon_max_per_client": summary["epsilon_max"],
        "epsilon_per_client": eps,
        "epsilon_amplified": summary["epsilon_amplified"]["epsilon"],
        "accounting": summary["accounting"] + "; includes every client's selection query (members and others)",
        "bright_fraction": bright_fraction(run, group_cfg, num_samples),
        "num_samples": num_samples,
        "samples_png": str(samples[-1]) if samples else None,
    }


def _result(cfg, out, selection, truth, suspects, rest, groups, clf_meta, threshold, selection_noise):
    inverted = [int(c) for c in np.flatnonzero(truth)]
    hits = len(set(suspects) & set(inverted))
    ledger_note = (
        "each client's ledger holds its selection query (a Gaussian mechanism with noise "
        f"multiplier {selection_noise} on its accuracy, client-level sensitivity 1) and its GS-WGAN answers"
    )
    return {
        "run_dir": str(out),
        "invert_prob": cfg.invert_prob,
        "delta": cfg.delta,
        "threshold": threshold,
        "bright_level": BRIGHT_LEVEL,
        "classifier": {k: clf_meta[k] for k in ("test_accuracy", "num_train", "num_test") if k in clf_meta},
        "selection": {str(c): {**s, "inverted": bool(truth[c])} for c, s in selection.items()},
        "selection_precision": hits / len(suspects) if suspects else None,
        "selection_recall": hits / len(inverted) if inverted else None,
        "groups": groups,
        "privacy": ledger_note,
    }


def format_result(result: dict[str, Any]) -> str:
    lines = [
        f"debugging task in {result['run_dir']}",
        f"selection: {len(result['groups']['suspect']['clients'])} suspect clients (accuracy < "
        f"{result['threshold']}), precision {result['selection_precision']}, recall {result['selection_recall']}",
    ]
    for name, group in result["groups"].items():
        if "bright_fraction" in group:
            worst = group["epsilon_max_per_client"]
            lines.append(
                f"{name:>8}: bright samples {group['bright_fraction']:.1%} of {group['num_samples']} "
                f"(mean intensity > {result['bright_level']}); ε max per client "
                f"{'unbounded' if worst is None else format(worst, '.4g')} (δ={result['delta']:g})"
            )
        else:
            lines.append(f"{name:>8}: {group['note']}")
    if "side_by_side_png" in result:
        lines.append(f"samples side by side: {result['side_by_side_png']}")
    return "\n".join(lines)
