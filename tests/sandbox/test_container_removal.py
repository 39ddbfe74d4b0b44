"""A stopped container is frozen at once and removed in the background.

The engine's pause (the cgroup freezer) stops every process of the container in about
12 ms; the removal, about 270 ms on Podman, runs off the attempt's path. An attempt that
joins the same network namespace waits for it; the executor drains them all.
"""

from __future__ import annotations

import contextlib
import threading
import time

import docker.errors
import pytest

from maka_eval.sandbox.container import images as container_images
from maka_eval.sandbox.container.engine import LABEL, client_for
from maka_eval.sandbox.container.removal import Removals, drain_removals, leftover_containers
from maka_eval.sandbox.container.sandbox import ContainerSandbox
from tests.helpers import sandbox_layout
from tests.sandbox.conftest import BASE_IMAGE


class FakeApi:
    def __init__(
        self, *, pausable: bool = True, removal_sec: float = 0.0, held: bool = False
    ) -> None:
        self.pausable = pausable
        self.removal_sec = removal_sec
        self.release = threading.Event()
        """A held removal lasts until the test sets this."""
        if not held:
            self.release.set()
        self.calls: list[tuple[str, str]] = []
        self.removed = threading.Event()

    def pause(self, container_id: str) -> None:
        self.calls.append(("pause", container_id))
        if not self.pausable:
            raise docker.errors.APIError("pause is not supported (no freezer)")

    def remove_container(self, container_id: str, force: bool, v: bool) -> None:
        assert force and v
        # The deadline only ends a hang: a test releases a held removal itself.
        assert self.release.wait(timeout=600), "the test never released the removal"
        time.sleep(self.removal_sec)
        self.calls.append(("remove", container_id))
        self.removed.set()


class FakeClient:
    def __init__(self, api: FakeApi) -> None:
        self.api = api


def test_a_container_is_paused_now_and_removed_later():
    removals = Removals()
    api = FakeApi(held=True)
    # The removal cannot finish before the release below: remove() returns without it.
    removals.remove(FakeClient(api), "c1", "/run/netns/cell-1")
    assert api.calls == [("pause", "c1")]
    removals.wait_for("/run/netns/other")  # another namespace: nothing to wait for
    assert not api.removed.is_set()
    api.release.set()
    removals.wait_for("/run/netns/cell-1")  # the same: its ports are free after this
    assert api.calls == [("pause", "c1"), ("remove", "c1")]


def test_drain_waits_for_every_removal():
    removals = Removals()
    apis = [FakeApi(removal_sec=0.2) for _ in range(3)]
    for number, api in enumerate(apis):
        removals.remove(FakeClient(api), f"c{number}", None)
    removals.drain()
    assert all(api.calls[-1][0] == "remove" for api in apis)


def test_a_container_that_cannot_be_paused_is_removed_at_once():
    removals = Removals()
    api = FakeApi(pausable=False)
    removals.remove(FakeClient(api), "c1", None)
    assert api.calls == [("pause", "c1"), ("remove", "c1")]  # before remove() returned


def test_a_failed_removal_does_not_hang_the_drain():
    removals = Removals()
    api = FakeApi()

    def broken(container_id, force, v):
        raise docker.errors.APIError("the engine went away")

    api.remove_container = broken  # type: ignore[method-assign]
    removals.remove(FakeClient(api), "c1", None)
    removals.drain()


@pytest.mark.usefixtures("container_engine")
def test_on_the_engine_the_processes_are_frozen_until_the_container_is_gone(container_engine):
    client = client_for(container_engine)
    created = client.api.create_container(
        BASE_IMAGE,
        entrypoint=["sh", "-c"],
        command=["while :; do date +%s%N >/tmp/now; done"],
        labels={f"{LABEL}.attempt-id": "removal-test"},
    )
    container_id = created["Id"]
    client.api.start(container_id)
    removals = Removals()
    removals.remove(client, container_id, None)
    try:
        state = client.api.inspect_container(container_id)["State"]
    except docker.errors.APIError as exc:  # already removed (Podman 4.3: a 500 mid-removal)
        assert exc.response.status_code == 404 or "no such container" in str(exc)
        state = None
    if state is not None:
        assert state["Paused"] or state["Status"] in ("paused", "removing", "exited")
    removals.drain()
    # Gone: a 404, or Podman 4.3's 500 "no such container" right after a removal.
    with pytest.raises(docker.errors.APIError, match=r"(?i)no such container|not found"):
        client.api.inspect_container(container_id)


# -- an image is resolved once per run ------------------------------------------------------


class InspectingApi:
    def __init__(self) -> None:
        self.inspected = 0

    def inspect_image(self, image: str) -> dict[str, object]:
        self.inspected += 1
        return {"Id": f"sha256:{'ab' * 32}", "Config": {"WorkingDir": "/app"}}


def test_an_image_is_inspected_once_per_run(monkeypatch):
    from maka_eval.sandbox.plans import ContainerPlan

    api = InspectingApi()
    monkeypatch.setattr(container_images, "client_for", lambda engine: FakeClient(api))
    plan = ContainerPlan(engine="unix:///nowhere.sock", image="example/task:1")
    container_images.forget_images()
    first = container_images.ensure_image(plan, "t")
    assert container_images.ensure_image(plan, "t") is first  # the next attempts
    assert api.inspected == 1
    other = ContainerPlan(engine="unix:///nowhere.sock", image="example/task:2")
    container_images.ensure_image(other, "t")
    assert api.inspected == 2
    container_images.forget_images()  # a new run
    container_images.ensure_image(plan, "t")
    assert api.inspected == 3
    container_images.forget_images()


def _sandbox(tmp_path, engine, image, number):
    from maka_eval.processes.supervisor import ProcessSupervisor
    from maka_eval.sandbox.plans import ContainerPlan

    layout = sandbox_layout(tmp_path / f"attempt-{number}")
    return ContainerSandbox(
        ProcessSupervisor(),
        f"pinning-test-{number}",
        layout,
        ContainerPlan(engine=engine, image=image),
        task_id="t",
        labels={"cell-id": "t::1::s", "run-id": "pinning-test"},
    )


def test_a_tag_moved_during_a_run_changes_none_of_its_attempts(container_engine, tmp_path):
    from tests.sandbox.conftest import PYTHON_IMAGE

    client = client_for(container_engine)
    tag = "localhost/maka-eval-test/moved:1"
    base_id = client.api.inspect_image(BASE_IMAGE)["Id"]
    python_id = client.api.inspect_image(PYTHON_IMAGE)["Id"]
    assert base_id != python_id
    client.api.tag(BASE_IMAGE, "localhost/maka-eval-test/moved", "1")
    container_images.forget_images()  # a run starts
    images = []
    try:
        for number in range(3):
            if number == 1:  # the tag moves to another image while the run goes on
                client.api.tag(PYTHON_IMAGE, "localhost/maka-eval-test/moved", "1")
            if number == 2:  # a new run
                container_images.forget_images()
            sandbox = _sandbox(tmp_path, container_engine, tag, number)
            sandbox.start()
            try:
                images.append(client.api.inspect_container(sandbox.container_id)["Image"])
            finally:
                sandbox.stop()
        drain_removals()
    finally:
        container_images.forget_images()
        with contextlib.suppress(docker.errors.APIError):
            client.api.remove_image(tag)
    assert [i.removeprefix("sha256:") for i in images] == [
        base_id.removeprefix("sha256:"),
        base_id.removeprefix("sha256:"),  # pinned within the run
        python_id.removeprefix("sha256:"),  # resolved again by the next run
    ]
    assert leftover_containers(container_engine, "pinning-test") == []


def test_a_holder_that_never_answers_is_an_infrastructure_failure(
    container_engine, tmp_path, monkeypatch
):
    # The engine accepts the privileged exec but the holder says neither `ready` nor
    # `fail` (seen under load): the attempt must not go on with a verifier whose /tests
    # and /logs/verifier the subject's leftovers could reach; it fails to start, retried.
    from maka_eval.sandbox.container import shell

    real = shell.program

    def silent(name: str) -> str:
        return "exit 0" if name == "maka-holder" else real(name)

    monkeypatch.setattr(shell, "program", silent)
    sandbox = _sandbox(tmp_path, container_engine, BASE_IMAGE, 99)
    try:
        with pytest.raises(OSError, match="the verifier's holder did not start: no answer"):
            sandbox.start()
    finally:
        sandbox.stop()
    assert sandbox.container_id is None
