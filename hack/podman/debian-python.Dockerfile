# maka-eval/debian-python:bookworm, built by `hack/podman.sh images` on top of the local
# registry-free debian:bookworm-slim (see docs/containers.md). apt reaches the mirror
# through the default (bridge) network during the build.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/*
CMD ["python3"]
