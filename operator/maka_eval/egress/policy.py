"""The contamination blocklist: URL normalization, unwrapping, rules and presets.

One policy object answers "may the subject fetch this?" for the per-cell proxy, the
cluster sidecar and the egress gateway, which is why this module imports the standard
library only (no pydantic, no mitmproxy): the proxy process loads it from a policy file.

A URL is checked in three steps:

1. **Normalize** (`normalize_url`): scheme and host case, default ports, userinfo,
   percent-encoding (unreserved characters decoded, hex in upper case), IDNA (a Unicode
   host becomes punycode, so both spellings compare equal), trailing dots, dot segments
   and repeated slashes. Never raises: input that has no usable host becomes an
   *unparseable* form, which the policy blocks (its destination cannot be checked).
2. **Unwrap** (`unwrap_url`): archive and cache mirrors, redirectors, reader proxies and
   encoded URLs carry another URL; every URL found is checked too, recursively, up to
   `MAX_WRAP_DEPTH` levels (a deeper nesting is blocked). Wrapped text that does not
   parse is not a destination and is skipped; the request itself is still checked.
3. **Match** each URL against the rules. Three kinds of rule, written as entries:
   - ``example.com``: the host and every subdomain; ``*.example.com``: subdomains only;
   - ``github.com/org/repo``: that host (and subdomains) with a request target starting
     with the path prefix at a segment boundary (``/org/repo``, ``/org/repo/...``,
     ``/org/repo.git``, ``/org/repo@v1``, not ``/org/repository``); compared
     case-insensitively after full percent-decoding;
   - ``re:<regex>``: searched, case-insensitively, in the host and — separately — in the
     request target (path and query, percent-decoded, lower case). It never sees the two
     joined, so no match can straddle the host/path boundary (host ``terminal.example``
     with path ``/-bench`` is not ``terminal-bench``). A punycode host is searched in its
     Unicode form too.

Presets are named, versioned rule sets (`PRESETS`); the policy is a preset plus the
spec's own entries, and its `digest` names exactly that.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import ipaddress
import json
import os
import re
import unicodedata
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from encodings import idna
from typing import Literal, NamedTuple
from urllib.parse import unquote

from maka_eval import strict_json
from maka_eval.errors import MakaEvalError, Problem

# -- normalization -------------------------------------------------------------------------

DEFAULT_PORTS: Mapping[str, int] = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}
"""Schemes parsed the WHATWG way (any number of slashes, '\\' as '/'), with their ports."""

UNPARSEABLE = "<unparseable>"
"""The rule named by a verdict on a URL whose destination cannot be determined."""
TOO_DEEP = "<wrapped too deep>"
"""The rule named by a verdict on a URL nested past `MAX_WRAP_DEPTH` or `MAX_URLS`."""
CHECK_FAILED = "<check failed>"
"""The rule named when checking itself failed: the request is blocked, never let through
(an exception in a mitmproxy hook would otherwise let the flow continue)."""
NOT_ALLOWED = "<not in allowed_hosts>"
"""The rule named when a task's allowlist (task.toml `network_mode = "allowlist"`) does
not name the request's host."""

_C0_AND_SPACE = "".join(map(chr, range(0x21)))
_TAB_OR_NEWLINE = re.compile(r"[\t\n\r]")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
_ENCODED_SCHEME = re.compile(r"(?i)(?:https?|wss?|ftp)%3a")
_AUTHORITY_END = re.compile(r"[/?#]")
_DOTS = re.compile("[.\u3002\uff0e\uff61]")  # the label separators IDNA knows
_LABEL = re.compile(r"[a-z0-9_-]+")
_ASCII_HOST = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_PATH_SAFE = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/]*")
_QUERY_SAFE = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/?]*")
_PATH_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}|%|[^A-Za-z0-9\-._~!$&'()*+,;=:@/%]")
_QUERY_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}|%|[^A-Za-z0-9\-._~!$&'()*+,;=:@/?%]")
_MAX_DECODE_ROUNDS = 4


class NormalizedUrl(NamedTuple):
    """A URL in normal form, or an unparseable one (`problem` says why)."""

    text: str
    """The normal form (`scheme://host[:port]/path[?query]`); the cleaned input when
    unparseable. Normalizing `text` again gives `text`."""
    scheme: str = ""
    host: str = ""
    """ASCII, lower case, punycode labels, no trailing dot; IPv6 in brackets."""
    port: int | None = None
    """None for the scheme's default port."""
    path: str = ""
    query: str = ""
    problem: str | None = None

    @property
    def parseable(self) -> bool:
        """Whether a destination could be determined."""
        return self.problem is None


def _clean(text: str) -> str:
    """What browsers do first: strip C0 controls and spaces around, drop tabs/newlines."""
    return _TAB_OR_NEWLINE.sub("", text.strip(_C0_AND_SPACE))


def _escape(match: re.Match[str]) -> str:
    token = match.group()
    if len(token) == 3:  # %XX
        char = chr(int(token[1:], 16))
        return char if char in _UNRESERVED else token.upper()
    if token == "%":  # a bare '%' is ambiguous; make it a literal one
        return "%25"
    return "".join(f"%{b:02X}" for b in token.encode("utf-8", "surrogatepass"))


def _normalize_escapes(text: str, safe: re.Pattern[str], escape: re.Pattern[str]) -> str:
    if "%" not in text and safe.fullmatch(text):
        return text
    return escape.sub(_escape, text)


def _remove_dot_segments(segments: Iterable[str]) -> tuple[list[str], bool]:
    """Resolve '.' and '..' (RFC 3986 5.2.4) over non-empty segments; (segments, ends
    with a slash)."""
    out: list[str] = []
    trailing = False
    for segment in segments:
        if segment in ("", "."):
            trailing = True
            continue
        if segment == "..":
            if out:
                out.pop()
            trailing = True
            continue
        out.append(segment)
        trailing = False
    return out, trailing


def _join_path(segments: list[str], trailing: bool) -> str:
    if not segments:
        return "/"
    return "/" + "/".join(segments) + ("/" if trailing else "")


def _normalize_path(path: str) -> str:
    if "//" not in path and "/." not in path and "%" not in path and _PATH_SAFE.fullmatch(path):
        return path or "/"  # already normal: the common case, kept fast
    path = _normalize_escapes(path, _PATH_SAFE, _PATH_ESCAPE)
    # Repeated slashes collapse: servers and mirrors commonly treat `a//b` as `a/b`.
    return _join_path(*_remove_dot_segments(path.split("/")))


def _label_ascii(label: str) -> str:
    if label.isascii():
        return label.lower()
    try:
        return idna.ToASCII(label).decode("ascii").lower()
    except UnicodeError:
        # IDNA 2003 refuses some labels (too long, unassigned code points); this mapping
        # is still deterministic, so equal inputs compare equal.
        folded = unicodedata.normalize("NFKC", label).casefold()
        return "xn--" + folded.encode("punycode").decode("ascii").lower()


def canonical_host(raw: str) -> str | None:
    """`raw` (already percent-decoded) as an ASCII lower-case host, or None if invalid."""
    if raw.isascii():
        lower = raw.lower()
        if _ASCII_HOST.fullmatch(lower):
            return lower
    if raw.startswith("["):
        if not raw.endswith("]"):
            return None
        try:
            return f"[{ipaddress.IPv6Address(raw[1:-1]).compressed}]"
        except ValueError:
            return None
    labels = [label for label in _DOTS.split(raw) if label]
    if not labels:
        return None
    out = []
    for label in labels:
        ascii_label = _label_ascii(label)
        if not _LABEL.fullmatch(ascii_label):
            return None
        out.append(ascii_label)
    return ".".join(out)


def unicode_host(host: str) -> str:
    """The Unicode form of a canonical host (its punycode labels decoded, when valid)."""
    if "xn--" not in host:
        return host
    labels = []
    for label in host.split("."):
        if label.startswith("xn--"):
            with contextlib.suppress(UnicodeError):  # an invalid one stays as it is
                label = idna.ToUnicode(label).casefold()
        labels.append(label)
    return ".".join(labels)


def _unparseable(text: str, problem: str) -> NormalizedUrl:
    return NormalizedUrl(text=text, problem=problem)


def normalize_url(url: str) -> NormalizedUrl:
    """`url` in normal form; never raises (an unusable URL comes back unparseable)."""
    text = _clean(url)
    try:
        return _normalize(text)
    except (UnicodeError, ValueError, OverflowError) as exc:  # pragma: no cover - defensive
        return _unparseable(text, f"cannot be parsed ({exc.__class__.__name__})")


def _split_scheme(text: str) -> tuple[str, str]:
    """(scheme, rest); a text without a scheme is taken as http."""
    if _ENCODED_SCHEME.match(text):
        # A whole URL percent-encoded (e.g. copied out of a query string).
        for _ in range(_MAX_DECODE_ROUNDS):
            decoded = unquote(text, errors="replace")
            if decoded == text:
                break
            text = decoded
    match = _SCHEME.match(text)
    if match:
        scheme = match.group(1).lower()
        rest = text[match.end() :]
        # `localhost:8080/x`, `tbench.ai:443`: a host and port, not a scheme.
        if scheme in DEFAULT_PORTS or not rest[:1].isdigit():
            return scheme, rest
    return "", text


def _normalize(text: str) -> NormalizedUrl:
    scheme, rest = _split_scheme(text)
    if not scheme or scheme in DEFAULT_PORTS:
        rest = rest.replace("\\", "/").lstrip("/")
        scheme = scheme or "http"
    elif rest.startswith("//"):
        rest = rest[2:]
    else:
        return _unparseable(text, f"'{scheme}:' URL without a host")

    stop = _AUTHORITY_END.search(rest)
    end = stop.start() if stop else len(rest)
    authority, tail = rest[:end], rest[end:]
    hostport = authority.rpartition("@")[2]  # userinfo is stripped
    if hostport.startswith("["):
        close = hostport.find("]")
        if close < 0:
            return _unparseable(text, "unterminated IPv6 address")
        raw_host, after = hostport[: close + 1], hostport[close + 1 :]
        if after and not after.startswith(":"):
            return _unparseable(text, "junk after an IPv6 address")
        port_text = after[1:]
    else:
        raw_host, _, port_text = hostport.partition(":") if ":" in hostport else (hostport, "", "")
    port: int | None = None
    if port_text:
        if not port_text.isascii() or not port_text.isdigit() or len(port_text) > 5:
            return _unparseable(text, f"port '{port_text[:20]}' is not a number")
        port = int(port_text)
        if port > 65535:
            return _unparseable(text, f"port {port} is out of range")
        if port == DEFAULT_PORTS.get(scheme):
            port = None
    if "%" in raw_host:
        raw_host = unquote(raw_host, errors="replace")
    host = canonical_host(raw_host)
    if host is None:
        return _unparseable(text, "no valid host name")

    tail = tail.partition("#")[0]  # a fragment never reaches the server
    path, _, query = tail.partition("?")
    path = _normalize_path(path)
    query = _normalize_escapes(query, _QUERY_SAFE, _QUERY_ESCAPE)
    netloc = host if port is None else f"{host}:{port}"
    normal = f"{scheme}://{netloc}{path}" + (f"?{query}" if query else "")
    return NormalizedUrl(text=normal, scheme=scheme, host=host, port=port, path=path, query=query)


def decode_fully(text: str) -> str:
    """Percent-decode until nothing changes (double-encoded forms too), bounded."""
    for _ in range(_MAX_DECODE_ROUNDS):
        if "%" not in text:
            break
        decoded = unquote(text, errors="replace")
        if decoded == text:
            break
        text = decoded
    return text


def _decoded_path(path: str) -> str:
    """A normal path fully decoded and in lower case, with its segments normalized again
    (decoding may reveal '%2e%2e' or '%2f%2f')."""
    path = decode_fully(path).lower().replace("\\", "/")
    if "/." in path or "//" in path:
        path = _join_path(*_remove_dot_segments(path.split("/")))
    return path


def match_target(url: NormalizedUrl) -> str:
    """The request target as rules see it: path and query, decoded, lower case."""
    path = _decoded_path(url.path)
    return f"{path}?{decode_fully(url.query).lower()}" if url.query else path


# -- unwrapping ----------------------------------------------------------------------------

MAX_WRAP_DEPTH = 8
"""URLs nested deeper than this are blocked: their innermost target is not checked."""
MAX_URLS = 64
"""At most this many URLs (the request and what it wraps) are checked per request."""

MIRROR_DOMAINS: tuple[str, ...] = (
    # Web archives: /web/<timestamp>/<url>, /newest/<url>, /<timestamp>/<url>, ...
    "archive.org",
    "archive.today",
    "archive.ph",
    "archive.is",
    "archive.li",
    "archive.vn",
    "archive.fo",
    "archive.md",
    "arquivo.pt",
    "webarchive.org.uk",
    "mementoweb.org",
    "ghostarchive.org",
    "webcitation.org",
    # Caches: search?q=cache:<url>, /#<url>
    "webcache.googleusercontent.com",
    "cachedview.nl",
    "cachedview.com",
    # Reader proxies and paywall removers: /<url>, proxy?q=<url>
    "r.jina.ai",
    "12ft.io",
    "removepaywall.com",
    "translate.google.com",
)
"""Hosts whose path or query may hold a URL *without* its scheme (e.g.
web.archive.org/web/2024/tbench.ai/); with a scheme, any host is unwrapped."""

_EMBEDDED_SCHEME = re.compile(r"(?i)(?:https?|wss?|ftp):[/\\]")
_DOMAIN_AT_START = re.compile(
    r"(?i)(?:[^\W_][\w-]*\.)+(?:[^\W\d_]{2,}|xn--[a-z0-9-]+)\.?(?::\d{1,5})?(?=$|[/?])"
)
_WWW_AT_START = re.compile(r"(?i)www\.")
_CACHE_PREFIX = re.compile(r"(?i)^cache:(?:[A-Za-z0-9_-]{8,}:(?!\d))?")
# base64 of "http..." in any letter case: "htt", "HTT", "Htt", ... encode to these.
_BASE64_URL = re.compile(r"(?:[aS][FH]R[0U])[A-Za-z0-9+/_-]{6,}={0,2}")
_TRANSLATE_PROXY = ".translate.goog"


_MIRRORS = frozenset(MIRROR_DOMAINS)


def _is_mirror(host: str) -> bool:
    if host in _MIRRORS:
        return True
    dot = host.find(".")
    while dot >= 0:
        if host[dot + 1 :] in _MIRRORS:
            return True
        dot = host.find(".", dot + 1)
    return False


def _base64_urls(text: str) -> Iterator[str]:
    if "R0" not in text and "RU" not in text:  # cheap: no candidate at all
        return
    for match in _BASE64_URL.finditer(text):
        token = match.group().replace("+", "-").replace("/", "_").rstrip("=")
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError):
            continue
        decoded = raw.decode("utf-8", "replace")
        if _EMBEDDED_SCHEME.match(decoded):
            yield decoded


def _query_values(query: str) -> Iterator[str]:
    for piece in re.split(r"[&;]", query):
        key, equals, value = piece.partition("=")
        yield value if equals else key


def _translated_host(host: str) -> str | None:
    """Google Translate's proxy host form: tbench-ai.translate.goog is tbench.ai."""
    if not host.endswith(_TRANSLATE_PROXY):
        return None
    label = host[: -len(_TRANSLATE_PROXY)]
    if not label or "." in label:
        return None
    return label.replace("--", "\0").replace("-", ".").replace("\0", "-")


def embedded_urls(url: NormalizedUrl) -> list[str]:
    """The URLs `url` carries (one level): in its path, its query values (percent- or
    base64-encoded too), or its host (translation proxies)."""
    found: list[str] = []
    mirror = _is_mirror(url.host)
    path = decode_fully(url.path)
    raw_query = f"?{url.query}" if url.query else ""

    scheme_at = _EMBEDDED_SCHEME.search(path)
    if scheme_at:  # reader proxies, archives: /https://example.org/page (+ its query)
        found.append(path[scheme_at.start() :] + raw_query)
    elif mirror:
        segments = path.split("/")
        for i in range(1, min(len(segments), 6)):
            if _DOMAIN_AT_START.match(segments[i]):
                found.append("http://" + "/".join(segments[i:]) + raw_query)
                break
    found.extend(_base64_urls(path))

    for raw_value in _query_values(url.query) if url.query else ():
        value = decode_fully(raw_value)
        value = _CACHE_PREFIX.sub("", value, count=1).strip()
        if _EMBEDDED_SCHEME.match(value):
            found.append(value)
        elif value.startswith("//"):
            found.append("http:" + value)
        elif (mirror or _WWW_AT_START.match(value)) and _DOMAIN_AT_START.match(value):
            found.append("http://" + value)
        found.extend(_base64_urls(value))

    translated = _translated_host(url.host)
    if translated:
        found.append(f"{url.scheme}://{translated}{url.path}{raw_query}")
    return found


class Unwrapped(NamedTuple):
    """A URL and every URL found inside it, outermost first."""

    urls: tuple[tuple[NormalizedUrl, int], ...]
    """(url, depth): depth 0 is the request itself (perhaps unparseable); the wrapped
    URLs that follow all parse."""
    truncated: bool
    """More nesting (or more URLs) than the bounds allow was left unchecked."""


def unwrap_url(url: str) -> Unwrapped:
    """`url` and, recursively, the URLs it wraps (bounded by MAX_WRAP_DEPTH, MAX_URLS)."""
    first = normalize_url(url)
    inner = embedded_urls(first) if first.parseable else []
    if not inner:  # the common case, kept fast
        return Unwrapped(((first, 0),), False)
    seen: set[str] = {first.text}
    found: list[tuple[NormalizedUrl, int]] = [(first, 0)]
    queue: deque[tuple[str, int]] = deque((t, 1) for t in inner)
    truncated = False
    while queue:
        text, depth = queue.popleft()
        normal = normalize_url(text)
        if normal.text in seen:
            continue
        if len(found) >= MAX_URLS:
            truncated = True
            break
        seen.add(normal.text)
        if not normal.parseable:
            # Text that looks wrapped but names no destination (`/web/2024/http:/`) is
            # not a URL anything could fetch; the request itself is checked as it is.
            continue
        found.append((normal, depth))
        inner = embedded_urls(normal)
        if inner and depth >= MAX_WRAP_DEPTH:
            truncated = True
            continue
        queue.extend((t, depth + 1) for t in inner)
    return Unwrapped(tuple(found), truncated)


# -- rules and entries ---------------------------------------------------------------------

RuleKind = Literal["host", "path", "name"]
MAX_ENTRY_LENGTH = 1024


@dataclass(frozen=True)
class Rule:
    """One parsed entry: what it matches and where it comes from."""

    entry: str
    """Canonical entry text (what `to_json` writes)."""
    kind: RuleKind
    why: str
    host: str = ""
    subdomains_only: bool = False
    path: str = ""
    """Path prefix (kind 'path'): decoded, lower case, no trailing slash."""
    pattern: re.Pattern[str] | None = None


class PolicyError(MakaEvalError):
    """An egress policy (entry, preset or policy file) is not valid."""


_ENTRY_HELP = (
    "write a host (example.com: it and its subdomains; *.example.com: subdomains only), "
    "a host and path prefix (github.com/org/repo) or re:<regular expression>"
)


def _parse_entry(entry: str, why: str) -> Rule:
    """The rule an entry stands for; raises ValueError with the fix."""
    if not entry:
        raise ValueError(f"an entry must not be empty; {_ENTRY_HELP}")
    if "\0" in entry:
        raise ValueError("contains a NUL byte (\\u0000); remove it")
    if len(entry) > MAX_ENTRY_LENGTH:
        raise ValueError(f"is {len(entry)} characters; an entry is at most {MAX_ENTRY_LENGTH}")
    if entry != entry.strip():
        raise ValueError(f"'{entry.strip()}' has spaces around it; remove them")
    if entry.startswith("re:"):
        source = entry[3:]
        try:
            pattern = re.compile(source, re.IGNORECASE)
        except re.error as exc:
            raise ValueError(
                f"'{entry}' is not a valid regular expression ({exc}); fix it, or escape "
                "special characters with a backslash"
            ) from None
        if pattern.search(""):
            raise ValueError(
                f"'{entry}' matches the empty text, so it would block every request; make it "
                "match the name you mean"
            )
        return Rule(entry=entry, kind="name", why=why, pattern=pattern)
    if "://" in entry:
        bare = entry.split("://", 1)[1]
        raise ValueError(
            f"'{entry}' has a scheme; write it without one ('{bare}'): an entry applies to "
            "every scheme and port"
        )
    if any(c.isspace() for c in entry):
        raise ValueError(f"'{entry}' contains a space; {_ENTRY_HELP}")
    if "?" in entry or "#" in entry:
        raise ValueError(
            f"'{entry}' has a query or fragment; an entry is a host and a path prefix "
            "(use re:<regex> to match inside a query)"
        )
    raw_host, slash, raw_path = entry.partition("/")
    if "@" in raw_host:
        raise ValueError(f"'{entry}' has a user name ('...@'); write only the host")
    subdomains_only = raw_host.startswith("*.")
    if subdomains_only:
        raw_host = raw_host[2:]
    if "*" in raw_host:
        raise ValueError(
            f"'{entry}': only a leading '*.' wildcard is supported (*.example.com); for other "
            "patterns use re:<regex>"
        )
    if ":" in raw_host and not raw_host.startswith("["):
        raise ValueError(
            f"'{entry}' has a port; remove it: an entry applies to every port of the host"
        )
    host = canonical_host(unquote(raw_host, errors="replace"))
    if host is None:
        raise ValueError(f"'{raw_host}' is not a host name; {_ENTRY_HELP}")
    path = ""
    if slash:
        if {".", ".."} & set(decode_fully(raw_path).replace("\\", "/").split("/")):
            raise ValueError(f"'{entry}' has '.' or '..' segments; write the path they lead to")
        path = _decoded_path(_normalize_path("/" + raw_path)).rstrip("/")
    text = ("*." if subdomains_only else "") + host + path
    kind: RuleKind = "path" if path else "host"
    return Rule(
        entry=text, kind=kind, why=why, host=host, subdomains_only=subdomains_only, path=path
    )


def entry_problem(entry: str) -> str | None:
    """Why `entry` is not a valid blocklist entry (the message names the fix), or None."""
    try:
        _parse_entry(entry, "")
    except ValueError as exc:
        return str(exc)
    return None


def canonical_entry(entry: str) -> str:
    """The canonical spelling of a valid entry (`Example.COM/` -> `example.com`)."""
    try:
        return _parse_entry(entry, "").entry
    except ValueError as exc:
        raise PolicyError("not a valid blocklist entry", [Problem(entry[:80], str(exc))]) from None


# -- allowlists (task.toml network_mode = "allowlist") ---------------------------------------

_ALLOWED_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


def allowed_host_entry(raw: str) -> str:
    """One `allowed_hosts` entry in Harbor 0.26's normal form: a host name
    (`example.com`, that host only), a leading wildcard (`*.example.com`, its subdomains),
    an IP address or an IP network in CIDR form. Raises ValueError naming the fix."""
    host = raw.strip().lower().rstrip(".") if isinstance(raw, str) else None
    if not host:
        raise ValueError("must be a non-empty host name, IP address or IP network")
    if "://" in host:
        raise ValueError(f"'{_short(raw, 60)}' is a URL; give its host only (such as example.com)")
    if "/" in host:
        try:
            return ipaddress.ip_network(host, strict=True).compressed
        except ValueError:
            raise ValueError(
                f"'{_short(raw, 60)}' is not an IP network in CIDR form (such as "
                "192.0.2.0/24); entries are host names, IP addresses or IP networks, not URLs"
            ) from None
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host).compressed
        except ValueError:
            raise ValueError(
                f"'{_short(raw, 60)}' is not a host: entries are host names, IP addresses or "
                "IP networks, without a scheme, port or path"
            ) from None
    name = host[2:] if host.startswith("*.") else host
    if "*" in name:
        raise ValueError(f"'{_short(raw, 60)}': a wildcard is only allowed as a leading '*.'")
    if _ip(name):
        if host.startswith("*."):
            raise ValueError(f"'{_short(raw, 60)}': a wildcard needs a host name, not an address")
        return ipaddress.IPv4Address(name).compressed
    if not all(_ALLOWED_LABEL.fullmatch(label) for label in name.split(".")):
        raise ValueError(
            f"'{_short(raw, 60)}' is not a valid host name (letters, digits, hyphens and "
            "dots; a leading '*.' for subdomains)"
        )
    return host


class _Allowlist:
    """The hosts a task allows: every other destination is blocked."""

    def __init__(self, entries: Sequence[str]) -> None:
        self.entries = tuple(sorted(set(entries)))
        self._names = frozenset(e for e in self.entries if not e.startswith("*.") and not _ip(e))
        self._suffixes = tuple(e[1:] for e in self.entries if e.startswith("*."))
        self._networks = tuple(ipaddress.ip_network(e) for e in self.entries if _ip(e) or "/" in e)

    def allows(self, host: str) -> bool:
        """Whether canonical `host` (as `canonical_host` gives it) is allowed. An address
        is matched only in its standard form: any other spelling of it is refused."""
        bare = host[1:-1] if host.startswith("[") else host
        try:
            address = ipaddress.ip_address(bare)
        except ValueError:
            return host in self._names or host.endswith(self._suffixes)
        if address.compressed != bare:
            return False
        return any(address in network for network in self._networks)


def _ip(entry: str) -> bool:
    try:
        ipaddress.ip_address(entry)
    except ValueError:
        return False
    return True


# -- presets -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PresetEntry:
    """A preset's entry and why it is there."""

    entry: str
    why: str


@dataclass(frozen=True)
class Preset:
    """A named, versioned set of entries. Changing the entries means a new version."""

    name: str
    version: int
    description: str
    entries: tuple[PresetEntry, ...]


_REPOSITORY_ORGS: tuple[tuple[str, str], ...] = (
    (
        "laude-institute",
        "the Terminal-Bench project's GitHub organization: the benchmark repositories "
        "(tasks with their tests and reference solutions, at every pinned revision), the "
        "leaderboard and experiment repositories (submitted agent trajectories)",
    ),
    (
        "harbor-framework",
        "the GitHub organization of Harbor, the framework by Terminal-Bench's authors: "
        "Terminal-Bench 2.x/3.x task repositories with tests and solutions, and Harbor's "
        "registry.json, which pins every registered dataset to a repository revision",
    ),
)
_REPOSITORY_FORMS: tuple[tuple[str, str], ...] = (
    ("github.com/{org}", "{why}"),
    ("raw.githubusercontent.com/{org}", "raw file downloads from {org}'s repositories"),
    ("codeload.github.com/{org}", "zip/tar archives of any revision of {org}'s repositories"),
    ("api.github.com/repos/{org}", "the GitHub API form: contents, tarballs, git blobs"),
    ("patch-diff.githubusercontent.com/raw/{org}", "pull-request patches and diffs"),
    ("gist.github.com/{org}", "gists published by {org}"),
    ("gist.githubusercontent.com/{org}", "raw gists published by {org}"),
    ("cdn.jsdelivr.net/gh/{org}", "jsDelivr's mirror of {org}'s GitHub repositories"),
    ("raw.githack.com/{org}", "githack's mirror of raw files"),
    ("rawcdn.githack.com/{org}", "githack's CDN mirror of raw files"),
    ("github1s.com/{org}", "an online viewer serving the repositories' files"),
    ("sourcegraph.com/github.com/{org}", "Sourcegraph's mirror of the repositories"),
)


def _repository_entries() -> Iterator[PresetEntry]:
    for org, why in _REPOSITORY_ORGS:
        for entry, form_why in _REPOSITORY_FORMS:
            yield PresetEntry(entry.format(org=org), form_why.format(org=org, why=why))


TERMINAL_BENCH = Preset(
    name="terminal-bench",
    version=1,
    description=(
        "Terminal-Bench contamination surfaces: references to the benchmark, its "
        "repositories and pinned revisions, task registries, dataset mirrors, published "
        "trajectories and patch mirrors"
    ),
    entries=(
        PresetEntry(
            r"re:terminal[-_. +]?bench(?!mark)",
            "the benchmark's name, in a host (terminal-bench.example.org) or a request "
            "target: repositories, forks, dataset mirrors (Hugging Face), package pages "
            "(PyPI terminal-bench, terminal_bench-*.tar.gz), published trajectories and "
            "write-ups named after it",
        ),
        PresetEntry(
            r"re:(?<![a-z0-9])t-?bench(?!mark)",
            "the benchmark's short names: tbench (tbench.ai, tbench-* repositories) and "
            "t-bench (the project's first name); not testbench or benchmark",
        ),
        PresetEntry(
            "tbench.ai",
            "Terminal-Bench's website: the task registry and task pages, the leaderboard "
            "and the published agent runs (trajectories) behind it",
        ),
        PresetEntry(
            "harborframework.com",
            "Harbor's site and Harbor Hub: the dataset registry (Terminal-Bench tasks ship "
            "their tests/ and solution/), uploaded jobs with trial artifacts (trajectories) "
            "and the Terminal-Bench leaderboards",
        ),
        *_repository_entries(),
        PresetEntry(
            "huggingface.co/datasets/harborframework",
            "Harbor's dataset mirrors on Hugging Face: every Terminal-Bench release, tagged "
            "per version, with tests and solutions",
        ),
        PresetEntry(
            "huggingface.co/api/datasets/harborframework",
            "the Hugging Face API form of the same datasets",
        ),
        PresetEntry("huggingface.co/harborframework", "the same organization's Hub page"),
        PresetEntry("hf.co/datasets/harborframework", "hf.co is Hugging Face's short domain"),
        PresetEntry("hf-mirror.com/datasets/harborframework", "a public Hugging Face mirror"),
        PresetEntry(
            "pypi.org/project/terminal-bench",
            "the benchmark harness on PyPI (its distributions carry the task registry)",
        ),
        PresetEntry("pypi.org/simple/terminal-bench", "the same package's download index"),
    ),
)

NO_PRESET = Preset(
    name="none",
    version=1,
    description="no built-in entries: only the spec's own block entries",
    entries=(),
)

PRESETS: Mapping[str, Preset] = {p.name: p for p in (TERMINAL_BENCH, NO_PRESET)}
PRESET_NAMES: tuple[str, ...] = tuple(PRESETS)


# -- the policy ----------------------------------------------------------------------------

POLICY_FORMAT = "maka-eval.egress-policy.v1"
MAX_POLICY_FILE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Verdict:
    """Whether a request may pass, and which rule decided."""

    blocked: bool
    rule: str | None
    """The entry that matched (or UNPARSEABLE / TOO_DEEP); None when allowed."""
    reason: str


def _preset(name: str) -> Preset:
    preset = PRESETS.get(name)
    if preset is None:
        raise PolicyError(
            f"unknown egress preset '{name}'",
            [Problem("preset", f"use one of: {', '.join(PRESET_NAMES)}")],
        )
    return preset


class EgressPolicy:
    """A preset plus spec entries, compiled for per-request checks."""

    def __init__(
        self,
        preset: str = "terminal-bench",
        block: Sequence[str] = (),
        allow: Sequence[str] | None = None,
    ) -> None:
        """`allow`: a task's `allowed_hosts` (network_mode = "allowlist"): only these
        hosts may be reached, and the blocklist still applies to them. None: no
        allowlist (every host the blocklist does not match)."""
        self._preset = _preset(preset)
        problems: list[Problem] = []
        spec_rules: list[Rule] = []
        for i, entry in enumerate(block):
            try:
                spec_rules.append(_parse_entry(entry, "spec entry, executor.config.egress.block"))
            except ValueError as exc:
                problems.append(Problem(f"block[{i}]", str(exc)))
        allowed: list[str] = []
        for i, entry in enumerate(allow or ()):
            try:
                allowed.append(allowed_host_entry(entry))
            except ValueError as exc:
                problems.append(Problem(f"allowed_hosts[{i}]", str(exc)))
        if problems:
            raise PolicyError("the egress policy has invalid entries:", problems)
        preset_rules = [
            _parse_entry(e.entry, f"preset {self._preset.name}: {e.why}")
            for e in self._preset.entries
        ]
        by_entry = {r.entry: r for r in sorted(spec_rules, key=lambda r: r.entry)}
        self.block: tuple[str, ...] = tuple(by_entry)
        """The spec's entries, canonical, without repeats, sorted."""
        self.rules: tuple[Rule, ...] = (*preset_rules, *by_entry.values())
        self._domains: dict[str, Rule] = {}
        self._subdomains: dict[str, Rule] = {}
        self._domain_paths: dict[str, list[Rule]] = {}
        self._subdomain_paths: dict[str, list[Rule]] = {}
        self._names: list[Rule] = []
        for rule in self.rules:
            if rule.kind == "name":
                self._names.append(rule)
            elif rule.kind == "host":
                table = self._subdomains if rule.subdomains_only else self._domains
                table.setdefault(rule.host, rule)
            else:
                paths = self._subdomain_paths if rule.subdomains_only else self._domain_paths
                paths.setdefault(rule.host, []).append(rule)
        self._allowlist = _Allowlist(allowed) if allow is not None else None
        self.allow: tuple[str, ...] | None = (
            self._allowlist.entries if self._allowlist is not None else None
        )
        """The allowed hosts, canonical, sorted; None when there is no allowlist."""
        document: dict[str, object] = {
            "format": POLICY_FORMAT,
            "preset": self._preset.name,
            "presetVersion": self._preset.version,
            "block": list(self.block),
        }
        if self.allow is not None:
            document["allow"] = list(self.allow)
        self._json = json.dumps(document, sort_keys=True, separators=(",", ":"))
        self.digest: str = hashlib.sha256(self._json.encode("utf-8")).hexdigest()
        """sha256 (hex) of the canonical JSON: preset name and version, spec entries,
        and the allowlist when there is one."""

    @property
    def preset(self) -> Preset:
        """The built-in preset this policy starts from."""
        return self._preset

    def __repr__(self) -> str:
        return (
            f"EgressPolicy(preset={self._preset.name!r}, block={list(self.block)!r}, "
            + (f"allow={list(self.allow)!r}, " if self.allow is not None else "")
            + f"digest={self.digest[:12]!r})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EgressPolicy) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    # -- serialization -----------------------------------------------------------------

    def to_json(self) -> str:
        """The canonical JSON the proxy is launched with (and the digest covers)."""
        return self._json

    @classmethod
    def from_json(cls, text: str, source: str = "policy") -> EgressPolicy:
        """The policy `to_json` wrote; raises PolicyError naming what is wrong."""
        try:
            data = strict_json.loads(text)
        except ValueError as exc:
            raise PolicyError(f"{source} is not JSON", [Problem(source, str(exc))]) from None
        expected = {"format", "preset", "presetVersion", "block"}
        if not isinstance(data, dict) or set(data) - {"allow"} != expected:
            found = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise PolicyError(
                f"{source} is not an egress policy",
                [Problem(source, f"expected the fields {sorted(expected)}, found {found}")],
            )
        if data["format"] != POLICY_FORMAT:
            raise PolicyError(
                f"{source} has another format",
                [Problem(f"{source}.format", f"is {data['format']!r}; expected {POLICY_FORMAT}")],
            )
        name, version, block = data["preset"], data["presetVersion"], data["block"]
        if not isinstance(name, str) or name not in PRESETS:
            raise PolicyError(
                f"{source} names an unknown preset",
                [Problem(f"{source}.preset", f"use one of: {', '.join(PRESET_NAMES)}")],
            )
        if version != PRESETS[name].version:
            raise PolicyError(
                f"{source} was written for another version of preset '{name}'",
                [
                    Problem(
                        f"{source}.presetVersion",
                        f"is {version!r}, this maka-eval has version {PRESETS[name].version}; "
                        "run the same maka-eval version in the operator and the proxy image",
                    )
                ],
            )
        if not isinstance(block, list) or not all(isinstance(e, str) for e in block):
            raise PolicyError(
                f"{source} is not an egress policy",
                [Problem(f"{source}.block", "must be a list of strings")],
            )
        allow = data.get("allow")
        if allow is not None and (
            not isinstance(allow, list) or not all(isinstance(e, str) for e in allow)
        ):
            raise PolicyError(
                f"{source} is not an egress policy",
                [Problem(f"{source}.allow", "must be a list of strings")],
            )
        try:
            return cls(name, block, allow)
        except PolicyError as exc:
            raise PolicyError(
                f"{source}: {exc.summary}",
                [Problem(f"{source}.{p.where}", p.message) for p in exc.problems],
            ) from None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> EgressPolicy:
        """Read a policy file (what the proxy process is launched with)."""
        try:
            with open(path, "rb") as file:
                raw = file.read(MAX_POLICY_FILE_BYTES + 1)
        except OSError as exc:
            raise PolicyError(
                f"cannot read the egress policy {os.fspath(path)!s}",
                [Problem(str(os.fspath(path)), exc.strerror or str(exc))],
            ) from None
        if len(raw) > MAX_POLICY_FILE_BYTES:
            raise PolicyError(
                f"{os.fspath(path)!s} is too large for an egress policy",
                [Problem(str(os.fspath(path)), f"at most {MAX_POLICY_FILE_BYTES} bytes")],
            )
        return cls.from_json(raw.decode("utf-8", "replace"), str(os.fspath(path)))

    # -- checks ------------------------------------------------------------------------

    def _host_rule(self, host: str) -> Rule | None:
        rule = self._domains.get(host)
        if rule is not None:
            return rule
        dot = host.find(".")
        while dot >= 0:
            suffix = host[dot + 1 :]
            rule = self._domains.get(suffix) or self._subdomains.get(suffix)
            if rule is not None:
                return rule
            dot = host.find(".", dot + 1)
        return None

    def _path_rule(self, host: str, target: str) -> Rule | None:
        rules = list(self._domain_paths.get(host, ()))
        dot = host.find(".")
        while dot >= 0:
            suffix = host[dot + 1 :]
            rules += self._domain_paths.get(suffix, ())
            rules += self._subdomain_paths.get(suffix, ())
            dot = host.find(".", dot + 1)
        for rule in rules:
            # A prefix ends at a segment boundary: /org/repo is /org/repo/x, /org/repo.git
            # and /org/repo@v1, not /org/repository.
            if target.startswith(rule.path) and (
                len(target) == len(rule.path) or target[len(rule.path)] in "/.?@"
            ):
                return rule
        return None

    def _name_in_host(self, host: str) -> Rule | None:
        hosts = (host, unicode_host(host)) if "xn--" in host else (host,)
        for rule in self._names:
            assert rule.pattern is not None
            if any(rule.pattern.search(h) for h in hosts):
                return rule
        return None

    def _site_match(self, url: NormalizedUrl) -> tuple[Rule, str] | None:
        """The host or host+path rule `url` matches, and where; or None."""
        rule = self._host_rule(url.host)
        if rule is not None:
            return rule, f"host {url.host}"
        if self._domain_paths or self._subdomain_paths:
            rule = self._path_rule(url.host, match_target(url))
            if rule is not None:
                return rule, f"host {url.host} with path {rule.path}"
        return None

    def _name_match(self, url: NormalizedUrl) -> tuple[Rule, str] | None:
        """The name rule (re:) `url` matches in its host, or else in its path; or None.
        The two are searched apart, so no match spans the host/path boundary."""
        rule = self._name_in_host(url.host)
        if rule is not None:
            return rule, f"host {url.host}"
        if self._names:
            target = match_target(url)
            for rule in self._names:
                assert rule.pattern is not None
                found = rule.pattern.search(target)
                if found:
                    return rule, f"path ('{found.group()}' in {_short(target)})"
        return None

    def check_url(self, url: str) -> Verdict:
        """Whether a request to `url` (or to any URL it wraps) is blocked; never raises."""
        try:
            return self._check_url(url)
        except Exception as exc:  # fail closed: a bug here must not open the proxy
            return Verdict(True, CHECK_FAILED, f"checking failed ({exc!r}); blocked")

    def _check_url(self, url: str) -> Verdict:
        unwrapped = unwrap_url(url)
        request = unwrapped.urls[0][0]
        if not request.parseable:
            return Verdict(
                True,
                UNPARSEABLE,
                f"{request.problem}; blocked because its destination cannot be checked",
            )
        # Sites first, over every URL, then names: the most specific rule is reported.
        for matcher in (self._site_match, self._name_match):
            for normal, depth in unwrapped.urls:
                found = matcher(normal)
                if found is not None:
                    rule, where = found
                    return Verdict(
                        True, rule.entry, f"{_via(normal, depth)}{where} matches ({rule.why})"
                    )
        if self._allowlist is not None and not self._allowlist.allows(request.host):
            return self._not_allowed(request.host)
        if unwrapped.truncated:
            return Verdict(
                True,
                TOO_DEEP,
                f"wraps URLs more than {MAX_WRAP_DEPTH} levels deep (or more than {MAX_URLS}); "
                "blocked because the innermost cannot be checked",
            )
        count = len(unwrapped.urls)
        inner = f" (nor the {count - 1} URL(s) it wraps)" if count > 1 else ""
        return Verdict(False, None, f"no rule matches{inner}")

    def check_host(self, host: str, port: int) -> Verdict:
        """Whether a tunnel (CONNECT) to host:port is blocked; host-level rules only,
        the path rules apply to the requests inside the tunnel. Never raises."""
        try:
            return self._check_host(host, port)
        except Exception as exc:  # fail closed, as check_url
            return Verdict(True, CHECK_FAILED, f"checking failed ({exc!r}); blocked")

    def _check_host(self, host: str, port: int) -> Verdict:
        if not 0 < port <= 65535:
            return Verdict(True, UNPARSEABLE, f"port {port} is out of range; blocked")
        raw = f"[{host}]" if ":" in host and not host.startswith("[") else host
        canonical = canonical_host(raw)
        if canonical is None:
            return Verdict(True, UNPARSEABLE, f"'{_short(host)}' is not a host name; blocked")
        hosts = [canonical]
        translated = _translated_host(canonical)
        if translated:
            inner = canonical_host(translated)
            hosts.append(inner or translated)
        for name in hosts:
            rule = self._host_rule(name) or self._name_in_host(name)
            if rule is not None:
                return Verdict(True, rule.entry, f"host {name} matches ({rule.why})")
        if self._allowlist is not None and not self._allowlist.allows(canonical):
            return self._not_allowed(canonical)
        return Verdict(False, None, "no host rule matches")

    def _not_allowed(self, host: str) -> Verdict:
        return Verdict(
            True,
            NOT_ALLOWED,
            f"host {host} is not in the task's allowed_hosts (task.toml network_mode = "
            "'allowlist')",
        )


def _via(url: NormalizedUrl, depth: int) -> str:
    return "" if depth == 0 else f"wrapped URL {_short(url.text)}: "


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
