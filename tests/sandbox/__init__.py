"""The container sandbox's engine: rootful Podman behind the Docker Engine API, with
registry-free base images (hack/podman.sh, docs/containers.md)."""
