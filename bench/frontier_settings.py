"""The frontier's settings: each strategy's unit, its no-noise flags, the per-scale flags, GS-WGAN's
cumulative levers and the method rows (``VARIANTS``, indexed by ``--variants``; append, never
reorder). What ``bench/frontier.py`` runs; nothing here runs anything."""

from __future__ import annotations

UNITS = {
    "gswgan": "per-client, untrusted server",
    "dpgan": "example-level, trusted curator",
    "fedavg-gan": "user-level, trusted server",
    "dp-merf": "per-client, untrusted server",
    "dp-ntk": "per-client, untrusted server",
}
# The ∞ point: no noise. Opacus refuses σ = 0, so DPGAN's runs at σ = 1e-6 (clipping still on, ε
# astronomically large but finite, and printed as such).
NO_NOISE = {
    "gswgan": ["--noise-multiplier", "0"],
    "dpgan": ["--dpgan-noise-multiplier", "1e-6"],
    "fedavg-gan": ["--fedavg-noise-multiplier", "0"],
    "dp-merf": ["--merf-noise-multiplier", "0"],
    "dp-ntk": ["--merf-noise-multiplier", "0"],
}

FEDAVG_LEVERS = [
    "--fedavg-delta", "weights", "--fedavg-client-optimizer", "adam", "--fedavg-lr-d", "1e-3",
    "--fedavg-clip", "1", "--fedavg-g-optimizer", "adam", "--fedavg-lr-g", "1e-3",
    "--local-steps", "10", "--server-g-steps", "3",
]  # fmt: skip

# Per scale: flags every run shares, then each strategy's own (steps mean generator steps for
# gswgan, rounds for dpgan and fedavg-gan; chosen so the three cost about the same wall time).
SCALES: dict[str, dict[str, list[str]]] = {
    "cpu": {
        "common": ["--model", "small", "--num-clients", "100", "--partition", "iid", "--batch-size", "32"],
        "gswgan": ["--steps", "1500", "--critic-fakes", "query", "--lr-g", "1e-3", "--lr-d", "1e-3"],
        "dpgan": ["--steps", "300", "--dpgan-batch-size", "64"],
        # Fed-Avg's free levers (bench/results/fedavg-levers.md): a weights-only delta (spectral
        # norm's power-iteration vectors filled 98% of the clipped delta), clients' Adam (lr 1e-3) with
        # S = 1 (about its delta's norm), the server's Adam on G (lr 1e-3), 10 local D steps to 3 G
        # steps per round. The ledger of a config is unchanged.
        "fedavg-gan": ["--steps", "150", "--fedavg-clients-per-round", "10", *FEDAVG_LEVERS],
        # One release per client, so its noise on the average falls as 1/sqrt(K): the same 60,000
        # images in 3,000 clients of 20 (its lever, as K = 400 is GS-WGAN's); S = 1/sqrt(10) clips
        # nothing of an IID client's summary.
        "dp-merf": ["--num-clients", "3000", "--steps", "400", "--merf-clip", "0.32", "--ema-decay", "0.99"],
        "dp-ntk": ["--num-clients", "3000", "--steps", "400", "--merf-clip", "0.32", "--ema-decay", "0.99"],
    },
    "paper": {
        "common": ["--model", "paper", "--num-clients", "1000", "--partition", "iid", "--batch-size", "32"],
        "gswgan": ["--steps", "20000", "--warmup-steps", "2000"],
        "dpgan": ["--steps", "4000", "--dpgan-batch-size", "64"],
        "fedavg-gan": ["--steps", "2000", "--fedavg-clients-per-round", "100"],
        "dp-merf": ["--num-clients", "3000", "--steps", "2000", "--merf-clip", "0.32"],
        "dp-ntk": ["--num-clients", "3000", "--steps", "2000", "--merf-clip", "0.32"],
    },
}

# GS-WGAN's free levers (no extra ε), each row adding one to the row before, all at --levers-at:
# what each did is the difference between consecutive rows. The first row is GS-WGAN as published
# (lr 1e-4, EMA 0.999, fresh fakes per critic step).
LEVERS: dict[str, list[tuple[str, list[str]]]] = {
    "cpu": [
        ("as published", ["--lr-g", "1e-4", "--lr-d", "1e-4", "--ema-decay", "0.999", "--critic-fakes", "fresh"]),
        ("+ lr 1e-3, EMA 0.99, critic fakes = query", ["--lr-g", "1e-3", "--lr-d", "1e-3", "--ema-decay", "0.99"]),
        ("+ grad-dct 8", ["--grad-dct", "8"]),
        ("+ warm start 50", ["--warmup-steps", "50"]),
        ("+ K = 400 (fewer queries per client)", ["--num-clients", "400"]),
    ],
    "paper": [
        ("as published", ["--lr-g", "1e-4", "--lr-d", "1e-4", "--ema-decay", "0.999", "--critic-fakes", "fresh"]),
        ("+ grad-dct 8", ["--grad-dct", "8"]),
    ],
}

# The source papers' further methods and options, each a row at --levers-at on top of its strategy's
# main flags (GS-WGAN's: every lever): DPAC's ablation (Chen et al. 2023, Table 4: baseline, w/o g2r,
# w/o r2g, w/o seq, w/o init, full), in its federated and centralized forms, and dpGAN's public warm
# start and grouped clipping. The baseline of each is the strategy's main row at that target.
DPAC = ["--dpac-beta", "0.5"]
PUBLIC = ["--public-data", "holdout", "--public-size", "1000"]
VARIANTS: list[tuple[str, str, list[str]]] = [
    ("gswgan", "DPAC full (β 0.5, seq, init 100)", DPAC),
    ("gswgan", "DPAC w/o g2r (C learns from real data only)", [*DPAC, "--dpac-train", "real"]),
    ("gswgan", "DPAC w/o r2g (C learns from generated data only)", [*DPAC, "--dpac-train", "fake"]),
    ("gswgan", "DPAC w/o seq (one joint step on both)", [*DPAC, "--dpac-train", "joint"]),
    ("gswgan", "DPAC w/o init", [*DPAC, "--dpac-init", "0"]),
    ("dpgan", "DPAC, centralized (C by DP-SGD, charged)", [*DPAC, "--dpac-init", "20"]),
    # dpGAN (Zhang et al. 2018): a public warm start on a held-apart 1,000 examples, grouped clipping
    ("gswgan", "public warm start (holdout 1,000; G 20 steps, each D 20)", [*PUBLIC, "--public-warmup-steps", "20"]),
    ("dpgan", "public warm start (holdout 1,000; 100 steps)", [*PUBLIC, "--public-warmup-steps", "100"]),
    ("dpgan", "grouped clipping: weight-bias, equal bounds", ["--dpgan-clip-groups", "weight-bias"]),
    (
        "dpgan",
        "grouped clipping: per layer, public bounds, proportional noise",
        [
            *PUBLIC,
            "--dpgan-clip-groups",
            "layer",
            "--dpgan-group-bounds",
            "public",
            "--dpgan-group-noise",
            "proportional",
        ],
    ),
]

# DP-MERF's own levers at --levers-at, each against its main row (K = 3,000, S = 0.32, 10x10 DCT).
VARIANTS += [
    ("dp-merf", "K = 100 (the other strategies' federation)", ["--num-clients", "100"]),
    ("dp-merf", "K = 400 (GS-WGAN's best federation)", ["--num-clients", "400"]),
    ("dp-merf", "S = 1 (no clipping below the summary's bound)", ["--merf-clip", "1"]),
    ("dp-merf", "kernel on pixels instead of the 10x10 DCT", ["--merf-dct", "0"]),
]
# Issue 26's ceiling levers and DP-NTK's ablation (appended: the indices above stay what they were).
VARIANTS += [
    ("dp-merf", "pixels, D = 1,000 frequencies", ["--merf-dct", "0", "--merf-features", "1000"]),
    ("dp-merf", "pixels, D = 3,000 frequencies", ["--merf-dct", "0", "--merf-features", "3000"]),
    ("dp-ntk", "width 800 (4x the features)", ["--ntk-width", "800"]),
    ("dp-ntk", "on the 10x10 DCT instead of pixels", ["--ntk-dct", "10"]),
    (
        "dp-merf",
        "pixels, D = 3,000, length scale 5",
        ["--merf-dct", "0", "--merf-features", "3000", "--merf-lengthscale", "5"],
    ),
    (
        "dp-merf",
        "pixels, D = 3,000, length scale 4",
        ["--merf-dct", "0", "--merf-features", "3000", "--merf-lengthscale", "4"],
    ),
    (
        "dp-merf",
        "pixels, D = 3,000, length scale 5, 4,000 generator steps",
        ["--merf-dct", "0", "--merf-features", "3000", "--merf-lengthscale", "5", "--steps", "4000"],
    ),
]
