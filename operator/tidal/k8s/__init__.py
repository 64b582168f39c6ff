"""The only layer that talks to the Kubernetes API: kopf handlers and API calls."""
