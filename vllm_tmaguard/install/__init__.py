"""The commands that place the guard: into a directory, a wheel, an environment, Kubernetes manifests."""
