"""A release through a secure sum (common/secagg/plan.py): the encoded vectors of a cohort
sum, mod 2^b, to the sum of the clipped vectors plus exactly the calibrated noise; the plan's two
events give the ε against a server that runs the protocol and against one that deviates."""

import numpy as np
import pytest

from common.privacy import PrivacyLedger
from common.secagg.plan import SecureSumPlan, decode, encode, noise_std, plan_for


def cohort_sum(vectors, plan, rng):
    total = np.zeros(plan.dim, dtype=np.uint64)
    modulus = np.uint64(2**plan.bits)
    for x in vectors:
        total = (total + encode(x, plan, rng)) % modulus
    return decode(total, plan)


def test_the_decoded_sum_is_the_clipped_sum_plus_the_calibrated_noise():
    rng = np.random.default_rng(0)
    plan = SecureSumPlan(dim=5000, clip=1.0, cohort=20, threshold=15, mu=2.0e9)
    vectors = [rng.normal(size=plan.dim) * (3.0 if i == 0 else 0.005) for i in range(20)]  # vector 0 is clipped
    clipped = sum(x * min(1.0, plan.clip / np.linalg.norm(x)) for x in vectors)
    error = cohort_sum(vectors, plan, rng) - clipped
    assert abs(error.mean()) < 4 * noise_std(plan, 20) / np.sqrt(plan.dim)  # unbiased
    assert error.std() == pytest.approx(noise_std(plan, 20), rel=0.05)  # Sk(20 μ/t), in the vectors' units


def test_the_plan_meets_its_target_against_the_protocol_and_says_what_a_deviating_server_learns():
    plan = plan_for(dim=1000, clip=1.0, cohort=10, threshold=8, target_epsilon=2.0, releases=3, delta=1e-5)
    protocol = PrivacyLedger([plan.protocol_event(3)]).epsilon(delta=1e-5)
    own = PrivacyLedger([plan.own_event(3)]).epsilon(delta=1e-5)
    assert 1.99 < protocol <= 2.0
    assert own > 2 * protocol  # a share alone is t times less noise
    assert 2 ** (plan.bits - 1) > plan.cohort * plan.bound  # no in-range sum can wrap


def test_a_vector_of_the_wrong_size_is_refused():
    plan = SecureSumPlan(dim=10, clip=1.0, cohort=3, threshold=2, mu=100.0)
    with pytest.raises(ValueError, match="11 coordinates for a plan of 10"):
        encode(np.zeros(11), plan, np.random.default_rng(0))
    with pytest.raises(ValueError, match="threshold"):
        SecureSumPlan(dim=10, clip=1.0, cohort=3, threshold=4, mu=100.0)
