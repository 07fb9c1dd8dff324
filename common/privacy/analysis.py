"""Pure privacy math over Opacus' accountants (no state, no torch).

An *event* is a triple ``(noise_multiplier, sample_rate, count)``: ``count`` runs of a
(Poisson-)subsampled Gaussian mechanism whose noise std is ``noise_multiplier`` times its L2
sensitivity, each run included with probability ``sample_rate``. Heterogeneous events compose by
summing their Rényi-DP curves (RDP composition, Mironov 2017, Prop. 1) or by convolving their
privacy-loss distributions (PRV, Gopi et al. 2021).

GS-WGAN (docs/privacy.md): one answered query releases B per-sample outputs, each with L2 sensitivity
2C and noise std 2σC, all computed from the same private discriminator. Stacked, they are one
Gaussian mechanism whose sensitivity is √B·2C, so its noise multiplier is ``σ/√B``
(:func:`query_noise_multiplier`). Composing the B samples as separate subsampled mechanisms (the
original code's script) understates ε by orders of magnitude.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
import warnings
from collections.abc import Iterable, Sequence
from types import ModuleType

import numpy as np

from .wor import wor_rdp_curve

OPACUS_RDP = "opacus.accountants.analysis.rdp"


def _opacus_rdp() -> ModuleType:
    """Opacus' RDP analysis module, without importing the ``opacus`` package when it is not loaded.

    ``opacus/__init__`` imports the privacy engine, ``torch.distributed.tensor`` and ``scipy.stats``
    (2.8 s of a ClientApp's 6.6 s start-up on this project's CPU), while a client checking its budget
    needs only ``analysis/rdp.py``, which imports numpy and ``scipy.special`` alone. A Flower
    deployment starts a ClientApp process per message, so the package import was paid per query.
    This loads that same file under a private name; once ``opacus`` is imported, its own module is used.
    """
    loaded = sys.modules.get(OPACUS_RDP)
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("opacus")  # locates the package; does not execute it
    if package is None or not package.submodule_search_locations:
        raise ImportError("opacus is not installed (fedgan's accountants are Opacus'): run `make install`")
    path = f"{list(package.submodule_search_locations)[0]}/accountants/analysis/rdp.py"
    spec = importlib.util.spec_from_file_location("_fedgan_opacus_rdp", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"Opacus' RDP analysis is missing at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compute_rdp(*, q: float, noise_multiplier: float, steps: int, orders: list[float]) -> np.ndarray:
    """Opacus' ``compute_rdp`` (see :func:`_opacus_rdp`)."""
    return _opacus_rdp().compute_rdp(q=q, noise_multiplier=noise_multiplier, steps=steps, orders=orders)


def get_privacy_spent(*, orders: list[float], rdp: np.ndarray, delta: float) -> tuple[float, float]:
    """Opacus' ``get_privacy_spent`` (see :func:`_opacus_rdp`)."""
    return _opacus_rdp().get_privacy_spent(orders=orders, rdp=rdp, delta=delta)


Event = tuple[float, float, int]

# RDP orders. GS-WGAN's ε are large (hundreds), and large ε is minimised at orders barely above 1
# (roughly α-1 ≈ sqrt(2·nm²·log(1/δ)/n) for n queries at noise multiplier nm), so the grid is
# geometric in α-1 from 1e-5 (ratio 10^0.05 ≈ 1.12: at most ~0.4% looser than a fine grid), then the
# usual half/integer orders for mid-range ε and a sparse tail up to 1024 for small ε. Fractional
# orders of a subsampled Gaussian are the costly ones to evaluate (Opacus loops until the series
# converges), which is why the fine part stops below 2.
ORDERS: tuple[float, ...] = tuple(
    sorted(
        {1.0 + 10.0 ** (k / 20.0) for k in range(-100, -1)}
        | {2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5}
        | {float(a) for a in range(6, 65)}
        | {72.0, 80.0, 96.0, 112.0, 128.0, 160.0, 192.0, 256.0, 320.0, 384.0, 512.0, 768.0, 1024.0}
    )
)

# PRV discretisation. eps_error is an *absolute* error that PRV adds to its upper bound, so a coarser
# mesh still gives an upper bound. Opacus' default (0.01) puts ~4e7 grid points on GS-WGAN's
# amplified default (ε≈330) and takes a minute, for a precision nobody needs at that ε. We use the
# smallest eps_error of PRV_EPS_ERRORS that is at least PRV_RELATIVE_ERROR × (RDP ε) and whose grid
# fits PRV_MAX_POINTS. Opacus' domain-size rule is only vouched for with eps_error < 1 (see its
# FIXME in analysis/prv/domain.py), so the ladder stops at 0.5.
PRV_EPS_ERRORS: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
PRV_RELATIVE_ERROR = 1e-3
PRV_MAX_POINTS = 1_200_000
# exp(t) overflows float64 beyond t≈709.8; PRV evaluates exp on its whole domain [-L, L], so a
# domain past this bound yields inf/NaN densities (observed: ε=inf for ~60 queries at nm=0.19).
PRV_MAX_DOMAIN = 650.0


def query_noise_multiplier(*, noise_multiplier: float, batch_size: int) -> float:
    """Noise multiplier of one GS-WGAN query: ``σ/√B``.

    B outputs, each with sensitivity 2C and independent noise std 2σC, form one Gaussian mechanism
    with sensitivity √B·2C, hence noise std / sensitivity = σ/√B.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be finite and >= 0, got {noise_multiplier}")
    return noise_multiplier / math.sqrt(batch_size)


def check_delta(delta: float) -> None:
    """Reject a δ outside (0, 1): every reported ε is meaningless without a valid δ."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")


def check_event(event: Event) -> Event:
    """Validate one ``(noise_multiplier, sample_rate, count)`` triple and return it normalised."""
    noise_multiplier, sample_rate, count = event
    if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be finite and >= 0, got {noise_multiplier}")
    if not 0.0 <= sample_rate <= 1.0:
        raise ValueError(f"sample_rate must be in [0, 1], got {sample_rate}")
    if int(count) != count or count < 0:
        raise ValueError(f"count must be an integer >= 0, got {count}")
    return float(noise_multiplier), float(sample_rate), int(count)


def _active(events: Iterable[Event]) -> list[Event]:
    """Validated events that release anything (q=0 or count=0 events cost nothing)."""
    checked = (check_event(e) for e in events)
    return [e for e in checked if e[1] > 0 and e[2] > 0]


@functools.lru_cache(maxsize=1024)
def _unit_rdp(noise_multiplier: float, sample_rate: float, orders: tuple[float, ...]) -> np.ndarray:
    """RDP curve of ONE run of an event, cached: n identical runs cost one evaluation."""
    curve = np.asarray(
        compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=list(orders)),
        dtype=float,
    )
    curve.setflags(write=False)
    return curve


def rdp_curve(events: Iterable[Event], *, orders: Sequence[float] = ORDERS) -> np.ndarray:
    """Composed RDP at each order: the sum over events of ``count`` times one run's curve."""
    orders = tuple(float(a) for a in orders)
    total = np.zeros(len(orders))
    for noise_multiplier, sample_rate, count in _active(events):
        total = total + count * _unit_rdp(noise_multiplier, sample_rate, orders)
    return total


def unit_rdp(
    noise_multiplier: float, sample_rate: float, sampling: str, orders: Sequence[float] = ORDERS
) -> np.ndarray:
    """RDP curve of ONE run of a Gaussian under ``sampling`` ("none", "poisson", "wor"; see
    ``events.py``): Opacus' subsampled-Gaussian bound, or Wang et al.'s without replacement."""
    orders = tuple(float(a) for a in orders)
    if sampling == "wor":
        return wor_rdp_curve(float(noise_multiplier), float(sample_rate), orders)
    return _unit_rdp(float(noise_multiplier), 1.0 if sampling == "none" else float(sample_rate), orders)


def epsilon_from_rdp(rdp: np.ndarray, *, delta: float, orders: Sequence[float] = ORDERS) -> tuple[float, float]:
    """(ε, best order) from an RDP curve via Opacus' conversion (Balle et al. 2020, Thm. 21).

    No release (all zeros) gives (0, nan): the conversion itself would report a small positive ε.
    No noise (inf everywhere) gives (inf, nan).
    """
    check_delta(delta)
    rdp = np.asarray(rdp, dtype=float)
    if not np.any(rdp):
        return 0.0, math.nan
    if np.all(np.isinf(rdp)):
        return math.inf, math.nan
    eps, order = get_privacy_spent(orders=list(orders), rdp=rdp, delta=delta)
    return max(float(eps), 0.0), float(order)


def rdp_epsilon(events: Iterable[Event], *, delta: float, orders: Sequence[float] = ORDERS) -> tuple[float, float]:
    """(ε, best RDP order) of heterogeneous events composed with Opacus' RDP accountant.

    Zero events give ε=0; any event with noise multiplier 0 gives ε=inf. The order is nan in both
    cases. An optimum at the edge of ``orders`` is still a valid (looser) bound; Opacus warns.
    """
    return epsilon_from_rdp(rdp_curve(events, orders=orders), delta=delta, orders=orders)


def prv_epsilon(events: Iterable[Event], *, delta: float) -> float | None:
    """ε from Opacus' PRV accountant (upper bound), or None when PRV cannot give a sound number.

    See :func:`prv_epsilon_with_reason` for the failure modes and why they are not patched over.
    """
    eps, _ = prv_epsilon_with_reason(events, delta=delta)
    return eps


def prv_epsilon_with_reason(events: Iterable[Event], *, delta: float) -> tuple[float | None, str | None]:
    """(ε, None) from PRV, or (None, reason) when it fails.

    PRV returns the *upper* end of its error interval, so it stays a guarantee. It fails, and we
    return None rather than a number we cannot vouch for, when: the privacy-loss domain needed
    exceeds ``PRV_MAX_DOMAIN`` (float64 exp overflow; happens beyond ε of several hundred), the
    grid would not fit ``PRV_MAX_POINTS`` even at the coarsest ``PRV_EPS_ERRORS``, or Opacus
    raises / returns a non-finite value (mean-shift or tail checks in its discretisation).
    """
    check_delta(delta)
    active = _active(events)
    if not active:
        return 0.0, None
    if any(nm == 0.0 for nm, _, _ in active):
        return math.inf, None
    return _prv_cached(tuple(active), delta)


@functools.lru_cache(maxsize=256)
def _prv_cached(events: tuple[Event, ...], delta: float) -> tuple[float | None, str | None]:
    delta_error = delta / 1000  # Opacus' default
    # q=1 evaluates log(1-q)=-inf on purpose inside Opacus; its internal RDP domain estimate may
    # warn about its own order grid, which a caller cannot act on (the estimate stays an upper one).
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            eps_error, reason = _prv_eps_error(events, delta=delta, delta_error=delta_error)
            if eps_error is None:
                return None, reason
            from opacus.accountants import PRVAccountant  # the package: server-side reports only

            accountant = PRVAccountant()
            accountant.history = [tuple(e) for e in events]
            eps = float(accountant.get_epsilon(delta, eps_error=eps_error, delta_error=delta_error))
        except (ArithmeticError, ValueError, RuntimeError, MemoryError) as error:
            return None, f"PRV accountant failed: {type(error).__name__}: {error}"
    if not math.isfinite(eps):
        return None, f"PRV accountant returned a non-finite epsilon ({eps})"
    return max(eps, 0.0), None


def _prv_eps_error(events: tuple[Event, ...], *, delta: float, delta_error: float) -> tuple[float | None, str | None]:
    """eps_error for PRV (see PRV_EPS_ERRORS), or None and why; grid size as PRVAccountant._get_domain."""
    from opacus.accountants.analysis.prv import PoissonSubsampledGaussianPRV, compute_safe_domain_size

    prvs = [PoissonSubsampledGaussianPRV(sample_rate=q, noise_multiplier=nm) for nm, q, _ in events]
    counts = [count for _, _, count in events]
    # Opacus' bound is max(L, eps_error) + 3 with L from RDP, independent of eps_error otherwise:
    # compute L once (it costs RDP evaluations) and apply the max per candidate.
    base = compute_safe_domain_size(prvs=prvs, max_self_compositions=counts, eps_error=0.0, delta_error=delta_error)
    floor = PRV_RELATIVE_ERROR * rdp_epsilon(events, delta=delta)[0]
    for eps_error in PRV_EPS_ERRORS:
        if eps_error < floor and eps_error != PRV_EPS_ERRORS[-1]:
            continue
        domain = max(base, eps_error + 3.0)
        if domain > PRV_MAX_DOMAIN:
            return None, (
                f"privacy-loss domain ±{domain:.0f} exceeds ±{PRV_MAX_DOMAIN:.0f} where PRV's "
                "float64 densities overflow (epsilon too large for PRV; use the RDP value)"
            )
        mesh = eps_error / math.sqrt(sum(counts) * math.log(12 / delta_error) / 2)
        if 2 * domain / mesh <= PRV_MAX_POINTS:
            return eps_error, None
    return None, f"PRV grid needs more than {PRV_MAX_POINTS} points even at eps_error={eps_error}"
