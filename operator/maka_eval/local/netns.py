"""Per-cell network namespaces whose nftables policy admits only the cell's egress proxy.

One namespace per cell with egress mode "proxy" (DESIGN.md section 6), made by the local
executor as root before the attempt's sandbox starts, removed when the attempt is over:

- `ip netns add` under a deterministic name (the run and the cell, hashed), so a writer
  that finds leftovers of a writer that died can remove them (`remove_leftovers`).
- A veth pair: the host end holds a private /30 picked per cell from 169.254.0.0/17
  (link-local, never routed; never overlapping an address or a narrow route of this
  machine, chosen under a lock so concurrent cells and runs never collide). The proxy
  listens on that host address only. No default route inside: the namespace can name
  nothing but its own addresses and the proxy's /30. No IPv6 address on either end.
- Inside, table `inet maka_eval`: output admits loopback (namespace-local addresses
  route over `lo`) and TCP to the proxy's address and port; every other TCP connection
  is reset and everything else (UDP, DNS, ICMP, IPv6) is rejected admin-prohibited.
  Input admits loopback and the proxy's replies only.
- On the host, table `inet maka_eval_<run>_<cell>` drops whatever enters from the veth
  that is not TCP to the proxy's address and port, and forwards nothing to or from it,
  so the namespace cannot reach any other port of this machine even with the inside
  table gone.

A process without CAP_NET_ADMIN in the namespace cannot change either table; the
sandboxes drop it (and NET_RAW) from the subject and the relay's gate checks they did.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from maka_eval import layout, strict_json

PROXY_NAME = "maka-eval-proxy"
"""The proxy's name in the sandbox's /etc/hosts (no resolver is reachable)."""
NETNS_DIR = Path("/run/netns")
NAME_PREFIX = "maka-eval-"
TABLE_PREFIX = "maka_eval_"
INSIDE_TABLE = "maka_eval"
INSIDE_INTERFACE = "maka0"
ADDRESS_POOL = ipaddress.IPv4Network("169.254.0.0/17")
"""Link-local: never routed off the machine. 169.254.0.0/24 (used by some hosts) is
skipped; 169.254.169.254 (cloud metadata) lies outside the pool."""
RESERVED = (ipaddress.IPv4Network("169.254.0.0/24"),)
LOCK_FILE = Path(layout.HOST_NETNS_LOCK)
COMMAND_TIMEOUT = 30.0


class NetnsError(RuntimeError):
    """A namespace, its addresses or its policy could not be made (or removed)."""


def _hash(text: str, size: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:size]


def namespace_name(run_id: str, cell_id: str) -> str:
    """`maka-eval-<run>-<cell>`: the same cell of the same run, the same name."""
    return f"{NAME_PREFIX}{_hash(run_id, 8)}-{_hash(cell_id, 10)}"


def _host_interface(name: str) -> str:
    return "mkv" + _hash(name, 11)  # interface names hold 15 characters


def _host_table(name: str) -> str:
    return TABLE_PREFIX + name.removeprefix(NAME_PREFIX).replace("-", "_")


def _run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, input=stdin, capture_output=True, text=True, check=False, timeout=COMMAND_TIMEOUT
    )


def _must(argv: list[str], stdin: str | None = None) -> str:
    proc = _run(argv, stdin)
    if proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv[:4])} failed: {proc.stderr.strip()[:400]}")
    return proc.stdout


# -- the rules (pure: what is loaded is what these return) --------------------------------
def inside_ruleset(proxy_address: str, proxy_port: int) -> str:
    """The namespace's own table: loopback and the proxy, nothing else."""
    return f"""table inet {INSIDE_TABLE} {{
	chain output {{
		type filter hook output priority filter; policy drop;
		oifname "lo" accept
		ip daddr {proxy_address} tcp dport {proxy_port} accept
		meta l4proto tcp reject with tcp reset
		reject with icmpx admin-prohibited
	}}
	chain input {{
		type filter hook input priority filter; policy drop;
		iifname "lo" accept
		ip saddr {proxy_address} tcp sport {proxy_port} accept
	}}
}}
"""


def host_ruleset(table: str, interface: str, proxy_address: str, proxy_port: int) -> str:
    """The host's table for one cell: from its veth, the proxy's port only."""
    return f"""table inet {table} {{
	chain input {{
		type filter hook input priority filter - 10; policy accept;
		iifname "{interface}" ip daddr {proxy_address} tcp dport {proxy_port} accept
		iifname "{interface}" drop
	}}
	chain forward {{
		type filter hook forward priority filter - 10; policy accept;
		iifname "{interface}" drop
		oifname "{interface}" drop
	}}
}}
"""


# -- what this machine can do ----------------------------------------------------------
@cache
def enforcement_unavailable() -> str | None:
    """Why this machine cannot give cells a policed namespace, or None if it can.

    Checked for real once per process: a namespace with the policy's kind of rules is
    made and removed."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespaces and nftables need root (run maka-eval as root)"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (Debian package {package})"
    name = f"{NAME_PREFIX}probe-{os.getpid()}"
    try:
        _must(["ip", "netns", "add", name])
        _must(
            ["nsenter", f"--net={NETNS_DIR / name}", "--", "nft", "-f", "-"],
            inside_ruleset("169.254.0.1", 1),
        )
    except (NetnsError, OSError, subprocess.TimeoutExpired) as exc:
        return f"this machine cannot apply the namespace policy: {exc}"
    finally:
        _run(["ip", "netns", "del", name])
    return None


# -- one cell's namespace ---------------------------------------------------------------
@dataclass
class CellNetwork:
    """One cell's namespace: where the proxy listens and what identifies the namespace."""

    name: str
    host_interface: str
    host_address: str
    """The proxy's address (the host end of the veth)."""
    inside_address: str
    host_table: str
    identity: str
    """`st_dev:st_ino` of the namespace: the relay's gate checks the subject is in it."""
    proxy_port: int | None = None
    """Set by `enforce`; until then nothing but loopback is reachable inside."""
    setup_sec: float = 0.0
    teardown_sec: float = 0.0
    _removed: bool = field(default=False, repr=False)

    @property
    def path(self) -> str:
        """What `nsenter --net=` and Podman's `ns:` network mode take."""
        return str(NETNS_DIR / self.name)

    def enforce(self, proxy_port: int) -> None:
        """Load both tables for a proxy listening on `host_address:proxy_port`."""
        started = time.perf_counter()
        _must(
            ["nsenter", f"--net={self.path}", "--", "nft", "-f", "-"],
            inside_ruleset(self.host_address, proxy_port),
        )
        _must(
            ["nft", "-f", "-"],
            host_ruleset(self.host_table, self.host_interface, self.host_address, proxy_port),
        )
        self.proxy_port = proxy_port
        self.setup_sec += time.perf_counter() - started

    def ruleset(self) -> str:
        """The ruleset loaded inside the namespace, as nft lists it."""
        return _must(["nsenter", f"--net={self.path}", "--", "nft", "list", "ruleset"])

    def remove(self) -> None:
        """Remove the host table, the veth pair and the namespace (idempotent)."""
        if self._removed:
            return
        started = time.perf_counter()
        remove_namespace(self.name)
        self._removed = True
        self.teardown_sec = time.perf_counter() - started


@contextlib.contextmanager
def _address_lock() -> Iterator[None]:
    """One allocator at a time on this machine (threads and processes alike)."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _in_use() -> tuple[list[ipaddress.IPv4Address], list[ipaddress.IPv4Network]]:
    """Addresses of this machine, and its routes narrow enough to be someone's link."""
    addresses: list[ipaddress.IPv4Address] = []
    routes: list[ipaddress.IPv4Network] = []
    for link in strict_json.loads(_must(["ip", "-4", "-j", "addr", "show"]) or "[]"):
        for info in link.get("addr_info", ()):
            with contextlib.suppress(ValueError, KeyError):
                addresses.append(ipaddress.IPv4Address(info["local"]))
    for route in strict_json.loads(
        _must(["ip", "-4", "-j", "route", "show", "table", "all"]) or "[]"
    ):
        with contextlib.suppress(ValueError, KeyError):
            net = ipaddress.IPv4Network(route["dst"], strict=False)
            if net.prefixlen >= 24:
                routes.append(net)
    return addresses, routes


def pick_block(
    name: str,
    addresses: list[ipaddress.IPv4Address],
    routes: list[ipaddress.IPv4Network],
) -> ipaddress.IPv4Network:
    """The first free /30 of the pool from the name's own starting point."""
    blocks = 1 << (30 - ADDRESS_POOL.prefixlen)
    first = int(_hash(name, 8), 16) % blocks
    base = int(ADDRESS_POOL.network_address)
    for step in range(blocks):
        block = ipaddress.IPv4Network((base + ((first + step) % blocks) * 4, 30))
        if any(block.overlaps(r) for r in RESERVED):
            continue
        if any(a in block for a in addresses) or any(block.overlaps(r) for r in routes):
            continue
        return block
    raise NetnsError(f"no free /30 left in {ADDRESS_POOL} for a cell's namespace")


def create(run_id: str, cell_id: str) -> CellNetwork:
    """Make the cell's namespace and veth pair (no policy yet: see `CellNetwork.enforce`).

    A namespace of the same name left by an earlier attempt of the cell is removed first.
    """
    started = time.perf_counter()
    name = namespace_name(run_id, cell_id)
    interface, table = _host_interface(name), _host_table(name)
    if (NETNS_DIR / name).exists():
        remove_namespace(name)
    with _address_lock():
        block = pick_block(name, *_in_use())
        host, inside = (str(a) for a in list(block.hosts())[:2])
        try:
            _must(
                ["ip", "-batch", "-"],
                f"netns add {name}\n"
                f"link add {interface} type veth peer name {INSIDE_INTERFACE} netns {name}\n"
                f"link set {interface} addrgenmode none\n"
                f"addr add {host}/30 dev {interface}\n"
                f"link set {interface} up\n",
            )
        except NetnsError:
            remove_namespace(name)
            raise
    try:
        _must(
            ["ip", "-n", name, "-batch", "-"],
            f"link set {INSIDE_INTERFACE} addrgenmode none\n"
            f"addr add {inside}/30 dev {INSIDE_INTERFACE}\n"
            f"link set {INSIDE_INTERFACE} up\n"
            "link set lo up\n",
        )
        info = os.stat(NETNS_DIR / name)
    except (NetnsError, OSError):
        remove_namespace(name)
        raise
    return CellNetwork(
        name=name,
        host_interface=interface,
        host_address=host,
        inside_address=inside,
        host_table=table,
        identity=f"{info.st_dev}:{info.st_ino}",
        setup_sec=time.perf_counter() - started,
    )


def remove_namespace(name: str) -> None:
    """Remove a cell namespace by name, with its host table and veth (what exists)."""
    table = _host_table(name)
    if _run(["nft", "list", "table", "inet", table]).returncode == 0:
        _run(["nft", "delete", "table", "inet", table])
    # The veth's other end dies with it; deleting it first also covers a namespace that
    # lives on because a process still holds it.
    _run(["ip", "-force", "-batch", "-"], f"link del {_host_interface(name)}\nnetns del {name}\n")
    if (NETNS_DIR / name).exists():
        raise NetnsError(f"the network namespace {name} could not be removed")


def leftovers(run_id: str | None = None) -> list[str]:
    """Names of the cell namespaces (of one run) that exist on this machine."""
    prefix = f"{NAME_PREFIX}{_hash(run_id, 8)}-" if run_id else NAME_PREFIX
    try:
        names = os.listdir(NETNS_DIR)
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(prefix) and "-probe-" not in n)


def leftover_tables(run_id: str | None = None) -> list[str]:
    """Host tables of cell namespaces (of one run) that exist on this machine."""
    proc = _run(["nft", "-j", "list", "tables", "inet"])
    if proc.returncode != 0:
        return []
    prefix = f"{TABLE_PREFIX}{_hash(run_id, 8)}_" if run_id else TABLE_PREFIX
    found = []
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        for item in strict_json.loads(proc.stdout).get("nftables", ()):
            table = item.get("table") if isinstance(item, dict) else None
            if isinstance(table, dict) and str(table.get("name", "")).startswith(prefix):
                found.append(str(table["name"]))
    return sorted(found)


def remove_leftovers(run_id: str) -> int:
    """Remove what a writer of this run left when it died (only the run's writer, holding
    its lock, may call this); how many namespaces."""
    names = leftovers(run_id)
    for name in names:
        remove_namespace(name)
    for table in leftover_tables(run_id):
        _run(["nft", "delete", "table", "inet", table])
    return len(names)


__all__ = [
    "PROXY_NAME",
    "CellNetwork",
    "NetnsError",
    "create",
    "enforcement_unavailable",
    "host_ruleset",
    "inside_ruleset",
    "leftover_tables",
    "leftovers",
    "namespace_name",
    "pick_block",
    "remove_leftovers",
    "remove_namespace",
]
