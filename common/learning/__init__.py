"""Training pieces every method builds on: the networks, their losses, DPAC's auxiliary classifier
and the warm start on public data."""
