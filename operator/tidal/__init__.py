"""tidal: topology-aware gang scheduling and day/night rebalancing on GPU supernodes."""

API_GROUP = "tidal.dev"
API_VERSION = "v1alpha1"

__version__ = "0.1.0"
