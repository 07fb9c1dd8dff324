"""Centralized DPGAN (Bie, Kamath, Zhang 2023), framework-free: the whole method.

All partitions are pooled on one curator node (client 0), which trains D with DP-SGD
(``common/dpsgd.py``: Opacus, secret Poisson batches q = B/N, per-example clipping of real and fake
rows) and G by post-processing, and returns G's weights every round; the server keeps the EMA, the
released model. Each round the curator takes n_D DP steps, then one generator step, updates the
adaptive n_D, records the steps that added noise in its ledger, and persists its state (D, G, both
optimizers, the schedule, the ledger, the public RNG) on its own disk.

The Poisson batches come from a secret sampler (the OS CSPRNG, nothing saved): amplification at
q = B/N holds only if nobody can tell which examples a step used, and the run's seed is published
in config.json. ``--sampling-seed`` (tests only) makes them reproducible and every event void.
ε is example-level, with the curator trusted: ``calibrate`` picks σ for ``--target-epsilon`` and
makes the target the curator's budget, so an adaptive n_D that outgrows the plan stops there.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from common.calibration import subsampled_noise
from common.codec import PayloadError
from common.data import load_client_partition, num_classes_for
from common.device import resolve_device
from common.dpac import REAL_DATA_MODES, build_classifier
from common.dpsgd import AdaptiveND, DpClassifierTrainer, DpDiscriminatorTrainer, build_dpgan_discriminator
from common.grouping import BOUND_RULES, GROUPINGS, NOISE_FORMS
from common.messages import StateDict, Stats
from common.models import build_generator, sample_latent
from common.options import check, check_all, check_choice, option
from common.privacy import PrivacyEvent, PrivacyLedger, Sampler, noise_generator
from common.privacy.events import VOID_NOISE_SEED
from common.privacy.node_ledger import pooled_event
from common.public_warmup import pretrain_gan, public_batch
from common.tensor_files import load_tensors, save_tensors

if TYPE_CHECKING:  # a type only: common.config composes this module's options
    from common.config import ExperimentConfig

MSG_ROUND = "train.dpgan"
CURATOR = 0  # the client id of the node that pools every partition
STEP_LABEL = "generator steps"
ACCEPTS_PRIOR_RELEASES = False
UNBOUNDED_AGAINST_SERVER = False
SUPPORTS_DPAC = True  # centralized DPAC: C trained with DP-SGD on the curator, charged like D's steps
LOSSES = ("ns", "wgan-gp")


@dataclass(frozen=True)
class Options:
    """Centralized DPGAN's section of the configuration."""

    dpgan_noise_multiplier: float = option(1.0, "dpgan: DP-SGD noise multiplier sigma (noise std sigma*C)")
    dpgan_clip: float = option(1.0, "dpgan: per-example clipping bound C of D's gradient")
    dpgan_batch_size: int = option(128, "dpgan: expected real batch B (Poisson sampling with q = B/N)")
    dpgan_n_d: int = option(5, "dpgan: discriminator steps per generator step (initial value when adaptive)")
    dpgan_adaptive: bool = option(False, "dpgan: adapt n_D when D's EMA accuracy on fakes drops below the threshold")
    dpgan_adaptive_threshold: float = option(0.6, "dpgan: threshold d of the adaptive n_D schedule")
    dpgan_loss: str = option("ns", f"dpgan: discriminator loss, one of {', '.join(LOSSES)}")
    dpgan_lr: float = option(2e-4, "dpgan: Adam learning rate of D and G")
    dpgan_clip_groups: str = option(
        "none",
        "dpgan: dpGAN's parameter grouping, clipping each example's gradient group by group: none, weight-bias "
        "(all weights / all biases) or layer (each tensor); the sensitivity is the norm over the groups' bounds, "
        "which always equals dpgan-clip, so sigma and epsilon are those of flat clipping",
    )
    dpgan_group_bounds: str = option(
        "equal",
        "dpgan: the groups' bounds: equal (dpgan-clip/sqrt(groups) each) or public (dpGAN's adaptive bounds: "
        "proportional to each group's median per-example gradient norm on a public batch, rescaled to "
        "dpgan-clip; needs public-data; costs no privacy)",
    )
    dpgan_group_noise: str = option(
        "isotropic",
        "dpgan: the grouped noise, isotropic (sigma * dpgan-clip on every coordinate, Opacus' per-layer form) or "
        "proportional (sigma * sqrt(groups) * C_j on group j: the same mechanism, smaller noise on small groups)",
    )
    dpgan_bounds_every: int = option(10, "dpgan: rounds between re-estimations of public group bounds")


def validate(c: ExperimentConfig) -> None:
    check_choice(c, "dpgan_loss", LOSSES)
    check_choice(c, "dpgan_clip_groups", GROUPINGS)
    check_choice(c, "dpgan_group_bounds", BOUND_RULES)
    check_choice(c, "dpgan_group_noise", NOISE_FORMS)
    check(c.dpgan_bounds_every >= 1, "dpgan_bounds_every", c.dpgan_bounds_every, "must be >= 1")
    check(
        c.dpgan_group_bounds == "equal" or (c.public_data and c.dpgan_clip_groups != "none"),
        "dpgan_group_bounds",
        c.dpgan_group_bounds,
        "public bounds need public-data and a dpgan-clip-groups other than none",
    )
    check_all(c, ("dpgan_batch_size", "dpgan_n_d"), lambda v: v >= 1, "must be >= 1")
    check_all(c, ("dpgan_clip", "dpgan_lr"), lambda v: v > 0, "must be > 0")
    check(
        c.dpgan_noise_multiplier > 0,
        "dpgan_noise_multiplier",
        c.dpgan_noise_multiplier,
        "must be > 0 (Opacus needs noise)",
    )
    check(
        0 < c.dpgan_adaptive_threshold < 1, "dpgan_adaptive_threshold", c.dpgan_adaptive_threshold, "must be in (0, 1)"
    )


@dataclass
class DpganRound:
    """Server -> curator: run round ``step``."""

    step: int


@dataclass
class DpganReply:
    """The curator's round: G's weights, the statistics of D on fakes, and its whole ledger; or a refusal."""

    step: int
    refused: bool
    reason: str
    noise_multiplier: float
    sample_rate: float
    n_d: int | None = None
    discriminator_steps: int | None = None
    ledger: str | None = None
    stats: Stats = field(default_factory=dict)
    generator: StateDict | None = None

    def decoded(self, *, step: int, like: StateDict | None = None) -> DpganReply:
        """The reply checked against the round it answers and, given ``like`` (the server's G),
        its generator against G (``generator_mismatch``)."""
        if self.step != step:
            raise PayloadError(f"the reply is for round {self.step}, expected round {step}")
        if not self.refused and (self.generator is None or self.ledger is None or self.n_d is None):
            raise PayloadError("a round's reply lacks the generator, the ledger or n_D")
        problem = generator_mismatch(self.generator, like) if like is not None and not self.refused else ""
        if problem:
            raise PayloadError(f"the reply's generator cannot be G: {problem}")
        return self


def generator_mismatch(state: StateDict, like: StateDict) -> str:
    """Why ``state`` cannot replace the server's G (""): other entries, another shape or dtype
    (loading it would crash the run), or a NaN or infinite value (the EMA, the released model, would
    take it). G is post-processing of the DP discriminator, so saying why releases nothing more."""
    if state.keys() != like.keys():
        missing, extra = sorted(set(like) - set(state)), sorted(set(state) - set(like))
        return f"its entries differ from G's (missing {missing[:3]}, unexpected {extra[:3]})"
    for name, t in state.items():
        ref = like[name]
        if tuple(t.shape) != tuple(ref.shape) or t.dtype != ref.dtype:
            return f"{name} is {t.dtype} of shape {tuple(t.shape)}, expected {ref.dtype} of shape {tuple(ref.shape)}"
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return f"{name} contains NaN or infinite values"
    return ""


MESSAGES = {MSG_ROUND: (DpganRound, DpganReply)}


def generator_updates(cfg: ExperimentConfig, steps: int) -> int:
    """Generator updates in ``steps`` steps of the loop (for comparisons across methods)."""
    return steps


# --- privacy ------------------------------------------------------------------------------------
def release_noise(cfg: ExperimentConfig) -> float:
    return cfg.dpgan_noise_multiplier


def nonprivate_options(cfg: ExperimentConfig) -> list[str]:
    return ["reproducible DP-SGD batches (sampling-seed, testing only)"] if cfg.sampling_seed >= 0 else []


def calibrate(cfg: ExperimentConfig, *, pooled_size: int | None = None) -> ExperimentConfig:
    """σ for the example-level ε of steps × n_D Poisson-subsampled DP-SGD steps (q = B/N); the
    target also becomes the curator's budget."""
    if pooled_size is None:
        raise ValueError("calibrating dpgan needs the pooled data size N")
    target = cfg.target_epsilon
    q = min(1.0, cfg.dpgan_batch_size / pooled_size)
    sigma = subsampled_noise(target, q, cfg.steps * cfg.dpgan_n_d + classifier_dp_steps(cfg, cfg.steps), cfg.delta)
    return cfg.replace(
        dpgan_noise_multiplier=sigma, client_epsilon_budget=min(cfg.client_epsilon_budget or target, target)
    )


def check_sizes(cfg: ExperimentConfig, sizes: list[int]) -> None:
    """The curator pools every partition: its expected batch B must not exceed the pooled N (q = B/N
    would exceed 1, and each step would process the whole data set several times over)."""
    check(
        cfg.dpgan_batch_size <= sum(sizes),
        "dpgan_batch_size",
        cfg.dpgan_batch_size,
        f"larger than the pooled data ({sum(sizes)} examples)",
    )


def classifier_dp_steps(cfg: ExperimentConfig, rounds: int) -> int:
    """DP-SGD steps DPAC's classifier takes in ``rounds`` rounds: its init, then one per round
    unless it learns from generated data only (those steps are free)."""
    if cfg.dpac_beta >= 1:
        return 0
    return cfg.dpac_init + rounds * classifier_round_steps(cfg)


def classifier_round_steps(cfg: ExperimentConfig) -> int:
    """DP-SGD steps of DPAC's classifier per round after its init: one unless it learns from
    generated data only."""
    return 1 if cfg.dpac_beta < 1 and cfg.dpac_train in REAL_DATA_MODES else 0


def node_ledger(cfg: ExperimentConfig, client_id: int, state_dir: str | Path) -> PrivacyLedger:
    """What the curator released in ``state_dir`` (its DP steps); nothing for any other node."""
    return load_ledger(state_dir) if client_id == CURATOR else PrivacyLedger()


# --- the curator ---------------------------------------------------------------------------------
_NODES: dict[str, DpganNode] = {}


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
    )


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
    """n_D DP discriminator steps, DPAC's classifier steps, one generator step; records the noised
    steps in the ledger, returns the statistics."""
    if not node.public_warmed:
        _public_warm_start(node, cfg)
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


def node_path(state_dir: str | Path) -> Path:
    return Path(state_dir) / "dpgan-node.pt"


def save_node(node: DpganNode, state_dir: str | Path) -> None:
    path = node_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {
        "D": node.trainer.D.state_dict(),
        "d_opt": node.trainer.optimizer.original_optimizer.state_dict(),
        "G": node.generator.state_dict(),
        "g_opt": node.g_optimizer.state_dict(),
        "schedule": node.schedule.state_dict() if node.schedule else None,
        "n_d": node.n_d,
        "ledger": node.ledger.state_dict(),
        "rng": node.rng.get_state(),
        "rounds": node.rounds,
        "steps_taken": node.trainer.steps_taken,
        "sampler": node.sampler.state_dict(),
        "public_warmed": node.public_warmed,
        "group_bounds": getattr(node.trainer.optimizer, "bounds", None),
        **_classifier_blob(node),
    }
    save_tensors(blob, path)
    _NODES[str(state_dir)] = node


def _classifier_blob(node: DpganNode) -> dict[str, Any]:
    C = node.classifier
    if C is None:
        return {}
    return {
        "C": C.C.state_dict(),
        "c_opt": C.optimizer.original_optimizer.state_dict(),
        "c_steps": C.steps_taken,
        "c_ready": node.classifier_ready,
    }


def load_ledger(state_dir: str | Path) -> PrivacyLedger:
    """The node's ledger as its file stands (empty before its first round)."""
    path = node_path(state_dir)
    if not path.exists():
        return PrivacyLedger()
    return PrivacyLedger.from_state_dict(load_tensors(path)["ledger"])


def load_node(cfg: ExperimentConfig, state_dir: str | Path, rounds: int) -> DpganNode:
    """The node at ``rounds`` rounds: from memory when current, else from disk, else new."""
    cached = _NODES.get(str(state_dir))
    if cached is not None and cached.rounds == rounds:
        return cached
    node = new_node(cfg)
    path = node_path(state_dir)
    if path.exists():
        blob = load_tensors(path)
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
        node.public_warmed = bool(blob.get("public_warmed", True))
        if blob.get("group_bounds") and hasattr(node.trainer.optimizer, "set_bounds"):
            node.trainer.optimizer.set_bounds(list(blob["group_bounds"]))
        if node.classifier is not None and "C" in blob:
            node.classifier.C.load_state_dict(blob["C"])
            node.classifier.optimizer.original_optimizer.load_state_dict(blob["c_opt"])
            node.classifier.steps_taken, node.classifier_ready = int(blob["c_steps"]), bool(blob["c_ready"])
    _NODES[str(state_dir)] = node
    return node
