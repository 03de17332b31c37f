"""The DNS shim's tests."""

from kafkatunnel.hostnames import ClusterZones, ResolvableName


def names_of(advertised: str) -> ResolvableName:
    """Every form of a broker's name, its namespace the user's (as with --namespace)."""
    return ClusterZones.of([advertised]).names_of(advertised)
