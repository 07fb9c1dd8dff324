"""What a handler knows of the node it runs on: the run (from its hello), its state, its own policy.

Flower recreates the ClientApp for every message, so the run's configuration lives in
``context.state`` (set by the hello) and the state itself on the node's disk (``client/state.py``),
in the directory the node's own configuration names (``node_root``), never one a server chooses.
The node's privacy policy is its own (``common/privacy/policy.py``): node config keys, a policy
file, or the defaults, never what the server sends. Every release is charged to the node's own
ledger (``common/privacy/node_ledger.py``) before its reply leaves, and the node's budget is
checked there: one ledger per node across runs and methods.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
from collections.abc import Iterable, Mapping
from functools import cached_property

import torch
from flwr.app import ConfigRecord, Context

from common.client_state import ClientState
from common.methods import ExperimentConfig, Method, method, run_terms
from common.privacy import NodePolicy, PolicyError, PrivacyEvent, PrivacyLedger, load_policy
from common.privacy.node_ledger import (
    NODE_STATE_ENV,
    ROLLED_BACK,
    NodeBook,
    NodeLedgerError,
    charge_node,
    node_ledger_path,
    read_node_book,
)
from common.privacy.policy import POLICY_ENV, POLICY_FILE_KEY

from .secure_deposit import deposit_input, node_identity
from .state import load_ledger, load_own_ledger, load_state, save_state

STATE_KEY = "fedgan"


@functools.lru_cache(maxsize=8)
def run_config(text: str) -> ExperimentConfig:
    """The run's configuration from the JSON text its hello left in ``context.state``.

    Parsed and validated once per text, not once per message: every node of a run holds the same
    text (one shared string, ``shared_text``), and a simulation of K nodes in one process otherwise
    validated the same configuration K times at the hello and again at every message. The
    configuration is frozen, so sharing it is safe."""
    return ExperimentConfig.from_mapping(json.loads(text))


def shared_text(text: str) -> str:
    """One string object for equal texts (interned; freed once no node holds it): K simulated
    nodes in one process keep one copy of the run's configuration, not K (2.5 kB each)."""
    return sys.intern(text)


def node_root(context: Context) -> str:
    """Where this node keeps its state and its own ledger: its node config's ``state-dir``, else
    ``FEDGAN_NODE_STATE`` (how a simulation's operator places its simulated nodes), else "" (the
    node has no place of its own and takes part in no run)."""
    return str(context.node_config.get("state-dir") or os.environ.get(NODE_STATE_ENV, ""))


def client_id_of(context: Context) -> int:
    """The partition this node holds (``partition-id`` in the node config, as Flower sets it)."""
    return int(context.node_config.get("partition-id", context.node_id))


def node_policy(context: Context) -> tuple[NodePolicy, str]:
    """(this node's privacy policy, "") or (the defaults, why the policy could not be used): a
    node whose policy is broken refuses everything rather than fall back to looser defaults."""
    key = tuple(sorted(context.node_config.items()))  # scalars: hashable, types kept
    env = os.environ.get(POLICY_ENV, "")
    return _cached_policy(key, env, _mtime(env), _mtime(str(context.node_config.get(POLICY_FILE_KEY, ""))))


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime if path else 0.0
    except OSError:
        return -1.0


@functools.lru_cache(maxsize=64)
def _cached_policy(node_config: tuple, env: str, _env_mtime: float, _file_mtime: float) -> tuple[NodePolicy, str]:
    try:
        return load_policy(dict(node_config), {POLICY_ENV: env} if env else {}), ""
    except PolicyError as err:
        return NodePolicy(), str(err)


def policy_refusal(context: Context, cfg: ExperimentConfig) -> str:
    """Why this node refuses the run (""), per its own policy and, through secure sums, its identity."""
    policy, problem = node_policy(context)
    reasons = [problem] if problem else policy.violations(cfg, run_terms(cfg))
    if not problem and run_terms(cfg).secagg_cohort:
        reasons += identity_problems(context, policy)
    return "; ".join(reasons) + f" [{policy.source}]" if reasons else ""


def identity_problems(context: Context, policy: NodePolicy) -> list[str]:
    """Why a node will not release through this run's secure sums for want of an identity: files that
    cannot be used, or ``trust-secure-sum`` without any (audit 4, item 3: a node that cannot verify
    its peers joined a "cohort of 10" whose only peer was the server's key, and was charged the
    protocol's figure while the server recovered its deposit)."""
    identity, broken = node_identity(dict(context.node_config), node_root(context), client_id_of(context))
    if broken:
        return [f"its secure-aggregation identity cannot be used: {broken}"]
    if identity is None and policy.trust_secure_sum:
        return [
            "trust-secure-sum = true, but this node cannot verify its peers (no identity key and published keys: "
            "secagg-identity, secagg-peers): a server could fill a sum with keys of its own, so the protocol's "
            "figure would not hold for it; provision them, or count the node's own share (trust-secure-sum = false)"
        ]
    return []


def own_ledger(cfg: ExperimentConfig, client_id: int, state_dir: str, version: int) -> PrivacyLedger:
    """Everything this node released in ``state_dir``: the method's own record where it keeps one
    (DPGAN's curator), else the client's ledger (GS-WGAN answers, the selection query, raw deltas)."""
    kept = method(cfg.strategy).node_ledger(cfg, client_id, state_dir)
    return kept if kept is not None else load_ledger(cfg, client_id, state_dir, version)


def client_threads() -> int:
    """Threads a client computes with: FEDGAN_CLIENT_THREADS, else the standard OMP_NUM_THREADS, else
    every core. With the in-process transport the clients share the server's process, so two runs
    side by side each need a smaller number (one each on two cores)."""
    for name in ("FEDGAN_CLIENT_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) >= 1:
            return int(value)
    return os.cpu_count() or 1


def use_client_threads() -> None:
    torch.set_num_threads(client_threads())


class Node:
    """The node as one message's handler sees it, once the run's hello has been accepted: the
    ``ClientNode`` a method's client side answers on (``common/methods/protocol.py``)."""

    def __init__(self, context: Context) -> None:
        if STATE_KEY not in context.state:
            raise RuntimeError(
                "this node received a query before the run's hello message; the server "
                "sends the run configuration in a query.hello to every node first"
            )
        self.context = context
        self.record: ConfigRecord = context.state.config_records[STATE_KEY]

    @cached_property
    def cfg(self) -> ExperimentConfig:
        return run_config(str(self.record["config"]))

    @property
    def method(self) -> Method:
        return method(self.cfg.strategy)

    @property
    def client_id(self) -> int:
        return client_id_of(self.context)

    @property
    def state_dir(self) -> str:
        return str(self.record["state_dir"])

    @cached_property
    def book(self) -> NodeBook:
        """This client's node-level record of every release: NodeLedgerError when unreadable, behind
        its counter (``read_node_book``), or behind the client state on the same disk, which is
        written after every charge and so never holds more releases than an intact node ledger."""
        book = read_node_book(self.state_dir, self.client_id)
        try:
            held = load_ledger(self.cfg, self.client_id, self.state_dir, int(self.record["version"])).queries
        except Exception:  # noqa: BLE001 - an unreadable state fails its own load, with its own message
            return book
        if held > book.releases:
            path = node_ledger_path(self.state_dir, self.client_id)
            raise NodeLedgerError(
                f"node ledger {path} holds {book.releases} releases, the client state beside it {held}" + ROLLED_BACK
            )
        return book

    @property
    def policy(self) -> NodePolicy:
        """The node's policy, its budget checked on the node's own ledger."""
        return dataclasses.replace(node_policy(self.context)[0], node_ledger=self.book.ledger)

    def refusal(self) -> str:
        """Why the node refuses this run's releases ("" when it allows them): its policy, or a node
        ledger it cannot read (then it releases nothing)."""
        try:
            self.book  # noqa: B018 - read now: an unreadable node ledger refuses every release
        except NodeLedgerError as err:
            return str(err)
        return policy_refusal(self.context, self.cfg)

    def releases_by(self, method_name: str) -> int:
        """How many releases the node's ledger records for ``method_name`` (in any run)."""
        return self.book.by_method.get(method_name, 0)

    def charge(self, charges: Mapping[int, Iterable[PrivacyEvent]]) -> None:
        """Charge releases to the node ledgers of the clients named (client id -> events), before the
        reply that carries them leaves the node."""
        charge_node(self.state_dir, dict(charges), method=self.cfg.strategy)
        self.__dict__.pop("book", None)  # read again when next asked

    def deposit_secure_input(self, session: str, vector: object, *, floor: int, bound: int) -> None:
        """Leave this node's integer vector for the secure sum ``session`` (masked in its third round,
        never sent in the clear), bound to the floor and range its noise share was calibrated for."""

        deposit_input(self.context, session, vector, floor=floor, bound=bound)

    def record_release(self, state: ClientState, before: PrivacyLedger) -> None:
        """The release just made on ``state`` (its ledger's events since ``before``) charged to the
        node's ledger, then the state written: a crash in between over-counts, never under-counts."""
        self.charge({self.client_id: state.ledger.since(before)})
        self.persist(state)

    def load_state(self) -> ClientState:
        """This node's client state at the version ``context.state`` says it is at (with a private D
        when the run's method keeps one)."""
        version, critic_lr = int(self.record["version"]), self.method.client_critic_lr(self.cfg)
        return load_state(self.cfg, self.client_id, self.state_dir, version, critic_lr=critic_lr)

    def persist(self, state: ClientState) -> None:
        """Write the state to the node's disk and remember its version in ``context.state``."""
        save_state(state, self.state_dir)
        self.record["version"] = state.version

    def ledger(self) -> PrivacyLedger:
        return own_ledger(self.cfg, self.client_id, self.state_dir, int(self.record["version"]))

    def share_ledger(self) -> PrivacyLedger:
        """Its secure releases against a server that deviates (own noise shares), every run on this state."""
        return load_own_ledger(self.cfg, self.client_id, self.state_dir, int(self.record["version"]))
