"""A client's critic phase replayed from CUDA graphs: one captured network, every client's weights.

Why: on a GPU a GS-WGAN critic step at the paper's networks is launch-bound. Eagerly it is ~130
small kernels (three strided convs, a linear and an embedding, each with spectral norm's power
iteration, the gradient penalty's double backward, Adam) issued one by one from Python: ~19 ms
per critic step and 86 ms per generator step on an H100 (``bench/gpu_step.py``), so a client's
2,000-iteration warm start takes 38 s and the paper-scale run's 1,000 warm starts ~10 hours. A
CUDA graph issues the same kernels with one launch.

How: a *slot* holds one template discriminator and a capturable Adam whose tensors keep fixed
addresses, with static input buffers, and two graphs captured on them: one critic step
(``common.learning.losses.critic_step``) and the release's per-sample gradient
(``common.learning.losses.generator_sample_grads``). A client's critic phase copies its weights,
power-iteration vectors and Adam moments into the slot, copies each batch into the static inputs
and replays, then copies everything back (``CriticSession``). The client draws its real batches and
the penalty's interpolation weights from its own RNG on the host in the order the eager path draws
them, so it ends where the eager path would, up to float rounding (capturable Adam computes its
bias corrections on the device), and its state file keeps the same format. One slot per shape is
shared by every client of a process, so memory does not grow with the number of clients.

Off the GPU (or with ``cuda_graphs`` off) ``EagerCritic`` runs the same calls on the client's own
modules; the tests compare the two on the CPU by running a slot's bodies without capture.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor, nn

from common.client_state import ClientState
from common.learning.dpac import combined_sample_grads
from common.learning.losses import critic_loss, critic_step, generator_sample_grads
from common.learning.models import IMAGE_SHAPE, ProjectionDiscriminator, device_of

from .critic_stack import _plain_adam

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

CAPTURE_WARMUP_ITERS = 3  # eager iterations on a side stream before capture, as torch.cuda.graph asks


def graphable(state: ClientState) -> bool:
    """Whether this client's critic phase can run in a slot: a projection discriminator in training
    mode with plain Adam (one group, as ``adam_for`` makes it) and no DPAC classifier (whose steps
    interleave with D's)."""
    D, opt = state.discriminator, state.optimizer
    return (
        isinstance(D, ProjectionDiscriminator)
        and D.training
        and isinstance(opt, torch.optim.Adam)
        and state.classifier is None
        and _plain_adam(opt, opt.param_groups[0]["betas"])
    )


@dataclass(frozen=True)
class SlotKey:
    """What a captured graph depends on: the network's shape, B, the device and the loss and Adam
    hyperparameters baked into it."""

    spec: object
    num_classes: int
    batch_size: int
    device: str
    gp_weight: float
    drift: float
    lr: float
    betas: tuple[float, float]
    eps: float
    capture: bool


class CriticSlot:
    """A template D and Adam with static inputs, and (on CUDA) the two captured graphs."""

    def __init__(self, key: SlotKey, like: nn.Module) -> None:
        self.key = key
        device = torch.device(key.device)
        self.D = copy.deepcopy(like).to(device).train()
        self.params = list(self.D.parameters())
        self.buffers = list(self.D.buffers())
        self.opt = torch.optim.Adam(
            self.params, lr=key.lr, betas=key.betas, eps=key.eps, capturable=key.capture, foreach=True
        )
        step_device = device if key.capture else torch.device("cpu")  # capturable Adam steps on the device
        for p in self.params:  # Adam's state created now, so its tensors exist before any capture
            self.opt.state[p] = {
                "step": torch.zeros((), dtype=torch.float32, device=step_device),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }
        B = key.batch_size
        self.real = torch.zeros(B, *IMAGE_SHAPE, device=device)
        self.fake = torch.zeros(B, *IMAGE_SHAPE, device=device)
        self.real_y = torch.zeros(B, dtype=torch.long, device=device)
        self.fake_y = torch.zeros(B, dtype=torch.long, device=device)
        self.alpha = torch.zeros(B, 1, 1, 1, device=device)
        self.query = torch.zeros(B, *IMAGE_SHAPE, device=device)
        self.query_y = torch.zeros(B, dtype=torch.long, device=device)
        self.stats: dict[str, Tensor] = {}
        self.grads = torch.zeros(B, *IMAGE_SHAPE, device=device)
        self.critic_graph: torch.cuda.CUDAGraph | None = None
        self.grads_graph: torch.cuda.CUDAGraph | None = None
        if key.capture:
            self._capture()

    # --- the bodies the graphs hold ---------------------------------------------------------------
    def _critic_body(self) -> dict[str, Tensor]:
        loss, stats = critic_loss(
            self.D,
            self.real,
            self.real_y,
            self.fake,
            self.fake_y,
            gp_weight=self.key.gp_weight,
            drift=self.key.drift,
            alpha=self.alpha,
        )
        loss.backward()
        self.opt.step()
        return stats

    def _grads_body(self) -> Tensor:
        return generator_sample_grads(self.D, self.query, self.query_y)

    def _capture(self) -> None:
        """Capture both bodies (``torch.cuda.graph``'s recipe: a few eager iterations on a side
        stream first, grads set to None so the captured backward allocates them from the graph's
        pool). The warm-up iterations step the template, which every client overwrites on load."""
        side = torch.cuda.Stream(self.real.device)
        side.wait_stream(torch.cuda.current_stream(self.real.device))
        with torch.cuda.stream(side):
            for _ in range(CAPTURE_WARMUP_ITERS):
                self.opt.zero_grad(set_to_none=True)
                self._critic_body()
                self._grads_body()
        torch.cuda.current_stream(self.real.device).wait_stream(side)
        self.opt.zero_grad(set_to_none=True)
        self.critic_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.critic_graph):
            self.stats = self._critic_body()
        self.grads_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.grads_graph):
            self.grads = self._grads_body()

    # --- what a client session calls --------------------------------------------------------------
    def critic_step(
        self, real: Tensor, real_y: Tensor, fake: Tensor, fake_y: Tensor, alpha: Tensor
    ) -> dict[str, Tensor]:
        """One critic step of the loaded client; its statistics, copied out of the static outputs."""
        for static, value in ((self.real, real), (self.real_y, real_y), (self.fake, fake), (self.fake_y, fake_y)):
            static.copy_(value.detach())
        self.alpha.copy_(alpha)
        if self.critic_graph is not None:
            self.critic_graph.replay()
            return {k: v.clone() for k, v in self.stats.items()}
        self.opt.zero_grad(set_to_none=True)
        return self._critic_body()

    def sample_grads(self, fake: Tensor, y: Tensor) -> Tensor:
        """The loaded client's per-sample ``d(-D(x_i, y_i))/dx_i`` at ``fake`` (a copy)."""
        self.query.copy_(fake.detach())
        self.query_y.copy_(y)
        if self.grads_graph is not None:
            self.grads_graph.replay()
            return self.grads.clone()
        return self._grads_body()

    @torch.no_grad()
    def load(self, state: ClientState) -> int:
        """Copy the client's D and Adam into the slot; returns the client's Adam step count."""
        D, opt = state.discriminator, state.optimizer
        torch._foreach_copy_(self.params + self.buffers, list(D.parameters()) + list(D.buffers()))
        own = [opt.state.get(p, {}) for p in D.parameters()]
        step = int(float(own[0].get("step", 0))) if own else 0
        for slot_p, st in zip(self.params, own, strict=True):
            mine = self.opt.state[slot_p]
            for name in ("exp_avg", "exp_avg_sq"):
                if name in st:
                    mine[name].copy_(st[name])
                else:
                    mine[name].zero_()
            mine["step"].fill_(step)
        return step

    @torch.no_grad()
    def store(self, state: ClientState, step: int) -> None:
        """Copy the slot back into the client's D and Adam (Adam's own format: a CPU step count)."""
        D, opt = state.discriminator, state.optimizer
        torch._foreach_copy_(list(D.parameters()) + list(D.buffers()), self.params + self.buffers)
        for p, slot_p in zip(D.parameters(), self.params, strict=True):
            mine = self.opt.state[slot_p]
            opt.state[p] = {
                "step": torch.tensor(float(step), dtype=torch.float32),
                "exp_avg": mine["exp_avg"].clone(),
                "exp_avg_sq": mine["exp_avg_sq"].clone(),
            }


_SLOTS: dict[SlotKey, CriticSlot] = {}


def slot_for(state: ClientState, batch_size: int, *, gp_weight: float, drift: float, capture: bool) -> CriticSlot:
    """The process's slot for this client's network shape and B (captured on first use)."""
    D = state.discriminator
    group = state.optimizer.param_groups[0]
    key = SlotKey(
        spec=D.spec,
        num_classes=D.num_classes,
        batch_size=batch_size,
        device=str(device_of(D)),
        gp_weight=gp_weight,
        drift=drift,
        lr=group["lr"],
        betas=tuple(group["betas"]),
        eps=group["eps"],
        capture=capture and device_of(D).type == "cuda",  # there is nothing to capture elsewhere
    )
    if key not in _SLOTS:
        _SLOTS[key] = CriticSlot(key, D)
    return _SLOTS[key]


class Critic(Protocol):
    """What a client's critic phase steps: its D (``D``, for a warm start's generator step), one
    WGAN-GP step at given interpolation weights, and the release's per-sample gradients."""

    D: nn.Module

    def critic_step(
        self, real: Tensor, real_y: Tensor, fake: Tensor, fake_y: Tensor, alpha: Tensor
    ) -> dict[str, Tensor]: ...

    def sample_grads(self, fake: Tensor, y: Tensor) -> Tensor: ...


class EagerCritic:
    """The client's own D and Adam, stepped eagerly: what runs without a slot (and with DPAC, whose
    release gradient mixes in the client's classifier)."""

    def __init__(self, state: ClientState, cfg: ExperimentConfig) -> None:
        self.D, self.opt, self.C = state.discriminator, state.optimizer, state.classifier
        self.cfg = cfg

    def critic_step(
        self, real: Tensor, real_y: Tensor, fake: Tensor, fake_y: Tensor, alpha: Tensor
    ) -> dict[str, Tensor]:
        cfg = self.cfg
        return critic_step(
            self.D, self.opt, real, real_y, fake, fake_y, gp_weight=cfg.gp_weight, drift=cfg.drift, alpha=alpha
        )

    def sample_grads(self, fake: Tensor, y: Tensor) -> Tensor:
        return combined_sample_grads(self.D, self.C, fake, y, self.cfg.dpac_beta)


class SlotCritic:
    """A client loaded into a slot: the same calls as ``EagerCritic``, on the slot's template."""

    def __init__(self, slot: CriticSlot) -> None:
        self.slot = slot
        self.D = slot.D
        self.steps = 0

    def critic_step(
        self, real: Tensor, real_y: Tensor, fake: Tensor, fake_y: Tensor, alpha: Tensor
    ) -> dict[str, Tensor]:
        self.steps += 1
        return self.slot.critic_step(real, real_y, fake, fake_y, alpha)

    def sample_grads(self, fake: Tensor, y: Tensor) -> Tensor:
        return self.slot.sample_grads(fake, y)


def use_graphs(state: ClientState, cfg: ExperimentConfig, batch_size: int) -> bool:
    """Graphs where they pay: asked for, a CUDA discriminator, a graphable client, and a partition
    of at least B images (the static inputs have B rows)."""
    return (
        cfg.cuda_graphs
        and device_of(state.discriminator).type == "cuda"
        and graphable(state)
        and len(state.data.labels) >= batch_size
    )


@contextmanager
def critic_session(
    state: ClientState, cfg: ExperimentConfig, batch_size: int, *, slot: bool | None = None, capture: bool = True
) -> Iterator[Critic]:
    """The critic this client's phase steps: its own modules eagerly, or a slot it is loaded into
    now and written back from when the block ends without an error (on an error the client's own
    objects are left as they were before the block). ``slot`` forces the choice (default:
    ``use_graphs``); ``capture=False`` runs a slot's bodies without capturing them (the CPU tests
    of the copy in and out)."""
    if not (use_graphs(state, cfg, batch_size) if slot is None else slot):
        yield EagerCritic(state, cfg)
        return
    target = slot_for(state, batch_size, gp_weight=cfg.gp_weight, drift=cfg.drift, capture=capture)
    start = target.load(state)
    critic = SlotCritic(target)
    yield critic
    target.store(state, start + critic.steps)
