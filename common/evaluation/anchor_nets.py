"""The classifier family DPImageBench trains on synthetic data: ResNet, Wide ResNet and ResNeXt.

DPImageBench (Gong et al. 2025) reports a synthetic set's utility as the mean test accuracy of three
classifiers trained on it; for 28x28 data they are a CIFAR-style ResNet (BasicBlocks, depth 6n+2,
widths 16/32/64; their default depth 110), a Wide ResNet (pre-activation blocks, depth 6n+4, widths
16k/32k/64k, dropout 0.3; their default WRN-40-4) and a ResNeXt (grouped bottlenecks, depth 9n+2,
cardinality 8, stages 64/64w/128w/256w, dropout 0.3 before the classifier; their default 29, w 4).
Written here from the architectures' papers (He et al. 2016, Zagoruyko & Komodakis 2016, Xie et al.
2017) with the same shapes, so that ``depth`` and width select either their exact networks or the
smaller members of the same families that 2 CPU cores can train (``common/evaluation/anchors.py``).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


def _conv3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def _init(module: nn.Module) -> None:
    """He-normal convolutions, unit batch norms, zero biases: the initialisation all three papers use."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    """The post-activation blocks' shortcut: the input itself, or a strided 1x1 projection with BN."""
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))


class _Basic(nn.Module):
    """ResNet's post-activation block: conv-BN-ReLU-conv-BN plus the (projected) input, then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            _conv3(cin, cout, stride),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            _conv3(cout, cout),
            nn.BatchNorm2d(cout),
        )
        self.skip = _shortcut(cin, cout, stride)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.body(x) + self.skip(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet of depth 6n+2 (20, 32, 44, 56, 110, ...)."""

    def __init__(self, num_classes: int, *, depth: int = 110, in_channels: int = 1) -> None:
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise ValueError(f"ResNet depth must be 6n+2 with n >= 1 (8, 14, 20, ..., 110), got {depth}")
        n = (depth - 2) // 6
        layers: list[nn.Module] = [_conv3(in_channels, 16), nn.BatchNorm2d(16), nn.ReLU(inplace=True)]
        cin = 16
        for width, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(n):
                layers.append(_Basic(cin, width, stride if i == 0 else 1))
                cin = width
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(64, num_classes)
        _init(self)

    def forward(self, x: Tensor) -> Tensor:
        """Class logits."""
        return self.fc(self.features(x))


class _PreAct(nn.Module):
    """Wide ResNet's pre-activation block: BN-ReLU-conv, dropout, BN-ReLU-conv, plus the shortcut."""

    def __init__(self, cin: int, cout: int, stride: int, drop: float) -> None:
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(cin), _conv3(cin, cout, stride)
        self.bn2, self.conv2 = nn.BatchNorm2d(cout), _conv3(cout, cout)
        self.drop = nn.Dropout(drop) if drop > 0 else nn.Identity()
        self.project = None if stride == 1 and cin == cout else nn.Conv2d(cin, cout, 1, stride=stride, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        a = F.relu(self.bn1(x))
        out = self.conv2(self.drop(F.relu(self.bn2(self.conv1(a)))))
        return out + (x if self.project is None else self.project(a))


class WideResNet(nn.Module):
    """WRN-depth-k of depth 6n+4 (10, 16, 22, 28, 40, ...), widths 16k, 32k, 64k."""

    def __init__(
        self, num_classes: int, *, depth: int = 40, widen: int = 4, dropout: float = 0.3, in_channels: int = 1
    ) -> None:
        super().__init__()
        if depth < 10 or (depth - 4) % 6:
            raise ValueError(f"Wide ResNet depth must be 6n+4 with n >= 1 (10, 16, ..., 40), got {depth}")
        n = (depth - 4) // 6
        layers: list[nn.Module] = [_conv3(in_channels, 16)]
        cin = 16
        for width, stride in ((16 * widen, 1), (32 * widen, 2), (64 * widen, 2)):
            for i in range(n):
                layers.append(_PreAct(cin, width, stride if i == 0 else 1, dropout))
                cin = width
        layers += [nn.BatchNorm2d(cin), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)
        _init(self)

    def forward(self, x: Tensor) -> Tensor:
        """Class logits."""
        return self.fc(self.features(x))


class _Grouped(nn.Module):
    """ResNeXt's bottleneck: 1x1 reduce to D = cardinality * cout / widen, grouped 3x3, 1x1 expand."""

    def __init__(self, cin: int, cout: int, stride: int, cardinality: int, widen: int) -> None:
        super().__init__()
        d = cardinality * cout // widen
        self.body = nn.Sequential(
            nn.Conv2d(cin, d, 1, bias=False),
            nn.BatchNorm2d(d),
            nn.ReLU(inplace=True),
            nn.Conv2d(d, d, 3, stride=stride, padding=1, groups=cardinality, bias=False),
            nn.BatchNorm2d(d),
            nn.ReLU(inplace=True),
            nn.Conv2d(d, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.skip = _shortcut(cin, cout, stride)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.body(x) + self.skip(x))


class ResNeXt(nn.Module):
    """CIFAR ResNeXt of depth 9n+2 (11, 20, 29, ...), stages b, bw, 2bw, 4bw (theirs: b = 64)."""

    def __init__(
        self,
        num_classes: int,
        *,
        depth: int = 29,
        cardinality: int = 8,
        widen: int = 4,
        base: int = 64,
        dropout: float = 0.3,
        in_channels: int = 1,
    ) -> None:
        super().__init__()
        if depth < 11 or (depth - 2) % 9:
            raise ValueError(f"ResNeXt depth must be 9n+2 with n >= 1 (11, 20, 29), got {depth}")
        n = (depth - 2) // 9
        layers: list[nn.Module] = [_conv3(in_channels, base), nn.BatchNorm2d(base), nn.ReLU(inplace=True)]
        cin = base
        for width, stride in ((base * widen, 1), (2 * base * widen, 2), (4 * base * widen, 2)):
            for i in range(n):
                layers.append(_Grouped(cin, width, stride if i == 0 else 1, cardinality, widen))
                cin = width
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.fc = nn.Linear(cin, num_classes)
        _init(self)

    def forward(self, x: Tensor) -> Tensor:
        """Class logits."""
        return self.fc(self.drop(self.features(x)))
