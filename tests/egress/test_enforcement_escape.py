"""A root subject in the process sandbox tries to leave it, for real: a network namespace
of its own or another's (unshare, setns into every namespace file it can see, PID 1's
included), a user namespace with a network of its own, remounting what it is shown
read-only, the host's disk as a device node, and a filesystem's root by handle.

The probe's attacks (tests/egress/attack_probe.py, also run by bench/egress_attacks.py)
are first shown to work: with the capabilities root kept before (every one but
CAP_NET_RAW and CAP_NET_ADMIN) and a gate that looked at those two only, they get
through. Then, as the sandbox really is, every one of them is stopped.
"""

from __future__ import annotations

from maka_eval.engine.status import AttemptStatus
from maka_eval.relay import gate
from maka_eval.sandbox import process
from tests.egress import attacks
from tests.egress.policing import POLICED

pytestmark = POLICED

ESCAPES = {
    "a capability that reaches around the policy or out (any set)",
    "unshare a network namespace (CAP_SYS_ADMIN)",
    "setns into any visible network namespace (PID 1's too), then TCP out",
    "a user namespace with its own network namespace, then TCP out",
    "remount the CA folder read-write and write into it",
    "mknod the root filesystem's disk and read it",
    "open_by_handle_at a filesystem's root (CAP_DAC_READ_SEARCH)",
}
"""The probe's attacks on the sandbox itself."""
WORK_WITH_SYS_ADMIN = {
    "a capability that reaches around the policy or out (any set)",
    "unshare a network namespace (CAP_SYS_ADMIN)",
    "remount the CA folder read-write and write into it",
    "open_by_handle_at a filesystem's root (CAP_DAC_READ_SEARCH)",
}
"""What a root subject got with every capability but the two network ones."""
OLD_DROP = ("net_raw", "net_admin")
ALL_CAPS = tuple(
    name.removeprefix("CAP_").lower()
    for name in (
        *("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID"),
        *("CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE"),
        *("CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_IPC_LOCK", "CAP_IPC_OWNER"),
        *("CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE"),
        *("CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_TIME"),
        *("CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE"),
        *("CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN"),
        *("CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ"),
        *("CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE"),
    )
    if name.removeprefix("CAP_").lower() not in OLD_DROP
)
"""Every capability but the two the sandbox used to drop (CAP_SYS_RESOURCE, which this
machine's own bounding set may lack, is left out)."""


def _by_attack(results: list[dict]) -> dict[str, dict]:
    return {r["attack"]: r for r in results}


def test_the_escapes_work_against_a_sandbox_that_keeps_root_capabilities(tmp_path, monkeypatch):
    # The sandbox as it was: root kept all but NET_RAW and NET_ADMIN; the gate checked
    # only those two.
    monkeypatch.setattr(process, "SUBJECT_CAPS", ALL_CAPS)
    monkeypatch.setattr(gate, "FORBIDDEN", {12: "CAP_NET_ADMIN", 13: "CAP_NET_RAW"})
    with attacks.host_side(monkeypatch) as side:
        cell = attacks.run_cell(tmp_path, side, container=False)
    assert cell.record.result.status is AttemptStatus.COMPLETED, cell.record.result.reason
    seen = _by_attack(cell.results)
    assert set(seen) >= ESCAPES
    got_through = {name for name in ESCAPES if not seen[name]["ok"]}
    assert got_through == WORK_WITH_SYS_ADMIN, {n: seen[n]["detail"] for n in ESCAPES}
    # Even so the network held: the namespace's policy does not depend on these.
    network = [r for r in cell.results if r["attack"] not in ESCAPES and r["expect"] == "blocked"]
    assert attacks.failures(network) == []


def test_no_escape_from_the_process_sandbox(tmp_path, monkeypatch):
    with attacks.host_side(monkeypatch) as side:
        cell = attacks.run_cell(tmp_path, side, container=False)
    assert cell.record.result.status is AttemptStatus.COMPLETED, cell.record.result.reason
    seen = _by_attack(cell.results)
    assert set(seen) >= ESCAPES
    assert attacks.failures([seen[name] for name in ESCAPES]) == []
    # Stopped by the kernel for want of the capability, not by chance.
    assert (
        "Operation not permitted" in seen["unshare a network namespace (CAP_SYS_ADMIN)"]["detail"]
    )
    assert (
        "Operation not permitted"
        in seen["open_by_handle_at a filesystem's root (CAP_DAC_READ_SEARCH)"]["detail"]
    )
    remount = seen["remount the CA folder read-write and write into it"]["detail"]
    assert "Operation not permitted" in remount
    # What the subject still holds: no more than a root process in a Docker container.
    assert set(process.SUBJECT_CAPS) <= {
        *("chown", "dac_override", "fowner", "fsetid", "kill", "setgid", "setuid"),
        *("setpcap", "setfcap", "net_bind_service", "sys_chroot", "audit_write"),
    }
