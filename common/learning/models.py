"""Conditional generator and discriminator for 1x28x28 images (GS-WGAN, Chen et al. 2020).

Three presets share one structure and differ only in width (see ``PRESET_SPECS``):

- ``paper``: the official GS-WGAN MNIST networks. Generator: a ResNet (adapted from BigGAN) with
  pixel norm and spectral norm, 4x4 -> 8 -> 16 -> 32 by three upsampling blocks, a 3x3 output conv
  without padding (30x30), sigmoid, top-left crop to 28x28; about 3.83M parameters. Discriminator:
  DCGAN (three 5x5 stride-2 convs, 28 -> 14 -> 7 -> 4) with spectral norm and a projection label
  term, ``linear(h) + <embed(y), h>``; about 1.07M parameters. Far too slow for two CPU cores.
- ``small``: the CPU default, the same layers at smaller width (the generator's channels shrink
  as resolution grows, since the cost of a block grows with its resolution squared).
- ``tiny``: a few thousand parameters, for tests.

The latent is a Bernoulli(0.5) code ``z`` concatenated with the one-hot label.

The discriminator never mixes samples of a batch (no BatchNorm; spectral norm's power iteration
depends on the weights only), so its output for sample i depends on input i alone. GS-WGAN's
per-sample input gradients, and hence its privacy analysis, rely on this.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import spectral_norm

IMAGE_SHAPE = (1, 28, 28)
PRESETS = ("tiny", "small", "paper")

# Pixel norm's epsilon. The official code uses 1e-10; at an all-zero pixel (after ReLU) the
# gradient of x * rsqrt(mean(x^2) + eps) is eps^-1/2, so a larger epsilon keeps it finite-sized.
_PIXEL_NORM_EPS = 1e-8

# Feature maps are kept channels-last: on CPU (oneDNN) the generator's convolutions and nearest
# upsampling run faster in that layout (about 1.4x for the whole ``small`` G). Values are unchanged.
_CL = torch.channels_last


@dataclass(frozen=True)
class GeneratorSpec:
    """Widths of the ResNet generator.

    ``channels[0]`` is the width of the 4x4 map produced by the input linear layer; each further
    entry is the output width of one upsampling residual block (three blocks: 8, 16, 32 pixels).
    """

    channels: tuple[int, int, int, int]
    spectral_norm: bool = True


@dataclass(frozen=True)
class DiscriminatorSpec:
    """Widths of the three stride-2 convs of the DCGAN discriminator (14, 7, 4 pixels)."""

    channels: tuple[int, int, int]
    spectral_norm: bool = True


PRESET_SPECS: dict[str, tuple[GeneratorSpec, DiscriminatorSpec]] = {
    # Official GS-WGAN: model_dim 64, generator width 4 * 64 throughout.
    "paper": (GeneratorSpec((256, 256, 256, 256)), DiscriminatorSpec((64, 128, 256))),
    # CPU default, sized so one full GS-WGAN step (B=32, n_critic=5) takes ~0.15 s on two cores.
    # Each block's cost grows with c_in * c_out * resolution^2, so the generator narrows
    # quickly as it upsamples; the discriminator is the paper's at a quarter of the width.
    "small": (GeneratorSpec((128, 48, 16, 8)), DiscriminatorSpec((16, 32, 64))),
    "tiny": (GeneratorSpec((16, 8, 8, 4)), DiscriminatorSpec((4, 8, 8))),
}


def _sn(module: nn.Module, enabled: bool) -> nn.Module:
    """Wrap ``module`` in spectral norm (one power iteration per training forward) if enabled."""
    return spectral_norm(module) if enabled else module


def pixel_norm(x: Tensor, eps: float = _PIXEL_NORM_EPS) -> Tensor:
    """Normalize each pixel's feature vector to unit RMS (ProGAN); acts per sample."""
    return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + eps)


def sample_latent(batch_size: int, z_dim: int, *, generator: torch.Generator | None = None) -> Tensor:
    """Draw ``[batch_size, z_dim]`` latents with i.i.d. Bernoulli(0.5) entries in {0, 1}."""
    bits = torch.randint(0, 2, (batch_size, z_dim), generator=generator)
    return bits.to(torch.float32)


def device_of(module: nn.Module) -> torch.device:
    """The device of ``module``'s parameters (where its inputs must be)."""
    return next(module.parameters()).device


def on_cpu(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict (or delta) with every tensor on the CPU, ready for the wire (the networks may
    live on a GPU)."""
    return {k: v.cpu() for k, v in tensors.items()}


def count_params(module: nn.Module) -> int:
    """Number of parameter entries (spectral norm's power-iteration vectors are buffers, so they
    are not counted; the official code keeps them as parameters, which adds ~0.6% to its G)."""
    return sum(p.numel() for p in module.parameters())


class UpBlock(nn.Module):
    """Residual block doubling the resolution: pixel norm, upsample, conv3x3, pixel norm, ReLU,
    conv3x3, plus a 1x1-conv shortcut on the upsampled input (layout of the official GBlock)."""

    def __init__(self, in_channels: int, out_channels: int, *, sn: bool) -> None:
        super().__init__()
        self.conv1 = _sn(nn.Conv2d(in_channels, out_channels, 3, padding=1), sn)
        self.conv2 = _sn(nn.Conv2d(out_channels, out_channels, 3, padding=1), sn)
        # Learnable shortcut: the official block always has one because it upsamples.
        self.shortcut = _sn(nn.Conv2d(in_channels, out_channels, 1), sn)

    def forward(self, x: Tensor) -> Tensor:
        h = F.interpolate(pixel_norm(x), scale_factor=2, mode="nearest")
        h = self.conv2(F.relu(pixel_norm(self.conv1(h))))
        return h + self.shortcut(F.interpolate(x, scale_factor=2, mode="nearest"))


class ResNetGenerator(nn.Module):
    """Conditional ResNet generator: ``(z [B, z_dim], y [B]) -> [B, 1, 28, 28]`` in [0, 1]."""

    def __init__(self, spec: GeneratorSpec, *, z_dim: int = 10, num_classes: int = 10) -> None:
        super().__init__()
        self.z_dim = z_dim
        self.num_classes = num_classes
        self.spec = spec
        c0 = spec.channels[0]
        self.fc = _sn(nn.Linear(z_dim + num_classes, 4 * 4 * c0), spec.spectral_norm)
        self.blocks = nn.Sequential(
            *(
                UpBlock(c_in, c_out, sn=spec.spectral_norm)
                for c_in, c_out in zip(spec.channels[:-1], spec.channels[1:], strict=False)
            )
        )
        # No padding: 32x32 -> 30x30, then cropped to 28x28 (as in the official code).
        self.to_image = _sn(nn.Conv2d(spec.channels[-1], IMAGE_SHAPE[0], 3), spec.spectral_norm)

    def forward(self, z: Tensor, y: Tensor) -> Tensor:
        y_onehot = F.one_hot(y.long(), self.num_classes).to(z.dtype)
        h = self.fc(torch.cat([z, y_onehot], dim=1))
        h = h.view(z.shape[0], self.spec.channels[0], 4, 4).contiguous(memory_format=_CL)
        h = self.to_image(self.blocks(pixel_norm(F.relu(h))))
        return torch.sigmoid(h[:, :, : IMAGE_SHAPE[1], : IMAGE_SHAPE[2]]).contiguous()


class ProjectionDiscriminator(nn.Module):
    """Conditional DCGAN critic with a projection label term: ``(x [B,1,28,28], y [B]) -> [B]``.

    score(x, y) = w^T h(x) + b + <embed(y), h(x)>  (Miyato & Koyama 2018), h the flattened features.
    """

    def __init__(self, spec: DiscriminatorSpec, *, num_classes: int = 10) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.spec = spec
        c1, c2, c3 = spec.channels
        sn = spec.spectral_norm
        self.convs = nn.ModuleList(
            _sn(nn.Conv2d(c_in, c_out, 5, stride=2, padding=2), sn)
            for c_in, c_out in ((IMAGE_SHAPE[0], c1), (c1, c2), (c2, c3))
        )
        features = c3 * 4 * 4
        self.linear = _sn(nn.Linear(features, 1), sn)
        self.embed = _sn(nn.Embedding(num_classes, features), sn)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        h = x.reshape(x.shape[0], *IMAGE_SHAPE).contiguous(memory_format=_CL)
        for conv in self.convs:
            h = F.relu(conv(h))
        h = h.flatten(1)
        return self.linear(h).squeeze(1) + (self.embed(y.long()) * h).sum(dim=1)


def _spec(preset: str) -> tuple[GeneratorSpec, DiscriminatorSpec]:
    if preset not in PRESET_SPECS:
        raise ValueError(f"unknown model preset {preset!r}; expected one of {', '.join(PRESETS)}")
    return PRESET_SPECS[preset]


def build_generator(preset: str, *, z_dim: int = 10, num_classes: int = 10) -> ResNetGenerator:
    """The conditional generator of ``preset`` (one of ``PRESETS``)."""
    return ResNetGenerator(_spec(preset)[0], z_dim=z_dim, num_classes=num_classes)


def build_discriminator(preset: str, *, num_classes: int = 10) -> ProjectionDiscriminator:
    """The conditional projection discriminator of ``preset`` (one of ``PRESETS``)."""
    return ProjectionDiscriminator(_spec(preset)[1], num_classes=num_classes)


# --- exponential moving average of the generator (the released model) ------------------------


def ema_init(model: nn.Module) -> nn.Module:
    """A frozen copy of ``model`` to hold the moving average (kept in eval mode)."""
    ema = copy.deepcopy(model).eval()
    ema.requires_grad_(False)
    return ema


@torch.no_grad()
def ema_update(ema: nn.Module, model: nn.Module, decay: float, *, step: int | None = None) -> float:
    """``ema <- d * ema + (1 - d) * model`` over parameters; buffers are copied. Returns d used.

    With ``step`` (0-based count of updates so far), ``d = min(decay, (1 + step) / (10 + step))``
    (TensorFlow's ``num_updates`` rule): the average forgets the random initialization at once and
    its horizon grows with the run, about ``10 + step`` iterates, until it reaches ``1/(1-decay)``.
    The rule ``1 - 1/(step + 1)`` used before made the average *uniform* over every iterate up to
    step ``1/(1-decay)``, so a 300-step run released the mean of mostly untrained generators.
    Buffers (spectral norm's power-iteration vectors) are copied from ``model``: they track the
    live weights' top singular vectors, which the averaged weights share to first order.
    """
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"EMA decay must lie in [0, 1], got {decay}")
    d = decay if step is None else min(decay, (1.0 + step) / (10.0 + step))
    for p_ema, p in zip(ema.parameters(), model.parameters(), strict=True):
        p_ema.lerp_(p.detach(), 1.0 - d)
    for b_ema, b in zip(ema.buffers(), model.buffers(), strict=True):
        b_ema.copy_(b)
    return d


class GeneratorEMA:
    """Holds the EMA copy of a generator and its update counter; ``module`` is what is released."""

    def __init__(self, model: nn.Module, decay: float = 0.999, *, warmup: bool = True) -> None:
        self.module = ema_init(model)
        self.decay = decay
        self.warmup = warmup
        self.num_updates = 0

    def update(self, model: nn.Module) -> float:
        """Fold ``model``'s current weights into the average; returns the decay applied."""
        return ema_update(self.module, model, self.next_decay())

    def next_decay(self) -> float:
        """The decay of the next update (``ema_update``'s ``num_updates`` rule when warming up),
        counted as applied: for callers that apply it themselves (a CUDA graph's update)."""
        step = self.num_updates
        d = min(self.decay, (1.0 + step) / (10.0 + step)) if self.warmup else self.decay
        self.num_updates += 1
        return d

    def state_dict(self) -> dict:
        return {"module": self.module.state_dict(), "num_updates": self.num_updates}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["module"])
        self.num_updates = int(state["num_updates"])
