"""``fedgan audit``: canary clients through the releases a run's clients made, and what ε they show.

White box, per-client unit (the headline guarantee: an untrusted server sees every release). Each of
m canary clients is inserted (its data give the summary or per-sample gradient +a·u) or left out (−a·u:
the replace-one neighbour) with probability ½ from a CSPRNG, where u is one coordinate of the
release and a = 1.5× the clip bound, so clipping acts. Each canary then makes the releases a client
of the run made, through the method's own release code (its clip, its noise source, its ledger,
its budget check; GS-WGAN's wire encoding too), and the attacker — the server — scores it by the sum
of the released u-coordinates (the likelihood-ratio test of a Gaussian shift). From scores and bits:
Steinke et al.'s one-run bound, a Clopper–Pearson bound, and the μ of the Gaussian curve the ledger
claims (``common/privacy/audit.py``), beside the ε the canaries' own ledgers say.

Black box: a distance-to-nearest-synthetic-sample membership test on the released generator
(training images of the run's clients vs. held-out test images), reported beside, as AUC and TPR at
low FPR (no ε: the members are not randomized).

Each method's canary lives in its folder (``Method.canary_score``; ``auditable``): GS-WGAN and
DP-MERF have one. DPGAN (example-level DP-SGD on pooled data) and Fed-Avg (raw deltas: unbounded
against the server, which its ledgers already say) are not audited here.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from common.channels import channel_for
from common.client_state import ClientState
from common.data.clients import ClientData
from common.methods import METHODS, ExperimentConfig, method
from common.privacy import NodePolicy, PrivacyLedger
from common.privacy.audit import (
    best_one_run_epsilon,
    claimed_mu,
    clopper_pearson_epsilon,
    gaussian_epsilon,
    gaussian_mu_lower,
)

CANARY_BASE_ID = 10**7  # canary clients' ids: far from any federation's own
MAGNITUDE = 1.5  # canary summary / gradient norm, in clip bounds: clipping must act


def canary_state(client_id: int) -> ClientState:
    """A client with no data of its own: its releases come from the canary's crafted input."""
    empty = ClientData(torch.zeros(0, 1, 28, 28), torch.zeros(0, dtype=torch.long), client_id, False)
    return ClientState(client_id, None, None, PrivacyLedger(), torch.Generator(), empty)


# --- the audit ----------------------------------------------------------------------------------
def run_canaries(cfg: ExperimentConfig, *, canaries: int, releases: int, policy: NodePolicy) -> tuple:
    """Scores, inserted bits and the canaries' ledgers (in canary order)."""
    chosen = method(cfg.strategy)
    if not chosen.auditable:
        audited = ", ".join(name for name, m in METHODS.items() if m.auditable)
        raise ValueError(f"fedgan audit covers {audited}, not {cfg.strategy}")
    channel = channel_for(cfg)
    if channel.sums:  # its canaries run the release a client sends alone, not a sum's
        raise ValueError(
            f"fedgan audit does not cover releases through secure sums yet (release channel {channel.name}): its "
            "canaries would audit the release in the clear, not the one this run's ε describes"
        )
    bits = np.array([secrets.randbits(1) == 1 for _ in range(canaries)])  # never from the run's seed
    states = [canary_state(CANARY_BASE_ID + i) for i in range(canaries)]
    scores = np.array(
        [
            chosen.canary_score(s, cfg, 1 if b else -1, MAGNITUDE, releases, policy)
            for s, b in zip(states, bits, strict=True)
        ]
    )
    return scores, bits, [s.ledger for s in states]


def choose_threshold(
    scores: np.ndarray, bits: np.ndarray, bound: Callable[[np.ndarray, np.ndarray, float], float]
) -> float:
    """The threshold at which ``bound(in_scores, out_scores, threshold)`` — a lower bound itself, so
    thresholds whose rates rest on a few canaries lose — is largest on these scores, over midpoints
    between up to 200 quantiles."""
    ins, outs = scores[bits], scores[~bits]
    cuts = np.unique(np.quantile(scores, np.linspace(0, 1, 201)))
    candidates = (cuts[:-1] + cuts[1:]) / 2 if len(cuts) > 1 else cuts
    values = [bound(ins, outs, float(t)) for t in candidates]
    return float(candidates[int(np.argmax(values))])


def bounds(scores: np.ndarray, bits: np.ndarray, *, delta: float, confidence: float) -> dict[str, Any]:
    """Every lower bound from one set of scores: one-run on all canaries; the threshold tests on the
    second half, their threshold chosen on the first half (``choose_threshold``), so that no label of
    the half they are computed on chose it. Each of the three at a third of 1 − confidence, so that
    their maximum holds at ``confidence`` (Bonferroni)."""
    significance = (1 - confidence) / 3
    one_run, guesses = best_one_run_epsilon(scores, bits, delta=delta, significance=significance)
    half = len(scores) // 2

    def cp(i: np.ndarray, o: np.ndarray, t: float) -> float:
        return clopper_pearson_epsilon(i, o, t, delta=delta, significance=significance)[0]

    def gauss(i: np.ndarray, o: np.ndarray, t: float) -> float:
        return gaussian_mu_lower(i, o, t, significance=significance)

    cp_threshold = choose_threshold(scores[:half], bits[:half], cp)
    threshold = choose_threshold(scores[:half], bits[:half], gauss)
    ins, outs = scores[half:][bits[half:]], scores[half:][~bits[half:]]
    eps_cp = clopper_pearson_epsilon(ins, outs, cp_threshold, delta=delta, significance=significance)[0]
    _, tpr, fpr = clopper_pearson_epsilon(ins, outs, threshold, delta=delta, significance=significance)
    mu_low = gaussian_mu_lower(ins, outs, threshold, significance=significance)
    return {
        "epsilon_one_run": one_run,
        "one_run_guesses": {"canaries": guesses.m, "guesses": guesses.r, "correct": guesses.v},
        "epsilon_clopper_pearson": eps_cp,
        "tpr": tpr,
        "fpr": fpr,
        "threshold": threshold,
        "mu_lower": mu_low,
        "epsilon_gaussian_lower": gaussian_epsilon(mu_low, delta) if math.isfinite(mu_low) else math.inf,
    }


def ledger_claims(ledgers: list[PrivacyLedger], delta: float) -> dict[str, Any]:
    """What the canaries' own ledgers say: the largest ε any of them prints, and the μ they claim."""
    worst = max(ledgers, key=lambda led: (led.epsilon(delta=delta), led.queries))
    history = worst.history
    mu = claimed_mu([e.noise_multiplier for e in history], [e.count for e in history])
    eps = worst.epsilon(delta=delta)
    return {
        "epsilon_ledger": eps if math.isfinite(eps) else None,
        "ledger_releases": worst.queries,
        "mu_claimed": mu if math.isfinite(mu) else None,
        "epsilon_gaussian_exact": gaussian_epsilon(mu, delta) if math.isfinite(mu) else None,
    }


def audit(
    cfg: ExperimentConfig, *, canaries: int, releases: int, confidence: float = 0.95, policy: NodePolicy | None = None
) -> dict[str, Any]:
    """The white-box audit of ``cfg``'s per-client releases: canary design, bounds, ledger figures,
    and whether any lower bound contradicts the ledger (``violated``)."""
    policy = policy or NodePolicy(allow_nonprivate=True)
    scores, bits, ledgers = run_canaries(cfg, canaries=canaries, releases=releases, policy=policy)
    found = bounds(scores, bits, delta=cfg.delta, confidence=confidence)
    claims = ledger_claims(ledgers, cfg.delta)
    lower = max(found["epsilon_one_run"], found["epsilon_clopper_pearson"], found["epsilon_gaussian_lower"])
    printed = claims["epsilon_ledger"]
    return {
        "strategy": cfg.strategy,
        "unit": "per client, untrusted server (white box: the releases the server receives)",
        "canaries": canaries,
        "releases_per_canary": releases,
        "inserted": int(bits.sum()),
        "confidence": confidence,
        "delta": cfg.delta,
        "design": (
            f"{canaries} canary clients, each inserted with probability 1/2 (CSPRNG); inserted: crafted input "
            f"+{MAGNITUDE}x the clip bound along one coordinate u of the release, left out: the replace-one "
            f"neighbour (-{MAGNITUDE}x); each asked for {releases} release(s) through the method's own code; the "
            "attacker scores the sum of the released u-coordinates"
        ),
        **found,
        **claims,
        "epsilon_lower": lower,
        "violated": printed is not None and lower > printed,
        "scores": {"inserted": scores[bits].tolist(), "left_out": scores[~bits].tolist()},
    }


# --- a run directory: its parameters, the black-box test, the record and the report ---------------
def most_releases(privacy: dict[str, Any]) -> int:
    """The most releases any client of the run made (what its worst-off client's ledger holds)."""
    return max((int(c.get("queries") or 0) for c in privacy.get("clients", [])), default=0)


@torch.no_grad()
def membership_test(run: Any, cfg: ExperimentConfig, samples: int, state: dict | None = None) -> dict[str, Any]:
    """Black box: the released generator only. Score each real image by minus its distance to the
    nearest of ``samples`` generated images; members are training images of the run's clients,
    non-members held-out test images. AUC and TPR at 1% / 10% FPR (no ε: members are not random).
    ``state``: the released generator's weights (default: read from the run's checkpoint)."""
    from common.data import client_arrays, load_dataset, num_classes_for
    from simulations.experiments.evaluate import generate, load_generator

    state = released_generator(run) if state is None else state
    gen = load_generator(cfg, state, run.path / "checkpoint.pt")
    fakes, _ = generate(gen, samples, num_classes=num_classes_for(cfg), z_dim=cfg.z_dim)
    members = _members(cfg, samples, client_arrays)
    test = load_dataset(cfg.dataset, cfg.data_dir, split="test", emnist_split=cfg.emnist_split, seed=cfg.seed)
    outsiders = torch.from_numpy(test.images[:samples]).float().div(255.0)
    flat = fakes.flatten(1)
    score_in = -torch.cdist(members.flatten(1), flat).min(dim=1).values.numpy()
    score_out = -torch.cdist(outsiders.flatten(1), flat).min(dim=1).values.numpy()
    return {"members": len(score_in), "non_members": len(score_out), "generated": samples, **_roc(score_in, score_out)}


def released_generator(run: Any) -> dict:
    """The released generator's weights in the run's checkpoint (a RunDirectoryError naming it if none)."""
    from server.reporting import RunDirectoryError

    ckpt = run.load_checkpoint()
    state = ckpt.get("released_generator") if isinstance(ckpt, dict) else None
    if not isinstance(state, dict):
        raise RunDirectoryError(
            f"{run.path / 'checkpoint.pt'} holds no released generator for the membership test (--mia-samples 0 "
            "skips it)"
        )
    return state


def _members(cfg: ExperimentConfig, n: int, client_arrays: Callable) -> torch.Tensor:
    """Up to ``n`` training images of the run's clients, client by client."""
    images = []
    for k in range(cfg.num_clients):
        images.append(torch.as_tensor(client_arrays(cfg, k)[0]).float().reshape(-1, 28, 28))
        if sum(len(x) for x in images) >= n:
            break
    stacked = torch.cat(images)[:n]
    return stacked.div(255.0) if stacked.max() > 1.0 else stacked


def _roc(score_in: np.ndarray, score_out: np.ndarray) -> dict[str, float]:
    """AUC (ties half) and the TPR at a FPR of 1% and 10%."""
    greater = (score_in[:, None] > score_out[None, :]).mean() + 0.5 * (score_in[:, None] == score_out[None, :]).mean()
    out = {"auc": float(greater)}
    for fpr in (0.01, 0.1):
        threshold = float(np.quantile(score_out, 1 - fpr))
        out[f"tpr_at_fpr_{fpr:g}"] = float((score_in > threshold).mean())
    return out


@dataclass(frozen=True)
class RunFiles:
    """What the audit reads of a run directory, read and checked before any canary runs: a bad file
    then costs no work, and audit.json is never rewritten by an audit that cannot finish."""

    privacy: dict[str, Any]
    eval_result: dict[str, Any] | None  # eval.json, for the refreshed report
    has_summary: bool  # the report is refreshed only for a finished run
    generator: dict | None  # the released generator's weights, when the membership test runs


def read_run_files(run: Any, *, mia_samples: int) -> RunFiles:
    """privacy.json (required), summary.json and eval.json (when present) and the checkpoint (for the
    membership test), each checked; and that the run directory takes the audit's files. A
    RunDirectoryError naming the file (and its field) otherwise."""
    from server.reporting import RunDirectoryError, check_writable

    from .run_files import read_json, read_summary

    check_writable(run.path, "audit writes audit.json, plots/ and report.html there (copy the run somewhere writable)")
    privacy_path = run.path / "privacy.json"
    if not privacy_path.is_file():
        raise RunDirectoryError(f"{privacy_path} does not exist: audit a finished run")
    privacy = read_privacy(privacy_path)
    has_summary = (run.path / "summary.json").is_file()
    if has_summary:
        read_summary(run.path / "summary.json")
    eval_path = run.path / "eval.json"
    eval_result = read_json(eval_path) if eval_path.is_file() else None
    if eval_result is not None and not isinstance(eval_result, dict):
        raise RunDirectoryError(
            f"{eval_path} is corrupt: it holds a {type(eval_result).__name__}, not an object; run "
            "`fedgan evaluate` again to rewrite it"
        )
    generator = released_generator(run) if mia_samples else None
    return RunFiles(privacy, eval_result, has_summary, generator)


def read_privacy(path: Any) -> dict[str, Any]:
    """privacy.json, checked to hold what the audit reads: its clients, each with its queries and ε."""
    from server.reporting import RunDirectoryError

    from .run_files import malformed_clients, read_json

    privacy = read_json(path)
    if not isinstance(privacy, dict):
        raise RunDirectoryError(f"{path} is corrupt: it holds a {type(privacy).__name__}, not an object")
    wrong = malformed_clients(privacy.get("clients"))
    if wrong:
        raise RunDirectoryError(f"{path} is malformed: {wrong}; rerun the run")
    return privacy


def audit_run(path: str, *, canaries: int, releases: int | None, confidence: float, mia_samples: int) -> dict[str, Any]:
    """Audit the run in ``path`` at its own parameters; writes audit.json, plots/audit_scores.png
    and the report's audit section."""
    from server.reporting import RunDirectory

    run, cfg = RunDirectory.open_existing(path)
    files = read_run_files(run, mia_samples=mia_samples)
    asked = releases or max(most_releases(files.privacy), 1)
    result = audit(cfg, canaries=canaries, releases=asked, confidence=confidence)
    result["run_dir"] = str(run.path)
    result["run_epsilon_max"] = max(
        (c["epsilon"] for c in files.privacy["clients"] if c.get("epsilon") is not None), default=None
    )
    if mia_samples:
        result["membership"] = membership_test(run, cfg, mia_samples, files.generator)
    result["plot"] = str(_plot(run.path / "plots" / "audit_scores.png", result))
    run.write_json("audit.json", result)
    if files.has_summary:
        _refresh_report(run, files.eval_result)
    return result


def _plot(path: Any, result: dict[str, Any]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    scores = result["scores"]
    bins = np.histogram_bin_edges(scores["inserted"] + scores["left_out"], bins=60)
    ax.hist(scores["left_out"], bins=bins, alpha=0.6, label="left out")
    ax.hist(scores["inserted"], bins=bins, alpha=0.6, label="inserted")
    ax.axvline(result["threshold"], color="k", lw=0.8)
    ax.set_xlabel("attacker's score (sum of the released canary coordinates)")
    ax.set_ylabel("canaries")
    ax.set_title(
        f"{result['strategy']}: audited ε ≥ {result['epsilon_lower']:.3g}, ledger ε {_fmt(result['epsilon_ledger'])}",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _refresh_report(run: Any, eval_result: dict[str, Any] | None) -> None:
    """report.html again, now with its audit section (and the figures the run already has)."""
    from common.evaluation.report import write_report

    plots = {p.stem: p for p in sorted((run.path / "plots").glob("*.png"))}
    write_report(run.path, eval_result, plots)


def format_audit(result: dict[str, Any]) -> str:
    """The audit's lines for the terminal."""
    lines = [
        f"audit of {result['strategy']} ({result['unit']}), {result['canaries']} canaries, "
        f"{result['releases_per_canary']} release(s) each, confidence {result['confidence']:.0%}, "
        f"δ = {result['delta']:g}",
        f"  ledger ε (what the canaries' ledgers print): {_fmt(result['epsilon_ledger'])}",
        f"  Gaussian curve of the ledger's μ = {_fmt(result['mu_claimed'])}: "
        f"ε = {_fmt(result['epsilon_gaussian_exact'])}",
        f"  audited lower bounds: one-run {result['epsilon_one_run']:.3g} · Clopper-Pearson "
        f"{result['epsilon_clopper_pearson']:.3g} · Gaussian (μ ≥ {result['mu_lower']:.3g}) "
        f"{result['epsilon_gaussian_lower']:.3g}",
        f"  attack: TPR {result['tpr']:.3f} at FPR {result['fpr']:.3f}",
        "  VIOLATED: a lower bound exceeds the ledger's ε" if result["violated"] else "  consistent with the ledger",
    ]
    if "membership" in result:
        m = result["membership"]
        lines.append(
            f"  black box (nearest generated sample): AUC {m['auc']:.3f}, TPR {m['tpr_at_fpr_0.01']:.3f} at 1% FPR"
        )
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "unbounded" if value is None else f"{value:.4g}"
