"""DPImageBench's protocol (issue 26, item 1): its split, its networks, its selection rule."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from torch import nn

from common.data.protocol import protocol_validation
from common.evaluation.anchor_nets import ResNet, ResNeXt, WideResNet
from common.evaluation.anchors import RECIPES, recipe, synthetic_training_slice, train_and_select


def test_the_validation_split_is_the_one_random_split_draws_after_manual_seed_0():
    """Theirs: torch.manual_seed(0); random_split(train, [55000, 5000]) — run here for real."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        _, val = torch.utils.data.random_split(range(60_000), [55_000, 5_000])
    assert np.array_equal(protocol_validation(60_000), np.sort(np.array(val.indices)))
    assert len(protocol_validation(1_200)) == 100  # another size keeps 1 in 12
    with pytest.raises(ValueError, match="too small"):
        protocol_validation(5)


def params(model: nn.Module) -> float:
    return sum(p.numel() for p in model.parameters()) / 1e6


def test_their_default_networks_have_the_published_sizes():
    """ResNet-110 1.7M, WRN-40-4 8.9M (Zagoruyko & Komodakis, Table 1), ResNeXt-29 8x64d 34.4M (Xie et
    al., Table 7): a wrong block, width or depth rule shows here."""
    assert params(ResNet(10, depth=110)) == pytest.approx(1.73, abs=0.01)
    assert params(WideResNet(10, depth=40, widen=4)) == pytest.approx(8.95, abs=0.01)
    assert params(ResNeXt(10, depth=29, cardinality=8, widen=4)) == pytest.approx(34.43, abs=0.05)
    x = torch.rand(3, 1, 28, 28)
    for spec in RECIPES.values():
        for make in spec.networks(10).values():
            if params(make()) < 1:  # the CPU members; their full-size ones are checked above
                assert make()(x).shape == (3, 10)


def test_bad_depths_and_unknown_protocols_are_named():
    with pytest.raises(ValueError, match="6n\\+2"):
        ResNet(10, depth=21)
    with pytest.raises(ValueError, match="6n\\+4"):
        WideResNet(10, depth=12)
    with pytest.raises(ValueError, match="9n\\+2"):
        ResNeXt(10, depth=12)
    with pytest.raises(ValueError, match="dpimagebench-cpu"):
        recipe("dpimagebench-gpu")


def test_the_synthetic_set_is_shuffled_with_seed_0_and_cut_at_eleven_twelfths():
    images, labels = torch.arange(1200.0).view(1200, 1, 1, 1), torch.arange(1200)
    x, y = synthetic_training_slice(images, labels)
    order = np.random.default_rng(0).permutation(1200)[:1100]
    assert len(y) == 1100 and np.array_equal(y.numpy(), order)


def blobs(n: int, seed: int, flip: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Two classes told apart by the mean pixel (``flip``: the labels swapped)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    x = (0.3 + 0.4 * y.float()).view(n, 1, 1, 1) + 0.05 * torch.randn(n, 1, 28, 28, generator=g)
    return x.clamp(0, 1), (1 - y) if flip else y


class Mean(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean((1, 2, 3)).unsqueeze(1))


TINY = dataclasses.replace(RECIPES["dpimagebench-cpu"], epochs=6, step_epochs=3, batch_size=32, lr=0.05)


def test_the_selected_epoch_is_the_best_on_validation_never_on_test():
    """A test split with flipped labels: a rule that selected on it would pick the worst validation
    epoch; the protocol's picks the best validation epoch and reports that epoch's test accuracy."""
    train, val, test = blobs(256, 0), blobs(200, 1), blobs(200, 2, flip=True)
    out = train_and_select(Mean, train, val, test, TINY, epsilon=math.inf, seed=0, device=torch.device("cpu"))
    curve = out["curve"]
    best = max(range(len(curve)), key=lambda i: (curve[i]["val_acc"], i))
    assert out["epoch"] == best + 1 and out["test_acc"] == curve[best]["test_acc"]
    assert out["test_acc_noiseless_selection"] == out["test_acc"]  # ε = ∞: no noise
    assert curve[best]["val_acc"] > 0.9 and out["test_acc"] < 0.1  # the flipped test set, honestly reported


def test_a_small_epsilon_makes_the_selection_noisy():
    """Laplace(1/ε) on the correct count: at ε = 1e-4 (noise ~10^4 counts) the choice ignores the
    validation accuracy, so over seeds it differs from the noiseless choice."""
    train, val, test = blobs(256, 0), blobs(200, 1), blobs(200, 2)
    picks = [
        train_and_select(Mean, train, val, test, TINY, epsilon=1e-4, seed=s, device=torch.device("cpu"))
        for s in range(6)
    ]
    assert any(p["epoch"] != p["epoch_noiseless_selection"] for p in picks)


def test_the_classifiers_train_channels_last_and_the_layout_changes_nothing_but_rounding(monkeypatch):
    """The protocol trains channels-last for speed (bench/protocol_speed.py); a real ResNet-8 trained
    two epochs either way keeps NHWC weights and reaches the same curve up to rounding."""
    import common.evaluation.anchors as anchors

    spec = dataclasses.replace(RECIPES["dpimagebench-cpu"], epochs=2, step_epochs=1, batch_size=32)
    train, val, test = blobs(96, 0), blobs(64, 1), blobs(64, 2)
    seen = []

    def resnet():
        model = spec.networks(2)["resnet"]()
        seen.append(model)
        return model

    runs = {}
    for layout in (torch.channels_last, torch.contiguous_format):
        monkeypatch.setattr(anchors, "LAYOUT", layout)
        runs[layout] = train_and_select(
            resnet, train, val, test, spec, epsilon=math.inf, seed=0, device=torch.device("cpu")
        )
    conv = next(m.weight for m in seen[0].modules() if isinstance(m, nn.Conv2d) and m.in_channels > 1)
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    for a, b in zip(runs[torch.channels_last]["curve"], runs[torch.contiguous_format]["curve"], strict=True):
        assert a["val_acc"] == pytest.approx(b["val_acc"], abs=1 / 64) and a["test_acc"] == pytest.approx(
            b["test_acc"], abs=1 / 64
        )
