"""The server's generator: G, its EMA copy (the only released model), Adam, and the server's RNG."""

from __future__ import annotations

import torch

from common.config import ExperimentConfig
from common.models import GeneratorEMA, build_generator, sample_latent


class ServerGenerator:
    """Owns everything the server needs to produce samples and apply sanitized gradients."""

    def __init__(self, cfg: ExperimentConfig, num_classes: int) -> None:
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.num_classes = num_classes
        self.model = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes)
        self.ema = GeneratorEMA(self.model, decay=cfg.ema_decay)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=cfg.lr_g, betas=(cfg.beta1, cfg.beta2)
        )
        self.rng = torch.Generator().manual_seed(cfg.seed)

    def draw_labels(self, n: int) -> torch.Tensor:
        """Uniform labels drawn by the server, never from a client's label histogram (it would leak)."""
        return torch.randint(self.num_classes, (n,), generator=self.rng)

    def sample(self, n: int, labels: torch.Tensor, *, grad: bool) -> torch.Tensor:
        z = sample_latent(n, self.cfg.z_dim, generator=self.rng)
        with torch.set_grad_enabled(grad):
            return self.model(z, labels)

    def query_batches(self, batch_size: int, n_critic: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(n_critic+1)*B samples for one client: the critic batches without a graph, the last with.

        ``n_critic=0`` gives the queried batch only (clients that reuse fakes for their critic steps).
        Returns (all samples detached, their labels, the last batch still attached to G's graph).
        """
        labels = self.draw_labels((n_critic + 1) * batch_size)
        n = n_critic * batch_size
        critic = [self.sample(n, labels[:n], grad=False)] if n_critic else []
        last = self.sample(batch_size, labels[n:], grad=True)
        return torch.cat([*critic, last.detach()]), labels, last

    def apply(self, attached: list[torch.Tensor], grads: list[torch.Tensor], divisor: float) -> None:
        """Backpropagate the clients' sanitized gradients through G, step Adam, update the EMA.

        Straight-through estimator: with a lossy sample encoding (uint8) the clients differentiate
        at the *dequantized* images ``q(G(z))`` they received, while ``attached`` holds the
        unquantized ``G(z)``. Rounding has zero derivative almost everywhere, so the chain rule
        through ``q`` would give no signal; we treat ``q`` as the identity in the backward pass and
        apply the returned gradient at ``G(z)``. The error is at most half a level (1/510) per pixel.
        """
        self.optimizer.zero_grad(set_to_none=True)
        for fake, grad in zip(attached, grads, strict=True):
            fake.backward(grad / divisor)
        self.optimizer.step()
        self.ema.update(self.model)

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "ema": self.ema.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": self.rng.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.ema.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.set_state(state["rng"])
