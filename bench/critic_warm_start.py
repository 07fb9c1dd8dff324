"""How few warm-start iterations a client's discriminator needs when it starts from the seed's critic.

Issue 42, item 1: in a seeded run the server trains a critic on the seed generator's samples
(``server_critic``, post-processing of the seed release) and every GS-WGAN client's D starts from
it. This measures what that start saves. For a handful of the run's own clients (their real
partitions, ``new_state``), each arm runs the client's own warm start (``warm_start``: WGAN-GP
critic steps on its data against a throwaway generator, as a run does) for n iterations, then answers
one fixed query of the seed generator's samples: the per-sample gradients of the generator loss
-D(x, y) with respect to the samples, before clipping and noise (what a client sanitizes and
releases). Each answer is compared, by the mean cosine over the samples, with a *reference* answer of
the same client's D after ``--reference`` iterations from scratch (GS-WGAN's published warm start
is 2,000) under another draw of D's initial weights and of the data order. Two such references
compared with each other give the ceiling: how closely two fully warmed discriminators agree.

Arms: ``scratch`` (D from its per-client seed, as an unseeded run) and ``critic`` (D loaded from the
run's seed critic, as a seeded run; ``--critic-steps N`` derives that critic again with N steps, as
``--init-critic-steps N`` would, and must for a run that trained none; ``--lr-d`` sets the clients'
learning rate and, so derived, the critic's).
The summary names, per arm, the fewest iterations of the grid whose agreement reaches
``--fraction`` (0.9) of the ceiling; the cosine at n = 0 is what a client answering with no warm
start at all sends. ``between_clients`` is the same cosine between distinct clients' answers: what
of the m answers a step's sum adds up coherently. It runs on one thread (the critic is small; it is
meant to run beside a training).

    PYTHONPATH=. python bench/critic_warm_start.py --run RUN [--clients 6] [--grid 0,5,20,50,200]
        [--reference 2000] [--lr-d 1e-3] [--critic-steps 2000]

``RUN`` is a seeded GS-WGAN run directory (its ``seed_start.pt``; e.g. ``make run``'s). Writes
``bench/results/critic-warm-start-<dataset>.json`` and prints a one-line summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.client_state import ClientState, new_state  # noqa: E402
from common.data import num_classes_for  # noqa: E402
from common.io.tensor_files import load_tensors  # noqa: E402
from common.learning.losses import generator_sample_grads  # noqa: E402
from common.learning.models import build_discriminator, build_generator, sample_latent  # noqa: E402
from common.methods import ExperimentConfig  # noqa: E402
from common.methods.gswgan.critic import start_from_critic, warm_start  # noqa: E402
from common.methods.seeding import SeedStart, server_critic  # noqa: E402
from server.reporting import RunDirectory  # noqa: E402
from server.seeded import START_FILE  # noqa: E402

QUERY_STREAM = 0x0A11  # the fixed query's latents and labels
REFERENCE_STREAMS = (0x5EF1, 0x5EF2)  # the two references' D weights and data order


def load_seed(run: Path, *, lr_d: float | None, critic_steps: int | None) -> tuple[ExperimentConfig, SeedStart]:
    """The run's config (``lr_d`` replacing its critics' learning rate) and its seed start; with
    ``critic_steps`` the seed critic is derived again, as ``--init-critic-steps`` would, once."""
    _, cfg = RunDirectory.open_existing(run)
    if lr_d is not None:
        cfg = dataclasses.replace(cfg, lr_d=lr_d)
    path = run / START_FILE
    if not path.is_file():
        raise SystemExit(f"{run} has no {START_FILE}: not a seeded run (see --init-release)")
    start = SeedStart.from_state_dict(load_tensors(path))
    if critic_steps is not None:
        cfg = dataclasses.replace(cfg, init_critic_steps=critic_steps)
        start.critic = server_critic(cfg, start, num_classes_for(cfg))
    if start.critic is None:
        raise SystemExit(f"{run} trained no seed critic (--init-critic-steps 0): pass --critic-steps N")
    return cfg, start


def query(cfg: ExperimentConfig, start: SeedStart) -> tuple[Tensor, Tensor]:
    """One batch of the seed generator's samples and their labels: what stage 2's first queries hold."""
    nc = num_classes_for(cfg)
    rng = torch.Generator().manual_seed(cfg.seed + QUERY_STREAM)
    G = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=nc)
    G.load_state_dict(start.generator)
    G.eval()
    y = torch.randint(nc, (cfg.batch_size,), generator=rng)
    with torch.no_grad():
        return G(sample_latent(cfg.batch_size, cfg.z_dim, generator=rng), y), y


def client(cfg: ExperimentConfig, cid: int, *, critic: dict[str, Tensor] | None, stream: int | None) -> ClientState:
    """A fresh client as a run builds it; ``critic``: D starts from the seed's critic; ``stream``: D's
    initial weights and the data order drawn afresh (a reference's independent draw)."""
    state = new_state(cfg, cid, critic_lr=cfg.lr_d)
    if stream is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(stream * 7919 + cid)
            fresh = build_discriminator(cfg.model, num_classes=num_classes_for(cfg))
        state.discriminator.load_state_dict(fresh.state_dict())
        state.data_rng.manual_seed(stream * 7919 + cid)
    if critic is not None:
        start_from_critic(state, critic)
    return state


def warmed_answer(
    cfg: ExperimentConfig,
    cid: int,
    steps: int,
    x: Tensor,
    y: Tensor,
    *,
    critic: dict[str, Tensor] | None,
    stream: int | None,
) -> Tensor:
    """The client's answer to the query after ``steps`` warm-start iterations: its per-sample
    gradients of -D(x, y), flattened to [B, pixels] (before clipping and noise)."""
    state = client(cfg, cid, critic=critic, stream=stream)
    warm_start(state, cfg, steps=steps)
    return generator_sample_grads(state.discriminator, x, y).flatten(1)


def agreement(a: Tensor, b: Tensor) -> float:
    """Mean over the samples of the cosine between two answers' per-sample gradients."""
    return float(torch.nn.functional.cosine_similarity(a, b, dim=1, eps=1e-12).mean())


def between(answers: list[Tensor]) -> float:
    """Mean agreement of distinct clients' answers to the same query: how much of the m answers a
    secure sum adds up coherently (near 0: their sum grows as sqrt(m), its noise does not shrink)."""
    pairs = [(a, b) for i, a in enumerate(answers) for b in answers[i + 1 :]]
    return sum(agreement(a, b) for a, b in pairs) / len(pairs) if pairs else float("nan")


def measure(cfg: ExperimentConfig, start: SeedStart, args: argparse.Namespace) -> dict:
    x, y = query(cfg, start)
    step = max(cfg.num_clients // args.clients, 1)
    ids = [i * step for i in range(args.clients)]
    rows: dict[str, dict[int, list[float]]] = {"scratch": {}, "critic": {}}
    answers: dict[str, dict[int, list[Tensor]]] = {"scratch": {}, "critic": {}}
    ceilings, seconds = [], {"scratch": 0.0, "critic": 0.0}
    for cid in ids:
        ref = [warmed_answer(cfg, cid, args.reference, x, y, critic=None, stream=s) for s in REFERENCE_STREAMS]
        ceilings.append(agreement(*ref))
        for arm, critic in (("scratch", None), ("critic", start.critic)):
            for n in args.grid:
                t0 = time.perf_counter()
                got = warmed_answer(cfg, cid, n, x, y, critic=critic, stream=None)
                seconds[arm] += time.perf_counter() - t0
                rows[arm].setdefault(n, []).append(agreement(got, ref[0]))
                answers[arm].setdefault(n, []).append(got)
        print(
            f"client {cid}: ceiling {ceilings[-1]:.3f}, "
            + ", ".join(f"{arm} n={n} {rows[arm][n][-1]:.3f}" for arm in rows for n in (args.grid[0], args.grid[-1])),
            flush=True,
        )
    ceiling = sum(ceilings) / len(ceilings)
    means = {arm: {n: sum(v) / len(v) for n, v in by_n.items()} for arm, by_n in rows.items()}
    needed = {arm: next((n for n in args.grid if means[arm][n] >= args.fraction * ceiling), None) for arm in means}
    return {
        "clients": ids,
        "ceiling": ceiling,
        "ceilings": ceilings,
        "agreement": {arm: {str(n): v for n, v in m.items()} for arm, m in means.items()},
        "per_client": {arm: {str(n): v for n, v in by_n.items()} for arm, by_n in rows.items()},
        "needed": needed,
        "between_clients": {arm: {str(n): between(a) for n, a in by_n.items()} for arm, by_n in answers.items()},
        "arm_seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a seeded GS-WGAN run directory")
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--grid", default="0,5,20,50,200", help="warm-start iterations to measure")
    parser.add_argument("--reference", type=int, default=2000, help="iterations of the reference D")
    parser.add_argument("--fraction", type=float, default=0.9, help="of the ceiling, to count as warmed")
    parser.add_argument("--lr-d", type=float, default=None, help="the clients' critic lr (default: the run's)")
    parser.add_argument(
        "--critic-steps", type=int, default=None, help="derive the seed critic again with this many steps"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    args.grid = sorted({int(n) for n in args.grid.split(",")})
    torch.set_num_threads(1)
    cfg, start = load_seed(args.run, lr_d=args.lr_d, critic_steps=args.critic_steps)
    result = {
        "bench": "critic_warm_start",
        "run": str(args.run),
        "dataset": cfg.dataset,
        "partition": cfg.partition,
        "model": cfg.model,
        "batch_size": cfg.batch_size,
        "n_critic": cfg.n_critic,
        "lr_d": cfg.lr_d,
        "init_critic_steps": cfg.init_critic_steps,
        "reference": args.reference,
        "fraction": args.fraction,
        "grid": args.grid,
        **measure(cfg, start, args),
    }
    out = args.out or ROOT / "bench" / "results" / f"critic-warm-start-{cfg.dataset}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    a, need = result["agreement"], result["needed"]
    first, last = str(args.grid[0]), str(args.grid[-1])
    print(
        f"critic_warm_start: ceiling {result['ceiling']:.3f}; scratch {a['scratch'][first]:.3f} at n={first} → "
        f"{a['scratch'][last]:.3f} at n={last} (warmed at n={need['scratch']}); seed critic "
        f"{a['critic'][first]:.3f} → {a['critic'][last]:.3f} (warmed at n={need['critic']}); {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
