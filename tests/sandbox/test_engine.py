"""The container engine behaves as the sandbox needs: it answers on its socket, the
registry-free base image resolves as `debian:bookworm-slim`, `--network none` leaves only
`lo`, read-only bind mounts are read-only, exit codes come back, and a memory limit kills
with 137. Real containers; see docs/containers.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sandbox.conftest import (
    BASE_IMAGE,
    PYTHON_IMAGE,
    Engine,
    Mount,
    api_get,
    version_info,
)

pytestmark = pytest.mark.slow


def test_engine_answers(container_engine: str, engine: Engine) -> None:
    assert container_engine.startswith("unix://")
    assert api_get(container_engine, "/_ping") == (200, b"OK")
    version = version_info(container_engine)
    assert version["ApiVersion"]  # the Docker API version Podman speaks (1.41 for 4.3)
    assert any(c["Name"] == "Podman Engine" for c in version.get("Components", []))
    assert engine.ping()


def test_base_images_exist_locally(engine: Engine) -> None:
    assert engine.image_exists(BASE_IMAGE)
    assert engine.image_exists("docker.io/library/debian:bookworm-slim")
    assert engine.image_exists(PYTHON_IMAGE)
    result = engine.run(BASE_IMAGE, ["sh", "-c", ". /etc/os-release; echo $VERSION_CODENAME"])
    assert (result.exit_code, result.output.strip()) == (0, "bookworm")


def test_network_none_has_only_loopback(engine: Engine) -> None:
    result = engine.run(BASE_IMAGE, ["sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1"])
    assert result.exit_code == 0, result.output
    assert [line.strip() for line in result.output.split()] == ["lo"]


def test_read_only_bind_mount(engine: Engine, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "input.txt").write_text("hello from the host\n")
    script = "cat /data/input.txt && echo changed > /data/input.txt"
    ro = engine.run(BASE_IMAGE, ["sh", "-c", script], mounts=[Mount(shared, "/data")])
    assert ro.exit_code != 0
    assert "hello from the host" in ro.output
    assert "Read-only file system" in ro.output
    assert (shared / "input.txt").read_text() == "hello from the host\n"
    # The same mount read-write can write: the failure above is the :ro, not permissions.
    rw = engine.run(
        BASE_IMAGE, ["sh", "-c", script], mounts=[Mount(shared, "/data", read_only=False)]
    )
    assert rw.exit_code == 0, rw.output
    assert (shared / "input.txt").read_text() == "changed\n"


@pytest.mark.parametrize("code", [0, 3, 255])
def test_exit_code_comes_back(engine: Engine, code: int) -> None:
    result = engine.run(BASE_IMAGE, ["sh", "-c", f"echo out; echo err >&2; exit {code}"])
    assert result.exit_code == code
    assert "out" in result.output and "err" in result.output


def test_memory_limit_kill_gives_137(engine: Engine) -> None:
    # inspect() may say OOMKilled=false on Podman after such a kill: trust the 137.
    grab = "b = bytearray(256 * 1024 * 1024); print('survived', len(b))"
    result = engine.run(PYTHON_IMAGE, ["python3", "-c", grab], memory="64m")
    assert result.exit_code == 137, result.output
    assert "survived" not in result.output
    fits = engine.run(PYTHON_IMAGE, ["python3", "-c", grab.replace("256", "8")], memory="64m")
    assert fits.exit_code == 0, fits.output
