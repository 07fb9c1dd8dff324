"""Centralized DPGAN (Bie, Kamath, Zhang 2023): the whole method, in this folder.

All partitions are pooled on one curator node (client 0), which trains D with DP-SGD
(``dpsgd.py``: Opacus, secret Poisson batches q = B/N, per-example clipping of real and fake
rows) and G by post-processing, and returns G's weights every round; the server keeps the EMA, the
released model. Each round the curator takes n_D DP steps, then one generator step, updates the
adaptive n_D, records the steps that added noise in its ledger, and persists its state (D, G, both
optimizers, the schedule, the ledger, the public RNG) on its own disk.

The Poisson batches come from a secret sampler (the OS CSPRNG, nothing saved): amplification at
q = B/N holds only if nobody can tell which examples a step used, and the run's seed is published
in config.json. ``--sampling-seed`` (tests only) makes them reproducible and every event void.
ε is example-level, with the curator trusted: ``calibrate`` picks σ for ``--target-epsilon`` and
makes the target the curator's budget, so an adaptive n_D that outgrows the plan stops there.

Files: ``options.py``, ``messages.py``, ``curator.py`` (the curator's round) and ``storage.py``
(its state on the node's disk), ``dpsgd.py``, ``dp_classifier.py``, ``adaptive.py``,
``grouping.py`` and ``grouped_clip.py`` (DP-SGD and what it needs), ``client.py`` (a node's
answer), ``server.py`` (the server's side), ``privacy.py`` (calibration, the statement),
``method.py`` (``METHOD``, what the registry and the shells see).
"""

from .method import METHOD

__all__ = ["METHOD"]
