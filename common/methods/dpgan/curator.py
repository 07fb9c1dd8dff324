"""DPGAN's curator node: every partition pooled, D trained with DP-SGD (secret Poisson batches
q = B/N), DPAC's classifier beside it when asked, G by post-processing; one round at a time.

Each round the curator takes n_D DP steps, then one generator step, updates the adaptive n_D and
records the steps that added noise in its ledger (``run_round``); ``storage.py`` keeps it on the
node's disk between rounds. A seeded run's first round makes the seed release before them, on the
pooled data, and fits G to it (``seed_stage``, ``common/methods/seeding/pooled.py``); every generator
step then keeps fitting it beside D's loss.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from common.data import load_client_partition, num_classes_for
from common.device import resolve_device
from common.learning.dpac import build_classifier
from common.learning.models import build_generator, sample_latent
from common.learning.public_warmup import pretrain_gan, public_batch
from common.privacy import PrivacyEvent, PrivacyLedger, Sampler, noise_generator
from common.privacy.events import VOID_NOISE_SEED
from common.privacy.node_ledger import pooled_event

from ..seeding import SeedAnchor, SeedStart, seed_config, seeded
from ..seeding import pooled as pooled_seed
from .adaptive import AdaptiveND
from .dp_classifier import DpClassifierTrainer
from .dpsgd import DpDiscriminatorTrainer, build_dpgan_discriminator
from .privacy import classifier_round_steps

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

CURATOR = 0  # the client id of the node that pools every partition


@dataclass
class DpganNode:
    images: torch.Tensor
    labels: torch.Tensor
    sizes: list[int]  # each pooled client's number of examples (its node-level unit, ``pooled_charges``)
    trainer: DpDiscriminatorTrainer
    generator: torch.nn.Module
    g_optimizer: torch.optim.Optimizer
    schedule: AdaptiveND | None
    n_d: int
    ledger: PrivacyLedger
    rng: torch.Generator  # public randomness (fakes' latents and labels), seeded from the run's seed
    sampler: Sampler  # the Poisson batches: secret
    void: str = ""  # why this node's steps are not private (a seeded noise or sampling generator)
    rounds: int = 0
    classifier: DpClassifierTrainer | None = None  # DPAC's C (``dpac_beta`` < 1), trained with DP-SGD
    classifier_ready: bool = False  # its init on real data has run
    public_warmed: bool = True  # the warm start on public data has run (or none was asked for)
    seed_done: bool = True  # the seed release has been made and G fitted to it (or the run has none)
    seed_target: torch.Tensor | None = None  # that release as a labelled mean embedding (public once made)
    anchor: SeedAnchor | None = None  # G's fit to it in every generator step (``init_weight`` > 0)

    @property
    def dp_steps(self) -> int:
        """Noised steps so far, D's and C's (same σ and q: one kind of event)."""
        return self.trainer.steps_taken + (self.classifier.steps_taken if self.classifier else 0)

    @property
    def sample_rate(self) -> float:
        return self.trainer.sample_rate

    def round_dp_steps(self, cfg: ExperimentConfig) -> int:
        """Noised steps the next round takes: n_D, plus DPAC's classifier's (its init the first time)."""
        if self.classifier is None:
            return self.n_d
        init = 0 if self.classifier_ready else cfg.dpac_init
        return self.n_d + init + classifier_round_steps(cfg)

    def round_events(self, cfg: ExperimentConfig) -> list[PrivacyEvent]:
        """What the next round releases, in order: the seed release first if it is still to be
        made, then its DP-SGD steps."""
        seed = [] if self.seed_done else [pooled_seed.seed_event(cfg)]
        return [*seed, self.step_event(self.round_dp_steps(cfg))]

    def step_event(self, count: int) -> PrivacyEvent:
        """``count`` DP-SGD discriminator steps: a Poisson-subsampled Gaussian (σ, q = B/N)."""
        return PrivacyEvent(
            noise_multiplier=self.trainer.noise_multiplier,
            sample_rate=self.sample_rate,
            count=count,
            sampling="poisson",
            void=self.void,
        )


def pooled_data(cfg: ExperimentConfig) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Every partition, pooled, and each client's number of examples in the pool."""
    parts = [load_client_partition(cfg, k) for k in range(cfg.num_clients)]
    sizes = [len(p.labels) for p in parts]
    return torch.cat([p.images for p in parts]), torch.cat([p.labels for p in parts]), sizes


def pooled_charges(node: DpganNode, events: list[PrivacyEvent]) -> dict[int, list[PrivacyEvent]]:
    """What the curator's DP-SGD steps cost each pooled client in the node unit (its whole
    partition, ``pooled_event``): charged to every pooled client's node ledger, as its data took
    part in every step."""
    return {k: [pooled_event(e, n) for e in events] for k, n in enumerate(node.sizes)}


def new_node(cfg: ExperimentConfig) -> DpganNode:
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.device)
    images, labels, sizes = pooled_data(cfg)
    images, labels = images.to(device), labels.to(device)
    num_classes = num_classes_for(cfg)
    # Opacus draws the noise where the gradients are, so the noise generator lives on the device
    # (still seeded from the OS CSPRNG); the secret Poisson batches stay on the CPU (``Sampler``).
    noise = noise_generator(None if cfg.noise_seed < 0 else cfg.noise_seed, device=device)
    sample_rate = min(1.0, cfg.dpgan_batch_size / len(labels))
    sigma = cfg.dpgan_noise_multiplier  # already calibrated for --target-epsilon (common/calibration.py)
    trainer = DpDiscriminatorTrainer(
        build_dpgan_discriminator(cfg.model, num_classes=num_classes).to(device),
        lr=cfg.dpgan_lr,
        betas=(cfg.beta1, 0.999),
        noise_multiplier=sigma,
        max_grad_norm=cfg.dpgan_clip,
        sample_rate=sample_rate,
        expected_batch_size=cfg.dpgan_batch_size,
        loss=cfg.dpgan_loss,
        gp_weight=cfg.gp_weight,
        generator=noise,
        grouping=cfg.dpgan_clip_groups,
        noise_form=cfg.dpgan_group_noise,
    )
    gen = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes).to(device)
    schedule = (
        AdaptiveND(threshold=cfg.dpgan_adaptive_threshold, initial_n_d=cfg.dpgan_n_d) if cfg.dpgan_adaptive else None
    )
    sampler = Sampler(None if cfg.sampling_seed < 0 else cfg.sampling_seed)
    void = VOID_NOISE_SEED if cfg.noise_seed >= 0 else sampler.void_reason
    classifier = None
    if cfg.dpac_beta < 1:
        classifier = DpClassifierTrainer(
            build_classifier(cfg.model, num_classes=num_classes).to(device),
            lr=cfg.dpac_lr,
            noise_multiplier=sigma,
            max_grad_norm=cfg.dpgan_clip,
            sample_rate=sample_rate,
            expected_batch_size=cfg.dpgan_batch_size,
            joint=cfg.dpac_train == "joint",
            generator=noise,
        )
    return DpganNode(
        images=images,
        labels=labels,
        sizes=sizes,
        trainer=trainer,
        generator=gen,
        g_optimizer=torch.optim.Adam(gen.parameters(), lr=cfg.dpgan_lr, betas=(cfg.beta1, 0.999)),
        schedule=schedule,
        n_d=cfg.dpgan_n_d,
        ledger=PrivacyLedger(),
        rng=torch.Generator().manual_seed(cfg.seed * 31 + 7),
        sampler=sampler,
        void=void,
        classifier=classifier,
        public_warmed=not cfg.public_warmup_steps,
        seed_done=not seeded(cfg),
    )


def seed_stage(node: DpganNode, cfg: ExperimentConfig) -> None:
    """The seed release on the pooled data (recorded in the ledger before any DP-SGD step), G fitted
    to it, and the anchor that keeps G fitting it. The noise comes from the OS CSPRNG (a fixed
    ``noise_seed`` voids the release, as it voids the DP-SGD steps)."""
    device = node.images.device
    noise = noise_generator(None if cfg.noise_seed < 0 else cfg.noise_seed + 1, device=device)
    first = seed_config(cfg)
    release = pooled_seed.noisy_sum(cfg, first, node.images, node.labels, num_classes_for(cfg), noise)
    node.ledger.record(pooled_seed.seed_event(cfg))
    node.seed_target = pooled_seed.as_mean(cfg, release).cpu()
    pooled_seed.fit_generator(cfg, first, node.generator, node.seed_target.to(device), num_classes_for(cfg))
    node.anchor = seed_anchor(cfg, node.seed_target, device)
    node.seed_done = True


def seed_anchor(cfg: ExperimentConfig, target: torch.Tensor, device: torch.device) -> SeedAnchor | None:
    """G's fit to the seed release in every generator step (none at ``init_weight`` 0)."""
    return SeedAnchor(cfg, SeedStart({}, target, 1), device) if cfg.init_weight > 0 else None


def _fakes(node: DpganNode, cfg: ExperimentConfig, n: int, *, grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    device = node.images.device
    y = torch.randint(num_classes_for(cfg), (n,), generator=node.rng).to(device)
    with torch.set_grad_enabled(grad):
        return node.generator(sample_latent(n, cfg.z_dim, generator=node.rng).to(device), y), y


def _real_batch(node: DpganNode) -> tuple[torch.Tensor, torch.Tensor]:
    """A secret Poisson batch of the pooled data at q = B/N."""
    idx = node.sampler.poisson(len(node.labels), node.sample_rate).to(node.images.device)
    return node.images[idx], node.labels[idx]


def _train_classifier(node: DpganNode, cfg: ExperimentConfig) -> None:
    """DPAC's C: its init (DP steps on real data, once), then its share of the round."""
    C = node.classifier
    if C is None:
        return
    if not node.classifier_ready:
        for _ in range(cfg.dpac_init):
            C.dp_step(*_real_batch(node))
        node.classifier_ready = True
    C.train(cfg.dpac_train, *_real_batch(node), *_fakes(node, cfg, cfg.dpgan_batch_size, grad=False))


def _generator_step(node: DpganNode, cfg: ExperimentConfig) -> torch.Tensor:
    """One step of G on the non-saturating loss on D; with DPAC, β of it plus (1 − β) of C's
    cross-entropy on the fakes' labels. D and C stay frozen, their Opacus hooks off, until the
    backward pass is done. Returns the loss."""
    fake, fake_y = _fakes(node, cfg, cfg.dpgan_batch_size, grad=True)
    with ExitStack() as stack:
        D = stack.enter_context(node.trainer.frozen())
        loss = F.softplus(-D(fake, fake_y)).mean()
        if node.classifier is not None:
            C = stack.enter_context(node.classifier.frozen())
            loss = cfg.dpac_beta * loss + (1 - cfg.dpac_beta) * F.cross_entropy(C(fake), fake_y.long())
        node.g_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if node.anchor is not None:  # the seed release's fit, post-processing
            node.anchor.backward(node.generator)
        node.g_optimizer.step()
    return loss.detach()


def _public_warm_start(node: DpganNode, cfg: ExperimentConfig) -> None:
    """dpGAN's warm start: G and D trained on the public data without noise, Opacus' hooks off, with
    D's own Adam (its moments carry into the private steps: they hold nothing private)."""
    with node.trainer.hooks_off() as D:
        pretrain_gan(
            node.generator,
            D,
            node.trainer.optimizer.original_optimizer,
            cfg,
            steps=cfg.public_warmup_steps,
            n_critic=cfg.dpgan_n_d,
            num_classes=num_classes_for(cfg),
            rng=node.rng,
            loss=cfg.dpgan_loss,
            lr=cfg.dpgan_lr,
        )
    node.public_warmed = True


def _public_bounds(node: DpganNode, cfg: ExperimentConfig) -> None:
    """Re-estimate the group bounds on a public batch and B fakes (free: nothing private enters)."""
    real, real_y = public_batch(cfg, cfg.dpgan_batch_size, node.rng, node.images.device)
    node.trainer.set_public_bounds(real, real_y, *_fakes(node, cfg, cfg.dpgan_batch_size, grad=False))


def run_round(node: DpganNode, cfg: ExperimentConfig) -> dict[str, Any]:
    """The seed release first in a seeded run's first round; then n_D DP discriminator steps, DPAC's
    classifier steps, one generator step; records the noised steps in the ledger, returns the
    statistics."""
    if not node.public_warmed:
        _public_warm_start(node, cfg)
    if not node.seed_done:
        seed_stage(node, cfg)
    if cfg.dpgan_group_bounds == "public" and node.rounds % cfg.dpgan_bounds_every == 0:
        _public_bounds(node, cfg)
    before = node.dp_steps
    stats: dict[str, float] = {}
    for _ in range(node.n_d):
        real, real_y = _real_batch(node)
        fake, fake_y = _fakes(node, cfg, cfg.dpgan_batch_size, grad=False)
        stats = node.trainer.step(real, real_y, fake, fake_y)
    _train_classifier(node, cfg)
    g_loss = _generator_step(node, cfg)
    new_steps = node.dp_steps - before
    if new_steps:
        node.ledger.record(node.step_event(new_steps))
    if node.schedule is not None:
        node.n_d = node.schedule.update(stats.get("fake_accuracy", 0.0))
    node.rounds += 1
    return {"g_loss": float(g_loss.detach()), **stats}
