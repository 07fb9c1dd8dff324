"""Secure sum costs: bytes per client and wall time of one SecAgg+ sum vs a plain float32 upload.

For each cohort size c, one DP-MERF-sized release (10 classes × (2·200 + 1) = 4,010 coordinates)
goes to the server twice, side by side on the same in-process transport (real Flower messages,
counted by ``protos.wire.message_wire_bytes`` as summary.json's comm figures are):

- plain: the clipped vector as float32 in one DP-MERF release message (``train.dpmerf``);
- secure: the same vector encoded as the distributed-noise plan says (clip, scale by 1/γ,
  conditional rounding, the client's Skellam share; ``common.secagg.plan``) and summed by
  the four rounds of SecAgg+ (``server.secure_sum``), at the modulus the plan gives for a target ε.

The plan is calibrated (``plan_for``, one release, δ = 1e-5, clip 1/√10) at each target ε; the
modulus b fixes how wide a masked vector travels (uint32 up to 32 bits), so each ε is measured.
Cohorts up to ``--complete-up-to`` run on the complete graph and on Bell et al.'s sparse graph of
k ≈ 2·log2 c neighbours (``--graph both``); larger ones on the sparse graph only: the complete
graph's key agreements, Shamir shares and masks grow as c² (its share round alone takes about a
minute at c = 100 on 2 cores, so well over an hour at c = 1,000). The threshold t is the smallest
majority of a neighbourhood (c // 2 + 1 on the complete graph), which is also the fewest inputs a
revealed sum may hold, so the plan's noise shares are μ/t.

Writes ``bench/results/secure-sum-cost.json`` and ``.md`` and prints one line.

    python bench/secure_sum_cost.py [--cohorts 10 100 1000] [--dim 4010] [--epsilons 1 10]
                                    [--complete-up-to 100] [--graph both|auto|complete|sparse]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from client.app import app as client_app  # noqa: E402
from client.secure_deposit import deposit_input  # noqa: E402
from common.methods.dp_merf.messages import MSG_EMBED, MerfRelease, MerfRequest  # noqa: E402
from common.privacy.skellam import skellam_tail  # noqa: E402
from common.secagg import (  # noqa: E402
    complete_degree,
    decode_signed,
    majority_threshold,
    mask_dtype,
    required_bits,
    sparse_degree,
)
from common.secagg.plan import SecureSumPlan, encode, plan_for  # noqa: E402
from protos import wire  # noqa: E402
from server.secure_sum import STAGES, secure_sum  # noqa: E402
from server.session import exchange_in_chunks  # noqa: E402
from server.strategy import Outgoing  # noqa: E402
from server.transport import InProcessTransport  # noqa: E402

DP_MERF_DIM = 10 * (2 * 200 + 1)  # classes × (2 D + 1) random features: one DP-MERF release
CLIP = 1 / math.sqrt(10)  # a per-class unit norm over 10 classes
DELTA = 1e-5
SHARE_TAIL = 1e-12  # the chance a coordinate of a noise share leaves the declared input range
COMPLETE_UP_TO = 100
RESULTS = ROOT / "bench" / "results"


# --- the plan: threshold, noise, modulus ---------------------------------------------------------
def degrees_for(cohort: int, graph: str, complete_up_to: int = COMPLETE_UP_TO) -> list[int]:
    """Neighbours per node for each row of ``cohort``: ``complete``, ``sparse`` (Bell et al.'s k),
    ``auto`` (complete up to ``complete_up_to``, sparse above), ``both`` (auto, plus the sparse
    graph wherever auto chose the complete one and k is smaller)."""
    complete, sparse = complete_degree(cohort), sparse_degree(cohort)
    auto = complete if cohort <= complete_up_to else sparse
    chosen = {"complete": [complete], "sparse": [sparse], "auto": [auto], "both": [auto, sparse]}[graph]
    return sorted(set(chosen), reverse=True)


def calibrate(*, dim: int, cohort: int, degree: int, epsilon: float) -> tuple[SecureSumPlan, dict]:
    """The plan for one release at ``epsilon`` and the secure sum's parameters it implies.

    The sum's per-coordinate range R covers a rounded coordinate (≤ the rounded norm bound) plus the
    client's noise share except with probability ``SHARE_TAIL``; the sum runs at the larger of the
    plan's bits and the bits that range needs (``required_bits``), which the nodes insist on."""
    threshold = majority_threshold(degree)
    plan = plan_for(
        dim=dim, clip=CLIP, cohort=cohort, threshold=threshold, target_epsilon=epsilon, releases=1, delta=DELTA
    )
    bound = math.ceil(plan.bound + skellam_tail(plan.mu_share, SHARE_TAIL))
    bits = max(plan.bits, required_bits(cohort, bound))
    return plan, {
        "epsilon": epsilon,
        "threshold": threshold,
        "mu": plan.mu,
        "mu_share": plan.mu_share,
        "rounded_norm_bound": plan.bound,
        "input_range": bound,
        "plan_bits": plan.bits,
        "required_bits": required_bits(cohort, bound),
        "bits": bits,
        "masked_dtype": mask_dtype(bits).name,
    }


def client_vectors(dim: int, cohort: int, seed: int) -> list[np.ndarray]:
    """Releases of norm 1.5 C (each is clipped): random directions, as a feature mean's would be."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(cohort):
        x = rng.normal(size=dim)
        out.append(x * 1.5 * CLIP / np.linalg.norm(x))
    return out


def clipped(x: np.ndarray) -> np.ndarray:
    return x * min(1.0, CLIP / float(np.linalg.norm(x)))


def release_shape(dim: int) -> tuple[int, int]:
    """The release's [classes, 2D+1] shape (10 classes when d divides; else one row)."""
    return (10, dim // 10) if dim % 10 == 0 else (1, dim)


# --- the node: the project's ClientApp, plus a canned DP-MERF release for the plain arm ------------
def bench_app(plain: dict[int, np.ndarray]) -> Callable:
    """The real ClientApp (it answers the secure sum's rounds); a ``train.dpmerf`` request is
    answered with the node's vector from ``plain`` as DP-MERF's own float32 release message."""

    def app(message, context):
        if message.metadata.message_type != MSG_EMBED:
            return client_app(message, context)
        request = wire.decode(MerfRequest, message.content)
        return wire.reply(MerfRelease(step=request.step, embedding=plain[context.node_id]), message)

    return app


# --- the two arms ----------------------------------------------------------------------------------
def measure_plain(transport: InProcessTransport, nodes: list[int], shape: tuple[int, int]) -> dict:
    """One exchange: a release request down, the float32 release up; the server decodes and sums."""
    outgoing = [Outgoing(n, MSG_EMBED, wire.encode(MerfRequest(step=0))) for n in nodes]
    start, cpu = time.perf_counter(), time.process_time()
    exchange = exchange_in_chunks(transport, outgoing)
    releases = [wire.decode(MerfRelease, r.content).decoded(step=0, shape=shape) for r in exchange.replies]
    total = np.sum([r.embedding.astype(np.float64) for r in releases], axis=0)
    seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    down, up = exchange.totals()
    return {"sum": total.reshape(-1), "seconds": seconds, "cpu_s": cpu_s, **per_client(down, up, len(nodes))}


def measure_secure(
    transport: InProcessTransport, nodes: list[int], vectors: list[np.ndarray], plan: SecureSumPlan, params: dict
) -> dict:
    """Encode and deposit each node's vector (timed apart: the client's local work), then one secure sum."""
    rng = np.random.default_rng(1)
    session = f"bench-eps{params['epsilon']:g}".replace(".", "_")
    start = time.perf_counter()
    for node, x in zip(nodes, vectors, strict=True):
        vector = decode_signed(encode(x, plan, rng), plan.bits)
        deposit_input(transport.contexts[node], session, vector, floor=plan.threshold, bound=params["input_range"])
    encode_s = time.perf_counter() - start
    degree, cpu = params["degree"], time.process_time()
    result = secure_sum(
        transport,
        nodes,
        bound=params["input_range"],
        length=plan.dim,
        threshold=params["threshold"],
        degree=degree,
        bits=params["bits"],
        session=session,
        peers=transport.secagg_peers,
    )
    cpu_s = time.process_time() - cpu
    if not result.revealed:
        raise RuntimeError(f"the secure sum aborted: {result.aborted}")
    n = len(nodes)
    stages = {s: per_client(b["down"], b["up"], n) for s, b in result.bytes_by_stage.items()}
    down = sum(b["down"] for b in result.bytes_by_stage.values())
    up = sum(b["up"] for b in result.bytes_by_stage.values())
    return {
        **per_client(down, up, n),
        "seconds": sum(result.seconds_by_stage.values()),
        "cpu_s": cpu_s,
        "seconds_by_round": dict(result.seconds_by_stage),
        "bytes_per_client_by_round": stages,
        "encode_s_per_client": encode_s / n,
        "sum": result.sum.astype(np.float64) * plan.gamma,
        "survivors": len(result.survivors),
    }


def per_client(down: int, up: int, cohort: int) -> dict[str, float]:
    return {"down": down / cohort, "up": up / cohort, "total": (down + up) / cohort}


# --- one cohort, every arm ----------------------------------------------------------------------
def measure_cohort(cohort: int, *, dim: int, epsilons: Sequence[float], degree: int, seed: int = 0) -> dict:
    """The plain arm and one secure sum per target ε, on one transport of ``cohort`` nodes."""
    vectors = client_vectors(dim, cohort, seed)
    plain = {}
    # the nodes hold identities, as a secure run's simulated nodes do: they sign and verify their peers
    identities = tempfile.mkdtemp(prefix="secagg-bench-")
    transport = InProcessTransport(bench_app(plain), cohort, node_state=identities, secagg_identities=True)
    nodes = transport.node_ids(cohort)
    shape = release_shape(dim)
    plain.update({n: clipped(x).astype(np.float32).reshape(shape) for n, x in zip(nodes, vectors, strict=True)})
    plain_arm = measure_plain(transport, nodes, shape)
    row = {"cohort": cohort, "dim": dim, "degree": degree, "graph": graph_name(cohort, degree), "plain": plain_arm}
    row["secure"] = []
    for epsilon in epsilons:
        plan, params = calibrate(dim=dim, cohort=cohort, degree=degree, epsilon=epsilon)
        secure = measure_secure(transport, nodes, vectors, plan, {**params, "degree": degree})
        secure["error_std_vs_plain"] = float(np.std(secure["sum"] - plain_arm["sum"]))  # the noise, in x's units
        secure["noise_std_expected"] = plan.gamma * math.sqrt(2 * plan.mu_share * cohort)
        secure["ratio_bytes"] = secure["total"] / plain_arm["total"]
        secure["ratio_up"] = secure["up"] / plain_arm["up"]
        secure["ratio_seconds"] = secure["seconds"] / plain_arm["seconds"]
        secure["ratio_cpu_s"] = secure["cpu_s"] / plain_arm["cpu_s"]
        row["secure"].append({**params, **secure})
    return row


def graph_name(cohort: int, degree: int) -> str:
    return "complete" if degree == complete_degree(cohort) else f"sparse (k = {degree})"


def run_benchmark(
    cohorts: Sequence[int],
    *,
    dim: int = DP_MERF_DIM,
    epsilons: Sequence[float] = (1.0, 10.0),
    graph: str = "both",
    complete_up_to: int = COMPLETE_UP_TO,
) -> dict:
    """Every cohort's row (JSON-ready: the sums themselves are dropped)."""
    rows = []
    for cohort in cohorts:
        for degree in degrees_for(cohort, graph, complete_up_to):
            row = measure_cohort(cohort, dim=dim, epsilons=epsilons, degree=degree)
            row["plain"].pop("sum")
            for arm in row["secure"]:
                arm.pop("sum")
            rows.append(row)
    return {
        "benchmark": "secure_sum_cost",
        "dim": dim,
        "clip": CLIP,
        "delta": DELTA,
        "releases": 1,
        "epsilons": list(epsilons),
        "graph": graph,
        "complete_up_to": complete_up_to,
        "transport": "in-process (real Flower messages, bytes by protos.wire.message_wire_bytes)",
        "definition": "bytes per client: serialized Flower message bytes of one release (plain: one "
        "train.dpmerf request down and its float32 release up; secure: the four SecAgg+ rounds), "
        "summed over the cohort and divided by c; seconds: server wall time of the exchange(s) "
        "including every node's handler, in one process; cpu_s: this process's CPU time over the "
        "same span (steadier than wall time on a shared host)",
        "host": {"machine": platform.machine(), "python": platform.python_version()},
        "rows": rows,
    }


# --- output ------------------------------------------------------------------------------------
def markdown(result: dict, command: str) -> str:
    """The results as a table, with the command that made them."""
    lines = [
        "# Secure sum costs (SecAgg+ vs plain float32 upload)",
        "",
        f"One release of d = {result['dim']} coordinates per client, in-process transport, "
        f"one process on this host. Plan: Skellam, one release, δ = {result['delta']:g}, "
        f"clip {result['clip']:.4f}. Bytes per client (down + up); seconds: server wall time of one sum "
        "(CPU s: the process's CPU time, every thread counted: Flower's Shamir sharing runs in a thread "
        "pool; steadier than wall time on a shared host).",
        "",
        "| c | graph | ε | t | b (plan / run) | masked | plain B/client | secure B/client (down / up) "
        "| × plain | plain s | secure s (CPU s) | × plain |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        plain = row["plain"]
        for arm in row["secure"]:
            lines.append(
                f"| {row['cohort']} | {row['graph']} | {arm['epsilon']:g} | {arm['threshold']} "
                f"| {arm['plan_bits']} / {arm['bits']} | {arm['masked_dtype']} | {plain['total']:,.0f} "
                f"| {arm['total']:,.0f} ({arm['down']:,.0f} / {arm['up']:,.0f}) | {arm['ratio_bytes']:.2f} "
                f"| {plain['seconds']:.3f} | {arm['seconds']:.2f} ({arm['cpu_s']:.2f}) | {arm['ratio_seconds']:.0f} |"
            )
    lines += [
        "",
        "b (plan / run): the modulus bits the Skellam plan gives (the sum of c rounded vectors plus "
        "the total noise's 1e-12 tail) and the bits the sum ran at: the larger of those and "
        "`required_bits(c, R)`, where each client's input range R must also hold its own noise "
        "share's tail (the nodes refuse a modulus below that).",
    ]
    lines += ["", f"Per round (bytes per client down / up; seconds), at ε = {result['epsilons'][0]:g}:", ""]
    lines += ["| c | graph | " + " | ".join(STAGES) + " |", "|---|---|" + "---|" * len(STAGES)]
    for row in result["rows"]:
        arm = row["secure"][0]
        cells = [
            f"{arm['bytes_per_client_by_round'][s]['down']:,.0f} / {arm['bytes_per_client_by_round'][s]['up']:,.0f}; "
            f"{arm['seconds_by_round'][s]:.2f} s"
            for s in STAGES
        ]
        lines.append(f"| {row['cohort']} | {row['graph']} | " + " | ".join(cells) + " |")
    lines += ["", "Command:", "", "```", command, "```", ""]
    return "\n".join(lines)


def write_results(result: dict, out_dir: Path, command: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "secure-sum-cost.json"
    path.write_text(json.dumps({**result, "command": command}, indent=2) + "\n")
    (out_dir / "secure-sum-cost.md").write_text(markdown(result, command))
    return path


def summary_line(result: dict) -> str:
    parts = [
        f"c={row['cohort']} ({row['graph']}) {row['plain']['total']:,.0f} -> "
        + "/".join(
            f"{arm['total']:,.0f} B ({arm['ratio_bytes']:.2f}x), {arm['seconds']:.2f} s" for arm in row["secure"]
        )
        for row in result["rows"]
    ]
    return f"secure_sum_cost (d={result['dim']}, eps {result['epsilons']}): bytes/client plain -> secure: " + "; ".join(
        parts
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cohorts", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--dim", type=int, default=DP_MERF_DIM)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 10.0])
    parser.add_argument("--graph", choices=("both", "auto", "complete", "sparse"), default="both")
    parser.add_argument("--complete-up-to", type=int, default=COMPLETE_UP_TO)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    # Opacus' RDP search notes when ε = 10's optimum is its largest order: ε is then an upper bound.
    warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
    result = run_benchmark(
        args.cohorts, dim=args.dim, epsilons=args.epsilons, graph=args.graph, complete_up_to=args.complete_up_to
    )
    command = "python bench/secure_sum_cost.py " + " ".join(argv if argv is not None else sys.argv[1:])
    path = write_results(result, args.out_dir, command.strip())
    print(f"{summary_line(result)} -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
