"""What many tests share: the repository root, the tiny run, and the node policy of testing options.

The tiny run is the smallest configuration that exercises every part of a method (a few clients,
the tiny model, a handful of samples); tests change what they are about and keep the rest.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from common.methods import ExperimentConfig
from common.methods.gswgan.messages import GsQuery, samples_per_query
from server.strategy import Strategy, build_strategy
from server.transport import InProcessTransport
from simulations.cli import config_flags

ROOT = Path(__file__).resolve().parents[1]

# A fixed noise seed makes runs reproducible but voids every guarantee, so a node refuses it unless
# its own policy allows non-private options: tests that need exact reproducibility pin such a policy
# on their (simulated) nodes, the way a user debugging on public data would.
ALLOW_NONPRIVATE = {"privacy-allow-nonprivate": True}
# Fed-Avg GAN's clients send raw deltas for the server to noise: a node takes part only when its
# policy trusts the server (the shipped policy file ``fedgan simulate --node-policy`` names).
TRUST_SERVER_POLICY = ROOT / "simulations" / "configs" / "policies" / "trust-server.toml"

TINY = dict(
    num_clients=3,
    model="tiny",
    batch_size=8,
    n_critic=1,
    synthetic_samples_per_writer=40,
    dpgan_batch_size=16,
    dpgan_n_d=2,
    fedavg_clients_per_round=2,
    progress=False,
    eval=False,
)


# The tiny run, seeded: a seed release at ε 2 (a few server steps fitting G, a few of the server's
# critic), then GS-WGAN calibrated so that both stages compose to ε 10 per client.
SEEDED_TINY = dict(
    num_clients=4,
    clients_per_step=2,
    steps=3,
    warmup_steps=1,
    target_epsilon=10.0,
    init_release="dp-merf",
    init_epsilon=2.0,
    init_steps=2,
    init_critic_steps=2,
    merf_clip=0.32,
    merf_features=20,
    merf_batch=4,
)


# ``values`` as the command line spells them (booleans as --x / --no-x; None leaves a flag out).
flags = config_flags


def tiny_flags(**changes: object) -> list[str]:
    """The tiny run as flags (in-process), with ``changes``; ``name=None`` drops a flag."""
    return flags(**{"transport": "inprocess", **TINY, **changes})


TINY_FLAGS = tiny_flags()


def secure_plan(cfg: ExperimentConfig):
    """The run's secure-sum plan, as its method describes one release to the secure-sum channel
    (``common/channels/secure_sum.py``)."""
    from common.channels.secure_sum import SecureSumChannel
    from common.methods import method

    return SecureSumChannel().plan(cfg, method(cfg.strategy).release_spec(cfg))


def tiny_cfg(out: Path | str = "", **changes) -> ExperimentConfig:
    """The tiny run, with ``changes``; written to ``out``."""
    return ExperimentConfig(**{**TINY, "out": str(out), **changes})


def gs_query(cfg: ExperimentConfig, step: int = 0) -> GsQuery:
    """A GS-WGAN query of random "fake" samples, shaped as ``cfg``'s server would send it."""
    rng = np.random.default_rng(step)
    n = samples_per_query(cfg.batch_size, cfg.n_critic, cfg.critic_fakes)
    return GsQuery(
        step=step,
        batch_size=cfg.batch_size,
        fake=rng.random((n, 1, 28, 28), dtype=np.float32),
        labels=rng.integers(0, 10, n),
    )


SERVER_NODES = {101: 0, 102: 1, 103: 2}  # node -> client: the federation of the hand-built replies


def make_strategy(strategy: str, **changes: object) -> tuple[ExperimentConfig, Strategy]:
    """A method's server side in the server's shell (``server/strategy.py``), bound to nodes 101..103
    holding clients 0..2: a test hands it replies as a transport would (tiny model, B = 4, n_critic = 2)."""
    base = dict(strategy=strategy, num_clients=3, model="tiny", batch_size=4, n_critic=2, fedavg_clients_per_round=2)
    cfg = ExperimentConfig(**{**base, **changes})
    strategy_ = build_strategy(cfg, 10)
    strategy_.bind_nodes(SERVER_NODES)
    return cfg, strategy_


def federation(cfg: ExperimentConfig, **node_config: object) -> tuple[InProcessTransport, list[int]]:
    """``cfg.num_clients`` real nodes in this process (the ClientApp, called by the in-process
    transport) that took ``cfg``'s hello; they keep their state where FEDGAN_NODE_STATE says."""
    from client.app import app
    from server.session import hello

    transport = InProcessTransport(app, cfg.num_clients, node_config=node_config or None)
    nodes = transport.node_ids(cfg.num_clients)
    hello(cfg, transport, nodes)
    return transport, nodes


def one_step(cfg: ExperimentConfig, transport: InProcessTransport, nodes: list[int], asked: list[int]):
    """The method's first step, its requests sent to the nodes ``asked`` (by client id) through the
    ClientApp; returns (the server's strategy, its step outcome)."""
    strategy = build_strategy(cfg, 10)
    strategy.bind_nodes(dict(zip(nodes, range(len(nodes)), strict=True)))
    outgoing = strategy.configure_step(0, [nodes[c] for c in asked])
    return strategy, strategy.aggregate_step(0, transport.exchange(outgoing).replies)


def cut_short(state: dict) -> dict:
    """A Fed-Avg delta or a DPGAN generator with one entry cut short."""
    name = next(iter(state))
    return {**state, name: state[name].flatten()[:-1]}


def drop_first(state: dict) -> dict:
    """The same state without its first entry."""
    return dict(list(state.items())[1:])


def wait_until(condition: Callable[[], object], *, timeout_s: float, what: str, every_s: float = 0.05) -> object:
    """Poll ``condition`` until it is true (returned) or ``timeout_s`` passes (AssertionError naming
    ``what``): tests wait for what they need, never a fixed time that a loaded machine can outlast."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s:g} s")
        time.sleep(every_s)


# --- disks that fail for real --------------------------------------------------------------------
# Root ignores permission bits, so "read-only" and "full" are made with mounts where that is allowed
# (a read-only bind mount, a small tmpfs); elsewhere read-only falls back to chmod, which a non-root
# process obeys, and a test needing a real full disk is skipped (a patched variant runs everywhere).


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


def _writable(folder: Path) -> bool:
    try:
        (folder / ".probe").write_text("x")
    except OSError:
        return False
    (folder / ".probe").unlink()
    return True


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[str]:
    """``folder`` (which exists) refuses writes for real while inside; yields how ("mount" or "chmod")."""
    if _mount("--bind", str(folder), str(folder)):
        try:
            if not _mount("-o", "remount,bind,ro", str(folder)):
                pytest.skip("cannot remount a bind mount read-only here")
            yield "mount"
        finally:
            subprocess.run(["umount", str(folder)], check=True)
        return
    modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")] if not p.is_symlink()}
    for p in modes:
        p.chmod(modes[p] & ~0o222)
    try:
        if _writable(folder):
            pytest.skip("neither a read-only mount nor chmod stops writes here")
        yield "chmod"
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


@contextlib.contextmanager
def small_disk(folder: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted on ``folder`` (made if missing); skipped where mounts are not allowed."""
    folder.mkdir(parents=True, exist_ok=True)
    if not _mount("-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(folder)):
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def fill_disk(folder: Path, leave_bytes: int) -> Path:
    """A file that takes all but ``leave_bytes`` of the free space of ``folder``'s file system."""
    stats = os.statvfs(folder)
    filler = folder / "filler.bin"
    with open(filler, "wb") as fh:
        fh.truncate(0)
        fh.write(b"\0" * max(0, stats.f_bavail * stats.f_frsize - leave_bytes))
    return filler
