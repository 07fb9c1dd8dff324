"""Sample grids: tiles of generated images, one row per class, and two generators side by side.

PNG files written atomically (a temporary name, then a rename), like every plot of the run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from .plots import DPI, _new_figure, _save


def tile_images(images: np.ndarray, *, rows: int, pad: int = 2) -> np.ndarray:
    """[N, H, W] (or [N, 1, H, W]) images -> one [rows*(H+pad)+pad, cols*(W+pad)+pad] uint8 grid."""
    images = np.asarray(images)
    if images.ndim == 4 and images.shape[1] == 1:
        images = images[:, 0]
    if images.ndim != 3:
        raise ValueError(f"expected images [N, H, W] or [N, 1, H, W], got shape {images.shape}")
    n, h, w = images.shape
    if rows < 1 or n % rows:
        raise ValueError(f"{n} images do not fill {rows} rows evenly (one row per class)")
    images = _to_uint8(images)
    cols = n // rows
    grid = np.zeros((rows * (h + pad) + pad, cols * (w + pad) + pad), dtype=np.uint8)
    for i, img in enumerate(images):
        r, c = divmod(i, cols)
        grid[pad + r * (h + pad) : pad + r * (h + pad) + h, pad + c * (w + pad) : pad + c * (w + pad) + w] = img
    return grid


def _to_uint8(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.uint8:
        return a
    if np.issubdtype(a.dtype, np.floating) and a.size and a.max() <= 1.0:
        a = a * 255.0  # generator output in [0, 1]
    return np.clip(np.round(a), 0, 255).astype(np.uint8)


def _show_grid(ax, grid: np.ndarray, *, rows: int | None, title: str | None) -> None:
    ax.imshow(grid, cmap="gray" if grid.ndim == 2 else None, vmin=0, vmax=255, interpolation="nearest")
    if title:
        ax.set_title(title, fontsize=11)
    ax.set_xticks([])
    if rows:
        height = grid.shape[0] / rows
        ax.set_yticks((np.arange(rows) + 0.5) * height, [str(r) for r in range(rows)], fontsize=8)
        ax.set_ylabel("class")
    else:
        ax.set_yticks([])


def plot_sample_grid(images: np.ndarray, path: Path, *, rows: int, title: str | None = None) -> Path:
    """Generated samples, one row per class, with the class on the left.

    ``images`` is either uint8 [C*k, 28, 28] (laid out row-major, class c in row c) or an already
    tiled 2-D grid, which is drawn as is with ``rows`` labels.
    """
    images = np.asarray(images)
    grid = _to_uint8(images) if images.ndim == 2 else tile_images(images, rows=rows)
    scale = 3.0 / DPI  # about 3 screen pixels per image pixel
    fig, axes = _new_figure(max(3.0, grid.shape[1] * scale + 0.8), grid.shape[0] * scale + (0.6 if title else 0.3))
    _show_grid(axes[0, 0], grid, rows=rows, title=title)
    return _save(fig, path)


def side_by_side(
    left_png: Path, right_png: Path, path: Path, *, titles: tuple[str, str], rows: int | None = None
) -> Path:
    """Two sample grids next to each other (the debugging task: suspect clients vs the rest)."""
    grids = []
    for png in (left_png, right_png):
        with Image.open(png) as img:
            grids.append(np.asarray(img.convert("L") if img.mode in ("L", "LA", "I", "P", "1") else img.convert("RGB")))
    height = max(g.shape[0] for g in grids)
    width = sum(g.shape[1] for g in grids)
    scale = 2.0 / DPI
    fig, axes = _new_figure(max(6.0, width * scale + 1.2), height * scale + 0.7, ncols=2)
    for ax, grid, title in zip(axes[0], grids, titles, strict=False):
        _show_grid(ax, grid, rows=rows, title=title)
    return _save(fig, path)
