"""The seed stage (``--init-release``): a one-shot release seeds a GAN, which then refines it.

Not a method (it is in no ``FOLDERS``): a mechanism every GAN that says ``accepts_seed`` starts
from, in this one place. ``stage.py`` plans it (stage 1's configuration and what it charges each
client, for the calibration and the nodes' checks), ``start.py`` holds what stage 2 starts from
(the fitted generator, the anchor to the released embedding, the server's critic);
``server/seeded.py`` runs both stages on one federation, so each client's ledger composes them;
``pooled.py`` is the seed a curator that pools every partition (DPGAN) makes itself, example-level.
"""

from __future__ import annotations

from .options import INIT_RELEASE_HELP, NONE, Options, validate
from .pooled import pools_data
from .stage import calibrate_seed, check_run, federated, seed_config, seed_events, seeded
from .start import SeedAnchor, SeedStart, server_critic, start_from_checkpoint, start_generator

__all__ = [
    "NONE",
    "INIT_RELEASE_HELP",
    "Options",
    "SeedAnchor",
    "SeedStart",
    "calibrate_seed",
    "check_run",
    "federated",
    "pools_data",
    "seed_config",
    "seed_events",
    "seeded",
    "server_critic",
    "start_from_checkpoint",
    "start_generator",
    "validate",
]
