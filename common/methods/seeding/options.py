"""The seed stage's section of the configuration (``ExperimentConfig`` composes it) and its checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.options import check, check_choice, option

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

NONE = "none"
# ``common.methods`` fills {seeds} from its registry (the methods that say ``seeds``)
INIT_RELEASE_HELP = (
    "seed stage: " + NONE + ", or the one-shot release ({seeds}) every client makes first, through the run's "
    "channel (secure sums with --secure-aggregation); the server fits the GAN's generator to it and trains a "
    "critic on that generator's samples, and the GAN starts from both (these GANs do: {takers}). Each client's "
    "ledger composes both stages; --target-epsilon is the total and --init-epsilon the seed's share. dpgan's "
    "curator, which pools the data, makes the release itself in its first round, example-level (sensitivity 1 "
    "on the pooled feature sum), fits G to it and composes it first in its ledger; its D starts from scratch"
)


@dataclass(frozen=True)
class Options:
    """The seed stage: a one-shot release before the run's GAN, which starts from its generator."""

    init_release: str = option(NONE, INIT_RELEASE_HELP.format(seeds="a method's", takers="GANs"))
    init_epsilon: float = option(
        0.0,
        "seed stage: the per-client epsilon of the seed release (its share of --target-epsilon, which is "
        "the total of both stages); the GAN's noise is calibrated for what is left after composing both",
    )
    init_steps: int = option(
        400, "seed stage: the server's generator steps fitting the GAN's generator to the seed release"
    )
    init_weight: float = option(
        1000.0,
        "seed stage: weight of the seed release's fit (its embedding distance, post-processing) in every "
        "generator step of the GAN beside the clients' gradients, so the GAN keeps what the seed released "
        "(measured on make run's data: at 1 the noisy gradients, ~1,000 times the fit's, erased the seed, "
        "78 to 70 percent gen2real; at 1,000 the fit holds)",
    )
    init_critic_steps: int = option(
        200,
        "seed stage: WGAN-GP steps of the critic the server trains on the seed generator's samples (public: "
        "post-processing of the release); each client's discriminator starts from it (0: from scratch). "
        "Measured: worth at most a few tens of iterations of a client's own warm start (--warmup-steps), which it "
        "does not replace (bench/results/critic-warm-start-synthetic.md)",
    )
    init_noise_multiplier: float = option(
        0.0,
        "seed stage: the seed release's noise multiplier (set by the calibration from --init-epsilon; "
        "written to config.json so that the run, its resume and its report agree)",
    )


def validate(c: ExperimentConfig) -> None:
    """The section's own checks; what depends on the run's method is ``stage.check_run``'s."""
    from common.methods import METHODS  # the registry, complete by the time a config is checked

    check_choice(c, "init_release", (NONE, *(m.name for m in METHODS.values() if m.seeds)))
    check(c.init_epsilon >= 0, "init_epsilon", c.init_epsilon, "must be >= 0")
    check(c.init_steps >= 1, "init_steps", c.init_steps, "must be >= 1")
    check(c.init_weight >= 0, "init_weight", c.init_weight, "must be >= 0")
    check(c.init_critic_steps >= 0, "init_critic_steps", c.init_critic_steps, "must be >= 0")
    check(c.init_noise_multiplier >= 0, "init_noise_multiplier", c.init_noise_multiplier, "must be >= 0")
    if c.init_release == NONE:
        return
    check(
        c.target_epsilon > 0,
        "target_epsilon",
        c.target_epsilon,
        "a seeded run needs the total per-client epsilon of both stages (--target-epsilon)",
    )
    check(
        0 < c.init_epsilon < c.target_epsilon,
        "init_epsilon",
        c.init_epsilon,
        f"the seed's share must be in (0, target_epsilon = {c.target_epsilon:g})",
    )
