"""The relay's gate before a policed subject starts: capabilities and network namespace.

The egress policy lives in the cell's network namespace, as nftables rules seen by the
IP output hooks. Two things would let a subject get around it: a capability that
reaches beneath or around those hooks or out of the sandbox (`FORBIDDEN`), held in any
set the subject could use or regain one from -- the bounding set included -- and a
subject that is simply not in the namespace the policy was applied to. The gate reads both from
a process started exactly like the subject (same sandbox, same wrapper, same user):
`/proc/self/status` for CapInh, CapPrm, CapEff, CapBnd and CapAmb, and the identity
(device and inode) of `/proc/self/ns/net`. Any doubt refuses: nothing is started, and
the attempt is an infrastructure failure whose reason says why.

Standard library only (the relay is injected into task images).
"""

from __future__ import annotations

from dataclasses import dataclass

CAPABILITY_SETS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
FORBIDDEN = {
    12: "CAP_NET_ADMIN",  # rewrite or drop the namespace's rules
    13: "CAP_NET_RAW",  # AF_PACKET: frames the IP hooks never see
    21: "CAP_SYS_ADMIN",  # setns/unshare/mount: another namespace; remount the host's files rw
    2: "CAP_DAC_READ_SEARCH",  # open_by_handle_at: any file of a mounted filesystem
    16: "CAP_SYS_MODULE",  # kernel modules
    17: "CAP_SYS_RAWIO",  # raw I/O ports and memory
    19: "CAP_SYS_PTRACE",  # another process's memory (and its namespaces)
    39: "CAP_BPF",  # BPF programs beneath the hooks
}
"""Capability number -> name: what a policed subject must hold in no set. (CAP_MKNOD is
not here: container engines grant it, with a device cgroup that makes it harmless; the
process sandbox, which has no device cgroup, drops it too.)"""
NETNS_TAG = "maka-netns"
PROBE_SCRIPT = (
    "cat /proc/self/status && "
    f'echo "{NETNS_TAG} $(stat -L -c %d:%i /proc/self/ns/net 2>/dev/null '
    '|| readlink /proc/self/ns/net)"'
)
"""Run by `sh -c` where and as the subject would run. `readlink` (net:[INODE]) stands in
where the image has no `stat`."""
PROBE_TIMEOUT_SEC = 60.0


def probe_argv() -> list[str]:
    """The probe program (the sandbox wraps it as it wraps the subject)."""
    return ["sh", "-c", PROBE_SCRIPT]


@dataclass(frozen=True)
class Evidence:
    """What the probe saw of the subject's context."""

    capabilities: dict[str, int]
    """Set name (CapInh ...) -> bit mask; a set the status did not show is missing."""
    netns: str | None
    """`dev:ino` of the network namespace, or `net:[ino]` (readlink), or None."""


def read_evidence(output: str) -> Evidence:
    """Parse the probe's output."""
    caps: dict[str, int] = {}
    netns: str | None = None
    for line in output.splitlines():
        key, _, value = line.partition(":")
        if key in CAPABILITY_SETS:
            try:
                caps[key] = int(value.strip(), 16)
            except ValueError:
                continue
        elif line.startswith(NETNS_TAG + " "):
            netns = line.removeprefix(NETNS_TAG + " ").strip() or None
    return Evidence(caps, netns)


def _same_namespace(seen: str, expected: str) -> bool:
    if seen.startswith("net:[") and seen.endswith("]"):
        return seen[5:-1] == expected.rpartition(":")[2]
    return seen == expected


def refusal(evidence: Evidence, expected_netns: str | None) -> str | None:
    """Why the subject must not start, or None when the gate passes.

    `expected_netns` is the `dev:ino` of the namespace the policy was applied to."""
    missing = [name for name in CAPABILITY_SETS if name not in evidence.capabilities]
    if missing:
        return (
            "the egress gate could not read the subject's capability sets "
            f"({', '.join(missing)} missing from /proc/self/status); the subject was not started"
        )
    held = []
    for number, cap in FORBIDDEN.items():
        sets = [n for n in CAPABILITY_SETS if evidence.capabilities[n] >> number & 1]
        if sets:
            held.append(f"{cap} (in {', '.join(sets)})")
    if held:
        return (
            "the egress gate refused to start the subject: it would hold "
            + "; ".join(held)
            + ", which gets around the namespace's nftables policy or out of the sandbox; "
            "drop it from the sandbox (every set, the bounding set included)"
        )
    if expected_netns is not None:
        if evidence.netns is None:
            return (
                "the egress gate could not read the subject's network namespace "
                "(/proc/self/ns/net); the subject was not started"
            )
        if not _same_namespace(evidence.netns, expected_netns):
            return (
                "the egress gate refused to start the subject: it is not in the network "
                f"namespace the egress policy was applied to (it is in {evidence.netns}, "
                f"the policy is in {expected_netns})"
            )
    return None


__all__ = [
    "CAPABILITY_SETS",
    "FORBIDDEN",
    "PROBE_SCRIPT",
    "Evidence",
    "probe_argv",
    "read_evidence",
    "refusal",
]
