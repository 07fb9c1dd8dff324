"""Fed-Avg GAN (Augenstein et al. 2020): the whole method, in this folder.

Per round: the server samples every available client independently with probability q = m/K
(secret, Poisson) and sends G and D to those sampled; each takes up to ``local_steps`` SGD steps on D
with the WGAN-GP loss (its real data, fakes from the frozen G) and returns its raw D delta
(``client.py``); the server aggregates them with user-level DP-FedAvg (``dp_fedavg.py``:
clip to S, sum, N(0, (zS)^2), divide by the fixed m), applies the result, then takes a few generator
steps against the new D (``server.py``: post-processing, no privacy cost).

Privacy: the server's ledger holds one Poisson-subsampled Gaussian (z, q) per round that released a
noised D, the user-level figure with a trusted server. The server sees raw deltas, so each client's
own ledger holds a void event per delta: against an untrusted server its ε is unbounded.

Files: ``options.py``, ``messages.py``, ``client.py`` (a client's round), ``dp_fedavg.py`` (the
aggregation), ``server.py`` (the server's side), ``privacy.py`` (calibration, statement),
``method.py`` (``METHOD``, what the registry and the shells see).
"""

from .method import METHOD

__all__ = ["METHOD"]
