"""FID sanity that must hold (issue: evaluation): real halves are close, noise is far, corruption is monotone.

Computed on the domain classifier's features (fast); the Inception path is exercised in
test_eval_fid.py on a handful of images.
"""

import pytest
import torch

from common.data import load_dataset
from common.evaluation.classifier import (
    extract_features,
)
from common.evaluation.domain_classifier import load_or_train_domain_classifier
from common.evaluation.fid import feature_stats, frechet_distance


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.manual_seed(0)
    kwargs = dict(synthetic_writers=30, synthetic_samples_per_writer=60)
    model, meta = load_or_train_domain_classifier(
        "synthetic", cache_dir=tmp_path_factory.mktemp("cache"), epochs=2, progress=False, **kwargs
    )
    test = load_dataset("synthetic", split="test", **kwargs)
    images = torch.from_numpy(test.images[:1200]).float().div(255).unsqueeze(1)
    return model, images


def fid(model, a, b) -> float:
    return frechet_distance(feature_stats(extract_features(model, a)), feature_stats(extract_features(model, b)))


def test_real_halves_are_far_closer_than_noise(setup):
    model, images = setup
    half_a, half_b = images[:600], images[600:]
    noise = torch.rand_like(half_b, generator=None)
    assert fid(model, half_a, half_b) < 0.05 * fid(model, half_a, noise)


def test_fid_grows_monotonically_with_corruption(setup):
    model, images = setup
    reference, target = images[:600], images[600:]
    rng = torch.Generator().manual_seed(1)
    noise = torch.rand(target.shape, generator=rng)
    values = [fid(model, reference, (1 - t) * target + t * noise) for t in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert all(b > a for a, b in zip(values, values[1:], strict=False)), values
