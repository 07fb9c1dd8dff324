"""The embedded ``synthetic`` data set: handwriting-like 28x28 digits generated in code.

Why it exists: the real federated data (FEMNIST, 3,400 writers) cannot be downloaded everywhere,
yet the system must be exercised on data with the property that matters for federated GANs:
every client is one *writer* with a consistent style. Each digit is a set of stroke polylines (a
hand-designed skeleton); each writer gets a style (slant, stroke width, pen softness, size,
aspect, a smooth personal deformation of every glyph, a preferred variant of 1, 2, 3, 4, 7 and 9,
and how sloppy the writer is), and each sample adds a small random deformation, rotation and shift.
Glyphs are rendered by an anti-aliased distance-to-segment field in vectorised numpy.

Determinism: the style of writer ``w`` depends only on ``(seed, w)`` and its samples only on
``(seed, w, split)``, so a client generates its own writer's images without generating anyone
else's: memory grows with the active clients, not with the federation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.data.dataset import Dataset

__all__ = [
    "MAX_WRITERS",
    "SYNTHETIC_CLASSES",
    "WriterStyle",
    "synthetic_dataset",
    "synthetic_writer",
    "synthetic_writer_labels",
    "writer_style",
]

SYNTHETIC_CLASSES = 10
# Writers the set can hold: a writer is rendered from its own seed, on demand, so any id works and
# none costs anything until asked; the bound matches the most clients a run may have (MAX_CLIENTS).
MAX_WRITERS = 1_000_000
SIDE = 28
_SPLIT_STREAMS = {"train": 0, "test": 1}
_BANDS = 3  # row bands of the distance field (see _banded_distance2)
_STEP = 0.13  # resampling step along strokes, in glyph units (about 2.5 px at the usual size)
Stroke = np.ndarray  # [P, 2] points (u right, v down) in the unit glyph box


# --- digit skeletons --------------------------------------------------------------------------------


def _arc(cx: float, cy: float, rx: float, ry: float, start_deg: float, end_deg: float) -> Stroke:
    """Elliptic arc; angles counter-clockwise as on paper (90 is the top) although v points down."""
    theta = np.radians(np.linspace(start_deg, end_deg, 48))
    return np.stack([cx + rx * np.cos(theta), cy - ry * np.sin(theta)], axis=1)


def _curve(*control: tuple[float, float]) -> Stroke:
    """Quadratic (3 points) or cubic (4 points) Bezier curve through the control polygon."""
    p = np.asarray(control, dtype=np.float64)
    t = np.linspace(0.0, 1.0, 32)[:, None]
    if len(p) == 3:
        return (1 - t) ** 2 * p[0] + 2 * (1 - t) * t * p[1] + t**2 * p[2]
    return (1 - t) ** 3 * p[0] + 3 * (1 - t) ** 2 * t * p[1] + 3 * (1 - t) * t**2 * p[2] + t**3 * p[3]


def _line(*points: tuple[float, float]) -> Stroke:
    return np.asarray(points, dtype=np.float64)


def _join(*parts: Stroke) -> Stroke:
    """One continuous stroke made of consecutive parts (the pen does not lift)."""
    return np.concatenate(parts, axis=0)


def _skeletons() -> dict[int, list[list[Stroke]]]:
    """Variants of every digit, each a list of strokes; a writer sticks to one variant per digit."""
    upper_3 = _arc(0.48, 0.27, 0.29, 0.23, 155, -90)
    lower_3 = _arc(0.47, 0.72, 0.33, 0.25, 90, -155)
    return {
        0: [[_arc(0.5, 0.5, 0.31, 0.46, 95, 455)], [_arc(0.5, 0.5, 0.27, 0.46, 70, 440)]],
        1: [
            [_line((0.52, 0.04), (0.48, 0.96))],
            [_line((0.28, 0.24), (0.55, 0.04), (0.55, 0.96))],
            [_line((0.3, 0.22), (0.53, 0.04), (0.53, 0.96)), _line((0.3, 0.96), (0.78, 0.96))],
        ],
        2: [
            [_join(_arc(0.5, 0.3, 0.3, 0.26, 165, -25), _line((0.14, 0.95), (0.88, 0.95)))],
            [
                _join(
                    _arc(0.5, 0.28, 0.31, 0.24, 160, -10),
                    _curve((0.8, 0.33), (0.6, 0.7), (0.12, 0.94)),
                    _curve((0.12, 0.94), (0.3, 0.84), (0.5, 0.92), (0.9, 0.92)),
                )
            ],
        ],
        3: [
            [_join(upper_3, lower_3)],
            [_join(_line((0.18, 0.05), (0.8, 0.05), (0.45, 0.42)), _arc(0.45, 0.7, 0.36, 0.27, 95, -155))],
        ],
        4: [
            [_line((0.64, 0.04), (0.1, 0.66), (0.92, 0.66)), _line((0.68, 0.32), (0.68, 0.96))],
            [_line((0.22, 0.04), (0.16, 0.6), (0.9, 0.6)), _line((0.7, 0.04), (0.7, 0.96))],
        ],
        5: [[_join(_line((0.82, 0.05), (0.3, 0.05), (0.25, 0.45)), _arc(0.48, 0.68, 0.33, 0.27, 125, -160))]],
        6: [[_join(_curve((0.74, 0.04), (0.3, 0.18), (0.2, 0.7)), _arc(0.49, 0.7, 0.29, 0.26, 180, 540))]],
        7: [
            [_line((0.12, 0.05), (0.86, 0.05), (0.42, 0.96))],
            [_line((0.12, 0.05), (0.86, 0.05), (0.42, 0.96)), _line((0.38, 0.52), (0.8, 0.5))],
            [_join(_line((0.14, 0.12), (0.86, 0.05)), _curve((0.86, 0.05), (0.5, 0.4), (0.46, 0.96)))],
        ],
        8: [
            [_arc(0.5, 0.26, 0.25, 0.22, -90, 270), _arc(0.5, 0.71, 0.3, 0.25, 90, 450)],
            [
                _join(
                    _arc(0.5, 0.26, 0.25, 0.22, 0, 200),
                    _curve((0.27, 0.33), (0.85, 0.6), (0.72, 0.92), (0.5, 0.96)),
                    _curve((0.5, 0.96), (0.15, 0.96), (0.2, 0.6), (0.75, 0.26)),
                )
            ],
        ],
        9: [
            [_arc(0.5, 0.3, 0.28, 0.25, 0, 360), _line((0.78, 0.3), (0.72, 0.96))],
            [_arc(0.48, 0.29, 0.28, 0.24, 0, 360), _curve((0.76, 0.3), (0.76, 0.85), (0.4, 0.96))],
        ],
    }


_SKELETONS = _skeletons()


def _resample(stroke: Stroke, step: float = _STEP) -> Stroke:
    """Points evenly spaced along the stroke, so long straight lines bend under deformation too."""
    seg = np.linalg.norm(np.diff(stroke, axis=0), axis=1)
    arc = np.concatenate([[0.0], np.cumsum(seg)])
    count = max(2, int(np.ceil(arc[-1] / step)) + 1)
    where = np.linspace(0.0, arc[-1], count)
    return np.stack([np.interp(where, arc, stroke[:, 0]), np.interp(where, arc, stroke[:, 1])], axis=1)


# --- writer style ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriterStyle:
    """Everything that makes one writer's digits recognisably theirs."""

    slant: float  # horizontal shear; > 0 leans right
    rotation: float  # radians
    height_px: float  # glyph box height
    aspect: float  # glyph box width / height
    width_px: float  # pen width
    softness_px: float  # width of the anti-aliased edge ramp
    ink: float  # peak intensity in (0, 1]
    sloppiness: float  # amplitude of the per-sample deformation, glyph units
    warp: np.ndarray  # [2, K, 4] personal smooth deformation: amplitude, freq u, freq v, phase
    variants: np.ndarray  # [10] chosen variant of each digit


def _random_warp(rng: np.random.Generator, amplitude: float | np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Coefficients of a smooth random field (a few low-frequency sinusoids per axis)."""
    k = 3
    amp = rng.normal(0.0, 1.0, shape + (2, k)) * np.asarray(amplitude)[..., None, None] / np.sqrt(k)
    freq = rng.uniform(-1.4, 1.4, shape + (2, k, 2)) * np.pi
    phase = rng.uniform(0.0, 2 * np.pi, shape + (2, k))
    return np.concatenate([amp[..., None], freq, phase[..., None]], axis=-1)


def _apply_warp(points: np.ndarray, warp: np.ndarray) -> np.ndarray:
    """Displace ``points`` [..., P, 2] by the field ``warp`` [..., 2, K, 4] (broadcast over ...)."""
    u, v = points[..., None, None, :, 0], points[..., None, None, :, 1]  # [..., 1, 1, P]
    w = warp[..., None]  # [..., 2, K, 4, 1]
    field = w[..., 0, :] * np.sin(w[..., 1, :] * u + w[..., 2, :] * v + w[..., 3, :])  # [..., 2, K, P]
    return points + np.moveaxis(field.sum(axis=-2), -2, -1)


def writer_style(writer_id: int, *, seed: int) -> WriterStyle:
    """The style of one writer, a pure function of ``(seed, writer_id)``."""
    rng = np.random.default_rng([seed, writer_id, 0x5717])
    counts = np.array([len(_SKELETONS[d]) for d in range(SYNTHETIC_CLASSES)])
    width = float(rng.uniform(1.5, 3.6))
    return WriterStyle(
        slant=float(rng.normal(0.12, 0.2)),
        rotation=float(rng.normal(0.0, 0.06)),
        height_px=float(rng.uniform(17.0, 22.5)),
        aspect=float(rng.uniform(0.6, 1.05)),
        width_px=width,
        softness_px=float(rng.uniform(0.8, min(1.8, width))),  # <= width: the stroke core reaches full ink
        ink=float(rng.uniform(0.9, 1.0)),
        sloppiness=float(rng.uniform(0.015, 0.05)),
        warp=_random_warp(rng, rng.uniform(0.04, 0.09), ()),
        variants=(rng.random(SYNTHETIC_CLASSES) * counts).astype(np.int64),
    )


def _writer_glyph(style: WriterStyle, digit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The writer's version of ``digit``: resampled points and the segment endpoints' indices."""
    strokes = [_resample(_apply_warp(s, style.warp)) for s in _SKELETONS[digit][style.variants[digit]]]
    starts = np.cumsum([0] + [len(s) for s in strokes[:-1]])
    seg_a = np.concatenate([start + np.arange(len(s) - 1) for start, s in zip(starts, strokes, strict=False)])
    return np.concatenate(strokes), seg_a, seg_a + 1


# --- rendering ------------------------------------------------------------------------------------


def _place(points: np.ndarray, style: WriterStyle, rng: np.random.Generator, m: int) -> np.ndarray:
    """Per-sample deformation, slant, size, rotation and shift: glyph units to pixel coordinates."""
    warped = _apply_warp(points, _random_warp(rng, np.full(m, style.sloppiness), (m,)))  # [m, P, 2]
    height = style.height_px * rng.uniform(0.92, 1.06, (m, 1))
    width = height * style.aspect * rng.uniform(0.92, 1.08, (m, 1))
    x, y = (warped[..., 0] - 0.5) * width, (warped[..., 1] - 0.5) * height
    x = x - (style.slant + rng.normal(0.0, 0.07, (m, 1))) * y
    angle = style.rotation + rng.normal(0.0, 0.05, (m, 1))
    cos, sin = np.cos(angle), np.sin(angle)
    shift = rng.normal(0.0, 0.8, (m, 2, 1)) + SIDE / 2
    return np.stack([cos * x - sin * y + shift[:, 0], sin * x + cos * y + shift[:, 1]], axis=-1)


def _segment_distance2(a: np.ndarray, b: np.ndarray, cols: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Squared distance of pixel centres to the nearest segment: [m, S, 2] x2 -> [m, rows, cols].

    The projection and the squared distance to each segment's start are separable in rows and
    columns, so only a handful of full-size operations run on the [m, S, rows, cols] block.
    """
    d = (b - a).astype(np.float32)
    len2 = np.maximum((d**2).sum(-1), 1e-6)[..., None]  # [m, S, 1]
    rel_x = cols - a[..., 0:1].astype(np.float32)  # [m, S, C]
    rel_y = rows - a[..., 1:2].astype(np.float32)  # [m, S, R]
    t_raw = ((rel_x * d[..., 0:1]) / len2)[..., None, :] + ((rel_y * d[..., 1:2]) / len2)[..., :, None]
    t = np.minimum(np.maximum(t_raw, 0.0), 1.0)
    # |p - a - t d|^2 = |p - a|^2 + len2 * t * (t - 2 t_raw)
    t_raw *= -2.0
    t_raw += t
    t_raw *= t
    t_raw *= len2[..., None]
    t_raw += (rel_x**2)[..., None, :]
    t_raw += (rel_y**2)[..., :, None]
    return np.maximum(t_raw.min(axis=1), 0.0)


def _ink_box(pixels: np.ndarray, margin: float) -> tuple[slice, slice]:
    """Rows and columns that can receive ink: the glyphs' bounding box plus the pen's reach."""
    lo = np.floor(pixels.reshape(-1, 2).min(axis=0) - margin).astype(int)
    hi = np.ceil(pixels.reshape(-1, 2).max(axis=0) + margin).astype(int)
    lo, hi = np.clip(lo, 0, SIDE), np.clip(hi, 0, SIDE)
    return slice(lo[1], max(lo[1], hi[1])), slice(lo[0], max(lo[0], hi[0]))


def _banded_distance2(a: np.ndarray, b: np.ndarray, rows: np.ndarray, cols: np.ndarray, reach: float) -> np.ndarray:
    """``_segment_distance2`` band by band of rows, each band seeing only the segments within reach.

    A segment farther than ``reach`` from a band cannot ink it, so skipping it there changes no
    pixel; this roughly halves the work of the distance field.
    """
    top = np.minimum(a[..., 1], b[..., 1]).min(axis=0) - reach  # [S], over all samples
    bottom = np.maximum(a[..., 1], b[..., 1]).max(axis=0) + reach
    dist2 = np.full((a.shape[0], len(rows), len(cols)), np.inf, dtype=np.float32)
    for band in np.array_split(np.arange(len(rows)), _BANDS):
        if len(band) == 0:
            continue
        keep = (bottom >= rows[band[0]]) & (top <= rows[band[-1]])
        if keep.any():
            dist2[:, band] = _segment_distance2(a[:, keep], b[:, keep], cols, rows[band])
    return dist2


def _render_glyphs(
    points: np.ndarray,
    seg_a: np.ndarray,
    seg_b: np.ndarray,
    style: WriterStyle,
    rng: np.random.Generator,
    m: int,
) -> np.ndarray:
    """``m`` anti-aliased samples of one glyph as uint8 [m, 28, 28].

    Only the box the pen can reach is computed: the distance field is the cost of the generator.
    """
    pixels = _place(points, style, rng, m)
    half = (style.width_px * rng.uniform(0.85, 1.15, (m, 1, 1))).astype(np.float32) / 2
    soft = np.float32(style.softness_px)
    reach = float(half.max() + soft)
    rows, cols = _ink_box(pixels, reach)
    centres = np.arange(SIDE, dtype=np.float32) + 0.5
    dist = np.sqrt(_banded_distance2(pixels[:, seg_a], pixels[:, seg_b], centres[rows], centres[cols], reach))
    coverage = np.minimum(np.maximum((half + soft / 2 - dist) / soft, 0.0), 1.0)
    images = np.zeros((m, SIDE, SIDE), dtype=np.uint8)
    images[:, rows, cols] = np.rint(coverage * (255.0 * style.ink))
    return images


# --- public API ---------------------------------------------------------------------------------


def synthetic_writer_labels(writer_id: int, num_samples: int, *, seed: int, split: str = "train") -> np.ndarray:
    """The labels ``synthetic_writer`` would return, without rendering (for sizes and balance).

    Each writer writes every digit equally often (counts differ by at most one), in random order.
    """
    rng = np.random.default_rng([seed, writer_id, 0x1AB, _SPLIT_STREAMS[split]])
    return rng.permutation(np.arange(num_samples, dtype=np.int64) % SYNTHETIC_CLASSES)


def synthetic_writer(
    writer_id: int, num_samples: int, *, seed: int, split: str = "train"
) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 [n, 28, 28] and labels int64 [n] of one writer; other writers are not touched."""
    if writer_id < 0 or num_samples < 0:
        raise ValueError(f"writer_id and num_samples must be >= 0, got {writer_id}, {num_samples}")
    labels = synthetic_writer_labels(writer_id, num_samples, seed=seed, split=split)
    style = writer_style(writer_id, seed=seed)
    rng = np.random.default_rng([seed, writer_id, 0x5A3, _SPLIT_STREAMS[split]])
    images = np.zeros((num_samples, SIDE, SIDE), dtype=np.uint8)
    for digit in range(SYNTHETIC_CLASSES):
        where = np.flatnonzero(labels == digit)
        if len(where):
            images[where] = _render_glyphs(*_writer_glyph(style, digit), style, rng, len(where))
    return images, labels


def synthetic_dataset(num_writers: int, samples_per_writer: int, *, seed: int, split: str = "train") -> Dataset:
    """Writers ``0..num_writers-1`` concatenated, with the writer ordinal of every image."""
    parts = [synthetic_writer(w, samples_per_writer, seed=seed, split=split) for w in range(num_writers)]
    images = np.concatenate([p[0] for p in parts]) if parts else np.zeros((0, SIDE, SIDE), np.uint8)
    labels = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
    writers = np.repeat(np.arange(num_writers, dtype=np.int64), samples_per_writer)
    return Dataset(images=images, labels=labels, num_classes=SYNTHETIC_CLASSES, writers=writers)
