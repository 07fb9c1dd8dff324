"""The curator node of centralized DPGAN (Bie, Kamath, Zhang 2023): all partitions pooled on one node.

Each round the node takes n_D DP-SGD discriminator steps (Opacus; Poisson sampling q = B/N), then
one non-private generator step (post-processing), updates the adaptive n_D, records the steps that
added noise in its ledger, and returns the generator's weights. State (D, G, both optimizers, the
adaptive schedule, the ledger, the public RNG) persists on the node's disk between rounds.

The Poisson batches come from a secret sampler (the OS CSPRNG, nothing saved): amplification at
q = B/N holds only if nobody can tell which examples a step used, and the run's seed is published
in config.json. ``--sampling-seed`` (tests only) makes them reproducible and every event void.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from common.config import ExperimentConfig
from common.data import load_client_partition, num_classes_for
from common.dpgan import AdaptiveND, DpDiscriminatorTrainer, build_dpgan_discriminator
from common.models import build_generator, sample_latent
from common.privacy import PrivacyEvent, PrivacyLedger, Sampler, noise_generator
from common.privacy.events import VOID_NOISE_SEED

_NODES: dict[str, "DpganNode"] = {}


@dataclass
class DpganNode:
    images: torch.Tensor
    labels: torch.Tensor
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

    @property
    def sample_rate(self) -> float:
        return self.trainer.sample_rate

    def step_event(self, count: int) -> PrivacyEvent:
        """``count`` DP-SGD discriminator steps: a Poisson-subsampled Gaussian (σ, q = B/N)."""
        return PrivacyEvent(noise_multiplier=self.trainer.noise_multiplier, sample_rate=self.sample_rate,
                            count=count, sampling="poisson", void=self.void)


def pooled_data(cfg: ExperimentConfig) -> tuple[torch.Tensor, torch.Tensor]:
    parts = [load_client_partition(cfg, k) for k in range(cfg.num_clients)]
    return torch.cat([p.images for p in parts]), torch.cat([p.labels for p in parts])


def new_node(cfg: ExperimentConfig) -> DpganNode:
    torch.manual_seed(cfg.seed)
    images, labels = pooled_data(cfg)
    num_classes = num_classes_for(cfg)
    noise = noise_generator(None if cfg.noise_seed < 0 else cfg.noise_seed)
    sample_rate = min(1.0, cfg.dpgan_batch_size / len(labels))
    sigma = cfg.dpgan_noise_multiplier  # already calibrated for --target-epsilon (common/calibration.py)
    trainer = DpDiscriminatorTrainer(
        build_dpgan_discriminator(cfg.model, num_classes=num_classes), lr=cfg.dpgan_lr, betas=(cfg.beta1, 0.999),
        noise_multiplier=sigma, max_grad_norm=cfg.dpgan_clip,
        sample_rate=sample_rate, expected_batch_size=cfg.dpgan_batch_size,
        loss=cfg.dpgan_loss, gp_weight=cfg.gp_weight, generator=noise)
    gen = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes)
    schedule = AdaptiveND(threshold=cfg.dpgan_adaptive_threshold, initial_n_d=cfg.dpgan_n_d) \
        if cfg.dpgan_adaptive else None
    sampler = Sampler(None if cfg.sampling_seed < 0 else cfg.sampling_seed)
    void = VOID_NOISE_SEED if cfg.noise_seed >= 0 else sampler.void_reason
    return DpganNode(images=images, labels=labels, trainer=trainer, generator=gen,
                     g_optimizer=torch.optim.Adam(gen.parameters(), lr=cfg.dpgan_lr, betas=(cfg.beta1, 0.999)),
                     schedule=schedule, n_d=cfg.dpgan_n_d, ledger=PrivacyLedger(),
                     rng=torch.Generator().manual_seed(cfg.seed * 31 + 7), sampler=sampler, void=void)


def _fakes(node: DpganNode, cfg: ExperimentConfig, n: int, *, grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.randint(num_classes_for(cfg), (n,), generator=node.rng)
    with torch.set_grad_enabled(grad):
        return node.generator(sample_latent(n, cfg.z_dim, generator=node.rng), y), y


def run_round(node: DpganNode, cfg: ExperimentConfig) -> dict[str, Any]:
    """n_D DP discriminator steps, one generator step; returns the round's stats and privacy event."""
    before = node.trainer.steps_taken
    stats: dict[str, float] = {}
    for _ in range(node.n_d):
        idx = node.sampler.poisson(len(node.labels), node.sample_rate)
        fake, fake_y = _fakes(node, cfg, cfg.dpgan_batch_size, grad=False)
        stats = node.trainer.step(node.images[idx], node.labels[idx], fake, fake_y)
    fake, fake_y = _fakes(node, cfg, cfg.dpgan_batch_size, grad=True)
    with node.trainer.frozen() as D:
        g_loss = F.softplus(-D(fake, fake_y)).mean()  # non-saturating generator loss
        node.g_optimizer.zero_grad(set_to_none=True)
        g_loss.backward()
        node.g_optimizer.step()
    new_steps = node.trainer.steps_taken - before
    if new_steps:
        node.ledger.record(node.step_event(new_steps))
    if node.schedule is not None:
        node.n_d = node.schedule.update(stats.get("fake_accuracy", 0.0))
    node.rounds += 1
    return {"new_steps": new_steps, "g_loss": float(g_loss.detach()), **stats}


def node_path(state_dir: str | Path) -> Path:
    return Path(state_dir) / "dpgan-node.pt"


def save_node(node: DpganNode, state_dir: str | Path) -> None:
    path = node_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {
        "D": node.trainer.D.state_dict(), "d_opt": node.trainer.optimizer.original_optimizer.state_dict(),
        "G": node.generator.state_dict(), "g_opt": node.g_optimizer.state_dict(),
        "schedule": node.schedule.state_dict() if node.schedule else None, "n_d": node.n_d,
        "ledger": node.ledger.state_dict(), "rng": node.rng.get_state(), "rounds": node.rounds,
        "steps_taken": node.trainer.steps_taken, "sampler": node.sampler.state_dict(),
    }
    tmp = path.with_suffix(".tmp")
    torch.save(blob, tmp)
    os.replace(tmp, path)
    _NODES[str(state_dir)] = node


def load_ledger(state_dir: str | Path) -> PrivacyLedger:
    """The node's ledger as its file stands (empty before its first round)."""
    path = node_path(state_dir)
    if not path.exists():
        return PrivacyLedger()
    return PrivacyLedger.from_state_dict(torch.load(path, map_location="cpu", weights_only=False)["ledger"])


def load_node(cfg: ExperimentConfig, state_dir: str | Path, rounds: int) -> DpganNode:
    """The node at ``rounds`` rounds: from memory when current, else from disk, else new."""
    cached = _NODES.get(str(state_dir))
    if cached is not None and cached.rounds == rounds:
        return cached
    node = new_node(cfg)
    path = node_path(state_dir)
    if path.exists():
        blob = torch.load(path, map_location="cpu", weights_only=False)
        node.trainer.D.load_state_dict(blob["D"])
        node.trainer.optimizer.original_optimizer.load_state_dict(blob["d_opt"])
        node.generator.load_state_dict(blob["G"])
        node.g_optimizer.load_state_dict(blob["g_opt"])
        if node.schedule is not None and blob["schedule"] is not None:
            node.schedule.load_state_dict(blob["schedule"])
        node.n_d, node.rounds = int(blob["n_d"]), int(blob["rounds"])
        node.ledger = PrivacyLedger.from_state_dict(blob["ledger"])
        node.rng.set_state(blob["rng"])
        node.sampler.load_state_dict(blob.get("sampler", {}))
        node.trainer.steps_taken = int(blob["steps_taken"])
    _NODES[str(state_dir)] = node
    return node
