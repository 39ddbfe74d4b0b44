"""maka-eval's three images, built for real from images/Dockerfile with Podman.

hack/build-images.sh builds the operator, egress and relay images from a Debian 12 base
named by digest (`debian:bookworm-slim@sha256:...`, the form the Dockerfile documents
for images you ship); without a registry that base is the image hack/podman.sh makes
from Debian packages. The first run installs the Python packages into the layer cache
(a few minutes); a second run reuses every dependency layer. Without root these tests
skip, saying why.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest

from tests.shipping.test_relay_bundle import REPO, build_images, podman  # noqa: F401

DOCKERFILE = REPO / "images" / "Dockerfile"
BASE = "docker.io/library/debian:bookworm-slim"
TARGETS = ("operator", "egress", "relay")
RUN_TIMEOUT = 180


def run(
    image: str, *command: str, entrypoint: str | None = None
) -> subprocess.CompletedProcess[str]:
    args = ["podman", "run", "--rm", "--network", "none"]
    if entrypoint is not None:
        args += ["--entrypoint", entrypoint]
    return subprocess.run(
        [*args, image, *command], capture_output=True, text=True, timeout=RUN_TIMEOUT
    )


def inspect(image: str) -> dict:
    proc = subprocess.run(
        ["podman", "image", "inspect", image], capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout)[0]


@pytest.fixture(scope="module")
def pinned_base(podman: None) -> str:  # noqa: F811
    digest = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Digest}}", BASE],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), digest
    return f"{BASE}@{digest}"


@pytest.fixture(scope="module")
def images(pinned_base: str) -> dict[str, str]:
    return build_images(*TARGETS, base=pinned_base)


def test_the_dockerfile_pins_its_base_by_a_documented_build_arg() -> None:
    text = DOCKERFILE.read_text()
    assert f"ARG DEBIAN_IMAGE={BASE}\n" in text
    assert f"--build-arg DEBIAN_IMAGE={BASE}@sha256:<digest>" in text
    stages: list[str] = []
    for line in text.splitlines():
        if line.startswith("FROM "):
            parts = line.split()
            # Every stage starts from the pinned base or from an earlier stage.
            assert parts[1] == "${DEBIAN_IMAGE}" or parts[1] in stages, line
            stages.append(parts[3])
    assert set(TARGETS) <= set(stages)
    # The operator and egress images share the Python stage: one package-install step.
    assert text.count("apt-get install -y --no-install-recommends python3 ") == 1


@pytest.mark.slow
def test_three_images_build_run_as_non_root_and_start(images: dict[str, str]) -> None:
    assert set(TARGETS) <= set(images)
    for target in TARGETS:
        config = inspect(images[target])["Config"]
        assert config.get("User") == "65532:65532", (target, config.get("User"))

    operator = run(images["operator"], "--help")
    assert operator.returncode == 0, operator.stderr
    assert "--relay-bundle-digest" in operator.stdout and "--egress-gateway" in operator.stdout

    egress = images["egress"]
    for command in (
        ("python3", "-m", "maka_eval.egress.gateway", "--help"),
        ("python3", "-m", "maka_eval.egress.sidecar", "--help"),
        ("mitmdump", "--version"),
    ):
        proc = run(egress, *command)
        assert proc.returncode == 0, (command, proc.stderr)
    # Only what the sidecar and the gateway import: not the operator's libraries.
    proc = run(egress, "python3", "-c", "import kopf")
    assert proc.returncode != 0 and "No module named 'kopf'" in proc.stderr

    relay = images["relay"]
    proc = run(relay)  # CMD: the frozen relay's --help, with no Python in the image
    assert proc.returncode == 0 and "--plan-json" in proc.stdout, proc.stderr
    proc = run(relay, "sh", "-c", "command -v python3 || ls -d /usr/lib/python3*")
    assert proc.returncode != 0, f"the relay image holds a Python: {proc.stdout}"
    digest = images["relay-bundle-digest"]
    proc = run(relay, "sha256sum", "/opt/maka-eval/checksums.sha256")
    assert digest == "sha256:" + proc.stdout[:64]


@pytest.mark.slow
def test_a_second_build_reuses_the_dependency_layers(
    images: dict[str, str], pinned_base: str
) -> None:
    env = {**os.environ, "MAKA_EVAL_BUILDER": "podman", "MAKA_EVAL_DEBIAN_IMAGE": pinned_base}
    started = time.monotonic()
    proc = subprocess.run(
        [str(REPO / "hack" / "build-images.sh"), *TARGETS],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Every apt and pip step comes from the cache; only a changed source tree (the wheel
    # and the frozen relay) is rebuilt.
    steps = re.split(r"\n(?=\[\d+/\d+\] STEP )", proc.stderr)
    heavy = [s for s in steps if re.search(r"apt-get install|install -r requirements", s)]
    assert len(heavy) >= 5, proc.stderr[-3000:]
    for step in heavy:
        assert "Using cache" in step, step[:400]
    print(f"second build of {', '.join(TARGETS)}: {took:.1f} s")
