"""GS-WGAN (Chen, Orekondy, Fritz 2020), federated: the whole method, in this folder.

The server holds the generator, every client a private discriminator on its own partition; each
generator step the sampled clients return per-sample gradients of the generator loss that they
clipped and noised themselves, so the per-client guarantee holds against an untrusted server.

- ``options.py``: its section of the configuration; ``messages.py``: ``GsQuery``/``GsAnswer``;
- ``client.py`` (the answer), ``critic.py`` (the critic steps, warm starts), ``critic_stack.py``
  (m clients as one network), ``critic_graph.py`` (a client's steps as CUDA graphs);
- ``server.py`` (whom to ask, what the answers do), ``generator.py`` (G, its EMA, the
  straight-through update), ``generator_graph.py`` (G's query and update as CUDA graphs);
- ``privacy.py``: the mechanism (σ/√B per answer), calibration, bounds and the statement;
- ``method.py``: ``METHOD``, what the registry and the shells see.
"""

from .method import METHOD

__all__ = ["METHOD"]
