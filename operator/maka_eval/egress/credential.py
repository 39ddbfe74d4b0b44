"""Per-attempt credentials of the cluster's egress gateway, derived without shared state.

An attempt's credential is `<identity>:<password>` for HTTP Basic proxy authentication,
where the identity names the attempt (`<namespace>/<attempt name>`) and the password is
HMAC-SHA256 of the identity under the gateway key, in hex. The operator computes it when
it starts the attempt and puts it in a Secret that only the attempt's egress sidecar
mounts; the gateway recomputes it from the identity the request presents, so it needs
no list of attempts, no API access and no state. Only the operator and the gateway hold
the key (a Secret in the operator's namespace).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Iterable

MIN_KEY_BYTES = 16
"""A shorter key is refused: the passwords are only as strong as the key."""
_DOMAIN = b"maka-eval egress gateway v1\0"
"""Keeps these MACs apart from anything else a reused key might sign."""
_TOKEN_DOMAIN = b"maka-eval result token v1\0"
_IDENTITY = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$")
IDENTITY_MAX_LENGTH = 63 + 1 + 253


class InvalidKey(ValueError):
    """The gateway key is missing, too short, or unreadable."""


def load_key(data: bytes | str) -> bytes:
    """The key as both sides use it: the Secret's bytes without surrounding whitespace
    (so `--from-file` with a trailing newline and `--from-literal` give the same key)."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    key = raw.strip()
    if len(key) < MIN_KEY_BYTES:
        raise InvalidKey(
            f"the egress gateway key has {len(key)} bytes, at least {MIN_KEY_BYTES} are "
            "needed; make one with: openssl rand -hex 32"
        )
    return key


def attempt_identity(namespace: str, attempt_name: str) -> str:
    """The identity an attempt presents to the gateway (it appears in the audit log)."""
    identity = f"{namespace}/{attempt_name}"
    if not valid_identity(identity):
        raise ValueError(f"not a namespace/name pair: {identity!r}")
    return identity


def valid_identity(identity: str) -> bool:
    """Whether `identity` has the `<namespace>/<name>` shape (DNS names, no colon)."""
    return len(identity) <= IDENTITY_MAX_LENGTH and _IDENTITY.match(identity) is not None


def password(key: bytes, identity: str) -> str:
    """HMAC-SHA256 of the identity under the key, 64 hex digits."""
    return hmac.new(key, _DOMAIN + identity.encode(), hashlib.sha256).hexdigest()


def credential(key: bytes, identity: str) -> str:
    """`identity:password`: mitmproxy's `upstream_auth` value, the Secret's content."""
    return f"{identity}:{password(key, identity)}"


def result_token(key: bytes, identity: str, attempt_uid: str) -> str:
    """An attempt's result token: the HMAC key of its egress sidecar's provider-usage
    checkpoint, which the relay verifies. Derived (HMAC-SHA256 of the identity and the
    Attempt's uid under the gateway key, apart from the passwords by its domain), so
    rendering the attempt's Secret stays a pure function; an Attempt made again under
    the same name gets another one."""
    message = _TOKEN_DOMAIN + identity.encode() + b"\0" + attempt_uid.encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def proxy_authorization(value: str) -> str:
    """The Proxy-Authorization header value for a credential."""
    return "Basic " + base64.b64encode(value.encode()).decode("ascii")


def verify(keys: Iterable[bytes], header: str | None) -> str | None:
    """The identity a Proxy-Authorization header proves, or None (missing, malformed,
    or a password that no key gives). Several keys allow a rotation without downtime."""
    if not header:
        return None
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("ascii")
    except (binascii.Error, UnicodeDecodeError):
        return None
    identity, sep, given = decoded.partition(":")
    if not sep or not valid_identity(identity):
        return None
    matched = False
    for key in keys:
        # compare_digest over every key: the time taken does not tell which one matched.
        matched |= hmac.compare_digest(password(key, identity), given)
    return identity if matched else None
