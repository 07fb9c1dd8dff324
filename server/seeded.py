"""A seeded run (``--init-release``, ``common/methods/seeding``): both stages on one federation.

Stage 1 is the seed method's own run in ``<run>/seed/`` (its config, checkpoints and reports), over
the same nodes and the same node state, so every client's one ledger holds its seed release before
its GAN answers and the node's budget (the total) covers both. Stage 2 is the run itself: it starts
from what the server derives from the seed release (``SeedStart``: the fitted generator, the
embedding, a critic; ``<run>/seed_start.pt``) and from each client's stage-1 ledger (``PriorReleases``),
so its reports compose both stages and show each one's share.

Either stage resumes after a crash: stage 1 from its own checkpoint until its summary says it
completed, stage 2 from the run's checkpoint once it has one.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from common.data import num_classes_for
from common.io.tensor_files import load_tensors, save_tensors
from common.methods import ExperimentConfig
from common.methods.protocol import PriorReleases
from common.methods.seeding import SeedStart, federated, seed_config, server_critic, start_from_checkpoint
from common.privacy import PrivacyLedger

from .loop import run_experiment
from .reporting import CHECKPOINT, RunDirectory, RunDirectoryError
from .session import Transport, hello

SEED_DIR = "seed"
START_FILE = "seed_start.pt"


def seed_run(run: RunDirectory, cfg: ExperimentConfig) -> tuple[RunDirectory, ExperimentConfig]:
    """Stage 1's run directory (created on first use) and configuration; its nodes keep their state
    where the run's do."""
    first = seed_config(cfg).replace(out=str(run.path / SEED_DIR))
    path = run.path / SEED_DIR
    if (path / "config.json").is_file():
        return RunDirectory(path), first
    return RunDirectory.create(first, state_dir=run.state_dir), first


def check_resumable(run: RunDirectory, cfg: ExperimentConfig) -> None:
    """What ``--resume`` needs of a seeded run: stage 2's checkpoint, or else stage 1's."""
    if (run.path / CHECKPOINT).is_file():
        run.resumable_checkpoint()
    elif (run.path / SEED_DIR / CHECKPOINT).is_file():
        RunDirectory(run.path / SEED_DIR).resumable_checkpoint()
    else:
        run.resumable_checkpoint()  # its error: nothing to resume


def run_configured(
    cfg: ExperimentConfig,
    run: RunDirectory,
    transport: Transport,
    *,
    resume: bool = False,
    transport_name: str,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """The run ``cfg`` describes, on any transport (a simulation, a deployment): both stages of a
    seeded one (each resuming from its own checkpoint), else ``run_experiment`` (a seed that a curator
    makes in the run's first round, ``seeding/pooled.py``, included)."""
    if federated(cfg):
        return run_seeded(cfg, run, transport, transport_name=transport_name, stop=stop)
    return run_experiment(cfg, run, transport, resume=resume, transport_name=transport_name, stop=stop)


def run_seeded(
    cfg: ExperimentConfig,
    run: RunDirectory,
    transport: Transport,
    *,
    transport_name: str,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """Stage 1 unless it completed, then stage 2 from it (each resumed where it has a checkpoint);
    returns stage 2's summary, or stage 1's with its status marked when it did not complete."""
    first_run, first = seed_run(run, cfg)
    done = completed_summary(first_run)
    if done is None:
        # Before stage 1 (again on a resume: a node may have tightened its policy since), every node
        # checks the whole run against its policy (the total budget, stage 2's noise): one that admits
        # the seed's share but not the rest refuses now, instead of releasing its seed for a run that
        # then stops (``NodeRefused``).
        hello(cfg, transport, transport.node_ids(cfg.num_clients))
        done = run_experiment(
            first,
            first_run,
            transport,
            resume=(first_run.path / CHECKPOINT).is_file(),
            transport_name=transport_name,
            stop=stop,
        )
        if done["status"] != "completed":
            return {**done, "status": f"seed stage: {done['status']}", "run_dir": str(run.path)}
    prior = seed_prior(cfg, run, first_run, first, seed_wall_s=float(done.get("wall_s") or 0.0))
    resume = (run.path / CHECKPOINT).is_file()
    return run_experiment(cfg, run, transport, resume=resume, transport_name=transport_name, stop=stop, prior=prior)


def completed_summary(first_run: RunDirectory) -> dict[str, Any] | None:
    """Stage 1's summary if it completed (then it is not run again), else None."""
    path = first_run.path / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    return summary if summary.get("status") == "completed" else None


def seed_prior(
    cfg: ExperimentConfig,
    run: RunDirectory,
    first_run: RunDirectory,
    first: ExperimentConfig,
    *,
    seed_wall_s: float,
) -> PriorReleases:
    """Stage 1 as stage 2 accounts for it: each client's stage-1 ledger (from its privacy.json, the
    larger of the server's record and the client's own), one unsampled release of the federation
    for the server's figure, the seed's share for the report, and what stage 2 starts from;
    ``seed_wall_s`` (stage 1's summary says it) and the start's derivation are the time before it."""
    report = json.loads((first_run.path / "privacy.json").read_text())
    clients = {
        int(c["client_id"]): PrivacyLedger.from_state_dict(c["ledger"]) for c in report["clients"] if c["queries"] > 0
    }
    worst = max((c["epsilon"] for c in report["clients"] if c["queries"] > 0), default=0.0)
    event = next(iter(clients.values())).history[0] if clients else None
    share = {
        "stage": "seed",
        "method": first.strategy,
        "epsilon_max": worst,
        "accounting": report["accounting"],
        "releases": sum(c["queries"] for c in report["clients"]),
    }
    description = (
        f"Stage 1 (the seed, {first.strategy}): {_first_sentence(report['statement'])} Its per-client ε was at most "
        f"{_fmt(worst)} ({report['accounting']}). Stage 2 started from the generator the server fitted to that "
        "release, kept fitting the released embedding and gave each client's discriminator a critic trained on "
        "the fitted generator's samples: post-processing, no further cost. Every per-client ε above composes both "
        "stages in the client's one ledger."
    )
    amplified = report.get("epsilon_amplified", {})
    beside = PrivacyLedger.from_state_dict(amplified["ledger"]) if amplified.get("ledger") else None
    start = seed_start(cfg, run, first_run)
    return PriorReleases(
        beside=beside,
        clients=clients,
        server=[event] if event is not None else [],
        description=description,
        start=start,
        stages=share,
        wall_s=seed_wall_s + start.derive_s,
    )


def seed_start(cfg: ExperimentConfig, run: RunDirectory, first_run: RunDirectory) -> SeedStart:
    """What stage 2 starts from: derived once from stage 1's last checkpoint (the critic's training
    is deterministic in the run's seed) and kept in ``<run>/seed_start.pt`` for a resume."""
    path = run.path / START_FILE
    if path.is_file():
        try:
            return SeedStart.from_state_dict(load_tensors(path))
        except Exception as err:  # noqa: BLE001 - derived, not precious: derive it again
            print(f"fedgan: {path} unreadable ({type(err).__name__}); derived again from the seed stage")
    began = time.monotonic()
    try:
        start = start_from_checkpoint(first_run.load_checkpoint())
    except (KeyError, ValueError) as err:
        raise RunDirectoryError(f"{first_run.path}: the seed stage left no generator to start from ({err})") from err
    if cfg.init_critic_steps:
        start.critic = server_critic(cfg, start, num_classes_for(cfg))
    start.derive_s = time.monotonic() - began
    save_tensors(start.state_dict(), path)  # atomic
    return start


def _first_sentence(statement: str) -> str:
    """The seed statement's mechanism: its sentences after the header, up to the per-client figures."""
    body = statement.split("). ", 1)[-1]
    return body.split(" Per-client", 1)[0].strip()


def _fmt(eps: float | None) -> str:
    return "unbounded" if eps is None else f"{eps:.3g}"


__all__ = [
    "SEED_DIR",
    "check_resumable",
    "completed_summary",
    "run_configured",
    "run_seeded",
    "seed_prior",
    "seed_run",
    "seed_start",
]
