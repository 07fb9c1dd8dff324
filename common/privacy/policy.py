"""A node's own privacy policy: what it will release, whatever the (untrusted) server asks.

The server sends the run's configuration in its hello, so without a policy it would decide how
much noise a client adds, its budget, δ, and whether a fixed noise seed or un-noised statistics
are used. A node pins these itself, in its node config or a policy file on its own disk:

    min-noise-multiplier = 1.0   # refuse any release whose own noise multiplier is smaller: the
                                 # mechanism as it runs (GS-WGAN: σ/√B, the server picks B)
    max-epsilon = 50.0           # its own budget at its own δ (0: none); a larger ask is refused
    delta = 1e-5                 # the δ of that budget; a server asking for a larger δ is refused
    allow-nonprivate = false     # fixed noise seeds, un-noised statistics, σ = 0, reproducible
                                 # DP-SGD batches: debugging only, and then ε is unbounded
    trust-server = false         # send updates the server noises (Fed-Avg GAN's raw deltas: ε
                                 # unbounded against the server, user-level DP only if it is honest)
    trust-secure-sum = false     # a secure sum's release: count (budget, minimum noise) the guarantee
                                 # against a server that runs the protocol (true) or only the node's
                                 # own noise share, what protects it from a server that deviates (false)
    min-secagg-cohort = 3        # take part in a secure sum only over at least this many nodes
    min-secagg-threshold = 2     # ... and only if its secrets need at least this many holders (the
                                 # fewest inputs a revealed sum can hold); the protocol itself also
                                 # demands a strict majority of each neighbourhood (common/secagg.py)
    min-secagg-colluders = 0     # ... and only if the noise shares are calibrated to survive at least
                                 # this many colluding clients of a sum (the run's --secagg-colluders)

Sources, exactly one: node-config keys ``privacy-<key>`` (e.g. ``privacy-max-epsilon=50``), or a
TOML file named by node-config ``privacy-policy``, or one named by the environment variable
``FEDGAN_NODE_POLICY`` (how ``fedgan simulate --node-policy`` reaches simulated nodes); none of them:
the defaults above (no minimum noise, no budget, δ = 1e-5, nothing non-private, secure sums over
at least 3 nodes with threshold at least 2). Two sources at once (an
inline key beside a file, two different files), a key outside the file's ``[policy]`` table beside
it, or a ``policy`` that is not a table are errors, never one source silently winning. A policy
that cannot be read or is invalid makes the node refuse everything, naming the cause (fail closed).
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

POLICY_ENV = "FEDGAN_NODE_POLICY"
POLICY_FILE_KEY = "privacy-policy"
NODE_CONFIG_PREFIX = "privacy-"
DEFAULT_DELTA = 1e-5
SHARE_NOTE = " (its own share of a secure sum's noise; trust-secure-sum = false)"
# A sum over fewer nodes is no aggregate worth the name (two: either one learns the other's input);
# a threshold of 1 would let any single holder rebuild a node's secrets. A node's policy may raise both.
DEFAULT_MIN_SECAGG_COHORT = 3
DEFAULT_MIN_SECAGG_THRESHOLD = 2


class PolicyError(ValueError):
    """The node's policy cannot be read or is invalid; the message names the source and the field."""


@dataclass(frozen=True)
class NodePolicy:
    min_noise_multiplier: float = 0.0
    max_epsilon: float = 0.0  # 0: no budget of the node's own
    delta: float = DEFAULT_DELTA
    allow_nonprivate: bool = False
    trust_server: bool = False
    trust_secure_sum: bool = False
    min_secagg_cohort: int = DEFAULT_MIN_SECAGG_COHORT
    min_secagg_threshold: int = DEFAULT_MIN_SECAGG_THRESHOLD
    min_secagg_colluders: int = 0
    source: str = "default policy"
    # The node's own ledger of every release (``node_ledger.py``), attached by the node before a
    # release: its max-epsilon is checked there. None: the run's ledger stands in (a bare policy).
    node_ledger: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _require(
            self.min_noise_multiplier >= 0 and math.isfinite(self.min_noise_multiplier),
            self,
            "min-noise-multiplier",
            "must be a finite number >= 0",
        )
        _require(self.max_epsilon >= 0 and not math.isnan(self.max_epsilon), self, "max-epsilon", "must be >= 0")
        _require(0 < self.delta < 1, self, "delta", "must be in (0, 1)")
        _require(isinstance(self.allow_nonprivate, bool), self, "allow-nonprivate", "must be true or false")
        _require(isinstance(self.trust_server, bool), self, "trust-server", "must be true or false")
        _require(isinstance(self.trust_secure_sum, bool), self, "trust-secure-sum", "must be true or false")
        for key in ("min-secagg-cohort", "min-secagg-threshold"):
            value = getattr(self, key.replace("-", "_"))
            _require(type(value) is int and value >= 2, self, key, "must be an integer >= 2")
        value = self.min_secagg_colluders
        _require(type(value) is int and value >= 0, self, "min-secagg-colluders", "must be an integer >= 0")

    # --- what the node enforces ---------------------------------------------------------------
    def budgets(self, cfg: Any) -> list[tuple[float, float]]:
        """The (ε, δ) budgets the node enforces: its own maximum at its own δ, and the run's
        ``client_epsilon_budget`` at the run's δ (which may only be smaller: a smaller budget or δ
        protects more). Empty: no budget."""
        out = [(b, d) for b, d in ((self.max_epsilon, self.delta), (cfg.client_epsilon_budget, cfg.delta)) if b > 0]
        return sorted(set(out))

    def over_budget(self, ledger: Any, event: Any, cfg: Any) -> str:
        """Why recording ``event`` would break a budget ("" when it would not), as the end of a
        sentence whose subject is the release ("one more answer would exceed ..."). The run's budget
        (``client_epsilon_budget``, at the run's δ) is checked on the run's ``ledger``; the node's
        own ``max-epsilon`` (at its δ) on the node's ledger of every run and method."""
        checks = [(cfg.client_epsilon_budget, cfg.delta, ledger, "the run's")]
        checks.append((self.max_epsilon, self.delta, self.node_ledger or ledger, "the node's"))
        for budget, delta, book, whose in checks:
            if budget > 0 and book.would_exceed(budget=budget, delta=delta, next_event=event):
                spent = book.nominal_rdp_epsilon(delta=delta)[0]
                return f"would exceed {whose} epsilon budget {budget:g} at delta {delta:g} (spent {spent:.4g})"
        return ""

    def violations(self, cfg: Any, terms: RunTerms) -> list[str]:
        """Why this node refuses a run configured as ``cfg`` (empty: it takes part); ``terms`` is what
        the run's method says of its releases (the node's shell asks it)."""
        out = []
        noise = self.counted_noise(terms)
        if noise < self.min_noise_multiplier:
            out.append(
                f"noise multiplier {noise:g} of each release is below the node's minimum "
                f"{self.min_noise_multiplier:g}"
                + (
                    " (its own share of a secure sum's noise; trust-secure-sum = false)"
                    if terms.protocol_release_noise
                    else ""
                )
            )
        if terms.unbounded_against_server and not self.trust_server:
            out.append(
                f"{cfg.strategy} sends raw discriminator updates for the server to noise (epsilon unbounded against "
                "it): the node allows that only with trust-server = true"
            )
        if self.max_epsilon > 0 and cfg.client_epsilon_budget > self.max_epsilon:
            out.append(f"epsilon budget {cfg.client_epsilon_budget:g} exceeds the node's maximum {self.max_epsilon:g}")
        if self.max_epsilon > 0 and terms.unbounded_against_server:
            out.append(
                f"{cfg.strategy} sends raw discriminator updates to the server (epsilon unbounded against "
                f"it), beyond the node's maximum epsilon {self.max_epsilon:g}"
            )
        if cfg.delta > self.delta:
            out.append(f"delta {cfg.delta:g} is larger than the node's delta {self.delta:g}")
        if not self.allow_nonprivate:
            out += [
                f"{option} is not allowed by the node (allow-nonprivate = false)"
                for option in nonprivate_options(cfg, terms)
            ]
        if terms.secagg_cohort:  # refused at the hello, before anything is deposited or charged
            out += self.secagg_violations(cohort=terms.secagg_cohort, threshold=terms.secagg_floor)
            out += self.collusion_violations(terms.secagg_colluders)
        return out

    def collusion_violations(self, colluders: int) -> list[str]:
        """Why the node refuses shares calibrated for ``colluders`` colluding clients (its minimum)."""
        if colluders >= self.min_secagg_colluders:
            return []
        return [
            f"noise shares calibrated for {colluders} colluding client(s) of a sum are below the node's minimum "
            f"{self.min_secagg_colluders} (min-secagg-colluders; the run's --secagg-colluders)"
        ]

    def counted_noise(self, terms: RunTerms) -> float:
        """The noise multiplier of a release as this node counts it: through a secure sum, the sum's
        (protocol) when the node trusts the server to run the protocol, else its own share's."""
        if terms.protocol_release_noise and self.trust_secure_sum:
            return terms.protocol_release_noise
        return terms.release_noise

    def secagg_violations(self, *, cohort: int, threshold: int) -> list[str]:
        """Why this node refuses a secure sum over ``cohort`` nodes with reconstruction ``threshold``
        (empty: it takes part): a server cannot talk it into a smaller cohort or a lower threshold."""
        out = []
        if cohort < self.min_secagg_cohort:
            out.append(f"a secure sum over {cohort} nodes is below the node's minimum cohort {self.min_secagg_cohort}")
        if threshold < self.min_secagg_threshold:
            minimum = self.min_secagg_threshold
            out.append(f"a secure-sum threshold of {threshold} is below the node's minimum threshold {minimum}")
        return out

    def release_refusal(self, ledger: Any, event: Any, cfg: Any, what: str) -> str:
        """Why the node refuses the release ``event`` ("" when it may go ahead): its own noise
        multiplier against the node's minimum (and no noise at all), then the budgets. ``what`` is
        the release as the subject of the sentence ("one more answer")."""
        problem = self.check_release(event.noise_multiplier, what)
        if problem:
            return problem
        over = self.over_budget(ledger, event, cfg)
        return f"{what} {over}" if over else ""

    def secure_release_refusal(self, ledger: Any, protocol: Any, own: Any, cfg: Any, what: str) -> tuple[str, Any]:
        """(why the node refuses a release through a secure sum, or ""; the event its own ledger
        counts): ``own`` (its noise share, against a server that deviates) unless the node trusts
        the protocol (``trust-secure-sum``), then ``protocol``. The node's minimum noise and
        max-epsilon are checked on the counted event, the run's budget on ``protocol`` (what the
        run's ledger records)."""
        counted = protocol if self.trust_secure_sum else own
        problem = self.check_release(counted.noise_multiplier, what)
        if problem:
            return problem, counted
        checks = [(cfg.client_epsilon_budget, cfg.delta, ledger, protocol, "the run's")]
        checks.append((self.max_epsilon, self.delta, self.node_ledger or ledger, counted, "the node's"))
        for budget, delta, book, event, whose in checks:
            if budget > 0 and book.would_exceed(budget=budget, delta=delta, next_event=event):
                spent = book.nominal_rdp_epsilon(delta=delta)[0]
                return (
                    f"{what} would exceed {whose} epsilon budget {budget:g} at delta {delta:g} (spent {spent:.4g})",
                    counted,
                )
        return "", counted

    def check_release(self, noise_multiplier: float, what: str) -> str | None:
        """Why the node refuses one release with this noise (None: it may go ahead)."""
        if noise_multiplier < self.min_noise_multiplier:
            minimum = self.min_noise_multiplier
            return f"{what}: noise multiplier {noise_multiplier:g} is below the node's minimum {minimum:g}"
        if noise_multiplier == 0 and not self.allow_nonprivate:
            return f"{what}: a release without noise is not allowed by the node (allow-nonprivate = false)"
        return None


@dataclass(frozen=True)
class RunTerms:
    """What a run's method says of the releases a node would make in it (``Method.release_noise``,
    ``unbounded_against_server``, ``nonprivate_options``): handed to the policy by the node's shell,
    so the policy never has to know the methods."""

    release_noise: float  # the noise multiplier of each release, as the mechanism runs (GS-WGAN: σ/√B);
    # through a secure sum: the node's own share's (what protects it from a server that deviates)
    protocol_release_noise: float = 0.0  # through a secure sum: the revealed sum's (0: no secure sum)
    unbounded_against_server: bool = False  # its clients add no noise of their own (Fed-Avg GAN)
    nonprivate_options: tuple[str, ...] = ()  # its debugging options that void the guarantee
    secagg_cohort: int = 0  # through secure sums: the clients of the smallest planned sum (0: none)
    secagg_floor: int = 0  # ... the fewest inputs a revealed sum holds (t)
    secagg_colluders: int = 0  # ... the colluding clients its noise shares are calibrated to survive (k)


def nonprivate_options(cfg: Any, terms: RunTerms) -> list[str]:
    """The debugging options of ``cfg`` that void a node's guarantee (its method's own among them)."""
    out = ["a fixed noise seed (noise-seed, testing only)"] if cfg.noise_seed >= 0 else []
    return out + list(terms.nonprivate_options)


def _require(ok: bool, policy: NodePolicy, key: str, why: str) -> None:
    if not ok:
        raise PolicyError(f"{policy.source}: {key} = {getattr(policy, key.replace('-', '_'))!r} {why}")


_KEYS = {f.name.replace("_", "-"): f for f in fields(NodePolicy) if f.name not in ("source", "node_ledger")}


def policy_from_mapping(values: Mapping[str, Any], *, source: str) -> NodePolicy:
    """A policy from TOML-style keys (dashes); unknown keys and wrong types are errors."""
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in _KEYS:
            raise PolicyError(f"{source}: unknown key {key!r} (known: {', '.join(sorted(_KEYS))})")
        kind = _KEYS[key].type
        if kind in ("float", float) and isinstance(value, str):  # a quoted number in a node config
            try:
                value = float(value)
            except ValueError:
                raise PolicyError(f"{source}: {key} must be a number, got {value!r}") from None
        if kind in ("float", float) and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = float(value)
        elif kind in ("bool", bool) and isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        elif kind in ("bool", bool) and not isinstance(value, bool):
            raise PolicyError(f"{source}: {key} must be true or false, got {value!r}")
        elif kind in ("int", int):
            value = _integer(value, key, source)
        elif kind in ("float", float) and not isinstance(value, float):
            raise PolicyError(f"{source}: {key} must be a number, got {value!r}")
        kwargs[_KEYS[key].name] = value
    return NodePolicy(**kwargs, source=source)


def _integer(value: Any, key: str, source: str) -> int:
    """An integer key's value: an int, or a node config's quoted digits ("5"); nothing else."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if type(value) is not int:
        raise PolicyError(f"{source}: {key} must be an integer, got {value!r}")
    return value


def policy_from_file(path: str | Path) -> NodePolicy:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))  # TOML is UTF-8, whatever the locale
    except OSError as err:
        raise PolicyError(f"node privacy policy {path} cannot be read: {err.strerror or err}") from err
    except UnicodeDecodeError as err:  # a binary file: the decoder's message names neither file nor field
        raise PolicyError(
            f"node privacy policy {path} is not UTF-8 text ({err.reason} at byte {err.start}): a policy is a TOML file"
        ) from err
    except tomllib.TOMLDecodeError as err:
        raise PolicyError(f"node privacy policy {path} is not valid TOML: {err}") from err
    source = f"node privacy policy {path}"
    return policy_from_mapping(_policy_table(data, source), source=source)


def _policy_table(data: dict[str, Any], source: str) -> dict[str, Any]:
    """The keys of a policy file: its ``[policy]`` table if it has one (and then nothing beside
    it: a key outside would be ignored), else its top level."""
    if "policy" not in data:
        return data
    table = data["policy"]
    if not isinstance(table, dict):
        raise PolicyError(f"{source}: policy must be a table ([policy] and its keys), got {table!r}")
    outside = sorted(k for k in data if k != "policy")
    if outside:
        raise PolicyError(
            f"{source}: {', '.join(outside)} outside the [policy] table would be ignored; put every key "
            "inside [policy] (or drop the table)"
        )
    return dict(table)


def load_policy(node_config: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> NodePolicy:
    """The node's policy from its node config or environment (see the module docstring)."""
    inline = {
        k[len(NODE_CONFIG_PREFIX) :]: v
        for k, v in node_config.items()
        if k.startswith(NODE_CONFIG_PREFIX) and k != POLICY_FILE_KEY
    }
    files = [
        (where, str(path))
        for where, path in (
            (f"node config {POLICY_FILE_KEY}", node_config.get(POLICY_FILE_KEY)),
            (POLICY_ENV, environ.get(POLICY_ENV)),
        )
        if path
    ]
    if inline and files:
        keys = ", ".join(NODE_CONFIG_PREFIX + k for k in sorted(inline))
        raise PolicyError(
            f"node config sets {keys} and {files[0][0]} names the policy file {files[0][1]}: a node's policy has "
            "one source; put every key in the file, or drop the file"
        )
    if len({os.path.realpath(path) for _, path in files}) > 1:
        raise PolicyError(
            f"two policy files: {files[0][1]} ({files[0][0]}) and {files[1][1]} ({files[1][0]}); a node's policy "
            "has one source"
        )
    if inline:
        return policy_from_mapping(inline, source="node config")
    return policy_from_file(files[0][1]) if files else NodePolicy()
