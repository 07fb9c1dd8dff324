"""Developer tools: keeping pyproject.toml's Flower run config in step, unpacking a wheel's files."""
