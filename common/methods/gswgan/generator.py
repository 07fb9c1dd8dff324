"""GS-WGAN's server side, the model: G, its EMA (the only released model), Adam, the samples it
sends, and the straight-through update from the clients' sanitized gradients."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from common.device import resolve_device
from common.learning.models import GeneratorEMA, build_discriminator, build_generator, sample_latent
from common.learning.public_warmup import warm_gan_on_public
from common.privacy.dct import to_pixels

from ..seeding import SeedAnchor, SeedStart, start_generator
from .generator_graph import GeneratorGraph

if TYPE_CHECKING:
    from common.methods import ExperimentConfig


class ServerGenerator:
    """Owns everything the server needs to produce samples and apply sanitized gradients."""

    def __init__(self, cfg: ExperimentConfig, num_classes: int) -> None:
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.num_classes = num_classes
        self.device = resolve_device(cfg.device)
        self.model = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes).to(self.device)
        self.ema = GeneratorEMA(self.model, decay=cfg.ema_decay)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr_g, betas=(cfg.beta1, cfg.beta2))
        self.rng = torch.Generator().manual_seed(cfg.seed)
        self.public_warmed = not cfg.public_warmup_steps
        self._graph: GeneratorGraph | None = None  # generator_graph.py, made on first use
        self._graph_query: torch.Tensor | None = None  # the queried batch the graph holds
        self.anchor: SeedAnchor | None = None  # a seeded run's fit to its seed release (``start_from``)

    def _graph_for(self, batch_size: int, n_critic: int) -> GeneratorGraph | None:
        """The CUDA graphs of G's query and update where they apply: asked for, on CUDA, one client
        per step (each query is applied before the next); rebuilt if B or the critic batches change."""
        if not (self.cfg.cuda_graphs and self.device.type == "cuda" and self.cfg.clients_per_step == 1):
            return None
        if self.anchor is not None:  # the anchor's own forward is not in the captured graph
            return None
        graph = self._graph
        if graph is None or (graph.batch_size, graph.critic) != (batch_size, n_critic):
            graph = self._graph = GeneratorGraph(self.model, self.optimizer, self.ema, batch_size, n_critic)
        return graph

    def public_warm_start(self) -> None:
        """dpGAN's warm start of G on the public data, against a public D that is then discarded;
        the EMA restarts from the warmed G. Runs once, before the first step."""
        D = build_discriminator(self.cfg.model, num_classes=self.num_classes).to(self.device)
        cfg = self.cfg
        self.ema = warm_gan_on_public(
            self.model,
            D,
            cfg,
            num_classes=self.num_classes,
            rng=self.rng,
            lr_g=cfg.lr_g,
            lr_d=cfg.lr_d,
            n_critic=cfg.n_critic,
        )
        self.public_warmed = True
        self._graph = None  # a new EMA: captured again on the next query

    def start_from(self, start: SeedStart) -> None:
        """A seeded run's G starts as the generator the server fitted to the seed release (its EMA,
        what stage 1 released), the EMA restarted from it; with ``init_weight`` > 0 each step also
        fits the seed release (``SeedAnchor``). Post-processing of stage 1: no privacy cost."""
        self.ema, self.anchor = start_generator(self.cfg, start, self.model, self.device)
        self._graph = None

    def draw_labels(self, n: int) -> torch.Tensor:
        """Uniform labels drawn by the server, never from a client's label histogram (it would leak)."""
        return torch.randint(self.num_classes, (n,), generator=self.rng)

    def sample(self, n: int, labels: torch.Tensor, *, grad: bool) -> torch.Tensor:
        z = sample_latent(n, self.cfg.z_dim, generator=self.rng).to(self.device)
        with torch.set_grad_enabled(grad):
            return self.model(z, labels.to(self.device))

    def query_batches(self, batch_size: int, n_critic: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(n_critic+1)*B samples for one client: the critic batches without a graph, the last with.

        ``n_critic=0`` gives the queried batch only (clients that reuse fakes for their critic steps).
        Returns (all samples detached on the CPU, their labels, the last batch still attached to
        G's graph on the device).
        """
        labels = self.draw_labels((n_critic + 1) * batch_size)
        n = n_critic * batch_size
        graph = self._graph_for(batch_size, n_critic)
        if graph is not None:  # the same draws in the same order as below
            z_critic = sample_latent(n, self.cfg.z_dim, generator=self.rng) if n_critic else torch.zeros(0, 0)
            z = sample_latent(batch_size, self.cfg.z_dim, generator=self.rng)
            samples, self._graph_query = graph.query(labels, z_critic.to(self.device), z.to(self.device))
            return samples.cpu(), labels, self._graph_query
        critic = [self.sample(n, labels[:n], grad=False)] if n_critic else []
        last = self.sample(batch_size, labels[n:], grad=True)
        return torch.cat([*critic, last.detach()]).cpu(), labels, last

    def apply(self, attached: list[torch.Tensor], grads: list[torch.Tensor], divisor: float) -> bool:
        """Backpropagate the clients' sanitized gradients through G, step Adam, update the EMA.

        Straight-through estimator: with a lossy sample encoding (uint8) the clients differentiate
        at the *dequantized* images ``q(G(z))`` they received, while ``attached`` holds the
        unquantized ``G(z)``. Rounding has zero derivative almost everywhere, so the chain rule
        through ``q`` would give no signal; we treat ``q`` as the identity in the backward pass and
        apply the returned gradient at ``G(z)``. The error is at most half a level (1/510) per pixel.
        With ``grad_dct`` the clients sent DCT coefficients; they are lifted back to pixels first.
        Returns False (no step) when G's gradient is not finite.
        """
        if self._graph is not None:
            if len(attached) != 1 or attached[0] is not self._graph_query:
                raise RuntimeError("a CUDA-graph step applies the one batch it queried last (clients_per_step = 1)")
            grad = to_pixels(grads[0], self.cfg.grad_dct) if self.cfg.grad_dct else grads[0]
            return self._graph.apply(grad.to(self.device), divisor)
        self.optimizer.zero_grad(set_to_none=True)
        for fake, grad in zip(attached, grads, strict=True):
            grad = to_pixels(grad, self.cfg.grad_dct) if self.cfg.grad_dct else grad
            fake.backward(grad.to(fake.device) / divisor)
        if self.anchor is not None:
            self.anchor.backward(self.model)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if grads and not bool(torch.isfinite(torch.stack(torch._foreach_norm(grads))).all()):  # one host sync
            # Never let a non-finite gradient into Adam's moments (they would stay non-finite).
            self.optimizer.zero_grad(set_to_none=True)
            return False
        self.optimizer.step()
        self.ema.update(self.model)
        return True

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "ema": self.ema.state_dict(),
            "optimizer": portable_adam_state(self.optimizer),
            "rng": self.rng.get_state(),
            "public_warmed": self.public_warmed,
            **({"anchor": self.anchor.state_dict()} if self.anchor is not None else {}),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.ema.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._graph = None  # Adam's state tensors are new: captured again on the next query
        self.rng.set_state(state["rng"])
        self.public_warmed = bool(state.get("public_warmed", True))
        if self.anchor is not None and "anchor" in state:
            self.anchor.load_state_dict(state["anchor"])


def portable_adam_state(optimizer: torch.optim.Optimizer) -> dict:
    """Adam's state dict as an eager Adam keeps it (CPU step counts, not capturable), whether or not
    a CUDA graph made it capturable: a checkpoint resumes on any device, with or without graphs.
    New dicts throughout: ``state_dict()`` shares the live state's."""
    sd = optimizer.state_dict()
    state = {
        k: {**v, "step": torch.as_tensor(v["step"]).detach().cpu()} if "step" in v else v
        for k, v in sd["state"].items()
    }
    groups = [{**g, "capturable": False} for g in sd["param_groups"]]
    return {"state": state, "param_groups": groups}
