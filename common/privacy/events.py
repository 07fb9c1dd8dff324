"""Typed privacy events: what one release did, as the ledger records it.

Following TF Privacy's ``dp_query`` pattern, the code that releases something returns (or records)
the event it performed, so every ε is composed from what ran. An event is ``count`` identical runs
of a Gaussian mechanism whose noise std is ``noise_multiplier`` times its L2 sensitivity, applied
to a sample drawn as ``sampling`` says:

- ``none``: no subsampling (``sample_rate`` 1): a client answering a query it knows it received;
- ``poisson``: every unit included independently with probability ``sample_rate`` (DP-SGD's
  batches, DP-FedAvg's clients); Opacus' bounds, add/remove adjacency;
- ``wor``: exactly m = ``sample_rate`` × ``population`` units drawn uniformly without replacement
  (a server picking m of the K clients still available); Wang et al.'s bound, replace-one
  adjacency (``wor.py``). The two schemes have different bounds and never mix in one ledger.

``noise`` is ``gaussian`` (the default) or ``skellam``: a secure sum's distributed discrete noise
(``skellam.py``), Sk(``skellam_mu``) per coordinate of a sum whose ℓ₁ / ℓ₂ sensitivities are
``l1`` / ``l2``, never subsampled; its ``noise_multiplier`` is the Gaussian equivalent √(2μ)/Δ₂ (same
variance), what a node's minimum noise is checked against.

``void`` names why a release was NOT private (a fixed noise seed makes the noise recomputable,
un-noised statistics were sent, a raw update was released): such an event makes ε unbounded,
whatever its noise multiplier, which then only describes the mechanism as if it had been private.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SAMPLINGS = ("none", "poisson", "wor")
NOISES = ("gaussian", "skellam")
# Why a release is not private although it may carry noise (``PrivacyEvent.void``).
VOID_NOISE_SEED = "fixed noise seed (--noise-seed, testing only): the noise is recomputable from the configuration"
VOID_CLIENT_STATS = "un-noised critic statistics sent to the server (--client-stats, debugging only)"
VOID_RAW_DELTA = "raw discriminator delta sent to the server (Fed-Avg GAN: no noise against the server)"


@dataclass(frozen=True)
class PrivacyEvent:
    """``count`` runs of one Gaussian mechanism (see the module docstring for the fields)."""

    noise_multiplier: float
    sample_rate: float = 1.0
    count: int = 1
    sampling: str = ""  # "": none when sample_rate is 1, else poisson (ledgers of format 1)
    population: int = 0  # wor only: the number of units the sample was drawn from
    void: str = ""
    noise: str = "gaussian"
    skellam_mu: float = 0.0  # skellam only: Sk(μ) per coordinate of the sum
    l1: float = 0.0  # skellam only: the sum's ℓ₁ sensitivity
    l2: float = 0.0  # skellam only: the sum's ℓ₂ sensitivity

    @classmethod
    def skellam(cls, *, mu: float, l1: float, l2: float, count: int = 1, void: str = "") -> PrivacyEvent:
        """``count`` secure sums each carrying Sk(μ) noise, sensitivities Δ₁ = ``l1``, Δ₂ = ``l2``."""
        if not (mu > 0 and l1 > 0 and l2 > 0 and math.isfinite(mu)):
            raise ValueError(f"a Skellam event needs mu, l1, l2 > 0, got {mu}, {l1}, {l2}")
        return cls(math.sqrt(2 * mu) / l2, 1.0, count, "none", 0, void, "skellam", float(mu), float(l1), float(l2))

    def __post_init__(self) -> None:
        if self.noise not in NOISES:
            raise ValueError(f"noise must be one of {NOISES}, got {self.noise!r}")
        if self.noise == "skellam" and (self.sample_rate != 1.0 or self.skellam_mu <= 0 or self.l2 <= 0):
            raise ValueError("a Skellam event is never subsampled and needs skellam_mu and l2 > 0")
        nm, q = self.noise_multiplier, self.sample_rate
        if not (nm >= 0 and math.isfinite(nm)):
            raise ValueError(f"noise_multiplier must be finite and >= 0, got {nm}")
        if not 0.0 < q <= 1.0:
            raise ValueError(f"sample_rate must be in (0, 1], got {q}")
        if int(self.count) != self.count or self.count < 1:
            raise ValueError(f"count must be an integer >= 1, got {self.count}")
        sampling = self.sampling or ("none" if q == 1.0 else "poisson")
        if q == 1.0:
            sampling = "none"  # a sample of everything is no sample: the same mechanism
        if sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        population = int(self.population) if sampling == "wor" else 0
        if sampling == "wor":
            m = q * population
            if population < 1 or abs(m - round(m)) > 1e-6 * max(1.0, m):
                raise ValueError(
                    f"sampling without replacement needs an integer sample m = q·n, got q={q}, n={self.population}"
                )
        object.__setattr__(self, "sampling", sampling)
        object.__setattr__(self, "population", population)
        object.__setattr__(self, "count", int(self.count))
        object.__setattr__(self, "void", str(self.void))

    def astuple(self) -> tuple[float, float, int]:
        """``(noise_multiplier, sample_rate, count)``, as ``analysis.rdp_epsilon`` takes Poisson events."""
        return (self.noise_multiplier, self.sample_rate, self.count)

    def mechanism(self) -> tuple:
        """Everything but the count: events with equal mechanisms merge into one run."""
        skellam = (self.noise, self.skellam_mu, self.l1, self.l2) if self.noise == "skellam" else ()
        return (self.noise_multiplier, self.sample_rate, self.sampling, self.population, self.void, *skellam)

    def same_mechanism(self, other: PrivacyEvent) -> bool:
        return self.mechanism() == other.mechanism()

    def times(self, count: int) -> PrivacyEvent:
        """The same mechanism run ``count`` times."""
        return PrivacyEvent(
            self.noise_multiplier,
            self.sample_rate,
            count,
            self.sampling,
            self.population,
            self.void,
            self.noise,
            self.skellam_mu,
            self.l1,
            self.l2,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "noise_multiplier": float(self.noise_multiplier),
            "sample_rate": float(self.sample_rate),
            "count": int(self.count),
            "sampling": self.sampling,
        }
        if self.sampling == "wor":
            out["population"] = self.population
        if self.void:
            out["void"] = self.void
        if self.noise == "skellam":
            out.update(noise="skellam", skellam_mu=float(self.skellam_mu), l1=float(self.l1), l2=float(self.l2))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyEvent:
        return cls(
            noise_multiplier=float(data["noise_multiplier"]),
            sample_rate=float(data["sample_rate"]),
            count=int(data.get("count", 1)),
            sampling=str(data.get("sampling", "")),
            population=int(data.get("population", 0)),
            void=str(data.get("void", "")),
            noise=str(data.get("noise", "gaussian")),
            skellam_mu=float(data.get("skellam_mu", 0.0)),
            l1=float(data.get("l1", 0.0)),
            l2=float(data.get("l2", 0.0)),
        )
