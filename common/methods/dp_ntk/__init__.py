"""DP-NTK (Yang, Adamczewski, Sutherland, Li & Park, AISTATS 2023), federated at client level like
DP-MERF: the fifth method, in this folder — only its feature map is its own.

Why it is here: a one-shot release spends each client's budget once, so its quality is bounded by
what the kernel's mean embedding can say about the data. DP-NTK replaces DP-MERF's random Fourier
features of a Gaussian kernel by the neural tangent features of a random one-hidden-layer ReLU
network (``features.py``), a richer kernel on images in its authors' experiments.

- **The summary, the release, the secure sums and the generator** are DP-MERF's
  (``common/methods/dp_merf/``: ``FeatureFamily`` is the seam): each client releases once the mean
  over its examples of ``φ(x) ⊗ onehot(y)`` (‖φ‖ = 1), clipped to S and noised (or deposited with a
  Skellam share with ``--secure-aggregation``); the generator is fitted to the mean on the server.
  The release options are the one-shot release's (``--merf-clip``, ``--merf-noise-multiplier``, …).
- **Its own**: ``--ntk-width`` and ``--ntk-dct`` (``options.py``), the message ``train.dpntk``, and
  the statement's description of φ. A node's one-shot releases (DP-MERF's and DP-NTK's) count
  together: a second needs a budget in the node's policy.

Files: ``options.py``, ``features.py`` (φ), ``method.py`` (``METHOD``).
"""

from .method import METHOD

__all__ = ["METHOD"]
