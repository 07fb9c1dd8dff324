"""What each ``fedgan`` command does once its flags are parsed (``simulations/cli.py`` parses them).

Every command checks its input before any work and answers bad input with exit code 2 and a message
naming the field, the file or the path; ``simulate`` and ``deploy`` return the run's exit code.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from common.config import ConfigError, refuse_noise_with_target
from common.methods import ExperimentConfig, prepare, schedule_notes

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
    "parallel_clients",  # wall time only: each client computes exactly as before
    "ray_address",  # where the actors run, not what they compute
    "ray_actor_cpus",
}
# Upper bounds of the counts the evaluation and audit flags take, far above any real use: each is
# held in memory at once (an audit of 10^9 canaries took 9.8 GB before it was stopped).
MAX_EVAL_SAMPLES = 100_000  # generated images at once: 314 MB; FID-50k, the largest usual figure, fits
MAX_CANARIES = 100_000  # measured for DP-MERF: ~1 ms and ~4 KB each; the default is 2,000
MAX_RELEASES = 100_000  # per canary; a client's budget stops it long before
# The membership test holds a samples x samples distance matrix per side (400 MB at 10,000), and
# MNIST's test split, its non-members, holds 10,000 images.
MAX_MIA_SAMPLES = 10_000


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


def check_node_state(args: argparse.Namespace) -> None:
    """``--node-state`` is a folder this process can write (made if missing), checked before the run
    directory is made: a bad one is then blamed on itself, not on ``--out``, and leaves no half-made
    run directory behind. A RunDirectoryError naming the flag and the path if not."""
    from server.reporting import RunDirectoryError, check_writable

    given = getattr(args, "node_state", None)
    if not given:
        return
    folder = Path(given)
    if folder.exists() and not folder.is_dir():
        raise RunDirectoryError(
            f"--node-state {folder} is not a directory: give a folder where the simulated nodes keep their state"
        )
    check_writable(folder, "--node-state must be a writable directory (the simulated nodes keep their state there)")


def bounded_count_problem(flag: str, value: int | None, low: int, high: int) -> str:
    """Why ``value`` of ``flag`` is out of [low, high] ("" when it is in, or not given)."""
    if value is None or low <= value <= high:
        return ""
    return f"invalid {flag}={value}: must be between {low:,} and {high:,}"


def resolve_config(args: argparse.Namespace) -> ExperimentConfig:
    names = {f.name for f in dataclasses.fields(ExperimentConfig)}
    given = {k: v for k, v in vars(args).items() if k in names}
    if getattr(args, "config", None):
        return ExperimentConfig.from_toml(args.config, **given)
    refuse_noise_with_target(ExperimentConfig, {"command line": given})
    return ExperimentConfig.from_mapping(given, source="command line")


def check_ray_placement(cfg: ExperimentConfig, transport: str) -> None:
    """Flower's simulation only: the cluster named by ray_address answers and ray_actor_cpus fits one
    of its nodes (or this machine), within a bounded time; a ConfigError naming the option if not."""
    if transport == "flower":
        from .experiments.ray_cluster import check_placement

        check_placement(cfg.ray_address, cfg.ray_actor_cpus, cfg.parallel_clients)


def print_schedule_notes(cfg: ExperimentConfig) -> None:
    """The method's notes on the calibrated schedule, before any training (they change nothing)."""
    for note in schedule_notes(cfg):
        print(f"fedgan: note: {note}", flush=True)


def cmd_simulate(args: argparse.Namespace) -> int:
    from common.data import DataError
    from server.reporting import RunDirectory, RunDirectoryError

    try:
        apply_node_policy(args)
        if args.resume:
            run, cfg = _resume_target(args)
            check_ray_placement(cfg, args.transport)
        else:
            cfg = prepare(resolve_config(args))
            check_ray_placement(cfg, args.transport)  # before the run directory: nothing to clean up
            check_node_state(args)
            run = RunDirectory.create(cfg, state_dir=getattr(args, "node_state", None))
            run.lock()
    except (ConfigError, DataError, RunDirectoryError, ValueError) as err:
        print(f"fedgan: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"run directory: {run.path}", flush=True)
    print_schedule_notes(cfg)
    from .experiments.simulate import simulate

    try:
        return simulate(cfg, run, resume=bool(args.resume), transport=args.transport)
    finally:
        run.unlock()


def cmd_deploy(args: argparse.Namespace) -> int:
    from common.data import DataError
    from server.reporting import RunDirectoryError, check_new_run_dir, check_writable

    from .deploy.local import DeployError, check_options, check_tools
    from .deploy.run import deploy_local

    try:
        check_tools()
        check_options(tls=args.tls, auth=args.auth, use_netns=args.netns)
        if getattr(args, "node_state", None):
            raise ConfigError(
                "--node-state places simulated nodes; a deployment's SuperNodes keep their state in their own "
                "state-dir (deploy/nodes/<n>/state), as their node config says"
            )
        policy = apply_node_policy(args)
        from common.config import load_toml_values

        in_toml = bool(args.config) and "dataplane" in load_toml_values(args.config)
        if "dataplane" not in vars(args) and not in_toml:
            args.dataplane = "grpc"  # a deployment's default: Flower as control plane only
        cfg = prepare(resolve_config(args))
        if cfg.out:  # the ServerApp makes the run directory; fail before starting any process
            check_new_run_dir(Path(cfg.out))
        check_writable(Path(cfg.out or "runs"), "choose a writable --out")
    except (ConfigError, DataError, DeployError, RunDirectoryError, ValueError) as err:
        print(f"fedgan: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print_schedule_notes(cfg)
    try:
        return deploy_local(cfg, tls=args.tls, auth=args.auth, use_netns=args.netns, node_policy=policy)
    except DeployError as err:
        print(f"fedgan: deployment failed: {err}", file=sys.stderr)
        return 1


def _resume_target(args: argparse.Namespace):
    from server.reporting import RunDirectory

    run, cfg = RunDirectory.open_existing(args.resume)
    run.lock()  # before anything is read or rewritten: another process may be driving it
    from common.methods.seeding import federated
    from server.seeded import check_resumable

    # fail now, with the path, if there is nothing (whole) to resume: a seeded run, in either stage
    if federated(cfg):
        check_resumable(run, cfg)
    else:
        run.resumable_checkpoint()
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
    from common.data import DataError
    from server.reporting import RunDirectoryError

    from .experiments.compare import STRATEGY_ORDER, check_new_compare_dir, compare, format_comparison, method_config

    try:
        apply_node_policy(args)
        cfg = resolve_config(args)
        for name in STRATEGY_ORDER:  # every strategy's own checks (its data too) now, not after the others trained
            method_config(cfg, name)
        check_ray_placement(cfg, args.transport)
        check_node_state(args)
        if cfg.out:
            check_new_compare_dir(Path(cfg.out))
    except (ConfigError, DataError, RunDirectoryError, ValueError) as err:
        print(f"fedgan: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    result = compare(cfg, transport=args.transport, node_state=getattr(args, "node_state", None))
    print(format_comparison(result))
    return 0 if all("summary" in e for e in result["strategies"]) else 1


def cmd_evaluate(args: argparse.Namespace) -> int:
    from common.data import DataError
    from server.reporting import RunDirectoryError

    from .experiments.evaluate import evaluate_run, print_eval

    for flag, value in (("--num-samples", args.num_samples), ("--fid-samples", args.fid_samples)):
        problem = bounded_count_problem(flag, value, 10, MAX_EVAL_SAMPLES)
        if problem:
            print(f"fedgan: error: {problem}", file=sys.stderr)
            return EXIT_BAD_INPUT
    if args.inception_weights and not Path(args.inception_weights).is_file():
        print(f"fedgan: error: --inception-weights {args.inception_weights} does not exist", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        result = evaluate_run(
            args.run_dir,
            num_samples=args.num_samples,
            fid_samples=args.fid_samples,
            inception=args.inception,
            inception_weights=args.inception_weights,
            progress=args.progress,
            protocol=args.protocol,
        )
    except (ConfigError, DataError, RunDirectoryError, FileNotFoundError) as err:
        print(f"fedgan: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print_eval(result)
    print(f"report: {Path(args.run_dir).resolve() / 'report.html'}")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from common.data import DataError
    from server.reporting import RunDirectoryError

    from .experiments.audit import audit_run, format_audit

    problem = audit_flags_problem(args)
    if problem:
        print(f"fedgan: error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        result = audit_run(
            args.run_dir,
            canaries=args.canaries,
            releases=args.releases,
            confidence=args.confidence,
            mia_samples=args.mia_samples,
        )
    except (ConfigError, DataError, RunDirectoryError, ValueError) as err:
        print(f"fedgan: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(format_audit(result))
    return 3 if result["violated"] else 0


def audit_flags_problem(args: argparse.Namespace) -> str:
    """The first of ``fedgan audit``'s flags out of its range, in words ("" when none): checked before
    the run directory is read, so that no count the audit would hold in memory is unbounded."""
    problems = (
        bounded_count_problem("--canaries", args.canaries, 100, MAX_CANARIES),
        bounded_count_problem("--releases", args.releases, 1, MAX_RELEASES),
        bounded_count_problem("--mia-samples", args.mia_samples, 0, MAX_MIA_SAMPLES),
        "" if 0.5 < args.confidence < 1 else f"invalid --confidence={args.confidence}: must be in (0.5, 1)",
    )
    return next((p for p in problems if p), "")


def cmd_debug_task(args: argparse.Namespace) -> int:
    from common.data import DataError
    from server.reporting import RunDirectoryError

    from .experiments.debug_task import debug_task, format_result

    try:
        apply_node_policy(args)
        if "invert_prob" not in vars(args):
            args.invert_prob = 0.5  # the task's default: half of the clients have the bug
        cfg = prepare(resolve_config(args))
        check_ray_placement(cfg, args.transport)
        check_node_state(args)
        if not 0 < cfg.invert_prob < 1:
            raise ConfigError(
                f"invalid invert_prob={cfg.invert_prob!r}: the task needs some clients with and "
                "some without the bug, choose 0 < p < 1"
            )
    except (ConfigError, DataError, RunDirectoryError, ValueError) as err:
        print(f"fedgan: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    result = debug_task(
        cfg,
        threshold=args.threshold,
        selection_noise=args.selection_noise,
        transport=args.transport,
        num_samples=args.num_samples,
        node_state=getattr(args, "node_state", None),
    )
    print(format_result(result))
    return 0


COMMANDS = {
    "simulate": cmd_simulate,
    "deploy": cmd_deploy,
    "compare": cmd_compare,
    "evaluate": cmd_evaluate,
    "audit": cmd_audit,
    "debug-task": cmd_debug_task,
    "data": cmd_data,
}
