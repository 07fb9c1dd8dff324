"""The arithmetic both ends of a secure sum agree on (``common/secagg.py``): the modulus, the rules a
node checks, the graph, the masks, the wire packing of keys and shares."""

from __future__ import annotations

import secrets

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from common import secagg
from common.secagg import SecAggError


@settings(max_examples=200, deadline=None)
@given(cohort=st.integers(2, 10_000), bound=st.integers(1, 2**40))
def test_the_modulus_holds_every_in_range_sum_with_a_bit_to_spare(cohort: int, bound: int) -> None:
    bits = secagg.required_bits(cohort, bound)
    assert 2**bits >= 2 * (2 * cohort * bound + 1)  # the sum's 2cR + 1 values, and as many outside
    assert 2 ** (bits - 2) < 2 * cohort * bound + 1  # and no bit more than the formula asks
    if bits <= secagg.MAX_BITS:
        extremes = np.array([cohort * bound, -cohort * bound, 0], dtype=np.int64)
        assert (secagg.decode_signed(secagg.encode_inputs(extremes), bits) == extremes).all()


def test_parameters_a_node_refuses_name_the_rule() -> None:
    ok = dict(cohort=10, threshold=6, degree=9, bits=secagg.required_bits(10, 100), bound=100, length=5)
    assert secagg.parameter_problems(**ok) == []
    for change, words in [
        (dict(threshold=5), "not a strict majority"),  # 5 of 10 holders: two disjoint halves
        (dict(threshold=11), "not a strict majority"),
        (dict(degree=5), "neither the complete graph"),  # odd and not complete
        (dict(degree=10), "neither the complete graph"),
        (dict(bits=secagg.required_bits(10, 100) - 1), "without wrapping"),
        (dict(bits=65), "without wrapping"),
        (dict(bound=0), "range 0"),
        (dict(length=0), "coordinates"),
        (dict(cohort=1, degree=0, threshold=1), "no aggregate"),
    ]:
        problems = "; ".join(secagg.parameter_problems(**{**ok, **change}))
        assert words in problems, (change, problems)
    assert secagg.parameter_problems(**{**ok, "degree": 4, "threshold": 3}) == []  # sparse: majority of 5


def test_the_sparse_graph_is_k_regular_symmetric_and_random() -> None:
    nodes = list(range(100, 150))
    graph = secagg.neighbourhoods(nodes, 8)
    assert all(len(ns) == 8 and u not in ns for u, ns in graph.items())
    assert all(u in graph[v] for u, ns in graph.items() for v in ns)
    assert graph != secagg.neighbourhoods(nodes, 8)  # the order is drawn afresh (2^-200-ish to collide)
    complete = secagg.neighbourhoods(nodes[:5], 4)
    assert complete == {u: set(nodes[:5]) - {u} for u in nodes[:5]}
    assert (secagg.sparse_degree(1000), secagg.sparse_degree(10), secagg.sparse_degree(5)) == (20, 8, 4)  # or complete


@pytest.mark.parametrize("bits", [3, 17, 64])
def test_masks_are_uniform_mod_2_to_the_bits(bits: int) -> None:
    """Chi-square over the residues' top 4 bits (bits 3: every residue): a mask drawn from
    [0, 2^b - 1) or folded to fewer bits than asked fails this."""
    mask = secagg.expand_mask(secrets.token_bytes(32), 200_000, bits, session="s", purpose="self")
    assert mask.dtype == np.uint64 and int(mask.max()) < 2**bits
    top = (mask >> np.uint64(max(0, bits - 4))).astype(np.int64)
    counts = np.bincount(top, minlength=min(16, 2**bits))
    assert len(counts) == min(16, 2**bits)
    assert stats.chisquare(counts).pvalue > 1e-4
    low = (mask & np.uint64(1)).astype(np.int64)  # the lowest bit too: not stuck
    assert stats.binomtest(int(low.sum()), low.size).pvalue > 1e-4


def test_a_mask_depends_on_its_key_session_and_purpose() -> None:
    key = secrets.token_bytes(32)
    base = secagg.expand_mask(key, 64, 32, session="s", purpose="self")
    assert (base == secagg.expand_mask(key, 64, 32, session="s", purpose="self")).all()
    for other in (
        secagg.expand_mask(secrets.token_bytes(32), 64, 32, session="s", purpose="self"),
        secagg.expand_mask(key, 64, 32, session="t", purpose="self"),
        secagg.expand_mask(key, 64, 32, session="s", purpose="pair:1:2"),
    ):
        assert (base != other).mean() > 0.9
    with pytest.raises(SecAggError, match="32 bytes"):
        secagg.expand_mask(b"short", 4, 8, session="s", purpose="self")


def test_two_nodes_derive_the_same_pair_mask_from_either_end() -> None:
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key

    a, b = secagg.new_private_key(), secagg.new_private_key()
    ab = generate_shared_key(a, secagg.public_key_from(secagg.public_key_bytes(b)))
    ba = generate_shared_key(b, secagg.public_key_from(secagg.public_key_bytes(a)))
    m1 = secagg.pair_mask(ab, 32, 20, session="s", pair=(7, 3))
    m2 = secagg.pair_mask(ba, 32, 20, session="s", pair=(3, 7))
    assert (m1 == m2).all()
    restored = secagg.private_key_from(secagg.private_key_bytes(a))
    assert secagg.public_key_bytes(restored) == secagg.public_key_bytes(a)
    with pytest.raises(SecAggError, match="not a public key"):
        secagg.public_key_from(b"\x02" + b"\xff" * 32)


def test_inputs_out_of_range_are_counted_never_quoted_int64_extremes_included() -> None:
    assert secagg.input_problem(np.array([-5, 0, 5]), bound=5, length=3) == ""
    problem = secagg.input_problem(np.array([0, 30041, 0]), bound=5, length=3)
    assert "1 coordinate(s) outside the range ±5" in problem and "30041" not in problem
    extreme = np.array([0, np.iinfo(np.int64).min], dtype=np.int64)  # |x| overflows back to negative
    assert "outside the range" in secagg.input_problem(extreme, bound=5, length=2)
    assert "outside" in secagg.input_problem(np.array([2**64 - 1], dtype=np.uint64), bound=5, length=1)
    assert "shape" in secagg.input_problem(np.zeros(4, np.int64), bound=5, length=3)
    assert "dtype" in secagg.input_problem(np.zeros(3, np.float32), bound=5, length=3)


def test_a_share_plaintext_is_bound_to_its_session_and_both_ends() -> None:
    text = secagg.share_plaintext("s1", 5, 9, b"seed-share", b"key")
    assert secagg.parse_share_plaintext(text, session="s1", src=5, dst=9) == (b"seed-share", b"key", b"")
    for where in (dict(session="s2", src=5, dst=9), dict(session="s1", src=9, dst=5)):
        with pytest.raises(SecAggError, match="another session or pair"):
            secagg.parse_share_plaintext(text, **where)


def test_byte_lists_pack_and_unpack_and_lying_lengths_are_caught() -> None:
    items = [b"abc", b"", b"defgh"]
    flat, lengths = secagg.pack_bytes(items)
    assert secagg.unpack_bytes(flat, lengths) == items
    with pytest.raises(SecAggError):
        secagg.unpack_bytes(flat, lengths + 1)
    assert secagg.session_problem("ok-1:2.x_") == "" and secagg.session_problem("a/b")


def test_cohorts_split_every_node_once_into_c_to_2c_minus_1() -> None:
    from common.secagg import split_cohorts

    nodes = [(1 << 63) + i for i in range(3_400)]  # Flower's node ids are 64-bit unsigned
    parts = split_cohorts(nodes, 1000, np.random.default_rng(0))
    assert sorted(n for part in parts for n in part) == nodes
    assert len(parts) == 3 and all(1000 <= len(p) <= 1999 for p in parts)
    assert split_cohorts(nodes[:10], 1000, np.random.default_rng(0)) == [nodes[:10]]  # fewer than c: one cohort
    assert split_cohorts([], 5, np.random.default_rng(0)) == []


def test_a_cohorts_graph_is_complete_when_small_and_sparse_with_a_majority_when_large() -> None:
    from common.secagg import cohort_graph, majority_threshold, sparse_degree

    assert cohort_graph(10, 0, 7) == (9, 7)  # complete: the sum's floor is the sharing threshold
    assert cohort_graph(10, 0, 3) == (9, majority_threshold(9))  # never below a strict majority
    assert cohort_graph(1000, 0, 667) == (sparse_degree(1000), majority_threshold(sparse_degree(1000)))
    assert cohort_graph(100, 9, 60) == (10, majority_threshold(10))  # an odd degree asked is made even
    assert cohort_graph(8, 50, 6) == (7, 6)  # a degree at or above the complete graph's is the complete graph


def test_shamir_over_the_prime_field_rebuilds_from_any_t_and_hides_below_t() -> None:
    """The vectorised sharing (``common/secagg/shamir.py``): any t of n shares rebuild the secret
    exactly, every subset does, shares are at distinct points, and t − 1 shares say nothing: the
    first limb of t − 1 shares of two different secrets has the same (uniform) distribution."""
    import itertools
    import os

    from scipy import stats

    from common.secagg.shamir import P, combine_shares, create_shares

    secret = os.urandom(32)
    shares = create_shares(secret, 4, 7)
    assert len({s[:4] for s in shares}) == 7
    for subset in itertools.combinations(shares, 4):
        assert combine_shares(list(subset), 32) == secret
    with pytest.raises(ValueError, match="repeated"):
        combine_shares([shares[0], shares[0], shares[1], shares[2]], 32)
    for fixed in (bytes(32), b"\xff" * 32):  # t − 1 = 2 shares of either secret: uniform limbs
        limbs = np.array([np.frombuffer(create_shares(fixed, 3, 5)[1][4:8], "<u4")[0] for _ in range(3000)])
        assert limbs.max() < P and stats.kstest(limbs / P, "uniform").pvalue > 1e-4
