"""DPImageBench's utility protocol (``--protocol dpimagebench``): the anchors' numbers, measured our way.

The published rows we compare with (DPImageBench, Gong et al. 2025: DP-GAN 70.3%, DP-Kernel 70.0%,
DPDM 85.6% on Fashion-MNIST at ε = 10) come from one protocol, read from their own code
(``evaluation/evaluator.py``, ``data/dataset_loader.py``, ``evaluation/ema.py``):

- **Synthetic set**: 60,000 generated images (``gen.data_num``), shuffled with seed 0; the first
  55,000 train the classifiers (the other 5,000 are their fallback validation set, unused when a
  sensitive one exists, as here).
- **Sensitive validation split**: the real training split cut by ``torch.manual_seed(0)`` and
  ``random_split`` into 55,000 and 5,000 (MNIST family); the generator is trained on the 55,000. The
  same permutation is drawn here, so the 5,000 are theirs (``common/data/protocol.py``).
- **Classifiers**: ResNet, Wide ResNet and ResNeXt (``anchor_nets.py``), each trained from scratch by
  Adam (lr 0.01, batch 256, StepLR every 20 of 50 epochs by 0.2) on inputs scaled to [-1, 1], with an
  exponential moving average of the weights (0.9999, warmed up as min(d, (1+n)/(10+n))) evaluated
  after every epoch.
- **Selection**: after each epoch the average's correct count on the validation split plus
  Laplace(1/ε) noise, ε the run's; the figure is the test accuracy at the epoch with the best noisy
  count (ties to the later epoch, as their ``>=``), never selected on the test set. The headline is the
  mean over the three classifiers (their standard deviation beside it). Their logged mean uses the
  noiseless selection; both are reported.
- **FID**: the synthetic images against the real training split's Inception pool3 statistics.

``dpimagebench`` is that recipe exactly (ResNet-110, WRN-40-4, ResNeXt-29 8x64d, 50 epochs, FID on
60,000): a GPU's work. ``dpimagebench-cpu`` keeps everything but the networks' size, the epochs and the
FID's N, to fit 2 CPU cores (docs/evaluation.md states how far its figures sit from the full recipe's).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .anchor_nets import ResNet, ResNeXt, WideResNet

PROTOCOL_NAMES = ("quick", "dpimagebench", "dpimagebench-cpu")
SYNTHETIC_SIZE = 60_000  # their gen.data_num
SYNTHETIC_TRAIN = 55_000  # the slice of the shuffled synthetic set the classifiers train on
SPLIT_SEED = 0  # their default_rng(0) shuffle of the synthetic set
# The classifiers run channels-last: the same convolutions in another loop order, 1.54x faster for
# the three together on this machine's CPU at one thread, logits equal to 4e-8
# (bench/results/protocol-speed.json). The protocol's figures do not depend on it beyond rounding.
LAYOUT = torch.channels_last


@dataclass(frozen=True)
class Recipe:
    """One scale of the protocol: the three networks' sizes, the schedule and the FID's N."""

    name: str
    resnet_depth: int
    wrn_depth: int
    wrn_widen: int
    resnext_depth: int
    resnext_base: int
    resnext_widen: int
    cardinality: int
    epochs: int
    step_epochs: int  # StepLR's step: 20 of their 50 epochs
    fid_samples: int
    synthetic_size: int = SYNTHETIC_SIZE  # theirs; smaller only in tests
    lr: float = 0.01
    batch_size: int = 256
    gamma: float = 0.2
    ema_decay: float = 0.9999
    dropout: float = 0.3

    def networks(self, num_classes: int) -> dict[str, Callable[[], nn.Module]]:
        """The three classifiers' factories, in their order (resnet, wrn, resnext)."""
        return {
            "resnet": lambda: ResNet(num_classes, depth=self.resnet_depth),
            "wrn": lambda: WideResNet(num_classes, depth=self.wrn_depth, widen=self.wrn_widen, dropout=self.dropout),
            "resnext": lambda: ResNeXt(
                num_classes,
                depth=self.resnext_depth,
                cardinality=self.cardinality,
                widen=self.resnext_widen,
                base=self.resnext_base,
                dropout=self.dropout,
            ),
        }


RECIPES: dict[str, Recipe] = {
    "dpimagebench": Recipe(
        "dpimagebench",
        resnet_depth=110,
        wrn_depth=40,
        wrn_widen=4,
        resnext_depth=29,
        resnext_base=64,
        resnext_widen=4,
        cardinality=8,
        epochs=50,
        step_epochs=20,
        fid_samples=SYNTHETIC_SIZE,
    ),  # fmt: skip
    # The smallest member of each family (ResNet-8, WRN-10-1, ResNeXt-11 4x8d on an 8-channel stem:
    # PyTorch's grouped convolutions are slow on CPUs, so fewer, wider groups), 5 epochs with the step
    # at 2; FID at N = 3,000, what 15 minutes of Inception allow here (0.29 s an image beside a training,
    # FID +1.8 above its fitted N = 10,000 value: bench/results/protocol-cost.md).
    "dpimagebench-cpu": Recipe(
        "dpimagebench-cpu",
        resnet_depth=8,
        wrn_depth=10,
        wrn_widen=1,
        resnext_depth=11,
        resnext_base=8,
        resnext_widen=4,
        cardinality=4,
        epochs=5,
        step_epochs=2,
        fid_samples=3_000,
    ),  # fmt: skip
}


def recipe(name: str) -> Recipe:
    """The recipe called ``name``; an unknown one is an error that lists the choices."""
    if name not in RECIPES:
        raise ValueError(f"unknown protocol {name!r}: choose one of {PROTOCOL_NAMES}")
    return RECIPES[name]


def synthetic_training_slice(images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Their shuffle (``default_rng(0).permutation``) and the first 55,000 (or 11 in 12 of a smaller set)."""
    order = torch.from_numpy(np.random.default_rng(SPLIT_SEED).permutation(len(labels)))
    keep = SYNTHETIC_TRAIN if len(labels) == SYNTHETIC_SIZE else len(labels) - len(labels) // 12
    return images[order][:keep], labels[order][:keep]


class WeightAverage:
    """Their moving average of the trainable weights (decay min(d, (1+n)/(10+n))); buffers (batch
    norm's running statistics) stay the live model's, as in theirs."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay, self.updates = decay, 0
        self.shadow = [p.detach().clone() for p in model.parameters() if p.requires_grad]

    def update(self, model: nn.Module) -> None:
        self.updates += 1
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        with torch.no_grad():
            for s, p in zip(self.shadow, (p for p in model.parameters() if p.requires_grad), strict=True):
                s.sub_((1.0 - d) * (s - p))

    def swapped(self, model: nn.Module) -> _Swap:
        """A context in which ``model`` holds the average (its own weights restored on exit)."""
        return _Swap(model, self.shadow)


class _Swap:
    def __init__(self, model: nn.Module, shadow: list[Tensor]) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.shadow, self.saved = shadow, []

    def __enter__(self) -> None:
        self.saved = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for p, s in zip(self.params, self.shadow, strict=True):
                p.copy_(s)

    def __exit__(self, *exc: object) -> None:
        with torch.no_grad():
            for p, s in zip(self.params, self.saved, strict=True):
                p.copy_(s)


def _layout(x: Tensor) -> Tensor:
    """A batch in the classifiers' memory layout (``LAYOUT``)."""
    return x.contiguous(memory_format=LAYOUT)


@torch.no_grad()
def correct_count(model: nn.Module, images: Tensor, labels: Tensor, device: torch.device, batch: int = 1000) -> int:
    """How many of ``images`` (in [0, 1]) ``model`` labels right, fed as [-1, 1] like their loaders."""
    model.eval()
    hits = 0
    for start in range(0, len(labels), batch):
        x = _layout(images[start : start + batch].to(device) * 2.0 - 1.0)
        hits += int((model(x).argmax(1).cpu() == labels[start : start + batch]).sum())
    return hits


def train_and_select(
    factory: Callable[[], nn.Module],
    train: tuple[Tensor, Tensor],
    validation: tuple[Tensor, Tensor],
    test: tuple[Tensor, Tensor],
    spec: Recipe,
    *,
    epsilon: float,
    seed: int,
    device: torch.device,
) -> dict[str, Any]:
    """One classifier of the protocol: trained on ``train``, the averaged weights scored after each
    epoch on the validation split (plus Laplace(1/ε) when ε is finite) and on the test split; returns
    the test accuracy at the best noisy and at the best noiseless validation epoch."""
    gen = torch.Generator().manual_seed(seed)
    noise = np.random.default_rng(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = factory().to(device, memory_format=LAYOUT)
    opt = torch.optim.Adam(model.parameters(), lr=spec.lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=spec.step_epochs, gamma=spec.gamma)
    avg = WeightAverage(model, spec.ema_decay)
    x, y = train
    best = {"noisy": (-math.inf, 0.0, -1), "plain": (-math.inf, 0.0, -1)}
    curve = []
    start_s = time.perf_counter()
    for epoch in range(spec.epochs):
        model.train()
        order = torch.randperm(len(y), generator=gen)
        for start in range(0, len(y), spec.batch_size):
            idx = order[start : start + spec.batch_size]
            loss = F.cross_entropy(model(_layout(x[idx].to(device) * 2.0 - 1.0)), y[idx].to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            avg.update(model)
        sched.step()
        with avg.swapped(model):
            val_hits = correct_count(model, *validation, device)
            test_acc = correct_count(model, *test, device) / len(test[1])
        noisy = val_hits + (noise.laplace(0.0, 1.0 / epsilon) if math.isfinite(epsilon) else 0.0)
        curve.append(
            {
                "epoch": epoch + 1,
                "val_acc": val_hits / len(validation[1]),
                "test_acc": test_acc,
                "wall_s": time.perf_counter() - start_s,
            }
        )
        for key, score in (("noisy", noisy), ("plain", float(val_hits))):
            if score >= best[key][0]:
                best[key] = (score, test_acc, epoch + 1)
    return {
        "test_acc": best["noisy"][1],
        "epoch": best["noisy"][2],
        "test_acc_noiseless_selection": best["plain"][1],
        "epoch_noiseless_selection": best["plain"][2],
        "curve": curve,
        "wall_s": time.perf_counter() - start_s,
    }


def protocol_accuracy(
    synthetic: tuple[Tensor, Tensor],
    validation: tuple[Tensor, Tensor],
    test: tuple[Tensor, Tensor],
    num_classes: int,
    spec: Recipe,
    *,
    epsilon: float,
    seed: int = 0,
    device: torch.device | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The protocol's accuracy of a synthetic set: each classifier's selected test accuracy, their
    mean and standard deviation (as fractions), and what was used."""
    device = device or torch.device("cpu")
    train = synthetic_training_slice(*synthetic)
    per: dict[str, Any] = {}
    for i, (name, factory) in enumerate(spec.networks(num_classes).items()):
        if progress:
            progress(f"{spec.name}: training {name} on {len(train[1])} synthetic images")
        per[name] = train_and_select(
            factory, train, validation, test, spec, epsilon=epsilon, seed=seed + i, device=device
        )
    accs = np.array([r["test_acc"] for r in per.values()])
    plain = np.array([r["test_acc_noiseless_selection"] for r in per.values()])
    return {
        "protocol": spec.name,
        "recipe": asdict(spec),
        "mean": float(accs.mean()),
        "std": float(accs.std()),
        "mean_noiseless_selection": float(plain.mean()),
        "selection": f"Laplace(1/ε) on the validation correct count, ε = {epsilon:g}"
        if math.isfinite(epsilon)
        else "validation accuracy (ε = ∞: no noise)",
        "num_train": len(train[1]),
        "num_validation": len(validation[1]),
        "num_test": len(test[1]),
        "classifiers": per,
    }
