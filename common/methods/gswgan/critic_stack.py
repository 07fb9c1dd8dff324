"""The m discriminators a GS-WGAN step samples, stepped together as one network.

Why: a client's critic phase is a few dozen small kernels per critic step (three strided convs, a
linear and an embedding, each with spectral norm's power iteration, then the gradient penalty's
double backward). m clients in turn pay that per-kernel overhead m times: on a GPU the launches,
not the arithmetic, set the time (issue 12: ~5,300 kernels per paper-scale iteration). Stacking the
m discriminators' weights along a leading axis turns every layer into one grouped convolution (or
one batched matrix product) over all m clients, so a step of m clients costs about as many kernels
as a step of one.

Nothing is shared between clients: the groups of a grouped convolution never mix, each client's
loss depends on its own weights, its own real batch (drawn with its own RNG) and the fakes sent to
it alone, and the gradient of the summed loss with respect to client k's weights is client k's
gradient. Spectral norm's power iteration and Adam run per client on its own slice (its own step
count). So every client ends with the weights, power-iteration vectors and Adam moments it would
have reached alone, up to float rounding (``tests/unit/common/methods/gswgan/test_critic_stack.py`` compares both
ways), and what it releases is sanitized, noised and charged by itself as before.

Only GS-WGAN's projection discriminator with spectral norm (every preset) in training mode is
stacked; ``stackable`` says when, and the caller falls back to one client at a time otherwise
(DPAC's classifier beside D, for one).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from common.client_state import ClientState
from common.learning.models import IMAGE_SHAPE, ProjectionDiscriminator

CONVS = ("convs.0", "convs.1", "convs.2")
SN_LAYERS = (*CONVS, "linear", "embed")
ORIGINAL = "parametrizations.weight.original"  # where torch's spectral_norm keeps the raw weight


def stackable(states: Sequence[ClientState]) -> bool:
    """Whether these clients' critic phases can run as one stacked network: two or more projection
    discriminators with spectral norm on every layer, in training mode, of one shape on one device,
    with Adam beside each and no DPAC classifier (its steps interleave with D's)."""
    if len(states) < 2:
        return False
    discs = [s.discriminator for s in states]
    if not all(isinstance(d, ProjectionDiscriminator) and d.training and d.spec.spectral_norm for d in discs):
        return False
    if any(s.classifier is not None or not isinstance(s.optimizer, torch.optim.Adam) for s in states):
        return False
    first = discs[0]
    same = all(  # one spec and one class count: the same parameter shapes
        d.spec == first.spec
        and d.num_classes == first.num_classes
        and next(d.parameters()).device == next(first.parameters()).device
        for d in discs
    )
    betas = states[0].optimizer.param_groups[0]["betas"]
    return same and all(_plain_adam(s.optimizer, betas) for s in states)


def _plain_adam(optimizer: torch.optim.Optimizer, betas: tuple[float, float]) -> bool:
    """Adam as ``adam_for`` makes it (one group, no weight decay, no AMSGrad, not maximizing, not
    capturable), with ``betas``: the stacked update shares them (learning rates may differ)."""
    groups = optimizer.param_groups
    return (
        len(groups) == 1
        and groups[0]["betas"] == betas
        and not groups[0]["weight_decay"]
        and not groups[0]["amsgrad"]
        and not groups[0]["maximize"]
        and not groups[0]["capturable"]
    )


class StackedCritics:
    """m clients' discriminators and Adam states, stacked for one step's critic phase.

    Built from the clients' own modules (copies of their tensors, stacked on a leading axis of
    size m), stepped as a whole, then written back into each client's module and optimizer by
    ``write_back``; until then the clients' own objects are untouched.
    """

    def __init__(self, states: Sequence[ClientState]) -> None:
        if not stackable(states):
            raise ValueError("these clients' discriminators cannot be stacked (see critic_stack.stackable)")
        self.states = list(states)
        discs = [s.discriminator for s in states]
        per_client = [list(d.parameters()) for d in discs]
        self.params = [
            torch.stack([p.detach() for p in ps]).requires_grad_(True) for ps in zip(*per_client, strict=True)
        ]
        names = [name for name, _ in discs[0].named_parameters()]
        self.by_name = dict(zip(names, self.params, strict=True))
        self.u = {n: torch.stack([_sn(d, n)._u for d in discs]) for n in SN_LAYERS}
        self.v = {n: torch.stack([_sn(d, n)._v for d in discs]) for n in SN_LAYERS}
        self.eps = _sn(discs[0], SN_LAYERS[0]).eps
        group = states[0].optimizer.param_groups[0]
        self.lr = [s.optimizer.param_groups[0]["lr"] for s in states]
        self.beta1, self.beta2 = group["betas"]
        self.adam_eps = group["eps"]
        self.step, self.exp_avg, self.exp_avg_sq = _stack_adam(states, per_client)

    # --- the stacked network --------------------------------------------------------------------
    def _weight(self, layer: str) -> Tensor:
        """The spectrally normalized weight of ``layer`` for every client, ``[m, *shape]``, after one
        power iteration, as each client's ``torch.nn.utils.parametrizations.spectral_norm`` does in
        training mode every time its forward reads the weight."""
        w = self.by_name[f"{layer}.{ORIGINAL}"]
        mat = w.flatten(2)  # [m, rows, cols]: spectral_norm's matrix view of each weight (dim 0)
        with torch.no_grad():
            u = F.normalize(torch.bmm(mat, self.v[layer].unsqueeze(2)).squeeze(2), dim=1, eps=self.eps)
            v = F.normalize(torch.bmm(mat.transpose(1, 2), u.unsqueeze(2)).squeeze(2), dim=1, eps=self.eps)
            self.u[layer], self.v[layer] = u, v
        sigma = (u * torch.bmm(mat, v.unsqueeze(2)).squeeze(2)).sum(dim=1)
        return w / sigma.view(-1, *([1] * (w.dim() - 1)))

    def scores(self, x: Tensor, y: Tensor) -> Tensor:
        """``[m, n, 1, 28, 28]`` images and ``[m, n]`` labels -> ``[m, n]`` scores: row k is client
        k's discriminator on its own n inputs (``ProjectionDiscriminator.forward`` for each k)."""
        m, n = y.shape
        h = x.reshape(m, n, *IMAGE_SHAPE[1:]).transpose(0, 1)  # [n, m, 28, 28]: one input channel per client
        for layer in CONVS:
            w = self._weight(layer)
            bias = self.by_name[f"{layer}.bias"].flatten()
            h = F.relu(F.conv2d(h, w.flatten(0, 1), bias, stride=2, padding=2, groups=m))
        h = h.reshape(n, m, -1).transpose(0, 1)  # [m, n, features], each client's h.flatten(1)
        linear = torch.baddbmm(self.by_name["linear.bias"].unsqueeze(1), h, self._weight("linear").transpose(1, 2))
        embed = self._weight("embed")  # [m, classes, features]
        rows = torch.gather(embed, 1, y.long().unsqueeze(2).expand(-1, -1, embed.shape[2]))
        return linear.squeeze(2) + (rows * h).sum(dim=2)

    # --- the critic phase -----------------------------------------------------------------------
    def critic_step(
        self,
        real: Tensor,
        real_y: Tensor,
        fake: Tensor,
        fake_y: Tensor,
        alpha: Tensor,
        *,
        gp_weight: float,
        drift: float,
    ) -> dict[str, Tensor]:
        """One WGAN-GP step of every client (``common.learning.losses.critic_step`` per client), each on its
        own ``[m, B, ...]`` slice; ``alpha`` ``[m, B, 1, 1, 1]`` are the interpolation weights each
        client drew. Returns each statistic as an ``[m]`` tensor (before the step)."""
        B = real.shape[1]
        fake = fake.detach()
        scores = self.scores(torch.cat([real, fake], dim=1), torch.cat([real_y, fake_y], dim=1))
        d_real, d_fake = scores[:, :B], scores[:, B:]
        x_hat = (alpha * real.detach() + (1 - alpha) * fake).requires_grad_(True)
        (grad,) = torch.autograd.grad(self.scores(x_hat, real_y).sum(), x_hat, create_graph=True)
        gp = (grad.flatten(2).norm(2, dim=2) - 1).pow(2).mean(dim=1)
        loss = d_fake.mean(dim=1) - d_real.mean(dim=1) + gp_weight * gp + drift * d_real.pow(2).mean(dim=1)
        grads = torch.autograd.grad(loss.sum(), self.params)
        self._adam(grads)
        return {
            "wasserstein": d_real.detach().mean(dim=1) - d_fake.detach().mean(dim=1),
            "gp": gp.detach(),
            "d_real": d_real.detach().mean(dim=1),
            "d_fake": d_fake.detach().mean(dim=1),
            "loss": loss.detach(),
        }

    def sample_grads(self, fake: Tensor, y: Tensor) -> Tensor:
        """Per client and sample ``d(-D_k(x_i, y_i)) / dx_i``, ``[m, B, ...]`` like ``fake``
        (``common.learning.losses.generator_sample_grads`` per client)."""
        x = fake.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(-self.scores(x, y).sum(), x)
        return grad

    @torch.no_grad()
    def _adam(self, grads: Sequence[Tensor]) -> None:
        """``torch.optim.Adam``'s update (single-tensor form, no weight decay) per client: each client
        has its own step count, hence its own bias corrections, and its own learning rate."""
        lr = torch.tensor(self.lr, dtype=torch.float64)
        for j, (param, grad) in enumerate(zip(self.params, grads, strict=True)):
            # The step counts and bias corrections live on the CPU (as Adam keeps its step): the
            # device only receives two [m] vectors, and nothing waits for it.
            self.step[j] += 1
            step = self.step[j].to(torch.float64)
            bias1 = 1 - torch.pow(self.beta1, step)
            bias2_sqrt = (1 - torch.pow(self.beta2, step)).sqrt()
            shape = (-1, *([1] * (param.dim() - 1)))
            step_size = (lr / bias1).to(param.device, param.dtype, non_blocking=True).view(shape)
            bias2_sqrt = bias2_sqrt.to(param.device, param.dtype, non_blocking=True).view(shape)
            self.exp_avg[j].lerp_(grad, 1 - self.beta1)
            self.exp_avg_sq[j].mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
            denom = (self.exp_avg_sq[j].sqrt() / bias2_sqrt).add_(self.adam_eps)
            param.sub_(step_size * self.exp_avg[j] / denom)

    # --- back to the clients --------------------------------------------------------------------
    @torch.no_grad()
    def write_back(self) -> None:
        """Each client's slice into its own discriminator, power-iteration vectors and Adam state,
        as if it had taken the steps alone (its state file keeps the same format)."""
        for k, state in enumerate(self.states):
            disc, optimizer = state.discriminator, state.optimizer
            for j, p in enumerate(disc.parameters()):
                p.copy_(self.params[j][k])
                optimizer.state[p] = {
                    "step": torch.tensor(float(self.step[j][k]), dtype=torch.float32),
                    "exp_avg": self.exp_avg[j][k].clone(),
                    "exp_avg_sq": self.exp_avg_sq[j][k].clone(),
                }
            for layer in SN_LAYERS:
                _sn(disc, layer)._u.copy_(self.u[layer][k])
                _sn(disc, layer)._v.copy_(self.v[layer][k])


def _sn(disc: torch.nn.Module, layer: str) -> torch.nn.Module:
    """The spectral-norm parametrization of ``layer`` (it holds ``_u``, ``_v`` and ``eps``)."""
    return disc.get_submodule(layer).parametrizations.weight[0]


def _stack_adam(
    states: Sequence[ClientState], per_client: list[list[Tensor]]
) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """Per parameter: the clients' step counts ``[m]`` and moments ``[m, *shape]`` (zeros and step 0
    for a client whose Adam has not stepped yet, as Adam's own lazy state starts)."""
    steps, avg, avg_sq = [], [], []
    for j in range(len(per_client[0])):
        rows = [s.optimizer.state.get(ps[j], {}) for s, ps in zip(states, per_client, strict=True)]
        like = per_client[0][j].detach()
        steps.append(torch.tensor([float(r.get("step", 0.0)) for r in rows]))  # on the CPU, as Adam's
        avg.append(torch.stack([r["exp_avg"] if "exp_avg" in r else torch.zeros_like(like) for r in rows]))
        avg_sq.append(torch.stack([r["exp_avg_sq"] if "exp_avg_sq" in r else torch.zeros_like(like) for r in rows]))
    return steps, avg, avg_sq
