"""Node privacy policies for tests.

A fixed noise seed makes runs reproducible but voids every guarantee, so a node refuses it unless
its own policy allows non-private options: tests that need exact reproducibility pin such a policy
on their (simulated) nodes, the way a user debugging on public data would.
"""

ALLOW_NONPRIVATE = {"privacy-allow-nonprivate": True}
