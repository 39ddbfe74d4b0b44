#!/usr/bin/env python3
"""A subject that tries to get out of its policed cell (see tests/egress/attacks.py).

Standard library only: it runs with whatever python3 the sandbox has. One JSON line per
attempt on stdout: {"attack", "expect": "blocked" | "allowed", "ok", "detail"}.
Inputs (its spec's env): ATTACK_BAIT_PORT, ATTACK_UPSTREAM, ATTACK_RESOLVERS,
ATTACK_HOST_ADDRESSES, ATTACK_BLOCKED_HOST; the proxy's address comes from /etc/hosts.
"""

import base64
import contextlib
import ctypes
import ctypes.util
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

TIMEOUT = 3.0
SO_MARK = 36
TB = "https://github.com/laude-institute/terminal-bench"
ECHO_REQUEST = b"\x08\x00\xf7\xfe\x00\x01\x00\x00"
results = []


def report(attack, expect, ok, detail):
    line = {"attack": attack, "expect": expect, "ok": bool(ok), "detail": str(detail)[:300]}
    results.append(line)
    print(json.dumps(line), flush=True)


def blocked(attack, action):
    """`action` returns what got through, or None, or raises when it was stopped."""
    try:
        got = action()
    except Exception as exc:  # refused, reset, unreachable, EPERM, timed out
        report(attack, "blocked", True, f"{type(exc).__name__}: {exc}")
        return
    report(attack, "blocked", got is None, got or "no answer")


def proxy_address():
    with open("/etc/hosts") as handle:
        for line in handle:
            words = line.split("#")[0].split()
            if "maka-eval-proxy" in words[1:]:
                return words[0]
    raise SystemExit("maka-eval-proxy is not in /etc/hosts")


def env_list(name):
    return [item for item in os.environ.get(name, "").split(",") if item]


ADDR = proxy_address()
BAIT = int(os.environ["ATTACK_BAIT_PORT"])
UPSTREAM = os.environ["ATTACK_UPSTREAM"]
BLOCKED_HOST = os.environ["ATTACK_BLOCKED_HOST"]


def tcp(host, port, family=socket.AF_INET):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT)
        s.connect((host, port))
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        return f"connected to {host}:{port}, read {s.recv(64)!r}"


def udp(host, port, payload=b"hello", family=socket.AF_INET):
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.settimeout(TIMEOUT)
        s.sendto(payload, (host, port))
        data, peer = s.recvfrom(512)
        return f"answer from {peer}: {data[:32]!r}"


def dns_query(name="example.com"):
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + qname + b"\x00\x01\x00\x01"


def dns_udp(host, family=socket.AF_INET):
    return udp(host, 53, dns_query(), family)


def dns_tcp(host):
    with socket.socket() as s:
        s.settimeout(TIMEOUT)
        s.connect((host, 53))
        query = dns_query()
        s.sendall(len(query).to_bytes(2, "big") + query)
        return f"DNS answer over TCP from {host}: {s.recv(64)[:16]!r}"


def ping(kind):
    with socket.socket(socket.AF_INET, kind, socket.IPPROTO_ICMP) as s:
        s.settimeout(TIMEOUT)
        s.sendto(ECHO_REQUEST, (ADDR, 0))
        return f"ICMP answer: {s.recv(64)[:8]!r}"


def tool(argv):
    """Run a tool: what it printed when it succeeded; raises when it failed."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise OSError((proc.stderr or proc.stdout).strip()[-200:])
    return f"{argv[0]} succeeded: {proc.stdout[:80]!r}"


def fetch(url, proxies=None):
    handlers = [urllib.request.ProxyHandler(proxies)] if proxies is not None else []
    with urllib.request.build_opener(*handlers).open(url, timeout=TIMEOUT) as response:
        return f"HTTP {response.status}", response.read(200)


def expect_403(attack, url):
    try:
        status, body = fetch(url)
        report(attack, "blocked", False, f"{status}: {body[:60]!r}")
    except urllib.error.HTTPError as exc:
        report(attack, "blocked", exc.code == 403, f"HTTP {exc.code} from the proxy")
    except OSError as exc:  # a refused CONNECT: 'Tunnel connection failed: 403 ...'
        report(attack, "blocked", "403" in str(exc), f"{type(exc).__name__}: {exc}")


def packet_socket():
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3)):
        return "an AF_PACKET socket was opened"


def packet_mark():
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, SO_MARK, 1)  # needs CAP_NET_ADMIN
        return "a packet mark was set"


FORBIDDEN_CAPS = (
    *((12, "NET_ADMIN"), (13, "NET_RAW"), (21, "SYS_ADMIN"), (2, "DAC_READ_SEARCH")),
    *((16, "SYS_MODULE"), (17, "SYS_RAWIO"), (19, "SYS_PTRACE"), (39, "BPF")),
)


def capabilities():
    with open("/proc/self/status") as handle:
        lines = [line.partition(":") for line in handle]
    caps = {key: int(value, 16) for key, _, value in lines if key.startswith("Cap")}
    held = [
        f"{cap} in {key}" for key, v in caps.items() for bit, cap in FORBIDDEN_CAPS if v >> bit & 1
    ]
    return ", ".join(held) or None


# -- out of the sandbox (a root subject with what root keeps) ------------------------------------
LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
MS_REMOUNT, MS_BIND = 32, 4096


def libc_failed(what):
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}")


def in_child(action):
    """Run `action` in a forked child (it may change its namespaces or mounts): what got
    through, or None; raises what stopped it."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            got = action()
            answer = {"got": None if got is None else str(got)}
        except BaseException as exc:  # reported to the parent
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write_end, json.dumps(answer).encode()[:4000])
        os._exit(0)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 4096):
        data += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    answer = json.loads(data or b'{"error": "the child died"}')
    if "error" in answer:
        raise OSError(answer["error"])
    return answer["got"]


def unshare_network():
    if LIBC.unshare(CLONE_NEWNET) != 0:
        raise libc_failed("unshare(CLONE_NEWNET)")
    return "made a network namespace of its own (it holds CAP_SYS_ADMIN)"


def namespace_files():
    """Every network namespace this sandbox shows: /proc/*/ns/net (PID 1's first), /run/netns."""
    found = ["/proc/1/ns/net"]
    found += [f"/proc/{pid}/ns/net" for pid in os.listdir("/proc") if pid.isdigit()]
    for folder in ("/run/netns", "/var/run/netns"):
        with contextlib.suppress(OSError):
            found += [os.path.join(folder, name) for name in os.listdir(folder)]
    return list(dict.fromkeys(found))


def setns_and_out():
    """setns(2) into each namespace it can see (nsenter --net=...), then raw TCP to the bait."""
    stops = []
    for path in namespace_files():

        def enter(path=path):
            fd = os.open(path, os.O_RDONLY)
            if LIBC.setns(fd, CLONE_NEWNET) != 0:
                raise libc_failed(f"setns({path})")
            return tcp(ADDR, BAIT)

        try:
            return in_child(enter)
        except OSError as exc:
            stops.append(str(exc))
    raise OSError("; ".join(stops[:3]) or "no namespace to enter")


def user_namespace_and_out():
    """A user namespace of its own (full capabilities inside), a network namespace in it."""
    if LIBC.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        raise libc_failed("unshare(CLONE_NEWUSER | CLONE_NEWNET)")
    for target in ((ADDR, BAIT), ("1.1.1.1", 443)):
        try:
            return tcp(*target)
        except OSError as exc:
            stop = exc
    raise stop


def remount_ca_folder():
    """The proxy's CA folder is shown read-only: remount the mount that holds it
    read-write (keeping its other flags) and write into the folder."""
    folder = os.path.dirname(os.environ["SSL_CERT_FILE"])
    flags = {"nosuid": 2, "nodev": 4, "noexec": 8}
    point, keep = "/", 0
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            mount_point = fields[4].encode().decode("unicode_escape")
            inside = folder == mount_point or folder.startswith(mount_point.rstrip("/") + "/")
            if inside and len(mount_point) >= len(point):
                point = mount_point
                keep = sum(flags.get(option, 0) for option in fields[5].split(","))
    if LIBC.mount(None, point.encode(), None, MS_REMOUNT | MS_BIND | keep, None) != 0:
        raise libc_failed(f"mount -o remount,rw {point}")
    probe = os.path.join(folder, "escaped")
    with open(probe, "w") as handle:
        handle.write("x")
    os.unlink(probe)
    return f"remounted {point} read-write and wrote into {folder}"


def mknod_root_disk():
    """A device node for the disk that holds / (the host's, in the process sandbox)."""
    with open("/proc/self/mountinfo") as handle:
        device = next(line.split()[2] for line in handle if line.split()[4] == "/")
    major, minor = (int(part) for part in device.split(":"))
    stops = []
    for folder in ("/tmp", os.getcwd()):
        node = os.path.join(folder, ".disk")
        try:
            os.mknod(node, 0o600 | 0o060000, os.makedev(major, minor))
            try:
                with open(node, "rb") as disk:
                    return f"read {len(disk.read(4096))} bytes of the disk {device}"
            finally:
                os.unlink(node)
        except OSError as exc:
            stops.append(f"{folder}: {exc}")
    raise OSError("; ".join(stops))


class FileHandle(ctypes.Structure):
    _fields_ = [
        ("handle_bytes", ctypes.c_uint),
        ("handle_type", ctypes.c_int),
        ("f_handle", ctypes.c_ubyte * 128),
    ]


def open_by_handle():
    """open_by_handle_at(2) on inode 2 -- an ext4 filesystem's root -- of the filesystem
    under /etc: the whole filesystem, whatever the sandbox mounted over it."""
    handle, mount_id = FileHandle(handle_bytes=128), ctypes.c_int()
    if LIBC.name_to_handle_at(-100, b"/etc", ctypes.byref(handle), ctypes.byref(mount_id), 0):
        raise libc_failed("name_to_handle_at(/etc)")
    root = FileHandle(handle_bytes=8, handle_type=1)  # FILEID_INO32_GEN: inode, generation
    root.f_handle[0] = 2
    anchor = os.open("/etc", os.O_RDONLY)
    fd = LIBC.open_by_handle_at(anchor, ctypes.byref(root), os.O_RDONLY | os.O_DIRECTORY)
    if fd < 0:
        raise libc_failed("open_by_handle_at(inode 2)")
    return f"opened a filesystem's root by handle: {sorted(os.listdir(f'/proc/self/fd/{fd}'))[:6]}"


def find_secrets():
    """The CA key, the audit log or the result token: next to the published certificate,
    or anywhere this sandbox shows."""
    found = []
    near = os.path.dirname(os.path.dirname(os.environ.get("SSL_CERT_FILE", "/none/cert.pem")))
    for rel in ("state/confdir/mitmproxy-ca.pem", "state/audit/audit.jsonl", "state/result-token"):
        path = os.path.join(near, rel)
        try:
            with open(path, "rb") as handle:
                found.append(f"{path}: {handle.read(40)!r}")
        except OSError:
            pass
    deadline = time.monotonic() + 2
    skip = {"/proc", "/sys", "/dev", "/usr", "/lib", "/lib64", "/bin", "/sbin", "/boot"}
    for top, dirs, files in os.walk("/"):
        dirs[:] = [d for d in dirs if os.path.join(top, d) not in skip]
        found += [
            os.path.join(top, name)
            for name in files
            if name in ("mitmproxy-ca.pem", "audit.jsonl", "result-token")
        ]
        if time.monotonic() > deadline:
            break
    return "; ".join(found) or None


def allowed(attack, action):
    try:
        ok, detail = action()
    except Exception as exc:
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    report(attack, "allowed", ok, detail)


def upstream():
    status, body = fetch(UPSTREAM)
    return status == "HTTP 200" and body == b"upstream-ok", f"{status} {body!r}"


def curl_upstream():
    proc = subprocess.run(["curl", "-sS", "-m", "5", UPSTREAM], capture_output=True, text=True)
    return proc.stdout == "upstream-ok", (proc.stdout or proc.stderr)[:120]


def trusted_ca():
    cert = os.environ["SSL_CERT_FILE"]
    with open(cert) as handle:
        pem = handle.read()
    ssl.create_default_context(cafile=cert)
    return "BEGIN CERTIFICATE" in pem and "PRIVATE KEY" not in pem, cert


# -- around the proxy -----------------------------------------------------------------------
bait_url = f"http://{ADDR}:{BAIT}/"
blocked("HTTP with the proxy variables unset (to the host's bait)", lambda: fetch(bait_url, {}))
blocked(
    "HTTP with the proxy variables unset (to a public address)",
    lambda: fetch("http://93.184.215.14/", {}),
)
if shutil.which("curl"):
    blocked(
        "curl --noproxy '*' (to the host's bait)",
        lambda: tool(["curl", "-sS", "-m", "3", "--noproxy", "*", bait_url]),
    )
blocked("raw TCP to another port of the proxy's address (the bait)", lambda: tcp(ADDR, BAIT))
blocked("a second connection to the proxy's address, port 22", lambda: tcp(ADDR, 22))
blocked("a second connection to the proxy's address, port 443", lambda: tcp(ADDR, 443))
for host in env_list("ATTACK_HOST_ADDRESSES"):
    blocked(f"raw TCP to the host's address {host}", lambda host=host: tcp(host, BAIT))
blocked("raw TCP to a public address (1.1.1.1:443)", lambda: tcp("1.1.1.1", 443))
blocked("IPv4-mapped IPv6 TCP to the bait", lambda: tcp(f"::ffff:{ADDR}", BAIT, socket.AF_INET6))
blocked("UDP to the host's bait (an echo server)", lambda: udp(ADDR, BAIT))
# -- DNS ------------------------------------------------------------------------------------
blocked("DNS over UDP to 8.8.8.8", lambda: dns_udp("8.8.8.8"))
blocked("DNS over TCP to 8.8.8.8", lambda: dns_tcp("8.8.8.8"))
blocked("DNS over UDP to the proxy's address", lambda: dns_udp(ADDR))
blocked("DNS over TCP to the proxy's address", lambda: dns_tcp(ADDR))
for resolver in env_list("ATTACK_RESOLVERS"):
    blocked(f"DNS over UDP to the host's resolver {resolver}", lambda r=resolver: dns_udp(r))
    blocked(f"DNS over TCP to the host's resolver {resolver}", lambda r=resolver: dns_tcp(r))
blocked(
    "name lookup (getaddrinfo example.com)",
    lambda: f"resolved to {socket.getaddrinfo('example.com', 80)[0][4]}",
)
# -- ICMP, IPv6, beneath and around the policy ----------------------------------------------
blocked("ping the proxy's address (ICMP datagram socket)", lambda: ping(socket.SOCK_DGRAM))
blocked("ping the proxy's address (raw ICMP socket)", lambda: ping(socket.SOCK_RAW))
if shutil.which("ping"):
    blocked("ping(8) the proxy's address", lambda: tool(["ping", "-c", "1", "-W", "2", ADDR]))
blocked("IPv6 TCP to a public address", lambda: tcp("2606:4700:4700::1111", 443, socket.AF_INET6))
blocked("IPv6 DNS to a public resolver", lambda: dns_udp("2001:4860:4860::8888", socket.AF_INET6))
blocked(
    "IPv6 to the link-local all-nodes address",
    lambda: udp("ff02::1%maka0", BAIT, b"x", socket.AF_INET6),
)
blocked("an AF_PACKET socket (frames beneath the policy)", packet_socket)
blocked("a packet mark (CAP_NET_ADMIN)", packet_mark)
if shutil.which("nft"):
    blocked("nft flush ruleset", lambda: tool(["nft", "flush", "ruleset"]))
blocked("a capability that reaches around the policy or out (any set)", capabilities)
# -- out of the sandbox --------------------------------------------------------------------------
blocked("unshare a network namespace (CAP_SYS_ADMIN)", lambda: in_child(unshare_network))
blocked("setns into any visible network namespace (PID 1's too), then TCP out", setns_and_out)
blocked(
    "a user namespace with its own network namespace, then TCP out",
    lambda: in_child(user_namespace_and_out),
)
blocked("remount the CA folder read-write and write into it", lambda: in_child(remount_ca_folder))
blocked("mknod the root filesystem's disk and read it", lambda: in_child(mknod_root_disk))
blocked(
    "open_by_handle_at a filesystem's root (CAP_DAC_READ_SEARCH)", lambda: in_child(open_by_handle)
)
# -- through the proxy: the blocklist ---------------------------------------------------------
encoded_twice = urllib.parse.quote(urllib.parse.quote(f"http://{BLOCKED_HOST}/x", safe=""))
expect_403("a blocked URL through the proxy", "http://github.com/laude-institute/terminal-bench")
expect_403("a blocked URL wrapped in an archive mirror", f"http://web.archive.org/web/2024/{TB}")
expect_403(
    "a blocked URL percent-encoded in a query",
    f"{UPSTREAM}?next={urllib.parse.quote(TB, safe='')}",
)
expect_403(
    "a blocked URL base64-encoded in a query",
    f"{UPSTREAM}?u={base64.urlsafe_b64encode(TB.encode()).decode()}",
)
expect_403("a blocked host over HTTPS (CONNECT)", "https://www.tbench.ai/")
expect_403("the spec's own blocked host", f"http://{BLOCKED_HOST}/")
expect_403("the spec's own blocked host, double-encoded", f"{UPSTREAM}?to={encoded_twice}")
# -- what the proxy keeps -----------------------------------------------------------------------
blocked("read the proxy's CA key, audit log or result token", find_secrets)
# -- what must work -----------------------------------------------------------------------------
allowed("the allowed upstream through the proxy", upstream)
if shutil.which("curl"):
    allowed("curl to the allowed upstream through the proxy", curl_upstream)
allowed("the proxy's CA certificate is trusted (SSL_CERT_FILE)", trusted_ca)
with open("done.txt", "w") as handle:
    handle.write(json.dumps(results))
