"""The server's side of a GS-WGAN step replayed from CUDA graphs: the query's samples, G's update.

Why: with the clients' critic phases captured (``critic_graph.py``), a step at the paper's
networks is bound by the server's eager kernels: two generator forwards, the backward of the
sanitized gradient through G, Adam and the EMA, ~700 launches from Python per step.

How (one client per step, ``clients_per_step = 1``, the paper's setting; otherwise the eager path
runs): three graphs on G's own tensors.
- ``sample``: the critic batches and the queried batch, each one training-mode forward without a
  graph (spectral norm's power iteration advances twice, as eagerly).
- ``backward``: the queried batch again in eval mode, which uses the power-iteration vectors the
  last training forward left and so reproduces the queried samples exactly, backpropagated from
  the client's gradient; plus whether G's gradient is finite (read on the host, as eagerly).
- ``update``: capturable Adam and the EMA with its decay in a device scalar.
The latents and labels are drawn on the host from the server's RNG in the eager order. Capture
runs a few iterations first (``torch.cuda.graph``'s recipe), so G, Adam and the EMA are saved
before and restored after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from common.learning.models import IMAGE_SHAPE, GeneratorEMA

CAPTURE_WARMUP_ITERS = 3


@dataclass
class Snapshot:
    """Copies of G's, Adam's and the EMA's tensors, put back after the capture's warm-up."""

    live: list[Tensor]
    saved: list[Tensor]

    @classmethod
    def of(cls, tensors: list[Tensor]) -> Snapshot:
        return cls(tensors, [t.detach().clone() for t in tensors])

    @torch.no_grad()
    def restore(self) -> None:
        torch._foreach_copy_(self.live, self.saved)


class GeneratorGraph:
    """G's query and update for one client per step, captured once per (B, n_critic)."""

    def __init__(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, ema: GeneratorEMA, batch_size: int, critic: int
    ) -> None:
        self.model, self.optimizer, self.ema = model, optimizer, ema
        self.batch_size, self.critic = batch_size, critic
        device = next(model.parameters()).device
        z_dim = model.z_dim
        self.z_critic = torch.zeros(critic * batch_size, z_dim, device=device)
        self.y_critic = torch.zeros(critic * batch_size, dtype=torch.long, device=device)
        self.z = torch.zeros(batch_size, z_dim, device=device)
        self.y = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.grad_in = torch.zeros(batch_size, *IMAGE_SHAPE, device=device)
        self.ema_weight = torch.zeros((), device=device)  # 1 - decay of this update
        self.params = list(model.parameters())
        self._make_capturable(device)
        self._capture()

    # --- setup --------------------------------------------------------------------------------
    def _make_capturable(self, device: torch.device) -> None:
        """Adam's state on the device, created now if Adam has not stepped (zeros and step 0 are
        what its lazy initialization would create), and its steps counted there."""
        for group in self.optimizer.param_groups:
            group["capturable"] = True
        for p in self.params:
            state = self.optimizer.state[p]
            state["step"] = torch.as_tensor(float(state.get("step", 0.0)), dtype=torch.float32).to(device)
            for name in ("exp_avg", "exp_avg_sq"):
                if name not in state:
                    state[name] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def _state_tensors(self) -> list[Tensor]:
        opt = [t for p in self.params for t in self.optimizer.state[p].values()]
        return [*self.params, *self.model.buffers(), *opt, *self.ema.module.parameters(), *self.ema.module.buffers()]

    def _capture(self) -> None:
        snapshot = Snapshot.of(self._state_tensors())
        side = torch.cuda.Stream(self.z.device)
        side.wait_stream(torch.cuda.current_stream(self.z.device))
        with torch.cuda.stream(side):
            for _ in range(CAPTURE_WARMUP_ITERS):
                self._sample_body()
                self.optimizer.zero_grad(set_to_none=True)
                self._backward_body()
                self._update_body()
        torch.cuda.current_stream(self.z.device).wait_stream(side)
        self.optimizer.zero_grad(set_to_none=True)  # the captured backward allocates the grads
        self.sample_graph, self.backward_graph, self.update_graph = (torch.cuda.CUDAGraph() for _ in range(3))
        with torch.cuda.graph(self.sample_graph):
            self.critic_out, self.out = self._sample_body()
        with torch.cuda.graph(self.backward_graph):
            self.finite = self._backward_body()
        with torch.cuda.graph(self.update_graph):
            self._update_body()
        snapshot.restore()

    # --- the bodies ---------------------------------------------------------------------------
    def _sample_body(self) -> tuple[Tensor | None, Tensor]:
        with torch.no_grad():
            critic = self.model(self.z_critic, self.y_critic) if self.critic else None
            return critic, self.model(self.z, self.y)

    def _backward_body(self) -> Tensor:
        self.model.eval()  # the last training forward's power-iteration vectors: the queried samples
        try:
            self.model(self.z, self.y).backward(self.grad_in)
        finally:
            self.model.train()
        grads = [p.grad for p in self.params]
        return torch.isfinite(torch.stack(torch._foreach_norm(grads))).all()

    @torch.no_grad()
    def _update_body(self) -> None:
        self.optimizer.step()
        ema = list(self.ema.module.parameters())
        diff = torch._foreach_sub(self.params, ema)
        torch._foreach_mul_(diff, self.ema_weight)
        torch._foreach_add_(ema, diff)  # ema + w (p - ema): lerp_'s formula for w < 0.5
        torch._foreach_copy_(list(self.ema.module.buffers()), list(self.model.buffers()))

    # --- one step -----------------------------------------------------------------------------
    def query(self, labels: Tensor, z_critic: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        """The critic batches and the queried batch for these host-drawn latents and labels
        (copies: the next query overwrites the graph's outputs)."""
        n = self.critic * self.batch_size
        if n:
            self.z_critic.copy_(z_critic)
            self.y_critic.copy_(labels[:n])
        self.z.copy_(z)
        self.y.copy_(labels[n:])
        self.sample_graph.replay()
        out = self.out.clone()
        return (torch.cat([self.critic_out, out]) if self.critic else out), out

    def apply(self, grad: Tensor, divisor: float) -> bool:
        """G's step from the queried batch's gradient; False (no step) when it is not finite."""
        self.grad_in.copy_(grad)
        self.grad_in.div_(divisor)
        self.backward_graph.replay()
        if not bool(self.finite):  # one host sync, as the eager path's check
            return False
        decay = self.ema.next_decay()
        self.ema_weight.fill_(1.0 - decay)
        self.update_graph.replay()
        return True
