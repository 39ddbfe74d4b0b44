"""The relay bundle: frozen with its own interpreter, run in a task image without Python,
and checked by every attempt Pod before the subject starts.

The Podman tests build the relay image with hack/build-images.sh (images/Dockerfile,
target relay: PyInstaller on Debian 12) and play the kubelet for one attempt Pod the
operator renders: the `relay-bundle` init container runs in the relay image with the
Pod's own command, the subject container in a Debian minbase image that has no Python
at all (hack/podman.sh images), with the Pod's mounts, working directory, capabilities
and termination message file. The first run builds the image (a few minutes); later runs
reuse the layer cache. As root on Linux a failing step fails loudly; without root the
Podman tests skip, saying why. The script tests at the end need only sh and coreutils.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from maka_eval import layout
from maka_eval.contract.kernel import ResultKernel
from maka_eval.engine.expand import expand
from maka_eval.engine.status import AttemptStatus, StatusSource, Trigger
from maka_eval.executors.load import experiment_from_data
from maka_eval.k8s import relay_bundle
from maka_eval.k8s.render import (
    ExperimentRef,
    attempt_object,
    pod_object,
)
from maka_eval.k8s.results import pod_end
from maka_eval.spec.experiment import KubernetesExecutorConfig

REPO = Path(__file__).resolve().parents[2]
PODMAN_SH = REPO / "hack" / "podman.sh"
BUILD_IMAGES = REPO / "hack" / "build-images.sh"
EXAMPLE = REPO / "examples" / "hello"
NO_PYTHON_IMAGE = "localhost/maka-eval/debian:bookworm-minbase"
REF = ExperimentRef("hello", "ns1", "00000000-1111-2222-3333-444444444444")
ZERO = "sha256:" + "0" * 64
RUN_TIMEOUT = 180


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


@pytest.fixture(scope="session")
def podman() -> None:
    """Rootful Podman with the registry-free Debian images (hack/podman.sh)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the images are built and run with rootful Podman, which needs Linux")
    if os.geteuid() != 0:
        pytest.skip("the images are built and run with rootful Podman: hack/podman.sh needs root")
    for step in ("setup", "images"):
        proc = subprocess.run([str(PODMAN_SH), step], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.fail(
                f"hack/podman.sh {step} failed (exit {proc.returncode}):\n{_tail(proc.stderr)}",
                pytrace=False,
            )


def build_images(*targets: str, base: str | None = None) -> dict[str, str]:
    """hack/build-images.sh TARGETS with Podman (FROM `base`, default the script's): image
    name by target, and the relay bundle digest under 'relay-bundle-digest' when the
    relay image was built."""
    env = {**os.environ, "MAKA_EVAL_BUILDER": "podman"}
    if base is not None:
        env["MAKA_EVAL_DEBIAN_IMAGE"] = base
    proc = subprocess.run([str(BUILD_IMAGES), *targets], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        pytest.fail(
            f"hack/build-images.sh {' '.join(targets)} failed (exit {proc.returncode}):\n"
            f"{_tail(proc.stderr, 60)}",
            pytrace=False,
        )
    out: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("relay-bundle-digest="):
            out["relay-bundle-digest"] = line.partition("=")[2]
        elif line.strip():
            out[line.rsplit("/", 1)[-1].split(":")[0]] = line.strip()
    return out


@dataclass(frozen=True)
class RelayImage:
    name: str
    digest: str


@pytest.fixture(scope="session")
def relay_image(podman: None) -> RelayImage:
    built = build_images("relay")
    return RelayImage(built["relay"], built["relay-bundle-digest"])


# ------------------------------------------------------------------ the Pod, on Podman


def document(**config: Any) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLE / "experiment.k8s.yaml").read_text())
    doc["spec"]["executor"]["config"].update(config)
    return doc


def rendered_pod(doc: dict[str, Any], *, relay_digest: str | None = None) -> dict[str, Any]:
    """The Pod the operator creates for the oracle's first fix-greeting attempt."""
    experiment, _ = experiment_from_data(doc)
    cell = next(
        c
        for c in expand(experiment).cells
        if c.subject_id == "oracle" and c.task_id == "fix-greeting"
    )
    attempt = attempt_object(REF, cell, "cell-uid", 1, Trigger.SCHEDULED, None)
    attempt["metadata"]["uid"] = "attempt-uid"
    return pod_object(REF, experiment, cell, attempt, gated=False, relay_digest=relay_digest)


@dataclass
class Ended:
    exit_code: int
    message: str
    log: str


class PodOnPodman:
    """Runs a rendered Pod's containers with Podman, as a kubelet would: emptyDirs are
    folders, mounts and working directory as the Pod says, one termination file each."""

    def __init__(self, pod: Mapping[str, Any], root: Path) -> None:
        self.pod = pod
        self.root = root
        self.volumes: dict[str, Path] = {}
        for volume in pod["spec"]["volumes"]:
            assert "emptyDir" in volume, volume
            path = root / "volumes" / volume["name"]
            path.mkdir(parents=True)
            path.chmod(0o777)  # an emptyDir: any uid of the Pod writes to it
            self.volumes[volume["name"]] = path

    def container(self, name: str) -> Mapping[str, Any]:
        spec = self.pod["spec"]
        return next(c for c in [*spec["initContainers"], *spec["containers"]] if c["name"] == name)

    def run(self, name: str, *, image: str | None = None, user: str | None = None) -> Ended:
        c = self.container(name)
        message = self.root / f"{name}.termination-log"
        message.write_text("")
        message.chmod(0o666)
        args = ["podman", "run", "--rm", "--network", "none"]
        for mount in c.get("volumeMounts", ()):
            mode = "ro" if mount.get("readOnly") else "rw"
            args += ["-v", f"{self.volumes[mount['name']]}:{mount['mountPath']}:{mode}"]
        args += ["-v", f"{message}:{c.get('terminationMessagePath', '/dev/termination-log')}"]
        if c.get("workingDir"):
            args += ["--workdir", c["workingDir"]]
        for cap in (c.get("securityContext") or {}).get("capabilities", {}).get("drop", ()):
            args += ["--cap-drop", cap]
        for var in c.get("env", ()):
            args += ["--env", f"{var['name']}={var['value']}"]
        if user:
            args += ["--user", user]
        command = [*c.get("command", ()), *c.get("args", ())]
        args += ["--entrypoint", command[0], image or c["image"], *command[1:]]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=RUN_TIMEOUT)
        return Ended(proc.returncode, message.read_text(), proc.stdout + proc.stderr)


def init_failure_status(name: str, ended: Ended) -> dict[str, Any]:
    """The Pod status a kubelet reports when init container `name` failed."""
    return {
        "metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {
            "phase": "Failed",
            "startTime": "2026-01-01T00:00:00Z",
            "initContainerStatuses": [
                {
                    "name": name,
                    "state": {
                        "terminated": {
                            "exitCode": ended.exit_code,
                            "reason": "Error",
                            "message": ended.message,
                        }
                    },
                }
            ],
        },
    }


def test_the_task_image_has_no_python(podman: None) -> None:
    proc = subprocess.run(
        [
            "podman", "run", "--rm", "--network", "none", NO_PYTHON_IMAGE, "sh", "-c",
            "for p in python3 python python3.11 python2; do command -v $p && exit 1; done;"
            " ls -d /usr/lib/python3* /usr/lib/*/libpython* 2>/dev/null && exit 1; exit 0",
        ],
        capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )  # fmt: skip
    assert proc.returncode == 0, f"{NO_PYTHON_IMAGE} holds a Python: {proc.stdout}"


@pytest.mark.slow
def test_the_bundle_runs_a_cell_in_an_image_without_python(
    relay_image: RelayImage, tmp_path: Path
) -> None:
    doc = document(
        relayImage=relay_image.name,
        taskImage=NO_PYTHON_IMAGE,
        relayBundleDigest=relay_image.digest,
    )
    pod = rendered_pod(doc, relay_digest=relay_image.digest)
    node = PodOnPodman(pod, tmp_path)
    # The benchmark init container copies the experiment folder (`cp -a /benchmark/.`).
    shutil.copytree(EXAMPLE, node.volumes["benchmark"], dirs_exist_ok=True)

    # The relay image's user (65532), as in a cluster: the check runs as non-root.
    init = node.run("relay-bundle")
    assert init.exit_code == 0, init.log
    assert f"relay bundle {relay_image.digest} verified" in init.log
    relay_dir = node.volumes["relay"]
    assert (relay_dir / "bin" / "maka-relay").is_file()
    assert (relay_dir / "bin" / "_internal").is_dir()

    subject = node.run("subject")
    assert subject.exit_code == 0, subject.log
    # What the operator reads of the Pod: the subject's termination message.
    status = {
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [
                {
                    "name": "subject",
                    "state": {
                        "terminated": {
                            "exitCode": 0,
                            "message": subject.message,
                            "finishedAt": "2026-01-01T00:01:00Z",
                        }
                    },
                }
            ],
        }
    }
    end = pod_end(status, datetime.now(UTC))
    assert end is not None, subject.log
    kernel = end.kernel
    assert kernel.status is AttemptStatus.COMPLETED, (kernel, subject.log)
    assert kernel.score == 1.0  # the oracle's solve.sh, the task's test.sh: no Python
    for entry in kernel.artifacts:
        data = (node.volumes["artifacts"] / entry.name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry.sha256
    assert ResultKernel.from_json(subject.message) == kernel


@pytest.fixture(scope="session")
def bundle_copy(relay_image: RelayImage, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The verified bundle, copied out of the relay image by the Pod's own init command."""
    root = tmp_path_factory.mktemp("bundle")
    pod = rendered_pod(document(relayImage=relay_image.name))
    node = PodOnPodman(pod, root)
    ended = node.run("relay-bundle")
    assert ended.exit_code == 0, ended.log
    return node.volumes["relay"]


def tampered(bundle: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "tampered"
    shutil.copytree(bundle, copy)
    for path in [copy, *copy.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o044 | (0o011 if path.is_dir() else 0))
    return copy


def run_init_over(
    relay_image: RelayImage, bundle: Path, tmp_path: Path, **pins: str | None
) -> tuple[Ended, PodOnPodman]:
    """The relay-bundle init container with `bundle` in place of the image's own."""
    spec_digest = pins.get("spec")
    doc = document(relayImage=relay_image.name)
    if spec_digest:
        doc["spec"]["executor"]["config"]["relayBundleDigest"] = spec_digest
    pod = rendered_pod(doc, relay_digest=pins.get("operator"))
    node = PodOnPodman(pod, tmp_path / "pod")
    c = dict(node.container("relay-bundle"))
    mounts = [
        *c["volumeMounts"],
        {"name": "bundle", "mountPath": layout.RELAY_BUNDLE_IN_IMAGE, "readOnly": True},
    ]
    node.volumes["bundle"] = bundle
    spec = node.pod["spec"]
    spec["initContainers"][0] = {**c, "volumeMounts": mounts}
    return node.run("relay-bundle"), node


def assert_rejected(ended: Ended, node: PodOnPodman, *words: str) -> ResultKernel:
    assert ended.exit_code == 1, ended.log
    assert ended.message.startswith(relay_bundle.REJECTED), ended.message
    for word in words:
        assert word in ended.message, ended.message
    assert list(node.volumes["relay"].iterdir()) == []  # nothing unverified is left
    end = pod_end(init_failure_status("relay-bundle", ended), datetime.now(UTC))
    assert end is not None
    assert end.kernel.status is AttemptStatus.INFRA_FAILED
    assert end.kernel.status_source is StatusSource.INFRASTRUCTURE
    # The Attempt's reason says why, whole (the image name, last, may be cut off).
    assert ended.message.rsplit(" (image ", 1)[0] in (end.kernel.reason or "")
    return end.kernel


@pytest.mark.slow
def test_a_bundle_with_another_digest_fails_the_pod_naming_both(
    relay_image: RelayImage, bundle_copy: Path, tmp_path: Path
) -> None:
    ended, node = run_init_over(relay_image, bundle_copy, tmp_path, operator=ZERO)
    assert_rejected(
        ended,
        node,
        f"expected {ZERO} (operator --relay-bundle-digest)",
        f"actual {relay_image.digest}",
    )
    # The spec's pin is checked too; both must hold.
    ended, node = run_init_over(
        relay_image, bundle_copy, tmp_path / "2", operator=relay_image.digest, spec=ZERO
    )
    assert_rejected(ended, node, f"expected {ZERO} (executor.config.relayBundleDigest)")


@pytest.mark.slow
def test_a_changed_file_fails_the_pod_naming_the_expected_and_actual_digest(
    relay_image: RelayImage, bundle_copy: Path, tmp_path: Path
) -> None:
    bundle = tampered(bundle_copy, tmp_path)
    target = bundle / "bin" / "_internal" / "base_library.zip"
    expected = hashlib.sha256(target.read_bytes()).hexdigest()
    with target.open("ab") as handle:
        handle.write(b"\0")
    actual = hashlib.sha256(target.read_bytes()).hexdigest()
    # The manifest is unchanged, so the pin still matches: the file check catches it.
    ended, node = run_init_over(relay_image, bundle, tmp_path, operator=relay_image.digest)
    assert_rejected(
        ended,
        node,
        "./bin/_internal/base_library.zip does not match checksums.sha256",
        f"expected sha256:{expected}",
        f"actual sha256:{actual}",
    )

    # A manifest rewritten to match the change has another digest: the pin catches it.
    manifest = bundle / "checksums.sha256"
    manifest.write_text(manifest.read_text().replace(expected, actual))
    new_digest = "sha256:" + hashlib.sha256(manifest.read_bytes()).hexdigest()
    ended, node = run_init_over(relay_image, bundle, tmp_path / "2", operator=relay_image.digest)
    assert_rejected(ended, node, f"expected {relay_image.digest}", f"actual {new_digest}")


@pytest.mark.slow
def test_a_file_the_manifest_does_not_name_fails_the_pod(
    relay_image: RelayImage, bundle_copy: Path, tmp_path: Path
) -> None:
    bundle = tampered(bundle_copy, tmp_path)
    (bundle / "bin" / "_internal" / "sitecustomize.py").write_text("import os\n")
    (bundle / "bin" / "_internal" / "sitecustomize.py").chmod(0o644)
    ended, node = run_init_over(relay_image, bundle, tmp_path)
    assert_rejected(ended, node, "not named in checksums.sha256", "sitecustomize.py")


# ------------------------------------------------------------------ without Podman


def fake_bundle(root: Path) -> tuple[Path, str]:
    """A two-file bundle with its manifest (the layout build-bundle.sh writes)."""
    (root / "bin" / "_internal").mkdir(parents=True)
    (root / "bin" / "maka-relay").write_text("#!/bin/sh\necho relay\n")
    (root / "bin" / "_internal" / "lib.so").write_bytes(b"\x7fELF fake")
    lines = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        lines.append(f"{digest}  ./{path.relative_to(root).as_posix()}\n")
    (root / "checksums.sha256").write_text("".join(lines))
    manifest = (root / "checksums.sha256").read_bytes()
    return root, "sha256:" + hashlib.sha256(manifest).hexdigest()


def run_script(src: Path, dst: Path, *pins: tuple[str, str]) -> subprocess.CompletedProcess[str]:
    dst.mkdir(exist_ok=True)
    command = relay_bundle.init_command(str(src), str(dst), "relay:test", list(pins))
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.fixture
def sh_tools() -> Iterator[None]:
    if not all(shutil.which(t) for t in ("sh", "sha256sum", "find", "awk", "uniq")):
        pytest.skip("the check needs sh and GNU coreutils (sha256sum --strict)")
    yield


def test_the_check_passes_a_good_bundle_and_copies_it(sh_tools: None, tmp_path: Path) -> None:
    src, digest = fake_bundle(tmp_path / "src")
    proc = run_script(src, tmp_path / "dst", (digest, relay_bundle.OPERATOR_PIN))
    assert proc.returncode == 0, proc.stderr
    assert f"relay bundle {digest} verified: 2 files" in proc.stdout
    assert (tmp_path / "dst" / "bin" / "maka-relay").read_text() == "#!/bin/sh\necho relay\n"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ("pin", ["digest mismatch", f"expected {ZERO} (operator --relay-bundle-digest)"]),
        ("file", ["./bin/_internal/lib.so does not match", "expected sha256:", "actual sha256:"]),
        ("extra", ["not named in checksums.sha256", "./bin/extra"]),
        ("missing", ["./bin/_internal/lib.so", "FAILED open or read"]),
        ("no-manifest", ["has no", "checksums.sha256"]),
        ("symlink", ["not plain files", "./bin/link"]),
        ("no-relay", ["does not name ./bin/maka-relay"]),
    ],
)
def test_the_check_fails_closed(
    sh_tools: None, tmp_path: Path, change: str, words: list[str]
) -> None:
    src, digest = fake_bundle(tmp_path / "src")
    pins = [(ZERO if change == "pin" else digest, relay_bundle.OPERATOR_PIN)]
    manifest = src / "checksums.sha256"
    if change == "file":
        (src / "bin" / "_internal" / "lib.so").write_bytes(b"changed")
    elif change == "extra":
        (src / "bin" / "extra").write_text("x")
    elif change == "missing":
        (src / "bin" / "_internal" / "lib.so").unlink()
    elif change == "no-manifest":
        manifest.unlink()
    elif change == "symlink":
        (src / "bin" / "link").symlink_to("/etc/passwd")
    elif change == "no-relay":
        manifest.write_text(manifest.read_text().replace("./bin/maka-relay", "./bin/other"))
        pins = []
    proc = run_script(src, tmp_path / "dst", *pins)
    assert proc.returncode == 1, proc.stdout
    message = proc.stderr.strip()
    assert message.startswith(f"{relay_bundle.REJECTED}: ")
    assert message.endswith("(image relay:test)")
    for word in words:
        assert word in message
    if change == "file":
        expected = hashlib.sha256(b"\x7fELF fake").hexdigest()
        assert f"expected sha256:{expected}, actual sha256:" in message
        assert hashlib.sha256(b"changed").hexdigest() in message
    assert list((tmp_path / "dst").iterdir()) == []


def test_pins_are_checked_where_they_are_given() -> None:
    good = "sha256:" + "a" * 64
    assert relay_bundle.pins(None, None) == []
    assert relay_bundle.pins(good, good) == [
        (good, relay_bundle.OPERATOR_PIN),
        (good, relay_bundle.SPEC_PIN),
    ]
    with pytest.raises(relay_bundle.BadDigest, match="operator --relay-bundle-digest: 'sha256:A"):
        relay_bundle.pins("sha256:" + "A" * 64, None)
    # The spec field and the operator flag accept the same values.
    schema = KubernetesExecutorConfig.model_json_schema(by_alias=True)
    field = schema["properties"]["relayBundleDigest"]["anyOf"][0]
    assert field["pattern"] == relay_bundle.DIGEST_PATTERN
    assert re.match(relay_bundle.DIGEST_PATTERN, good)


def test_the_pod_checks_the_bundle_with_every_pin() -> None:
    spec_pin = "sha256:" + "b" * 64
    pod = rendered_pod(document(relayBundleDigest=spec_pin), relay_digest="sha256:" + "c" * 64)
    init = pod["spec"]["initContainers"][0]
    assert init["name"] == "relay-bundle"
    assert init["command"][:3] == ["sh", "-c", relay_bundle.VERIFY_SCRIPT]
    assert init["command"][4:] == [
        "/opt/maka-eval",
        "/maka/relay",
        "localhost/maka-eval/relay:0.1.0",
        f"sha256:{'c' * 64}={relay_bundle.OPERATOR_PIN}",
        f"{spec_pin}={relay_bundle.SPEC_PIN}",
    ]
    subject = pod["spec"]["containers"][0]
    assert {"name": "relay", "mountPath": "/maka/relay", "readOnly": True} in subject[
        "volumeMounts"
    ]


def test_a_bad_digest_is_refused_naming_the_field() -> None:
    from maka_eval.errors import SpecError

    with pytest.raises(SpecError) as info:
        experiment_from_data(document(relayBundleDigest="sha256:1234"))
    assert "spec.executor.config.relayBundleDigest" in str(info.value)
    proc = subprocess.run(
        [sys.executable, "-m", "maka_eval.cli.main", "operator", "--relay-bundle-digest", "x"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--relay-bundle-digest" in proc.stderr and "64 lowercase hex digits" in proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------ the operator


@pytest.mark.slow
def test_the_operator_fails_an_attempt_whose_bundle_is_not_the_pinned_one(
    control_plane: Path,
    crds: list[str],
    kubectl: Any,
    namespace: str,
    node_agent: Any,
    tmp_path: Path,
) -> None:
    """`maka-eval operator --relay-bundle-digest` on the real API server, with the fake
    node's kubelet running the Pod's own init command: the Attempt's result is an
    infrastructure failure naming the pinned and the actual digest."""
    from tests.k8s.conftest import wait_until
    from tests.k8s.test_operator import Operator, example, get

    doc = example("pinned")
    spec = doc["spec"]
    spec["tasks"] = [{"id": "fix-greeting"}]
    spec["subjects"] = [{"id": "oracle", "kind": "oracle"}]
    spec["repetitions"] = 1
    spec["execution"]["maxInfraRetries"] = 0
    bundle = node_agent.images[spec["executor"]["config"]["relayImage"]]["/opt/maka-eval"]
    actual = "sha256:" + hashlib.sha256((bundle / "checksums.sha256").read_bytes()).hexdigest()

    op = Operator(
        control_plane, namespace, tmp_path / "operator.log", ("--relay-bundle-digest", ZERO)
    ).start()
    try:
        kubectl.run("apply", f"--namespace={namespace}", "-f", "-", input=yaml.safe_dump(doc))

        def finished() -> Any:
            items = get(kubectl, "attempts", namespace)["items"]
            done = [a for a in items if (a.get("status") or {}).get("result")]
            return done or None

        attempts = wait_until(finished, timeout=180, interval=1.0, what="an attempt's result")
    finally:
        op.stop()
        print(op.tail())
    result = attempts[0]["status"]["result"]
    assert result["status"] == "infra_failed", result
    reason = result["reason"]
    assert reason.startswith("init container relay-bundle failed"), reason
    assert f"expected {ZERO} (operator --relay-bundle-digest), actual {actual}" in reason
