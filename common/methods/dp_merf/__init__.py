"""DP-MERF (Harder, Adamczewski, Park 2021), federated at client level: the whole method, in this folder.

Why it is here: GS-WGAN spends a client's budget on every query it answers, so at an honest
per-client ε the noise per generator step only falls as the federation grows, and every client of a
large federation needs a trained discriminator (docs/frontier.md). DP-MERF spends
it once: each client releases a single noisy summary of its data and never speaks again; the
generator is then fitted to the average of those summaries on the server, as post-processing.

- **The summary** (``embed``): the mean, over the client's examples, of ``φ(x) ⊗ onehot(y)``, where
  ``φ`` maps an image to random Fourier features of a Gaussian kernel (``FeatureMap``: public
  frequencies drawn from the run's seed, a public length scale, optionally on the image's k×k lowest
  2-D DCT coefficients) plus one constant coordinate that carries the class counts. ``‖φ(x)‖ = 1``
  for every x, so the summary's Frobenius norm is at most 1 whatever the client holds.
- **The release** (``release``): the client clips its summary to L2 norm S (``merf_clip``; S = 1 clips
  nothing), so replacing its whole data moves the release by at most 2S, and adds N(0, (2σS)²) to
  every coordinate: one Gaussian mechanism with noise multiplier σ, recorded once in the client's
  ledger. A node's budget refuses any second release.
- **The server** (``MerfGenerator``): the mean of the noisy summaries is the target; G takes Adam
  steps on ``Σ_c ‖w_c · mean φ(G(z, c)) − target_c‖²`` (the class weights ``w_c`` read from the
  count coordinate); its EMA is released. Nothing after the releases touches private data.
- **Messages**: ``train.dpmerf`` carries a ``MerfRequest`` and its ``MerfRelease``.

Files: ``options.py``, ``messages.py``, ``features.py`` (φ and the summary), ``client.py`` (the
release), ``generator.py`` and ``server.py`` (the server's side), ``privacy.py`` (the mechanism, its
calibration and statement), ``method.py`` (``METHOD``, what the registry and the shells see).
"""

from .method import METHOD

__all__ = ["METHOD"]
