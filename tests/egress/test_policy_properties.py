"""Properties of the blocklist over generated input: the normalizer never crashes and is
idempotent, any nesting of wrappers around a blocked URL stays blocked, and URLs on
unrelated hosts pass."""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from urllib.parse import quote

from hypothesis import given, settings
from hypothesis import strategies as st

from maka_eval.egress.policy import CHECK_FAILED, UNPARSEABLE, EgressPolicy, normalize_url

POLICY = EgressPolicy("terminal-bench", ["answers.example.net", "code.example.org/leaks"])
# 300 examples keep the suite fast; EGRESS_EXAMPLES=5000 searches harder (a minute or two).
FAST = settings(max_examples=int(os.environ.get("EGRESS_EXAMPLES", "300")), deadline=None)

# -- generated URLs ------------------------------------------------------------------------

_LABEL_CHARS = "acdefgijklmnopqrsuvwxyz0123456789"  # no 'b' or 'h': never a benchmark name
_SEGMENT_TOKENS = st.sampled_from(
    [
        *"acdefgijklmnopqrsuvwxyzACDEFGIJKLMNOPQRSUVWXYZ0123456789-._~!$&'()*+,;=:@ ",
        *("%41", "%2f", "%2E", "%25", "%zz", "%", "é", "ü", "\u4e2d", "..", "."),
    ]
)


def _tokens(max_size: int) -> st.SearchStrategy[str]:
    return st.lists(_SEGMENT_TOKENS, max_size=max_size).map("".join)


label = st.text(alphabet=_LABEL_CHARS, min_size=1, max_size=12).map(lambda s: s.strip("-") or "x")
hosts = st.builds(
    lambda labels, tld, upper, dot: (
        (".".join([*labels, tld]).upper() if upper else ".".join([*labels, tld]))
        + ("." if dot else "")
    ),
    st.lists(label, min_size=1, max_size=3),
    st.sampled_from(["com", "org", "io", "dev", "net"]),
    st.booleans(),
    st.booleans(),
)
segments = st.lists(_tokens(6), max_size=5)
queries = st.lists(st.tuples(_tokens(4), _tokens(6)), max_size=3)


@st.composite
def urls(draw: st.DrawFn, host: st.SearchStrategy[str] = hosts) -> str:
    scheme = draw(st.sampled_from(["http", "https", "HTTPS", "ws"]))
    userinfo = draw(st.sampled_from(["", "user@", "u:p@"]))
    port = draw(st.sampled_from(["", ":80", ":443", ":8080"]))
    slashes = draw(st.sampled_from(["/", "//"]))
    path = slashes.join(draw(segments))
    query = "&".join(f"{k}={v}" for k, v in draw(queries))
    return f"{scheme}://{userinfo}{draw(host)}{port}/{path}" + (f"?{query}" if query else "")


# -- the normalizer ------------------------------------------------------------------------


@FAST
@given(st.text())
def test_normalizing_any_text_never_raises_and_is_idempotent(text):
    once = normalize_url(text)
    assert normalize_url(once.text) == once
    verdict = POLICY.check_url(text)
    assert verdict.rule != CHECK_FAILED, verdict  # the safety net never catches a bug
    if not once.parseable:
        assert verdict.blocked and verdict.rule == UNPARSEABLE


@FAST
@given(urls())
def test_normalizing_urls_is_idempotent(url):
    once = normalize_url(url)
    assert once.parseable, (url, once.problem)
    assert normalize_url(once.text) == once
    assert once.text == once.text.strip() and "#" not in once.text
    assert "//" not in once.text.split("://", 1)[1]


@FAST
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=80), st.integers(-5, 70000))
def test_check_host_never_raises(host, port):
    verdict = POLICY.check_host(host, port)
    assert verdict.blocked == (verdict.rule is not None)
    assert verdict.rule != CHECK_FAILED, verdict


# -- wrapped forms of a blocked URL --------------------------------------------------------

BLOCKED = [
    "https://tbench.ai/leaderboard/terminal-bench/2.0",
    "https://github.com/harbor-framework/harbor/blob/main/registry.json",
    "https://raw.githubusercontent.com/laude-institute/terminal-bench/main/tasks/x/solution.sh",
    "https://huggingface.co/datasets/harborframework/terminal-bench/resolve/main/x.json",
    "https://answers.example.net/q/1",
    "https://code.example.org/leaks/task-7.patch",
]


def _schemeless(url: str) -> str:
    return url.split("://", 1)[1]


def _b64(url: str) -> str:
    return base64.urlsafe_b64encode(url.encode()).decode()


Wrapper = Callable[[str], str]
WRAPPERS: list[tuple[str, Wrapper]] = [
    ("wayback", lambda u: f"https://web.archive.org/web/20240101000000/{u}"),
    ("wayback-bare", lambda u: f"https://web.archive.org/web/2024id_/{_schemeless(u)}"),
    ("archive.ph", lambda u: f"https://archive.ph/newest/{u}"),
    ("archive.is-bare", lambda u: f"http://archive.is/2024.01.01-000000/{_schemeless(u)}"),
    ("webcache", lambda u: f"https://webcache.googleusercontent.com/search?q=cache:{u}"),
    ("jina", lambda u: f"https://r.jina.ai/{u}"),
    ("12ft", lambda u: f"https://12ft.io/{u}"),
    ("google", lambda u: f"https://www.google.com/url?sa=t&q={quote(u, safe='')}&usg=x"),
    ("facebook", lambda u: f"https://l.facebook.com/l.php?u={quote(quote(u, safe=''), safe='')}"),
    ("generic-param", lambda u: f"https://out.example.com/redirect?target={u}"),
    ("base64-param", lambda u: f"https://click.example.com/c?u={_b64(u)}"),
    ("encoded-path", lambda u: f"https://proxy.example.com/fetch/{quote(u, safe='')}"),
]


@FAST
@given(
    st.sampled_from(BLOCKED),
    st.lists(st.sampled_from(WRAPPERS), min_size=1, max_size=4),
    st.booleans(),
)
def test_any_nesting_of_wrappers_around_a_blocked_url_is_blocked(target, wrappers, upper):
    assert POLICY.check_url(target).blocked
    url = target
    if upper:  # the host's case does not matter either
        scheme, rest = url.split("://", 1)
        host, _, path = rest.partition("/")
        url = f"{scheme.upper()}://{host.upper()}/{path}"
    for _, wrap in wrappers:
        url = wrap(url)
    verdict = POLICY.check_url(url)
    assert verdict.blocked, ([name for name, _ in wrappers], url, verdict)


# -- unrelated URLs ------------------------------------------------------------------------


@FAST
@given(urls())
def test_urls_on_unrelated_hosts_are_allowed(url):
    verdict = POLICY.check_url(url)
    assert not verdict.blocked, (url, verdict)


@FAST
@given(urls(), st.sampled_from(WRAPPERS))
def test_wrapping_an_unrelated_url_blocks_nothing(url, wrapper):
    name, wrap = wrapper
    verdict = POLICY.check_url(wrap(url))
    assert not verdict.blocked, (name, wrap(url), verdict)
