"""What every method shares: the defaults of the contract's optional members (``MethodBase``) and
the server side's ledger keeping (``ServerBase``).

``ServerBase`` holds the node -> client map, the server's record of each client beside the clients'
own ledgers (``common/privacy/records.py``; reports keep the larger), the triage of a step's
replies (lost, malformed, refused, or the method's to accept), the end-of-run ledger fetch, and the
skeleton of the privacy report. A method's server side fills in what is its own: what to accept,
how to update, and the parts of its report (its headline's kind and rule, the figure beside it,
its mechanism, its statement).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from common.channels import channel_for
from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.records import ClientRecords, LedgerClaim
from common.privacy.statement import client_entry, max_epsilon, not_private_reasons

from .protocol import ClientNode, PriorReleases, Reply, StepOutcome, SumRequest, SumResult

if TYPE_CHECKING:
    from common.channels import ReleaseSpec
    from common.channels.secure_server import SecureSums
    from common.client_state import ClientState
    from common.methods import ExperimentConfig
    from common.privacy import NodePolicy


def or_error(fn: Callable[..., Any], *args: object) -> Any:
    """``fn(*args)``, or the error it raised: one node's failure, returned in its place."""
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - this node fails, the others go on
        return err


class MethodBase:
    """The defaults of ``Method``'s optional members (see its docstring); a method's class derives
    from it and overrides what it needs."""

    accepts_prior_releases = False
    accepts_seed = False  # starts from a seed release (``seeding``: its server side uses ``prior.start``)
    pools_data = False  # one curator pools every partition: a seed is made there (``seeding/pooled.py``)
    seeds = False  # its one-shot release can seed a GAN (``--init-release``: a generator is fitted to it)
    target_unit = "per client"  # the unit of the headline ε that ``--target-epsilon`` calibrates
    unbounded_against_server = False
    supports_dpac = False

    channel_needs: frozenset[str] = frozenset()  # what a release channel may ask of it (``common/channels``)

    def check_run(self, cfg: ExperimentConfig) -> None:
        """Checks that apply only when this method is the run's (``validate`` runs for every method's
        section whatever the run): default, none."""

    def release_spec(self, cfg: ExperimentConfig, *, noise_multiplier: float | None = None) -> ReleaseSpec | None:
        """One release as the run's channel sees it, at the run's noise (or ``noise_multiplier``, for
        the calibration): default None, its releases take no channel."""
        return None

    def release_noise(self, cfg: ExperimentConfig) -> float:
        """The noise multiplier of each release in the clear: by default what its release spec says
        (``run_terms`` asks the run's channel instead); a method with no spec says its own."""
        spec = self.release_spec(cfg)
        if spec is None:
            raise NotImplementedError(f"{getattr(self, 'name', 'this method')} describes no release: say its noise")
        return spec.clear_event.noise_multiplier

    def min_client_images(self, cfg: ExperimentConfig) -> int:
        return cfg.batch_size

    def client_critic_lr(self, cfg: ExperimentConfig) -> float | None:
        return None

    def generator_updates(self, cfg: ExperimentConfig, steps: int) -> int:
        return steps

    def check_sizes(self, cfg: ExperimentConfig, sizes: list[int]) -> None:
        return None

    def schedule_notes(self, cfg: ExperimentConfig) -> list[str]:
        """What the user should know about the calibrated run's schedule before it starts (budget
        its plan leaves unspent); printed, never enforced: default none."""
        return []

    def node_ledger(self, cfg: ExperimentConfig, client_id: int, state_dir: str) -> PrivacyLedger | None:
        return None

    def answer_many(self, nodes: list[ClientNode], requests: list[Any]) -> list[Any]:
        """Each node's reply, or the error that made that node fail (it alone)."""
        return [or_error(self.answer, node, request) for node, request in zip(nodes, requests, strict=True)]

    def answer(self, node: ClientNode, request: Any) -> Any:
        raise NotImplementedError

    auditable = False  # ``canary_score`` runs its release path (``fedgan audit``)

    def canary_score(
        self, state: ClientState, cfg: ExperimentConfig, sign: int, magnitude: float, releases: int, policy: NodePolicy
    ) -> float:
        raise NotImplementedError(f"{getattr(self, 'name', 'this method')} has no white-box audit")


NOT_APPLICABLE = {"epsilon": None, "epsilon_reason": "not applicable", "kind": ""}


class ServerBase:
    """The ledger-keeping part of every method's server side (see the module docstring)."""

    reply_noun = "reply"  # what the notes call one of its replies ("a malformed delta")
    progress_metrics: dict[str, str] = {}  # label -> step metric shown beside ε on the progress bar
    epsilon_kind = ""  # what its headline ε protects, against whom (``common/privacy/statement.py``)
    accounting = ""  # the rule its headline ε is composed by

    def __init__(self, cfg: ExperimentConfig, prior: PriorReleases | None = None) -> None:
        self.cfg = cfg
        self.prior = prior or PriorReleases()
        self.records = ClientRecords(cfg.delta, self.prior.clients)
        self._live: tuple[ClientRecords, int, dict[int, PrivacyLedger], list[dict[str, Any]]] | None = None
        self.node_client: dict[int, int] = {}
        self.channel = channel_for(cfg)
        self.summing: SecureSums | None = None  # a summing channel's records of this run (``use_channel``)

    def use_channel(self, spec: ReleaseSpec) -> None:
        """This run's releases go through the run's channel (``common/channels``), as ``spec``
        describes one: a release is charged as the channel's event (``planned``, whose noise over the
        method's own is ``noise_scale``), the headline's kind
        and rule are the channel's (the method's own, for the local one), and a summing channel keeps
        its records of the run (``summing``: the sessions, the sums, and the figure beside the
        headline, against a server that deviates)."""
        cfg = self.cfg
        self.spec = spec
        self.planned = self.channel.events(cfg, spec)[0]
        # the channel's noise over the method's own (1: local), for bounds on what an honest release shows
        clear = spec.clear_event.noise_multiplier
        self.noise_scale = self.planned.noise_multiplier / clear if clear > 0 else 1.0
        self.epsilon_kind = self.channel.kind(cfg, self.epsilon_kind)
        self.accounting = self.channel.rule(cfg, spec, self.accounting)
        self.summing = self.channel.server(cfg, spec, self.client_of)

    def secure_sums(self, step: int) -> list[SumRequest]:
        """The sums the run's channel asks the shells to run after this step's replies: one per
        session that got deposits (none in the clear)."""
        return self.summing.requests() if self.summing else []

    def bind_nodes(self, node_client: dict[int, int]) -> None:
        """Learn which client (partition) each node holds, from the run's hello exchange."""
        self.node_client = dict(node_client)

    def client_of(self, node: int) -> int:
        return self.node_client.get(node, -1)

    def charge(self, node: int, event: PrivacyEvent) -> None:
        """Charge the server's record of the client ``node`` holds."""
        self.records.charge(self.client_of(node), event)

    # --- sums (a method whose releases a channel sums overrides this) ---------------------------
    def absorb_sums(self, step: int, results: list[SumResult], outcome: StepOutcome) -> None:
        """What the sums revealed, into the step's outcome."""

    def sample_within_budget(self, sampler: Any, available: list[int], m: int, event: PrivacyEvent) -> list[int]:
        """m nodes whose client one more ``event`` keeps within the run's budget, by the server's own
        record of it (the larger of what it charged and what the client reported; the client still
        checks its own ledgers), drawn least-used first: uniformly (``sampler.choose``) among the
        eligible nodes whose clients released the fewest times, then among the next fewest.

        For secure sums, where a refusal is not free (the others have deposited, and been charged,
        for a sum that may fall below t) and no amplification by sampling is claimed, so which m
        the server picks costs no client privacy. Least-used first because the calibration gives
        each client the budget of ceil(T·m/K) releases: uniform draws over the eligible left some
        clients spent and others short, so the last steps found fewer than m with budget and the
        run stopped early with budget unspent (K 6, m 3, 12 steps: 10 or 11 steps; 399 of 400 at
        the frontier's settings). A draw over budget is set aside and another drawn from the rest.
        The levels cost one record lookup per available node a step (O(K), where the uniform draw
        touched about m), small beside a secure step's key agreement and masking."""
        budget, delta = self.cfg.client_epsilon_budget, self.cfg.delta

        def eligible(node: int) -> bool:
            ledger = self.records.ledger_of(self.client_of(node))
            return budget <= 0 or not ledger.would_exceed(budget=budget, delta=delta, next_event=event)

        levels: dict[int, list[int]] = {}
        for node in available:
            levels.setdefault(self.records.releases(self.client_of(node)), []).append(node)
        chosen: list[int] = []
        for count in sorted(levels):
            pool = set(levels[count])
            while pool and len(chosen) < m:
                for node in sampler.choose(sorted(pool), m - len(chosen)):
                    pool.discard(node)
                    if eligible(node):
                        chosen.append(node)
        return chosen

    # --- a step's replies ----------------------------------------------------------------------
    def aggregate(self, step: int, replies: list[Reply]) -> StepOutcome:
        """Sort the replies: lost or malformed ones fail their node, refusals exhaust it, the rest go
        to ``accept``; then ``update`` with what was accepted."""
        outcome = StepOutcome(took_step=False)
        accepted = []
        for reply in replies:
            if reply.payload is None:
                if self.summing:
                    self._lost_deposit(reply)
                else:
                    self.on_lost(reply)
                outcome.failed_nodes.append(reply.node)
                outcome.notes.append(self._lost_note(reply))
            elif reply.payload.refused:
                self.on_refused(reply)
                outcome.exhausted_nodes.append(reply.node)
                outcome.notes.append(str(reply.payload.reason))
            elif self.summing:  # a deposit on the node: charged as the plan fixes, whatever the node says
                self.charge(reply.node, self.planned)
                self.summing.deposited(reply.node, self.client_of(reply.node))
                accepted.append(reply.node)
            else:
                kept = self.accept(step, reply, outcome)
                if kept is not None:
                    accepted.append(kept)
        self.update(step, accepted, replies, outcome)
        return outcome

    def _lost_deposit(self, reply: Reply) -> None:
        """A lost reply through secure sums: the node may have deposited, and charged itself, anyway."""
        self.charge(reply.node, self.planned)
        self.summing.charge_own(self.client_of(reply.node))

    def _lost_note(self, reply: Reply) -> str:
        who = f"node {reply.node} (client {reply.client})"
        if reply.lost:
            return f"{who} failed: {reply.problem}"
        return f"{who} sent a malformed {self.reply_noun}, ignored: {reply.problem}"

    def reject(self, reply: Reply, outcome: StepOutcome, why: str) -> None:
        """A decoded reply that no honest node sends: its node fails, the note says why."""
        outcome.failed_nodes.append(reply.node)
        outcome.notes.append(
            f"node {reply.node} (client {reply.client}) sent a {self.reply_noun} no honest client sends, ignored: {why}"
        )

    def on_lost(self, reply: Reply) -> None:
        """A lost or malformed reply (default: what was charged when the request was sent stands)."""

    def on_refused(self, reply: Reply) -> None:
        """An explicit refusal, which released nothing (default: nothing to withdraw)."""

    def accept(self, step: int, reply: Reply, outcome: StepOutcome) -> Any:
        """What this reply contributes to the step, or None (its node marked in ``outcome``)."""
        raise NotImplementedError

    def update(self, step: int, accepted: list[Any], replies: list[Reply], outcome: StepOutcome) -> None:
        """The server's update from the accepted contributions; sets ``outcome.took_step``."""
        raise NotImplementedError

    # --- the clients' own ledgers --------------------------------------------------------------
    def ledger_nodes(self, nodes: list[int]) -> list[int]:
        """The nodes asked for their own ledgers at the end of a run (default: all of them)."""
        return list(nodes)

    def absorb_ledgers(self, claims: list[LedgerClaim], *, final: bool = True) -> list[str]:
        """Take the ledgers the nodes sent (at the hello: ``final`` False; at the end of the run);
        returns notes for the run. Through secure sums, a ledger reply also carries the client's
        record of its own noise shares (every run on its state): the deviating server's figure keeps
        the larger of it and the server's own record of this run (audit 4, item 6)."""
        notes = self.records.absorb(self.node_client, claims, final=final)
        if self.summing:
            shares = [claim.shares() for claim in claims if claim.own_text is not None]
            self.summing.own.absorb(self.node_client, shares, final=False)
        return notes

    # --- the report ------------------------------------------------------------------------------
    def privacy_report(self, *, final: bool = False) -> dict[str, Any]:
        """Per-client and global privacy figures for metrics, summary.json and privacy.json: every
        ε from a ledger (``common/privacy/statement.py``), the statement only when ``final``."""
        ledgers, clients = self._per_client(final)
        report = {
            "clients": clients,
            "epsilon_max": max_epsilon(clients),
            "epsilon_kind": self.epsilon_kind,
            "accounting": self.accounting,
            "epsilon_amplified": self.summing.beside(ledgers, final=final, prior=self.prior.beside)
            if self.summing
            else self.beside(final=final),
            "not_private": not_private_reasons(self._voiding(ledgers)),
            "mechanism": {**self.mechanism(), **(self.summing.mechanism() if self.summing else {})},
            "parameters": {**self.parameters(), **(self.summing.section() if self.summing else {})},
        }
        if final:
            # Releases before the run (a seed stage, the debugging task's selection) are named here,
            # once for every method: the statement names every mechanism its ε composes.
            report["statement"] = " ".join(filter(None, [self.statement(ledgers), self.prior.description]))
            report["stages"] = self.stage_shares(ledgers, clients)
        return report

    def stage_shares(self, ledgers: dict[int, PrivacyLedger], clients: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A seeded run's figures per stage (none for another): the seed's, as its own run reported
        it; this run's releases alone (each client's ledger after its seed release; a ledger that
        does not extend the seed's counts whole, which can only overstate); and the total, the
        headline, which composes both."""
        seed = self.prior.stages
        if not seed:
            return []
        alone = []
        for cid, ledger in ledgers.items():
            before = self.prior.clients.get(cid)
            rest = PrivacyLedger(ledger.since(before)) if before is not None and ledger.extends(before) else ledger
            alone.append(rest.epsilon(delta=self.cfg.delta) if rest.queries else 0.0)
        refinement = {
            "stage": "refinement",
            "method": self.cfg.strategy,
            "epsilon_max": max(alone, default=0.0),
            "accounting": f"{self.accounting}; its releases alone",
            "releases": sum(led.queries for led in ledgers.values())
            - sum(led.queries for led in self.prior.clients.values()),
        }
        total = {
            "stage": "total",
            "method": f"{seed['method']} then {self.cfg.strategy}",
            "epsilon_max": max_epsilon(clients),
            "accounting": "both stages composed in each client's one ledger (RDP, the headline)",
            "releases": sum(led.queries for led in ledgers.values()),
        }
        return [seed, refinement, total]

    def _per_client(self, final: bool) -> tuple[dict[int, PrivacyLedger], list[dict[str, Any]]]:
        """The headline's ledgers and each client's entry. A live report reuses them while no record
        changed: once DP-MERF's collection is in, all K clients hold a release and computing their
        entries again for every metrics line took 1 s at K = 10^5."""
        cached = self._live
        if not final and cached is not None and cached[0] is self.records and cached[1] == self.records.version:
            return cached[2], cached[3]
        cfg = self.cfg
        ledgers = self.headline_ledgers(final=final)
        clients = [
            client_entry(cid, ledger, delta=cfg.delta, accountant=cfg.accountant, final=final)
            for cid, ledger in ledgers.items()
        ]
        if not final:
            self._live = (self.records, self.records.version, ledgers, clients)
        return ledgers, clients

    def _voiding(self, ledgers: dict[int, PrivacyLedger]) -> list[PrivacyLedger]:
        """Through secure sums the headline's own ledgers decide NOT PRIVATE (no server-side figure)."""
        return list(ledgers.values()) if self.summing else self.voiding_ledgers(ledgers)

    def headline_ledgers(self, *, final: bool = True) -> dict[int, PrivacyLedger]:
        """The ledger behind each client's headline ε (default: the larger record). The final report
        lists every client of the federation; a live one (each metrics line) only the clients with a
        record, which is all its figures read: listing all K there cost O(K) per line (0.5 s at
        K = 10^5, with a few hundred clients ever queried)."""
        return self.records.ledgers(range(self.cfg.num_clients) if final else self.records.clients())

    def voiding_ledgers(self, ledgers: dict[int, PrivacyLedger]) -> list[PrivacyLedger]:
        """The ledgers whose void releases make the headline NOT PRIVATE (default: the headline's)."""
        return list(ledgers.values())

    def beside(self, *, final: bool) -> dict[str, Any]:
        """The figure beside the headline (``epsilon_amplified``): default, none."""
        return {**NOT_APPLICABLE, "assumption": "not applicable"}

    def mechanism(self) -> dict[str, float]:
        """The noise and sampling parameters, as the report's table shows them."""
        raise NotImplementedError

    def parameters(self) -> dict[str, Any]:
        """The method's own figures for summary.json and privacy.json (under its name)."""
        raise NotImplementedError

    def statement(self, ledgers: dict[int, PrivacyLedger]) -> str:
        """The plain-language privacy statement of privacy.json."""
        raise NotImplementedError
