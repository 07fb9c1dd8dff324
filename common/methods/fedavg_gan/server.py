"""Fed-Avg GAN's server side, wire-free.

Per round: sample every available client independently with probability q = m/K (secret, Poisson),
send G and D to those sampled; each returns its D delta after a few local WGAN-GP SGD steps; the
server clips each delta to S, sums, adds N(0, (zS)^2), divides by the fixed m = qK, applies it
(``dp_fedavg.py``), then takes a few generator steps against the new D (post-processing).

Privacy records (ledgers): the server's ledger holds one Poisson-subsampled Gaussian event (z, q)
per round that released a noised D: the user-level figure with a trusted server. The server sees
raw deltas, so each client's own ledger (and the server's record of it, charged when D is sent)
holds a void event per delta: its ε against an untrusted server is unbounded, null with the reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from common.device import resolve_device
from common.learning.models import GeneratorEMA, build_discriminator, build_generator, device_of, on_cpu, sample_latent
from common.learning.public_warmup import warm_gan_on_public
from common.privacy import PrivacyEvent, PrivacyLedger, Sampler, noise_generator
from common.privacy.events import VOID_NOISE_SEED
from common.privacy.statement import KIND_PER_CLIENT, KIND_USER, server_entry

from ..base import ServerBase
from ..protocol import PriorReleases, Reply, StepOutcome, SumResult
from ..seeding import SeedAnchor, start_generator
from . import release
from .dp_fedavg import aggregate_deltas, apply_delta, flatten_delta, refresh_power_iteration, weights_only
from .messages import FedAvgRound
from .privacy import RAW_DELTA, RULE_FEDAVG_UNTRUSTED, RULE_FEDAVG_USER, statement

if TYPE_CHECKING:
    from common.methods import ExperimentConfig


class FedAvgServer(ServerBase):
    reply_noun = "delta"
    epsilon_kind = KIND_PER_CLIENT
    accounting = RULE_FEDAVG_UNTRUSTED

    def __init__(self, cfg: ExperimentConfig, num_classes: int, prior: PriorReleases | None = None) -> None:
        super().__init__(cfg, prior)
        torch.manual_seed(cfg.seed)
        self.num_classes = num_classes
        device = resolve_device(cfg.device)
        self.generator = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes).to(device)
        self.discriminator = build_discriminator(cfg.model, num_classes=num_classes).to(device)
        self.ema = GeneratorEMA(self.generator, decay=cfg.ema_decay)
        self.g_optimizer = generator_optimizer(self.generator, cfg)
        self.rng = torch.Generator().manual_seed(cfg.seed)  # public: latents, labels, clients' data order
        self.sampler = Sampler(None if cfg.sampling_seed < 0 else cfg.sampling_seed)
        self.population = len(cfg.participants())
        self.sample_rate = min(1.0, cfg.fedavg_clients_per_round / self.population)
        self.server_ledger = PrivacyLedger(self.prior.server)
        self.rounds_done = 0
        self.use_channel(release.release_spec(cfg))
        self.public_warmed = not cfg.public_warmup_steps
        self.anchor: SeedAnchor | None = None
        if self.prior.start is not None:
            self._start_from(self.prior.start, device)

    def _start_from(self, start: Any, device: torch.device) -> None:
        """A seeded run (``common/methods/seeding``): G starts as the generator fitted to the seed
        release (the EMA restarted from it), the first global D as the server's critic trained on its
        samples, and with ``init_weight`` > 0 every generator step also fits the seed release.
        Post-processing of stage 1: no privacy cost."""
        self.ema, self.anchor = start_generator(self.cfg, start, self.generator, device)
        if start.critic is not None:
            self.discriminator.load_state_dict(start.critic)

    def _public_warm_start(self) -> None:
        """dpGAN's warm start on the public data: the server's G and the first global D (the clients'
        WGAN-GP loss), before the first round; the EMA restarts from the warmed G."""
        cfg = self.cfg  # the learning rates and n_critic of GS-WGAN's section, as before Fed-Avg had its own
        self.ema = warm_gan_on_public(
            self.generator,
            self.discriminator,
            cfg,
            num_classes=self.num_classes,
            rng=self.rng,
            lr_g=cfg.lr_g,
            lr_d=cfg.lr_d,
            n_critic=cfg.n_critic,
        )
        self.public_warmed = True

    def _noise(self) -> torch.Generator:
        seed = None if self.cfg.noise_seed < 0 else self.cfg.noise_seed * 7_919 + self.rounds_done
        return noise_generator(seed)

    def _void(self) -> str:
        """Why this run's user-level figure is not private ("" when the sampling and noise are secret)."""
        return self.sampler.void_reason or (VOID_NOISE_SEED if self.cfg.noise_seed >= 0 else "")

    # --- a round ---------------------------------------------------------------------------------
    def select_nodes(self, available: list[int]) -> list[int]:
        """Every available node independently with probability q = m/K (possibly none); through
        secure sums, m of them within budget, least-used first (no amplification is claimed: the draw
        only has to give the sum its t inputs; ``sample_within_budget``), or none when fewer than t remain."""
        if self.summing:
            chosen = self.sample_within_budget(self.sampler, available, self.cfg.fedavg_clients_per_round, self.planned)
            return chosen if len(chosen) >= self.summing.fewest_to_ask else []  # else the run ends here
        return [available[i] for i in self.sampler.poisson(len(available), self.sample_rate).tolist()]

    def requests(self, step: int, nodes: list[int]) -> list[tuple[int, FedAvgRound]]:
        """G and D to every sampled node, each charged a raw delta when it is sent."""
        if not self.public_warmed:
            self._public_warm_start()
        out = []
        g_state, d_state = (on_cpu(m.state_dict()) for m in (self.generator, self.discriminator))
        session = self.summing.open(step, nodes, "fa") if self.summing and nodes else ""
        for node in nodes:
            seed = int(torch.randint(2**31, (1,), generator=self.rng))
            request = FedAvgRound(step=step, seed=seed, generator=g_state, discriminator=d_state, session=session)
            out.append((node, request))
            if not self.summing:
                self.charge(node, RAW_DELTA)
        return out

    def _template(self) -> dict[str, torch.Tensor]:
        """What a delta covers: D's floating-point state, or its weights only (``fedavg_delta``)."""
        state = self.discriminator.state_dict()
        template = flatten_delta(state, state)
        return weights_only(template, self.discriminator) if self.cfg.fedavg_delta == "weights" else template

    def expectations(self, step: int) -> dict[str, Any]:
        """A delta must fit D: the shapes of the entries it covers."""
        shapes = {name: tuple(t.shape) for name, t in self._template().items()}
        return {"step": step, "shapes": shapes, "secure": self.summing is not None}

    def accept(self, step: int, reply: Reply, outcome: StepOutcome) -> dict[str, torch.Tensor]:
        return reply.payload.delta

    def update(self, step: int, accepted: list[Any], replies: list[Reply], outcome: StepOutcome) -> None:
        """Clip, sum, noise, divide by m, apply; then the generator steps. Every round releases a
        noised D, also one whose sampled clients all failed or that sampled nobody: a lost or
        malformed delta contributes nothing, as a client that was not sampled (the sum's
        sensitivity is S per client whatever the others sent), and its sender stays charged.
        Through secure sums the deltas wait on the nodes: the round's sum follows (``absorb_sums``)."""
        if self.summing:
            return
        try:
            update, info = aggregate_deltas(
                accepted,
                template=self._template(),
                clip_norm=self.cfg.fedavg_clip,
                noise_multiplier=self.cfg.fedavg_noise_multiplier,
                num_sampled=self.cfg.fedavg_clients_per_round,
                generator=self._noise(),
            )
        except ValueError as err:  # cannot happen after decoding; if it does: no release, nothing to account
            outcome.notes.append(f"round {step} dropped: {err}")
            return
        self.server_ledger.record(info.privacy_event(num_clients=self.population, void=self._void()))
        self._finish_round(update, len(replies), outcome)

    def absorb_sums(self, step: int, results: list[SumResult], outcome: StepOutcome) -> None:
        """The revealed sum of the round's clipped, noised deltas, divided by the fixed m, applied;
        then the generator steps. A round whose sum revealed nothing changes nothing."""
        total, count = self.summing.total(results, outcome)
        if total is None:
            outcome.notes.append(f"round {step}: no secure sum was revealed; D and G unchanged")
            if results:
                self.summing.gave_up(step, outcome)
            return
        update = release.unflatten(torch.from_numpy(total / self.cfg.fedavg_clients_per_round), self.cfg)
        self._finish_round(update, count, outcome)

    def _finish_round(self, update: dict[str, torch.Tensor], sampled: int, outcome: StepOutcome) -> None:
        self._apply(update)
        outcome.metrics = {f"train/{k}": float(v) for k, v in self._generator_steps().items()}
        outcome.metrics["train/clients_sampled"] = float(sampled)
        self.ema.update(self.generator)
        self.rounds_done += 1
        outcome.took_step = True

    def _apply(self, update: dict[str, torch.Tensor]) -> None:
        """Add the averaged delta to D; a weights-only delta leaves D's power-iteration vectors to
        the server, which advances them on the new weights (post-processing)."""
        if self.cfg.fedavg_delta == "weights":
            D = self.discriminator
            with torch.no_grad():
                for name, param in D.named_parameters():
                    param.add_(update[name].to(device=param.device, dtype=param.dtype))
            refresh_power_iteration(D, iterations=self.cfg.fedavg_power_iterations)
        else:
            apply_delta(self.discriminator, update)

    def _generator_steps(self) -> dict[str, float]:
        return server_generator_steps(
            self.generator,
            self.discriminator,
            steps=self.cfg.server_g_steps,
            optimizer=self.g_optimizer,
            batch_size=self.cfg.batch_size,
            z_dim=self.cfg.z_dim,
            num_classes=self.num_classes,
            generator=self.rng,
            anchor=self.anchor,
        )

    def released_generator(self) -> nn.Module:
        return self.ema.module

    # --- the report ------------------------------------------------------------------------------
    def voiding_ledgers(self, ledgers: dict[int, PrivacyLedger]) -> list[PrivacyLedger]:
        """The clients' void raw deltas are the method, not a debugging option: only the server's
        record says whether the trusted-server figure is NOT PRIVATE."""
        return [self.server_ledger]

    def beside(self, *, final: bool) -> dict[str, Any]:
        """The user-level ε with a trusted server, from the server's own ledger."""
        cfg = self.cfg
        return server_entry(
            self.server_ledger,
            delta=cfg.delta,
            accountant=cfg.accountant,
            kind=KIND_USER,
            rule=RULE_FEDAVG_USER,
            final=final,
        )

    def mechanism(self) -> dict[str, float]:
        cfg = self.cfg
        return {
            "S": cfg.fedavg_clip,
            "z": cfg.fedavg_noise_multiplier,
            "expected m per round": cfg.fedavg_clients_per_round,
            "q": self.sample_rate,
        }

    def parameters(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "clients_per_round": cfg.fedavg_clients_per_round,
            "sample_rate": self.sample_rate,
            "clip": cfg.fedavg_clip,
            "noise_multiplier": cfg.fedavg_noise_multiplier,
            "local_steps": cfg.local_steps,
            "server_g_steps": cfg.server_g_steps,
            "delta": cfg.fedavg_delta,
            "client_optimizer": cfg.fedavg_client_optimizer,
            "g_optimizer": cfg.fedavg_g_optimizer,
        }

    def statement(self, ledgers: dict[int, PrivacyLedger]) -> str:
        return statement(self.cfg, ledgers, self.server_ledger, self.spec)

    # --- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.state_dict(),
            "discriminator": self.discriminator.state_dict(),
            "ema": self.ema.state_dict(),
            "rng": self.rng.get_state(),
            "rounds_done": self.rounds_done,
            "server_ledger": self.server_ledger.state_dict(),
            "records": self.records.state_dict(),
            "sampler": self.sampler.state_dict(),
            "public_warmed": self.public_warmed,
            "g_optimizer": self.g_optimizer.state_dict(),
            **({"anchor": self.anchor.state_dict()} if self.anchor is not None else {}),
            **({"secure_sums": self.summing.state_dict()} if self.summing else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.load_state_dict(state["generator"])
        self.discriminator.load_state_dict(state["discriminator"])
        self.ema.load_state_dict(state["ema"])
        self.rng.set_state(state["rng"])
        self.rounds_done = int(state["rounds_done"])
        self.records.load_state_dict(state.get("records", {}))
        self.sampler.load_state_dict(state.get("sampler", {}))
        self.public_warmed = bool(state.get("public_warmed", True))
        if self.anchor is not None and "anchor" in state:
            self.anchor.load_state_dict(state["anchor"])
        if self.summing and "secure_sums" in state:
            self.summing.load_state_dict(state["secure_sums"])
        if "g_optimizer" in state:  # a checkpoint from before it held the generator's optimizer: fresh
            self.g_optimizer.load_state_dict(state["g_optimizer"])
        if "server_ledger" in state:
            self.server_ledger = PrivacyLedger.from_state_dict(state["server_ledger"])
        else:  # a checkpoint from before the server's ledger: those rounds without amplification
            z = self.cfg.fedavg_noise_multiplier
            self.server_ledger = PrivacyLedger([PrivacyEvent(z, count=self.rounds_done)] if self.rounds_done else [])


# --- generator steps against the updated D ---------------------------------------------------------
def generator_optimizer(G: nn.Module, cfg: ExperimentConfig) -> torch.optim.Optimizer:
    """The server's optimizer of G (``fedavg_g_optimizer``), kept across rounds: SGD at
    ``fedavg_lr_g`` as in Augenstein et al., or Adam (betas ``beta1``, ``beta2``)."""
    if cfg.fedavg_g_optimizer == "adam":
        return torch.optim.Adam(G.parameters(), lr=cfg.fedavg_lr_g, betas=(cfg.beta1, cfg.beta2))
    return torch.optim.SGD(G.parameters(), lr=cfg.fedavg_lr_g)


def server_generator_steps(
    G: nn.Module,
    D: nn.Module,
    *,
    steps: int = 6,
    lr: float = 5e-3,
    optimizer: torch.optim.Optimizer | None = None,
    batch_size: int = 32,
    z_dim: int,
    num_classes: int,
    generator: torch.Generator,
    anchor: SeedAnchor | None = None,
) -> dict[str, float]:
    """``steps`` steps on G minimizing ``-mean D(G(z, y), y)`` with uniform labels: of
    ``optimizer`` (the server's, its state kept across rounds), else of a fresh SGD at ``lr``.

    Post-processing of the privatized D, so it costs no privacy. D is held in eval mode with its
    parameters frozen for the duration (its power-iteration buffers are not advanced, so D is
    exactly unchanged), then its mode and ``requires_grad`` flags are restored. A seeded run's
    ``anchor`` adds its fit to the seed release to every step.
    """
    was_training = D.training
    flags = [p.requires_grad for p in D.parameters()]
    D.eval().requires_grad_(False)
    optimizer = optimizer if optimizer is not None else torch.optim.SGD(G.parameters(), lr=lr)
    device = device_of(G)
    G.train()
    losses: list[float] = []
    try:
        for _ in range(steps):
            y = torch.randint(0, num_classes, (batch_size,), generator=generator).to(device)
            z = sample_latent(batch_size, z_dim, generator=generator).to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = -D(G(z, y), y).mean()
            loss.backward()
            if anchor is not None:
                anchor.backward(G)
            optimizer.step()
            losses.append(float(loss.detach()))
    finally:
        D.train(was_training)
        for p, flag in zip(D.parameters(), flags, strict=True):
            p.requires_grad_(flag)
    mean = sum(losses) / len(losses) if losses else float("nan")
    last = losses[-1] if losses else float("nan")
    return {"g_steps": float(steps), "g_loss": last, "g_loss_mean": mean}
