"""Generator/discriminator presets: sizes, shapes, ranges, per-sample independence, EMA."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from common.learning.models import (
    PRESETS,
    GeneratorEMA,
    build_discriminator,
    build_generator,
    count_params,
    ema_init,
    ema_update,
    sample_latent,
)

# Official GS-WGAN MNIST networks (the paper's code): ResNet G 3.83M, DCGAN D 1.07M.
PAPER_G_PARAMS = 3.83e6
PAPER_D_PARAMS = 1.07e6


def _batch(n: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z = sample_latent(n, 10, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    x = torch.rand(n, 1, 28, 28, generator=g)
    return z, y, x


def test_paper_preset_matches_official_parameter_counts() -> None:
    torch.manual_seed(0)
    n_g = count_params(build_generator("paper"))
    n_d = count_params(build_discriminator("paper"))
    print(f"paper: G {n_g:,} params, D {n_d:,} params")
    assert n_g == pytest.approx(PAPER_G_PARAMS, rel=0.01)
    assert n_d == pytest.approx(PAPER_D_PARAMS, rel=0.01)


def test_presets_are_ordered_by_size() -> None:
    sizes = {p: (count_params(build_generator(p)), count_params(build_discriminator(p))) for p in PRESETS}
    assert sizes["tiny"][0] < sizes["small"][0] < sizes["paper"][0]
    assert sizes["tiny"][1] < sizes["small"][1] < sizes["paper"][1]
    assert sizes["tiny"][0] < 50_000 and sizes["tiny"][1] < 50_000


def test_unknown_preset_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="huge"):
        build_generator("huge")
    with pytest.raises(ValueError, match="tiny, small, paper"):
        build_discriminator("huge")


@pytest.mark.parametrize("preset", PRESETS)
def test_shapes_and_output_range(preset: str) -> None:
    torch.manual_seed(0)
    G, D = build_generator(preset), build_discriminator(preset)
    assert (G.z_dim, G.num_classes, D.num_classes) == (10, 10, 10)
    z, y, _ = _batch(3)
    with torch.no_grad():
        x = G(z, y)
        scores = D(x, y)
    assert x.shape == (3, 1, 28, 28)
    assert x.min() >= 0.0 and x.max() <= 1.0  # sigmoid output
    assert scores.shape == (3,) and torch.isfinite(scores).all()


def test_custom_latent_and_class_count() -> None:
    G = build_generator("tiny", z_dim=7, num_classes=4)
    D = build_discriminator("tiny", num_classes=4)
    z = sample_latent(5, 7)
    y = torch.tensor([0, 1, 2, 3, 3])
    assert G(z, y).shape == (5, 1, 28, 28)
    assert D(G(z, y), y).shape == (5,)


def test_count_params_ignores_buffers() -> None:
    D = build_discriminator("tiny")
    n_buffers = sum(b.numel() for b in D.buffers())
    assert n_buffers > 0  # spectral norm's u and v
    assert count_params(D) == sum(p.numel() for p in D.parameters())
    assert count_params(ema_init(D)) == count_params(D)  # frozen parameters still count
    assert count_params(nn.Linear(3, 2)) == 8


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_layers_are_spectrally_normalized(preset: str) -> None:
    for model in (build_generator(preset), build_discriminator(preset)):
        weighted = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear, nn.Embedding))]
        assert weighted and all(parametrize.is_parametrized(m, "weight") for m in weighted)


def test_spectral_norm_bounds_discriminator_layers_after_power_iterations() -> None:
    D = build_discriminator("tiny")
    _, y, x = _batch(2)
    with torch.no_grad():
        for _ in range(50):  # each training-mode forward runs one power iteration per layer
            D(x, y)
    D.eval()
    with torch.no_grad():
        for layer in D.convs:
            sigma = torch.linalg.matrix_norm(layer.weight.flatten(1), ord=2).item()
            assert sigma == pytest.approx(1.0, abs=1e-3)


def _score_after(D: nn.Module, state: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    D.load_state_dict(state)  # same power-iteration vectors for every call in training mode
    with torch.no_grad():
        return D(x, y)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_discriminator_never_mixes_samples(mode: str) -> None:
    torch.manual_seed(0)
    D = build_discriminator("tiny").train(mode == "train")
    state = copy.deepcopy(D.state_dict())
    _, y, x = _batch(6)
    base = _score_after(D, state, x, y)
    x2, y2 = x.clone(), y.clone()
    x2[3] = torch.rand(1, 28, 28)
    y2[3] = (y[3] + 1) % 10
    moved = _score_after(D, state, x2, y2)
    others = [i for i in range(6) if i != 3]
    torch.testing.assert_close(moved[others], base[others], rtol=0, atol=1e-6)
    assert not torch.allclose(moved[3], base[3])
    # Batch composition does not matter either: sample 0 alone scores the same as in the batch.
    torch.testing.assert_close(_score_after(D, state, x[:1], y[:1]), base[:1], rtol=0, atol=1e-6)


def test_discriminator_jacobian_is_block_diagonal_in_train_mode() -> None:
    torch.manual_seed(0)
    D = build_discriminator("tiny").train()
    _, y, x = _batch(4)
    x.requires_grad_(True)
    scores = D(x, y)  # one forward, one power iteration: exact
    for i in range(4):
        (g,) = torch.autograd.grad(scores[i], x, retain_graph=True)
        per_sample = g.flatten(1).abs().sum(dim=1)
        assert per_sample[i] > 0
        assert torch.all(per_sample[torch.arange(4) != i] == 0)


def test_generator_treats_samples_independently() -> None:
    # The server may generate the critic's fake batches and the query batch in separate calls.
    torch.manual_seed(0)
    G = build_generator("tiny").eval()
    z, y, _ = _batch(8)
    with torch.no_grad():
        torch.testing.assert_close(G(z, y)[5:], G(z[5:], y[5:]), rtol=0, atol=1e-6)


def test_latent_is_bernoulli_half() -> None:
    z = sample_latent(4000, 10, generator=torch.Generator().manual_seed(1))
    assert z.shape == (4000, 10) and z.dtype == torch.float32
    assert set(z.unique().tolist()) == {0.0, 1.0}
    assert z.mean().item() == pytest.approx(0.5, abs=0.01)  # 5 sigma = 0.0125 over 40k draws
    again = sample_latent(4000, 10, generator=torch.Generator().manual_seed(1))
    assert torch.equal(z, again)


def test_state_dict_round_trip_reproduces_outputs() -> None:
    torch.manual_seed(0)
    G = build_generator("tiny").eval()
    torch.manual_seed(1)
    G2 = build_generator("tiny").eval()
    G2.load_state_dict(G.state_dict())
    z, y, _ = _batch(4)
    with torch.no_grad():
        torch.testing.assert_close(G2(z, y), G(z, y))


# --- EMA ---------------------------------------------------------------------------------------


def _perturb(model: nn.Module, scale: float = 0.1) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))


def test_ema_update_math() -> None:
    torch.manual_seed(0)
    model = build_generator("tiny")
    ema = ema_init(model)
    assert not ema.training and all(not p.requires_grad for p in ema.parameters())
    before = [p.clone() for p in ema.parameters()]
    _perturb(model)
    with torch.no_grad():
        model(*_batch(2)[:2])  # moves spectral norm's u, v buffers
    d = ema_update(ema, model, 0.9)
    assert d == 0.9
    for p_ema, p_old, p in zip(ema.parameters(), before, model.parameters(), strict=False):
        torch.testing.assert_close(p_ema, 0.9 * p_old + 0.1 * p)
    for b_ema, b in zip(ema.buffers(), model.buffers(), strict=False):
        assert torch.equal(b_ema, b)


def test_ema_warmup_forgets_the_start_then_uses_decay() -> None:
    torch.manual_seed(0)
    model = build_generator("tiny")
    tracker = GeneratorEMA(model, decay=0.999)
    _perturb(model)
    assert tracker.update(model) == pytest.approx(0.1)  # step 0: (1 + 0) / (10 + 0)
    assert tracker.update(model) == pytest.approx(2 / 11)
    tracker.num_updates = 10_000
    assert tracker.update(model) == pytest.approx(0.999)
    state = tracker.state_dict()
    other = GeneratorEMA(build_generator("tiny"))
    other.load_state_dict(state)
    assert other.num_updates == 10_001
    for a, b in zip(other.module.parameters(), tracker.module.parameters(), strict=False):
        assert torch.equal(a, b)


def test_ema_of_a_short_run_releases_its_late_iterates() -> None:
    """300 updates at decay 0.999: the first 100 iterates keep < 0.1% of the weight.

    The earlier rule ``1 - 1/(t+1)`` averaged uniformly up to t = 1,000 and gave them a third.
    """
    model = nn.Linear(1, 1, bias=False)
    tracker = GeneratorEMA(model, decay=0.999)
    for t in range(300):
        with torch.no_grad():
            model.weight.fill_(1.0 if t < 100 else 0.0)
        tracker.update(model)
    assert tracker.module.weight.item() < 1e-3


def test_ema_without_warmup_and_bad_decay() -> None:
    model = build_generator("tiny")
    tracker = GeneratorEMA(model, decay=0.5, warmup=False)
    assert tracker.update(model) == 0.5
    with pytest.raises(ValueError, match="decay"):
        ema_update(tracker.module, model, 1.5)
