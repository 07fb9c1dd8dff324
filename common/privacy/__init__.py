"""Privacy layer: pure math (``analysis``), the sanitizer, the per-client ledger, the statement.

No flwr import: the client and server both use these, and the math is tested on its own.
"""

from .analysis import (
    ORDERS,
    amplified_epsilon,
    epsilon_from_rdp,
    prv_epsilon,
    prv_epsilon_with_reason,
    query_noise_multiplier,
    rdp_curve,
    rdp_epsilon,
)
from .ledger import PrivacyLedger
from .sanitizer import PrivacyEvent, clip_sample_grads, noise_generator, sanitize_sample_grads
from .statement import ACCOUNTING_RULE_AMPLIFIED, ACCOUNTING_RULE_PER_CLIENT, privacy_statement

__all__ = [
    "ACCOUNTING_RULE_AMPLIFIED",
    "ACCOUNTING_RULE_PER_CLIENT",
    "ORDERS",
    "PrivacyEvent",
    "PrivacyLedger",
    "amplified_epsilon",
    "clip_sample_grads",
    "epsilon_from_rdp",
    "noise_generator",
    "privacy_statement",
    "prv_epsilon",
    "prv_epsilon_with_reason",
    "query_noise_multiplier",
    "rdp_curve",
    "rdp_epsilon",
    "sanitize_sample_grads",
]
