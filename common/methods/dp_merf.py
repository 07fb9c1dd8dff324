"""DP-MERF (Harder, Adamczewski, Park 2021), federated at client level: the whole method, framework-free.

Why it is here: GS-WGAN spends a client's budget on every query it answers, so at an honest
per-client ε the noise per generator step only falls as the federation grows, and every client of a
large federation needs a trained discriminator (README, "Privacy–utility frontier"). DP-MERF spends
it once: each client releases a single noisy summary of its data and never speaks again; the
generator is then fitted to the average of those summaries on the server, as post-processing.

- **The summary** (``embed``): the mean, over the client's examples, of ``φ(x) ⊗ onehot(y)``, where
  ``φ`` maps an image to random Fourier features of a Gaussian kernel (``FeatureMap``: public
  frequencies drawn from the run's seed, a public length scale, optionally on the image's k×k lowest
  2-D DCT coefficients) plus one constant coordinate that carries the class counts. ``‖φ(x)‖ = 1``
  for every x, so the summary's Frobenius norm is at most 1 whatever the client holds.
- **The release** (``release``): the client clips its summary to L2 norm S (``merf_clip``; S = 1 clips
  nothing), so replacing its whole data moves the release by at most 2S, and adds N(0, (2σS)²) to
  every coordinate: one Gaussian mechanism with noise multiplier σ, recorded once in the client's
  ledger. A node's budget refuses any second release.
- **The server** (``MerfGenerator``): the mean of the noisy summaries is the target; G takes Adam
  steps on ``Σ_c ‖w_c · mean φ(G(z, c)) − target_c‖²`` (the class weights ``w_c`` read from the
  count coordinate); its EMA is released. Nothing after the releases touches private data.
- **Messages**: ``train.dpmerf`` carries a ``MerfRequest`` and its ``MerfRelease``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from common.calibration import ledger_epsilon, smallest_noise
from common.codec import PayloadError
from common.data import num_classes_for
from common.device import resolve_device
from common.models import GeneratorEMA, build_generator, sample_latent
from common.options import check, check_all, option
from common.privacy import NodePolicy, PrivacyEvent
from common.privacy.dct import to_coefficients
from common.privacy.events import VOID_NOISE_SEED
from common.privacy.sanitizer import release_noise_source

if TYPE_CHECKING:  # types only: common.config composes this module's options
    from common.client_state import ClientState
    from common.config import ExperimentConfig

MSG_EMBED = "train.dpmerf"  # Flower routes by category ("train") and action
STEP_LABEL = "generator steps"
ACCEPTS_PRIOR_RELEASES = False
UNBOUNDED_AGAINST_SERVER = False
CLIENT_DISCRIMINATOR = False  # a client keeps no private D: its state is its ledger and its partition
MIN_CLIENT_IMAGES = 1  # a client draws no batches: one image makes a summary
SIDE = 28
FREQUENCY_STREAM = 0x3E5F  # the public frequencies' seed is derived from the run's seed and this


@dataclass(frozen=True)
class Options:
    """DP-MERF's section of the configuration."""

    merf_features: int = option(
        200,
        "dp-merf: random Fourier frequencies D of the kernel's features (each class's summary has 2D+1 "
        "coordinates); fewer features carry less noise in all but approximate the kernel more coarsely",
    )
    merf_lengthscale: float = option(
        8.0,
        "dp-merf: length scale of the Gaussian kernel on the kernel's input (pixels in [0, 1] or their DCT "
        "coefficients); a public constant, never estimated from the clients' data (that would leak)",
    )
    merf_dct: int = option(
        10,
        "dp-merf: k > 0: the kernel sees each image's k x k lowest 2-D DCT frequencies (a fixed public basis), "
        "so the summary spends its budget on shapes rather than pixel detail; 0: all 28 x 28 pixels",
    )
    merf_count_share: float = option(
        0.1,
        "dp-merf: share of each summary's squared norm spent on the class counts, from which the server "
        "estimates the class proportions (0: assume them uniform)",
    )
    merf_clip: float = option(
        1.0,
        "dp-merf: L2 bound S each client's summary is clipped to before the noise (sensitivity 2S, noise std "
        "2*sigma*S); a summary's norm is at most 1, and at most 1/sqrt(C) for a client whose data is spread "
        "evenly over C classes, so S = 1/sqrt(C) clips nothing of a balanced client and cuts the noise "
        "sqrt(C)-fold, while a client holding few classes is scaled down; 1: nothing is ever clipped",
    )
    merf_noise_multiplier: float = option(
        1.0, "dp-merf: sigma of each client's single release: noise std 2*sigma*S per coordinate (sensitivity 2S)"
    )
    merf_batch: int = option(16, "dp-merf: generated samples per class in each generator step")
    merf_lr: float = option(1e-3, "dp-merf: the generator's Adam learning rate (betas 0.9, 0.999)")


def validate(c: ExperimentConfig) -> None:
    """The section's own checks (``ExperimentConfig`` runs them with every other section's)."""
    check_all(c, ("merf_features", "merf_batch"), lambda v: v >= 1, "must be >= 1")
    check_all(c, ("merf_lengthscale", "merf_lr"), lambda v: v > 0, "must be > 0")
    check(0 < c.merf_clip <= 1, "merf_clip", c.merf_clip, "must be in (0, 1] (a summary's norm is at most 1)")
    check(0 <= c.merf_dct <= SIDE, "merf_dct", c.merf_dct, f"must be in [0, {SIDE}] (0: pixels)")
    check(0 <= c.merf_count_share < 1, "merf_count_share", c.merf_count_share, "must be in [0, 1)")
    check(c.merf_noise_multiplier >= 0, "merf_noise_multiplier", c.merf_noise_multiplier, "must be >= 0")


def generator_updates(cfg: ExperimentConfig, steps: int) -> int:
    """Generator updates in ``steps`` steps of the loop (for comparisons across methods)."""
    return steps


# --- messages -------------------------------------------------------------------------------------
@dataclass
class MerfRequest:
    """Server -> client: release your summary (once; the node's budget refuses a second)."""

    step: int


@dataclass
class MerfRelease:
    """Client -> server: the noisy summary ``[num_classes, 2D+1]`` float32, or a refusal.

    ``noise_multiplier`` is the mechanism the client ran (its ledger entry); the server charges the
    smaller of it and what the run asks for."""

    step: int
    refused: bool = False
    reason: str = ""
    embedding: np.ndarray | None = None
    noise_multiplier: float = 0.0

    def decoded(self, *, step: int, shape: tuple[int, int]) -> MerfRelease:
        """The release validated against the request it answers: its step, its shape, finite values."""
        if self.step != step:
            raise PayloadError(f"the release is for step {self.step}, expected step {step}")
        if self.refused:
            return self
        if self.embedding is None:
            raise PayloadError("the release carries no 'embedding' array")
        if tuple(self.embedding.shape) != tuple(shape):
            raise PayloadError(f"embedding has shape {tuple(self.embedding.shape)}, expected {tuple(shape)}")
        # The declared dtype, nothing else: an integer or bool array of the right shape would reach the
        # server's norm check and crash the run there (torch has no norm of an integer tensor).
        if self.embedding.dtype != np.float32:
            raise PayloadError(f"embedding has dtype {self.embedding.dtype}, expected float32")
        if not np.all(np.isfinite(self.embedding)):
            raise PayloadError("embedding contains NaN or infinite values")
        if not self.noise_multiplier >= 0:
            raise PayloadError(f"invalid privacy event: noise_multiplier={self.noise_multiplier}")
        return self


MESSAGES = {MSG_EMBED: (MerfRequest, MerfRelease)}


# --- the public feature map -----------------------------------------------------------------------
class FeatureMap:
    """``φ``: images ``[n, 1, 28, 28]`` in [0, 1] -> ``[n, 2D+1]`` rows of norm exactly 1.

    Random Fourier features of the Gaussian kernel ``exp(-‖u − u'‖² / 2ℓ²)`` on ``u`` (the pixels or
    their k×k lowest DCT coefficients), scaled to share ``1 − a`` of the squared norm, and one
    constant coordinate ``√a``: averaged per class, it is ``√a`` times the class's share of the data.
    Everything here is public: the frequencies come from the run's seed, on the CPU, so the server and
    every client build the same map without sending it.
    """

    def __init__(self, cfg: ExperimentConfig, device: torch.device | str = "cpu") -> None:
        self.dct = cfg.merf_dct
        self.features = cfg.merf_features
        dims = self.dct**2 if self.dct else SIDE * SIDE
        seed = torch.Generator().manual_seed(cfg.seed * 1_000_033 + FREQUENCY_STREAM)
        self.frequencies = (torch.randn(dims, self.features, generator=seed) / cfg.merf_lengthscale).to(device)
        self.scale = math.sqrt((1.0 - cfg.merf_count_share) / self.features)
        self.count = math.sqrt(cfg.merf_count_share)

    @property
    def dim(self) -> int:
        return 2 * self.features + 1

    def __call__(self, images: Tensor) -> Tensor:
        flat = to_coefficients(images, self.dct) if self.dct else images.reshape(images.shape[0], -1)
        phase = flat @ self.frequencies
        const = torch.full((images.shape[0], 1), self.count, device=images.device, dtype=phase.dtype)
        return torch.cat([phase.cos() * self.scale, phase.sin() * self.scale, const], dim=1)


def class_means(phi: Tensor, labels: Tensor, num_classes: int, *, total: int | None = None) -> Tensor:
    """``[C, dim]``: row c is ``Σ_{i: y_i = c} φ_i / total`` (``total`` defaults to n). With
    ``total = n`` this is the labelled mean embedding, of Frobenius norm at most 1."""
    out = torch.zeros(num_classes, phi.shape[1], device=phi.device, dtype=phi.dtype)
    return out.index_add_(0, labels, phi) / (total or phi.shape[0])


def embed(fmap: FeatureMap, images: Tensor, labels: Tensor, num_classes: int, *, chunk: int = 4096) -> Tensor:
    """The client's summary: its labelled mean embedding ``[C, 2D+1]`` (norm ≤ 1), in chunks of
    ``chunk`` images so a large client never holds all its features at once."""
    if images.shape[0] == 0 or images.shape[0] != labels.shape[0]:
        raise ValueError("images and labels must be non-empty and equally long")
    total = torch.zeros(num_classes, fmap.dim, device=images.device)
    for start in range(0, images.shape[0], chunk):
        sl = slice(start, start + chunk)
        total += class_means(fmap(images[sl]), labels[sl], num_classes, total=images.shape[0])
    return total


# --- privacy ------------------------------------------------------------------------------------
def release_noise(cfg: ExperimentConfig) -> float:
    """σ of the release a client makes (what a node's minimum noise is checked against)."""
    return cfg.merf_noise_multiplier


def nonprivate_options(cfg: ExperimentConfig) -> list[str]:
    return ["noise multiplier 0 (the summary released without noise)"] if cfg.merf_noise_multiplier == 0 else []


def client_void(cfg: ExperimentConfig) -> str:
    """Why a client's release in this run is not private (""): a fixed noise seed its node allowed."""
    return VOID_NOISE_SEED if cfg.noise_seed >= 0 else ""


def planned_event(cfg: ExperimentConfig) -> PrivacyEvent:
    """The mechanism one release runs: a Gaussian with noise multiplier σ (sensitivity 2, std 2σ)."""
    return PrivacyEvent(noise_multiplier=cfg.merf_noise_multiplier, sample_rate=1.0, void=client_void(cfg))


def calibrate(cfg: ExperimentConfig, *, pooled_size: int | None = None) -> ExperimentConfig:
    """σ for ``target_epsilon``: one release per client reaches the target; the target also becomes
    the clients' budget, so a second request is refused."""
    sigma = smallest_noise(lambda nm: ledger_epsilon(nm, 1.0, 1, cfg.delta), cfg.target_epsilon)
    budget = min(cfg.client_epsilon_budget or cfg.target_epsilon, cfg.target_epsilon)
    return cfg.replace(merf_noise_multiplier=sigma, client_epsilon_budget=budget)


# An honest release's noise exceeds 2σ(√d + TAIL) with probability below exp(-TAIL²/2) ≈ 1e-14.
HONEST_TAIL = 8.0


def honest_norm_bound(cfg: ExperimentConfig, coords: int) -> float:
    """The largest norm an honest release shows except with negligible probability: the clipped
    summary (≤ S) plus noise of std 2σS on each of its ``coords`` coordinates."""
    return cfg.merf_clip * (1.01 + 2 * cfg.merf_noise_multiplier * (math.sqrt(coords) + HONEST_TAIL))


def clip_summary(summary: Tensor, bound: float) -> Tensor:
    """``summary`` scaled to L2 norm at most ``bound`` (unchanged when already within it)."""
    return summary * min(1.0, bound / (float(summary.norm()) + 1e-12))


def noise_std(cfg: ExperimentConfig) -> float:
    """The noise std of a release: 2σS (replace-one sensitivity of a summary clipped to S is 2S)."""
    return 2.0 * cfg.merf_noise_multiplier * cfg.merf_clip


def release(
    state: ClientState,
    cfg: ExperimentConfig,
    request: MerfRequest,
    policy: NodePolicy,
    *,
    summary: Tensor | None = None,
) -> MerfRelease:
    """This client's one release, or a refusal when its budget would be exceeded (a second request
    is refused the same way: the budget is the target ε of a single release). ``summary``: a given
    summary instead of the client's own (a privacy audit's canary, ``fedgan audit``); it is clipped,
    noised and charged like any other."""
    event = planned_event(cfg)
    refusal = policy.release_refusal(state.ledger, event, cfg, "one more release")
    if refusal:
        return MerfRelease(step=request.step, refused=True, reason=f"client {state.client_id} refuses: {refusal}")
    if summary is None:
        device = resolve_device(cfg.device)
        images, labels = state.data.images.to(device), state.data.labels.to(device)
        summary = embed(FeatureMap(cfg, device), images, labels, num_classes_for(cfg))
    noise, void = release_noise_source(cfg.noise_seed, state.client_id, request.step)
    noisy = clip_summary(summary.cpu(), cfg.merf_clip) + noise_std(cfg) * torch.randn(summary.shape, generator=noise)
    ran = PrivacyEvent(noise_multiplier=cfg.merf_noise_multiplier, sample_rate=1.0, void=void or event.void)
    state.ledger.record(ran)
    state.version += 1
    return MerfRelease(
        step=request.step, embedding=noisy.numpy().astype(np.float32), noise_multiplier=ran.noise_multiplier
    )


# --- the server's side ----------------------------------------------------------------------------
class MerfGenerator:
    """G, its EMA (released), Adam, and the target it is fitted to: the mean of the noisy summaries."""

    def __init__(self, cfg: ExperimentConfig, num_classes: int) -> None:
        self.cfg, self.num_classes = cfg, num_classes
        self.device = resolve_device(cfg.device)
        torch.manual_seed(cfg.seed)
        self.model = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes).to(self.device)
        self.ema = GeneratorEMA(self.model, decay=cfg.ema_decay)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.merf_lr, betas=(0.9, 0.999))
        self.fmap = FeatureMap(cfg, self.device)
        self.rng = torch.Generator().manual_seed(cfg.seed)  # public: the latents
        self.target: Tensor | None = None
        self.releases = 0

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_classes, self.fmap.dim)

    def set_target(self, releases: list[Tensor]) -> None:
        """The target: the mean of the accepted noisy summaries (the count is public to the server)."""
        self.target = torch.stack(releases).mean(dim=0).to(self.device)
        self.releases = len(releases)

    def class_weights(self) -> Tensor:
        """Each class's share of the data, read from the target's count coordinate (uniform when the
        summaries carry no counts); clamped to [1e-3, 1] against the noise."""
        if self.target is None or self.cfg.merf_count_share == 0:
            return torch.full((self.num_classes,), 1.0 / self.num_classes, device=self.device)
        return (self.target[:, -1] / self.fmap.count).clamp(1e-3, 1.0)

    def step(self) -> float:
        """One Adam step on the squared distance between G's weighted class means and the target."""
        if self.target is None:
            raise RuntimeError("the generator has no target yet: no client's summary was accepted")
        per_class = self.cfg.merf_batch
        y = torch.arange(self.num_classes).repeat_interleave(per_class).to(self.device)
        z = sample_latent(len(y), self.cfg.z_dim, generator=self.rng).to(self.device)
        self.model.train()
        means = class_means(self.fmap(self.model(z, y)), y, self.num_classes, total=per_class)
        loss = (means * self.class_weights()[:, None] - self.target).square().sum()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.ema.update(self.model)
        return float(loss.detach())

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "ema": self.ema.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": self.rng.get_state(),
            "target": None if self.target is None else self.target.cpu(),
            "releases": self.releases,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.ema.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.set_state(state["rng"])
        target = state["target"]
        if target is not None and tuple(target.shape) != self.shape:
            raise ValueError(f"the checkpoint's target has shape {tuple(target.shape)}, this run's is {self.shape}")
        self.target = None if target is None else target.to(self.device)
        self.releases = int(state["releases"])
