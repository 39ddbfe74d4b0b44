"""Settling the metering proxy over HTTP, for a relay that cannot signal it.

In a Pod the egress proxy is a sidecar container: the relay (in the subject's container)
shares its network but not its processes, so it cannot send SIGUSR1 as the local
executor does. It sends `POST http://maka-eval-settle.invalid/` to the proxy instead;
the proxy's addon answers it itself (it never leaves the Pod: `.invalid` names nothing)
once the settled checkpoint is on disk, and the relay then reads the checkpoint.

Anyone in the Pod may send it: a settle only marks the figure final until the next
model request starts (`Meter.started` clears it), so an early settle by the subject
changes nothing a later read sees. Standard library only (the relay bundle loads it).
"""

from __future__ import annotations

import http.client
import time
import urllib.parse
from pathlib import Path

from maka_eval.metering.checkpoint import Checkpoint, CheckpointRejected, read_checkpoint

SETTLE_HOST = "maka-eval-settle.invalid"
"""The name the proxy answers settle requests for (RFC 2606: `.invalid` never resolves)."""
SETTLE_URL = f"http://{SETTLE_HOST}/"


class SettleError(RuntimeError):
    """The proxy did not confirm the settlement."""


def request_settlement(proxy_url: str, timeout: float = 5.0) -> None:
    """Ask the proxy at `proxy_url` (http://HOST:PORT) to settle; SettleError unless it
    confirms that the settled checkpoint is written."""
    parts = urllib.parse.urlsplit(proxy_url)
    if parts.scheme != "http" or not parts.hostname:
        raise SettleError(f"not an http proxy URL: {proxy_url!r}")
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        connection.request("POST", SETTLE_URL, body=b"", headers={"Host": SETTLE_HOST})
        response = connection.getresponse()
        body = response.read(200).decode("utf-8", "replace").strip()
    except OSError as exc:
        raise SettleError(f"the metering proxy at {proxy_url} did not answer: {exc}") from None
    finally:
        connection.close()
    if response.status != 200:
        raise SettleError(
            f"the metering proxy at {proxy_url} answered {response.status}: {body[:120]}"
        )


def wait_settled(
    path: Path, token: str, timeout: float = 5.0, interval: float = 0.02
) -> Checkpoint | CheckpointRejected:
    """Read the checkpoint until it says settled with nothing in flight (bounded by
    `timeout`); the last read is returned either way (`derive` says what it is worth)."""
    deadline = time.monotonic() + timeout
    while True:
        found = read_checkpoint(path, token)
        if isinstance(found, Checkpoint) and found.settled and found.in_flight == 0:
            return found
        if time.monotonic() >= deadline:
            return found
        time.sleep(interval)
