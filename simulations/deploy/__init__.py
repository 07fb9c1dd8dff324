"""Deployments: ``fedgan deploy --local`` (SuperLink and SuperNodes as processes on this machine, with
TLS, node keys, network namespaces and counting relays) and the Docker Compose files."""
