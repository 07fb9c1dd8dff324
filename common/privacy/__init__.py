"""Privacy layer: pure math (``analysis``, ``wor``), typed events, the sanitizer, ledgers, secret
sampling, the node's own policy and the plain-language statements.

No flwr import: the client and server both use these, and the math is tested on its own.
"""

from .analysis import (
    ORDERS,
    epsilon_from_rdp,
    prv_epsilon,
    prv_epsilon_with_reason,
    query_noise_multiplier,
    rdp_curve,
    rdp_epsilon,
    unit_rdp,
)
from .events import PrivacyEvent
from .ledger import PrivacyLedger
from .policy import NodePolicy, PolicyError, RunTerms, load_policy
from .sampling import Sampler
from .sanitizer import clip_sample_grads, noise_generator, sanitize_sample_grads

__all__ = [
    "ORDERS",
    "NodePolicy",
    "PolicyError",
    "PrivacyEvent",
    "PrivacyLedger",
    "RunTerms",
    "Sampler",
    "clip_sample_grads",
    "epsilon_from_rdp",
    "load_policy",
    "noise_generator",
    "prv_epsilon",
    "prv_epsilon_with_reason",
    "query_noise_multiplier",
    "rdp_curve",
    "rdp_epsilon",
    "sanitize_sample_grads",
    "unit_rdp",
]
