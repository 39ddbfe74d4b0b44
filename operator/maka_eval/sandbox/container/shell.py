"""The shell programs the container sandbox runs in the container (scripts/*.sh, package
data): which files make each program, and the argv that runs one.

Every program runs in the toolbox's busybox sh (`sandbox.toolbox`, read-only at
/.maka-tools): applets are preferred over PATH, so no program ever runs a program of the
container, which the subject may have replaced; users and groups are read from
/etc/passwd and /etc/group with awk (no name service, whose modules the container
holds), and privileges are dropped by the toolbox's static maka-setpriv.

The verifier gets its own /tests and /logs/verifier, and its own HOME and TMPDIR: tmpfs
mounts in a mount namespace that a holder process keeps. The holder is made by a
privileged exec at start, while the container holds only the image and what the relay
uploaded. It then drops to the container's own capabilities, which include
CAP_WAKE_ALARM (added for this and harmless); the subject runs with that one dropped
from its bounding set, so neither it nor anything it leaves behind may look into the
holder's /proc entries (the kernel requires the looker to hold every capability the
target holds), while the verifier, an ordinary exec, can chroot into /proc/HOLDER/root
and sees the private folders there. A verifier that is not root keeps that one
capability (ambient), so that a process the subject left behind, even one that became
the verifier's user, can neither trace it nor look into it. Secrets travel in the
environment, never in argv.

A program is its files joined in order: the functions it calls (`user_ids` in
user-ids.sh, `facts` in image-facts.sh) come first. A shell file cannot import the paths
of `maka_eval.layout` and `sandbox.toolbox`, so it names them `@NAME@` and `program`
writes them in (SUBSTITUTIONS); `@MARKER_CAP@` is MARKER_CAP's number.
"""

from __future__ import annotations

import functools
from importlib import resources

from maka_eval import layout
from maka_eval.sandbox import toolbox

MARKER_CAP = 35
"""CAP_WAKE_ALARM: held by the holder and the verifier, dropped by the subject."""

SUBSTITUTIONS: dict[str, str] = {
    "@MARKER_CAP@": str(MARKER_CAP),
    "@TESTS_PATH@": layout.TESTS_PATH,
    "@VERIFIER_LOGS_PATH@": layout.VERIFIER_LOGS_PATH,
    "@AGENT_LOGS_PATH@": layout.AGENT_LOGS_PATH,
    "@VERIFIER_BOX_PREFIX@": layout.VERIFIER_BOX_PREFIX,
    "@TOOLBOX_BIN@": toolbox.BIN,
    "@TOOLBOX_SETPRIV@": toolbox.SETPRIV,
    "@TOOLBOX_PRIVATE@": toolbox.PRIVATE,
}
"""`@NAME@` in a scripts/ file -> what the program says there."""

PROGRAMS: dict[str, tuple[str, ...]] = {
    "maka-holder": ("image-facts.sh", "user-ids.sh", "holder.sh"),
    "maka-facts": ("image-facts.sh", "report-facts.sh"),
    "maka-read": ("read-files.sh",),
    "maka-resolve": ("resolve.sh",),
    "maka-subject": ("user-ids.sh", "subject-wrapper.sh"),
    "maka-chown": ("user-ids.sh", "chown.sh"),
    "maka-verifier": ("user-ids.sh", "verifier-wrapper.sh"),
    "maka-setup": ("shared-verifier-setup.sh",),
    "maka-quiesce": ("quiesce.sh",),
    "maka-next-step": ("next-step.sh",),
}
"""Program name (its $0 in the container) -> the scripts/ files it is made of."""


def script_files() -> list[str]:
    """The names of the shell files shipped in scripts/."""
    folder = resources.files("maka_eval.sandbox.container").joinpath("scripts")
    return sorted(f.name for f in folder.iterdir() if f.name.endswith(".sh"))


@functools.cache
def program(name: str) -> str:
    """The text of a program of PROGRAMS, as the shell runs it."""
    folder = resources.files("maka_eval.sandbox.container").joinpath("scripts")
    text = "\n".join(folder.joinpath(f).read_text(encoding="utf-8") for f in PROGRAMS[name])
    for placeholder, value in SUBSTITUTIONS.items():
        text = text.replace(placeholder, value)
    return text


def argv(name: str, *args: str) -> list[str]:
    """argv that runs the program `name` in the toolbox's shell, with `args` as $1..."""
    return [toolbox.BUSYBOX, "sh", "-c", program(name), name, *args]
