"""Downstream utility of generated data: train a classifier on one side, test it on the other.

- **gen2real** (train on generated, test on real): a classifier learns the label -> image mapping
  from generated samples alone. It only beats chance when the samples look like the real data *and*
  carry their conditioning label, so it measures what FID cannot: whether the labels are right.
- **real2gen** (train on real, test on generated): the real-data classifier recognises the
  generated samples as their intended class, which punishes off-class or unrecognisable samples
  but, unlike gen2real, not a lack of diversity.

Both use two architectures, a CNN and an MLP, as in the GS-WGAN and DP-GAN evaluations: a
generator can fool one inductive bias and not the other. Training is seeded per call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor, nn

from common.evaluation.classifier import (
    DomainClassifier,
    ImageLike,
    LabelLike,
    accuracy,
    as_image_tensor,
    as_label_tensor,
    check_label_range,
    fit_classifier,
    seeded_model,
)

__all__ = ["ARCHS", "MLP", "build_classifier", "gen2real", "real2gen", "train_eval"]


class MLP(nn.Module):
    """784 -> 256 -> 128 -> C with ReLU: no spatial prior, so it leans on exact pixel statistics."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(28 * 28, 256),
            nn.ReLU(),
            nn.Linear(256, 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Class logits ``[N, num_classes]``."""
        return self.net(x)


# The CNN is the domain classifier's architecture: one small CNN to maintain, and its accuracy on
# real data (reported with the domain classifier) is the ceiling that gen2real is compared with.
ARCHS: dict[str, Callable[[int], nn.Module]] = {"cnn": DomainClassifier, "mlp": MLP}


def build_classifier(arch: str, num_classes: int, seed: int = 0) -> nn.Module:
    """A freshly initialised ``arch`` (``"cnn"`` or ``"mlp"``) with weights drawn from ``seed``."""
    if arch not in ARCHS:
        raise ValueError(f"unknown classifier architecture {arch!r}: choose one of {tuple(ARCHS)}")
    return seeded_model(lambda: ARCHS[arch](num_classes), seed)


def train_eval(
    arch: str,
    train_images: ImageLike,
    train_labels: LabelLike,
    test_images: ImageLike,
    test_labels: LabelLike,
    num_classes: int,
    *,
    epochs: int = 3,
    seed: int = 0,
    batch_size: int = 128,
    lr: float = 1e-3,
) -> float:
    """Test accuracy of an ``arch`` classifier trained from scratch on the training pair."""
    model = build_classifier(arch, num_classes, seed)
    fit_classifier(model, train_images, train_labels, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, desc=arch)
    return accuracy(model, test_images, test_labels)


def _utility(
    train: tuple[ImageLike, LabelLike],
    test: tuple[ImageLike, LabelLike],
    num_classes: int,
    archs: Sequence[str],
    epochs: int,
    seed: int,
) -> dict[str, float]:
    """``{arch: accuracy, ..., "num_train": n, "num_test": m}`` for one train/test direction."""
    train_x, test_x = as_image_tensor(train[0]), as_image_tensor(test[0])
    train_y, test_y = as_label_tensor(train[1], len(train_x)), as_label_tensor(test[1], len(test_x))
    check_label_range(train_y, num_classes)
    check_label_range(test_y, num_classes)
    result: dict[str, float] = {
        arch: train_eval(arch, train_x, train_y, test_x, test_y, num_classes, epochs=epochs, seed=seed)
        for arch in archs
    }
    result["num_train"] = len(train_x)
    result["num_test"] = len(test_x)
    return result


def gen2real(
    gen_images: ImageLike,
    gen_labels: LabelLike,
    real_test_images: ImageLike,
    real_test_labels: LabelLike,
    num_classes: int,
    *,
    archs: Sequence[str] = ("cnn", "mlp"),
    epochs: int = 3,
    seed: int = 0,
) -> dict[str, float]:
    """Train on generated samples with their conditioning labels, test on the real test split."""
    return _utility((gen_images, gen_labels), (real_test_images, real_test_labels), num_classes, archs, epochs, seed)


def real2gen(
    real_train_images: ImageLike,
    real_train_labels: LabelLike,
    gen_images: ImageLike,
    gen_labels: LabelLike,
    num_classes: int,
    *,
    archs: Sequence[str] = ("cnn", "mlp"),
    epochs: int = 3,
    seed: int = 0,
) -> dict[str, float]:
    """Train on the real training split, test on generated samples against their conditioning labels."""
    return _utility((real_train_images, real_train_labels), (gen_images, gen_labels), num_classes, archs, epochs, seed)
