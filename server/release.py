"""What a run may publish, apart from what only its operator may read (``publish/``).

Why: the amplified ε (the server samples clients in secret) and Fed-Avg's user-level ε hold only
against readers who do not know which clients were sampled when. summary.json and privacy.json list
each client's answers, metrics.jsonl the clients of each step, and the notes name clients per step:
with the rounds a Fed-Avg client took part in known, its ε was 9.02 where 7.50 was printed. Some
evaluation figures are computed from the clients' own training data, too. So a run writes two kinds
of output and says, in each, which ε its readers may rely on:

- ``publish/`` (release.json, generator.pt, samples.png, README.txt): nothing per client and nothing
  per step; the per-client ε only where it holds whatever the sampling (a budget every node enforced
  before each release, or a method without client sampling), the amplified ε with its assumption,
  and the evaluation figures computed from held-out data only (``fedgan evaluate`` adds them);
- everything else in the run directory (``PRIVATE.txt`` says so): the operator's, who knows the
  sampling and so may rely only on the per-client figures.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from common.channels.secure_server import KIND_SECURE_SUM, secure_basis
from common.io.tensor_files import save_tensors
from common.methods import ExperimentConfig

from .reporting import RunDirectory, atomic_write_json

PUBLISH_DIR = "publish"
RELEASE_FILE = "release.json"

READERS_PRIVATE = (
    "operator only: this file names which clients were sampled and when (their answers, the clients of each "
    "step, notes per step). A reader of it knows the sampling, so the amplified / user-level ε does not hold "
    "against them: rely on the per-client figures. What may be published is in publish/."
)
READERS_PUBLIC = (
    "publishable: nothing here says which client was sampled when. A reader who has seen only this folder "
    "may rely on epsilon_amplified (under its stated assumption) and on epsilon_per_client where it is given."
)
PRIVATE_TEXT = f"""This run directory is its operator's. Publish only {PUBLISH_DIR}/.

summary.json, privacy.json, metrics.jsonl, report.html, eval.json, plots/ and checkpoint.pt name which
clients were sampled in which step, or carry figures computed from the clients' own training data;
clients/ (in a simulation) holds every client's raw partition, its un-noised discriminator and its
ledgers. Against anyone who has read these files the amplified (secret sampling) epsilon does not
hold: they may rely on the per-client figures only.
"""
PUBLISH_README = f"""Publishable output of this run (see {RELEASE_FILE}'s "readers"):

  {RELEASE_FILE}  the method, the mechanism, the epsilon a reader may rely on, held-out evaluation figures
  generator.pt  the released generator's weights (a plain state dict of tensors)
  samples.png   its last sample grid

Nothing here says which client was sampled when, and no figure here was computed from the clients' data.
"""
MECHANISM_KEYS = ("strategy", "dataset", "partition", "model", "num_clients", "delta", "method")


def per_client_epsilon(cfg: ExperimentConfig, report: dict[str, Any]) -> dict[str, Any]:
    """The per-client ε a reader without the sampling may rely on, and on what basis."""
    if report["epsilon_max"] is None:
        return {
            "epsilon": None,
            "basis": "unbounded against the server, whatever the sampling: "
            + "; ".join(report.get("not_private") or ["its releases carry no noise of the client's own"]),
        }
    if report["epsilon_kind"].startswith(KIND_SECURE_SUM):  # beside it: the deviating server's, not amplified
        return {"epsilon": report["epsilon_max"], "basis": secure_basis(cfg.secagg_colluders)}
    sampled = report["epsilon_amplified"].get("epsilon") is not None
    if not sampled:
        return {
            "epsilon": report["epsilon_max"],
            "basis": "every client's ledger, maximum over clients: no client sampling to keep secret",
        }
    if cfg.client_epsilon_budget > 0:
        return {
            "epsilon": cfg.client_epsilon_budget,
            "basis": "an upper bound, whatever the sampling: every node refused any release beyond this budget",
        }
    return {
        "epsilon": None,
        "basis": "withheld: without a per-client budget the figure depends on how often each client was sampled "
        "(the operator's summary.json has it; set --target-epsilon or --client-epsilon-budget for a bound)",
    }


def release_document(cfg: ExperimentConfig, summary: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    amplified = {k: v for k, v in report["epsilon_amplified"].items() if k != "ledger"}
    return {
        "readers": READERS_PUBLIC,
        **{k: summary.get(k) for k in MECHANISM_KEYS},
        "steps_completed": summary["steps_completed"],
        "status": summary["status"],
        "accountant": cfg.accountant,
        "epsilon_kind": report["epsilon_kind"],
        "accounting": report["accounting"],
        "mechanism": report["mechanism"],
        "not_private": report["not_private"],
        "epsilon_per_client": per_client_epsilon(cfg, report),
        "epsilon_amplified": amplified,
        "eval": {},
    }


def write_release(
    run: RunDirectory,
    cfg: ExperimentConfig,
    summary: dict[str, Any],
    report: dict[str, Any],
    generator: torch.nn.Module,
) -> Path:
    """publish/ (release.json, generator.pt, samples.png, README.txt) and the run's PRIVATE.txt."""
    folder = run.path / PUBLISH_DIR
    folder.mkdir(exist_ok=True)
    (run.path / "PRIVATE.txt").write_text(PRIVATE_TEXT)
    (folder / "README.txt").write_text(PUBLISH_README)
    save_tensors({k: v.detach().cpu() for k, v in generator.state_dict().items()}, folder / "generator.pt")
    samples = sorted((run.path / "samples").glob("step-*.png"))
    if samples:
        shutil.copyfile(samples[-1], folder / "samples.png")
    atomic_write_json(folder / RELEASE_FILE, release_document(cfg, summary, report))
    return folder


def add_publishable_eval(run: RunDirectory, figures: dict[str, Any]) -> None:
    """The evaluation figures computed from held-out data only, into release.json (if the run wrote one)."""
    path = run.path / PUBLISH_DIR / RELEASE_FILE
    if not path.is_file():
        return
    document = json.loads(path.read_text())
    document["eval"] = figures
    atomic_write_json(path, document)
