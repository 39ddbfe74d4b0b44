"""The contamination blocklist: normalization, unwrapping, rules, presets, the digest."""

from __future__ import annotations

import base64
import hashlib
import json
import timeit
from urllib.parse import quote

import pytest

from maka_eval.egress import policy as policy_module
from maka_eval.egress.policy import (
    CHECK_FAILED,
    NOT_ALLOWED,
    PRESETS,
    TERMINAL_BENCH,
    TOO_DEEP,
    UNPARSEABLE,
    EgressPolicy,
    PolicyError,
    canonical_entry,
    entry_problem,
    normalize_url,
    unwrap_url,
)

POLICY = EgressPolicy("terminal-bench")


def blocked_by(url: str, policy: EgressPolicy = POLICY) -> str | None:
    verdict = policy.check_url(url)
    assert verdict.blocked == (verdict.rule is not None), verdict
    return verdict.rule


# -- normalization -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "normal"),
    [
        # scheme and host case, default ports
        ("HTTPS://Example.COM/Path", "https://example.com/Path"),
        ("http://example.com:80/", "http://example.com/"),
        ("https://example.com:443/a", "https://example.com/a"),
        ("https://example.com:8443/a", "https://example.com:8443/a"),
        ("http://example.com:443/", "http://example.com:443/"),
        ("https://example.com", "https://example.com/"),
        # trailing dots, empty labels, userinfo
        ("https://example.com./a", "https://example.com/a"),
        ("https://example.com../a", "https://example.com/a"),
        ("https://user:secret@example.com/a", "https://example.com/a"),
        ("https://a@b@example.com/a", "https://example.com/a"),
        # percent-encoding: unreserved decoded, other escapes upper case, bare '%' escaped
        ("https://example.com/%7euser/%41%2f%2F", "https://example.com/~user/A%2F%2F"),
        ("https://example.com/a b/ü", "https://example.com/a%20b/%C3%BC"),
        ("https://example.com/100%", "https://example.com/100%25"),
        ("https://example.com/?q=%7e%zz", "https://example.com/?q=~%25zz"),
        ("https://%65xample.com/", "https://example.com/"),
        # dot segments (encoded ones too) and repeated slashes
        ("https://example.com/a/./b/../c", "https://example.com/a/c"),
        ("https://example.com/a/%2E%2e/b", "https://example.com/b"),
        ("https://example.com/../../a", "https://example.com/a"),
        ("https://example.com//a///b//", "https://example.com/a/b/"),
        ("https://example.com/a/..", "https://example.com/"),
        ("https:\\\\example.com\\a\\b", "https://example.com/a/b"),
        # IDNA: Unicode and punycode spellings compare equal; full-width dots and letters
        ("https://Bücher.example/", "https://xn--bcher-kva.example/"),
        ("https://xn--bcher-kva.example/", "https://xn--bcher-kva.example/"),
        ("https://XN--BCHER-KVA.example/", "https://xn--bcher-kva.example/"),
        ("https://\uff45\uff58ample\u3002com/", "https://example.com/"),  # full-width
        # fragments never reach the server; a missing scheme means http
        ("https://example.com/a#frag", "https://example.com/a"),
        ("example.com/a", "http://example.com/a"),
        ("//example.com/a", "http://example.com/a"),
        ("localhost:8080/x", "http://localhost:8080/x"),
        ("  https://example.com/\n", "https://example.com/"),
        ("https:example.com", "https://example.com/"),
        ("https%3A%2F%2Fexample.com%2Fa", "https://example.com/a"),
        # IPv6
        ("http://[0:0::1]:80/", "http://[::1]/"),
        ("git://example.com/repo", "git://example.com/repo"),
    ],
)
def test_normalization(url, normal):
    result = normalize_url(url)
    assert result.parseable, result
    assert result.text == normal
    assert normalize_url(result.text).text == normal


@pytest.mark.parametrize(
    "url",
    [
        "",
        "not a url",
        "mailto:someone@example.com",
        "https://exa mple.com/",
        "https://example.com:99999/",
        "https://example.com:http/",
        "https://[::1/",
        "https://[nope]/",
        "https:///",
        "https://@/",
    ],
)
def test_unparseable_urls_are_blocked_and_say_why(url):
    result = normalize_url(url)
    assert not result.parseable and result.problem
    assert normalize_url(result.text) == result  # stable too
    verdict = POLICY.check_url(url)
    assert verdict.blocked and verdict.rule == UNPARSEABLE
    assert "cannot be checked" in verdict.reason
    # ... with preset none too: an unparseable destination is never let through.
    assert EgressPolicy("none").check_url(url).blocked


# -- unwrapping ----------------------------------------------------------------------------

TARGET = "https://github.com/harbor-framework/harbor/blob/main/registry.json"
"""A blocked URL whose text names no benchmark: only unwrapping can find it."""


@pytest.mark.parametrize(
    "wrapped",
    [
        # archive and cache mirrors
        f"https://web.archive.org/web/20240101000000/{TARGET}",
        f"https://web.archive.org/web/2024id_/{TARGET}",
        "https://web.archive.org/web/20240101000000/github.com/harbor-framework/harbor",
        f"https://archive.ph/newest/{TARGET}",
        "https://archive.today/2024.01.01/github.com/harbor-framework/harbor",
        "https://archive.is/o/AbCdE/github.com/harbor-framework/harbor",
        "https://webcache.googleusercontent.com/search?q=cache:github.com/harbor-framework/h",
        f"https://webcache.googleusercontent.com/search?q=cache:AbCdEfGh1234:{TARGET}",
        f"https://cachedview.nl/{TARGET}",
        # redirectors: any query value that is a URL
        f"https://www.google.com/url?q={quote(TARGET, safe='')}&sa=D",
        f"https://l.facebook.com/l.php?u={quote(TARGET, safe='')}&h=AT0",
        f"https://example.com/redirect?{TARGET}",
        "https://example.com/go?to=//github.com/harbor-framework/harbor",
        "https://example.com/go?url=www.github.com/harbor-framework/harbor",
        # reader proxies that prefix the URL
        f"https://r.jina.ai/{TARGET}",
        f"https://12ft.io/{TARGET}",
        f"https://12ft.io/proxy?q={TARGET}",
        "https://12ft.io/github.com/harbor-framework/harbor",
        # encoded: percent, double percent, base64
        f"https://example.com/?u={quote(quote(TARGET, safe=''), safe='')}",
        f"https://example.com/r/{quote(TARGET, safe='')}",
        f"https://example.com/?u={base64.urlsafe_b64encode(TARGET.encode()).decode()}",
        f"https://example.com/ck?u=a1{base64.b64encode(TARGET.encode()).decode()}",
        # translation proxies: the host itself is the wrapped one
        "https://github-com.translate.goog/harbor-framework/harbor?_x_tr_sl=auto",
        # nested
        f"https://web.archive.org/web/2024/https://r.jina.ai/{TARGET}",
        "https://www.google.com/url?q="
        + quote(f"https://web.archive.org/web/2024/{TARGET}", safe=""),
    ],
)
def test_wrapped_forms_of_a_blocked_url_are_blocked(wrapped):
    verdict = POLICY.check_url(wrapped)
    assert verdict.blocked, verdict
    assert verdict.rule == "github.com/harbor-framework", verdict
    assert "wrapped URL" in verdict.reason


def test_unwrap_lists_every_level_outermost_first():
    nested = f"https://www.google.com/url?q={quote(f'https://r.jina.ai/{TARGET}', safe='')}"
    found = unwrap_url(nested)
    assert [depth for _, depth in found.urls] == [0, 1, 2]
    assert found.urls[-1][0].text == TARGET
    assert not found.truncated


def test_opaque_shorteners_and_plain_urls_wrap_nothing():
    for url in ("https://t.co/AbCdEf", "https://pypi.org/simple/requests/?a=b"):
        assert len(unwrap_url(url).urls) == 1
        assert not POLICY.check_url(url).blocked


def test_nesting_deeper_than_the_bound_is_blocked():
    url = "https://example.org/"
    for _ in range(12):
        url = f"https://redirect.example/?u={quote(url, safe='')}"
    verdict = POLICY.check_url(url)
    assert verdict.blocked and verdict.rule == TOO_DEEP, verdict
    shallow = "https://redirect.example/?u=" + quote("https://example.org/", safe="")
    assert not POLICY.check_url(shallow).blocked


# -- host and path are searched apart -----------------------------------------------------


def test_a_benchmark_name_in_the_host_alone_is_blocked():
    assert blocked_by("https://terminal-bench.example.org/") == r"re:terminal[-_. +]?bench(?!mark)"
    assert blocked_by("https://mirror.terminalbench.dev/x") is not None
    assert blocked_by("https://tbench-mirror.example/") == r"re:(?<![a-z0-9])t-?bench(?!mark)"


def test_a_benchmark_name_in_the_path_alone_is_blocked():
    for url in (
        "https://example.com/terminal-bench/tasks",
        "https://example.com/%74erminal_bench",
        "https://example.com/a%252F..%252Fterminal%2Bbench",
        "https://huggingface.co/datasets/someone/T1-Terminal-Bench-2.1-Trajectories",
        "https://files.pythonhosted.org/packages/ab/cd/terminal_bench-0.2.1.tar.gz",
        "https://github.com/someone/t-bench",
        "https://www.google.com/search?q=terminal+bench+solutions",
    ):
        assert blocked_by(url) is not None, url


def test_no_match_spans_the_host_path_boundary():
    assert blocked_by("https://terminal.example.org/-bench/x") is None
    assert blocked_by("https://example.terminal/-bench") is None
    # A spec regex that would match the joined text matches neither field.
    policy = EgressPolicy("none", ["re:terminal/?-bench"])
    assert blocked_by("https://terminal/-bench", policy) is None
    assert blocked_by("https://x.org/terminal-bench", policy) == "re:terminal/?-bench"
    assert blocked_by("https://terminal-bench.org/", policy) == "re:terminal/?-bench"


def test_names_that_only_look_alike_are_allowed():
    for url in (
        "https://example.com/testbench/benchmark",
        "https://stackoverflow.com/questions/1/terminal-benchmark-tools",
        "https://github.com/psf/requests",
        "https://github.com/harbor-frameworks/x",
        "https://pypi.org/project/terminal-benchmark-kit/",
        "https://huggingface.co/datasets/harborframeworks/x",
    ):
        assert blocked_by(url) is None, url


# -- the terminal-bench preset -------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("https://tbench.ai/leaderboard", "tbench.ai"),
        ("https://www.tbench.ai/registry/terminal-bench-core/0.1.1", "tbench.ai"),
        ("https://harborframework.com/registry", "harborframework.com"),
        ("https://hub.harborframework.com/jobs/1", "harborframework.com"),
        ("https://github.com/laude-institute/terminal-bench", "github.com/laude-institute"),
        ("https://github.com/Laude-Institute/terminal-bench.git", "github.com/laude-institute"),
        ("https://github.com/harbor-framework/harbor", "github.com/harbor-framework"),
        (
            "https://raw.githubusercontent.com/laude-institute/terminal-bench/abc123/tasks/x",
            "raw.githubusercontent.com/laude-institute",
        ),
        (
            "https://codeload.github.com/harbor-framework/terminal-bench-2/zip/refs/heads/main",
            "codeload.github.com/harbor-framework",
        ),
        (
            "https://api.github.com/repos/harbor-framework/harbor/tarball/v1",
            "api.github.com/repos/harbor-framework",
        ),
        (
            "https://patch-diff.githubusercontent.com/raw/harbor-framework/harbor/pull/1.patch",
            "patch-diff.githubusercontent.com/raw/harbor-framework",
        ),
        (
            "https://gist.githubusercontent.com/laude-institute/abc/raw/x.patch",
            "gist.githubusercontent.com/laude-institute",
        ),
        (
            "https://cdn.jsdelivr.net/gh/harbor-framework/harbor@main/registry.json",
            "cdn.jsdelivr.net/gh/harbor-framework",
        ),
        (
            "https://huggingface.co/datasets/harborframework/terminal-bench/resolve/main/x",
            "huggingface.co/datasets/harborframework",
        ),
        ("https://hf.co/datasets/harborframework/x", "hf.co/datasets/harborframework"),
        ("https://pypi.org/project/terminal-bench/", "pypi.org/project/terminal-bench"),
        ("https://pypi.org/simple/terminal-bench/", "pypi.org/simple/terminal-bench"),
    ],
)
def test_the_preset_blocks_terminal_bench_surfaces(url, rule):
    verdict = POLICY.check_url(url)
    assert verdict.blocked and verdict.rule == rule, verdict
    assert "preset terminal-bench:" in verdict.reason


def test_every_preset_entry_is_documented_and_valid():
    for preset in PRESETS.values():
        entries = [e.entry for e in preset.entries]
        assert len(entries) == len(set(entries)), preset.name
        for entry in preset.entries:
            assert entry_problem(entry.entry) is None, entry
            assert canonical_entry(entry.entry) == entry.entry, entry  # written canonically
            assert len(entry.why) > 20, entry
    assert PRESETS["none"].entries == ()


def test_preset_none_blocks_only_spec_entries():
    policy = EgressPolicy("none", ["answers.example.com"])
    assert not policy.check_url("https://tbench.ai/").blocked
    assert policy.check_url("https://answers.example.com/q/1").blocked
    with pytest.raises(PolicyError, match="unknown egress preset"):
        EgressPolicy("swe-bench")


# -- spec entries --------------------------------------------------------------------------


def test_host_entries_cover_subdomains_and_wildcards_only_subdomains():
    policy = EgressPolicy("none", ["example.com", "*.answers.org"])
    assert policy.check_url("https://example.com/").blocked
    assert policy.check_url("https://a.b.example.com/").blocked
    assert not policy.check_url("https://notexample.com/").blocked
    assert not policy.check_url("https://example.com.evil.org/").blocked
    assert policy.check_url("https://www.answers.org/").blocked
    assert not policy.check_url("https://answers.org/").blocked


def test_path_entries_match_at_segment_boundaries_case_insensitively():
    policy = EgressPolicy("none", ["github.com/Org/Repo"])
    for url in (
        "https://github.com/org/repo",
        "https://github.com/ORG/REPO/blob/main/x",
        "https://github.com/org/repo.git",
        "https://github.com/org/repo?tab=readme",
        "https://www.github.com/org/repo",
        "https://github.com/org%2Frepo",
        "https://github.com/x/../org/repo",
    ):
        assert policy.check_url(url).blocked, url
    for url in (
        "https://github.com/org/repository",
        "https://github.com/org",
        "https://x.com/org/repo",
    ):
        assert not policy.check_url(url).blocked, url


def test_host_rules_apply_to_tunnels_and_path_rules_do_not():
    policy = EgressPolicy("terminal-bench", ["answers.example.com"])
    assert policy.check_host("tbench.ai", 443).blocked
    assert policy.check_host("TBENCH.AI.", 443).blocked
    assert policy.check_host("terminal-bench.example.org", 443).blocked
    assert policy.check_host("answers.example.com", 8443).blocked
    assert policy.check_host("tbench-ai.translate.goog", 443).blocked
    assert not policy.check_host("github.com", 443).blocked  # only some paths are
    assert not policy.check_host("::1", 443).blocked
    assert policy.check_host("github.com", 0).blocked
    assert policy.check_host("bad host", 443).rule == UNPARSEABLE


@pytest.mark.parametrize(
    ("entry", "fix"),
    [
        ("", "must not be empty"),
        (" example.com", "spaces around it"),
        ("https://example.com/x", "write it without one ('example.com/x')"),
        ("example.com:443", "has a port"),
        ("exa mple.com", "contains a space"),
        ("ex*ample.com", "only a leading '*.'"),
        ("example.com/a?b=c", "query or fragment"),
        ("user@example.com", "user name"),
        ("github.com/org/..", "'.' or '..' segments"),
        ("exa%mple.com", "is not a host name"),
        ("re:(", "not a valid regular expression"),
        ("re:", "matches the empty text"),
        ("re:x?", "matches the empty text"),
        ("a\0b", "NUL byte"),
        ("x" * 2000, "at most 1024"),
    ],
)
def test_bad_entries_are_refused_with_the_fix(entry, fix):
    problem = entry_problem(entry)
    assert problem is not None and fix in problem, problem
    with pytest.raises(PolicyError) as info:
        EgressPolicy("none", ["ok.example", entry])
    assert info.value.problems[0].where == "block[1]"


def test_entries_are_canonical():
    assert canonical_entry("Example.COM.") == "example.com"
    assert canonical_entry("*.Bücher.example") == "*.xn--bcher-kva.example"
    assert canonical_entry("GitHub.com/Org/Repo/") == "github.com/org/repo"
    assert canonical_entry("github.com//org/%72epo") == "github.com/org/repo"
    assert canonical_entry("re:Foo") == "re:Foo"


# -- the digest and the policy file --------------------------------------------------------


def test_the_digest_names_preset_version_and_entries():
    a = EgressPolicy("terminal-bench", ["b.example", "Example.com", "a.example/x"])
    b = EgressPolicy("terminal-bench", ["a.example/x", "example.com", "b.example", "b.example"])
    assert a.digest == b.digest and a == b and len(a.digest) == 64
    assert a.block == ("a.example/x", "b.example", "example.com")
    assert EgressPolicy("none", a.block).digest != a.digest
    assert EgressPolicy("terminal-bench", ["c.example"]).digest != a.digest
    # Stable across processes and releases: the canonical JSON is fixed text.
    assert json.loads(a.to_json()) == {
        "format": "maka-eval.egress-policy.v1",
        "preset": "terminal-bench",
        "presetVersion": TERMINAL_BENCH.version,
        "block": ["a.example/x", "b.example", "example.com"],
    }
    assert EgressPolicy().digest == (
        "dad7bc87bcd69cab6279042b06eb1782e961ccc9ad002ab71c3d748b8440ed3f"
    ), "the canonical JSON changed: that changes every recorded digest"


def test_the_preset_version_changes_with_its_entries():
    # The digest names the preset by version, so different entries need a new version.
    fingerprint = json.dumps([e.entry for e in TERMINAL_BENCH.entries])
    assert (TERMINAL_BENCH.version, hashlib.sha256(fingerprint.encode()).hexdigest()[:16]) == (
        1,
        "ed51542cc3cf8347",
    ), "the terminal-bench preset's entries changed: bump its version, update this fingerprint"


def test_a_policy_file_round_trips(tmp_path):
    policy = EgressPolicy("terminal-bench", ["answers.example.com", "re:leak"])
    path = tmp_path / "policy.json"
    path.write_text(policy.to_json())
    loaded = EgressPolicy.from_file(path)
    assert loaded == policy and loaded.to_json() == policy.to_json()
    assert loaded.check_url("https://answers.example.com/").blocked


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "is not JSON"),
        ("[]", "is not an egress policy"),
        ('{"format": "x", "preset": "none", "presetVersion": 1, "block": []}', "another format"),
        (
            '{"format": "maka-eval.egress-policy.v1", "preset": "nope", "presetVersion": 1, '
            '"block": []}',
            "unknown preset",
        ),
        (
            '{"format": "maka-eval.egress-policy.v1", "preset": "terminal-bench", '
            '"presetVersion": 99, "block": []}',
            "another version of preset",
        ),
        (
            '{"format": "maka-eval.egress-policy.v1", "preset": "none", "presetVersion": 1, '
            '"block": ["re:("]}',
            "invalid entries",
        ),
    ],
)
def test_a_bad_policy_file_is_refused(tmp_path, text, message):
    path = tmp_path / "policy.json"
    path.write_text(text)
    with pytest.raises(PolicyError, match=message) as info:
        EgressPolicy.from_file(path)
    assert str(path) in info.value.render()


def test_a_missing_policy_file_names_the_path(tmp_path):
    with pytest.raises(PolicyError, match="cannot read the egress policy"):
        EgressPolicy.from_file(tmp_path / "absent.json")


def test_check_url_takes_microseconds():
    url = "https://github.com/psf/requests/archive/refs/tags/v2.31.0.tar.gz"
    runs = 2000
    per_call = min(timeit.repeat(lambda: POLICY.check_url(url), number=runs, repeat=3)) / runs
    assert per_call < 1e-3, f"{per_call * 1e6:.0f} us per check"  # generous for slow CI


def test_a_failing_check_blocks_instead_of_raising(monkeypatch):
    def broken(url: str) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(policy_module, "unwrap_url", broken)
    monkeypatch.setattr(policy_module, "canonical_host", broken)
    for verdict in (POLICY.check_url("https://example.org/"), POLICY.check_host("x.org", 443)):
        assert verdict.blocked and verdict.rule == CHECK_FAILED
        assert "RuntimeError('bug')" in verdict.reason


# -- a task's allowlist (task.toml network_mode = "allowlist") ------------------------------

ALLOWLIST = EgressPolicy(
    "none", (), ["pypi.org", "*.pythonhosted.org", "192.0.2.7", "10.0.0.0/8", "2001:db8::/32"]
)


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://pypi.org/simple/requests/", True),
        ("HTTPS://PyPI.org.:443/simple", True),  # normalized first
        ("https://files.pythonhosted.org/packages/x.whl", True),
        ("https://pythonhosted.org/", False),  # '*.' is subdomains only, as in Harbor
        ("https://www.pypi.org/", False),  # a plain name is that host only
        ("https://pypi.org.evil.example/", False),
        ("https://evil.example/pypi.org", False),
        ("http://192.0.2.7:8080/x", True),
        ("http://192.0.2.8/", False),
        ("http://10.200.3.4/", True),
        ("http://[2001:db8::1]/", True),
        ("http://[2001:db9::1]/", False),
        # Other spellings of an allowed address are not that address here: refused.
        ("http://0xc0.0.2.7/", False),
        ("http://3221225991/", False),
        ("http://192.0.2.7.nip.io/", False),
        ("https://web.archive.org/web/2020/https://pypi.org/", False),
    ],
)
def test_an_allowlist_lets_through_its_hosts_only(url, allowed):
    verdict = ALLOWLIST.check_url(url)
    assert verdict.blocked is not allowed, verdict
    if not allowed:
        assert verdict.rule == NOT_ALLOWED and "allowed_hosts" in verdict.reason


def test_an_allowlist_checks_tunnels_by_host():
    assert not ALLOWLIST.check_host("files.pythonhosted.org", 443).blocked
    assert not ALLOWLIST.check_host("10.1.1.1", 22).blocked
    verdict = ALLOWLIST.check_host("github.com", 443)
    assert verdict.blocked and verdict.rule == NOT_ALLOWED


def test_the_blocklist_still_applies_to_allowed_hosts():
    policy = EgressPolicy("terminal-bench", ("github.com/org/answers",), ["github.com"])
    assert not policy.check_url("https://github.com/psf/requests").blocked
    assert (
        blocked_by("https://github.com/org/answers/raw/main/x", policy) == "github.com/org/answers"
    )
    assert blocked_by("https://github.com/laude-institute/terminal-bench", policy) not in (
        None,
        NOT_ALLOWED,
    )


def test_an_allowlist_is_part_of_the_digest_and_survives_the_proxys_json():
    plain = EgressPolicy("none")
    assert plain.allow is None and "allow" not in plain.to_json()
    # A policy without an allowlist keeps the digest it always had; an empty allowlist
    # (nothing reachable) is not the same policy as none.
    assert EgressPolicy("none", (), []).digest != plain.digest
    assert EgressPolicy("none", (), []).check_url("https://pypi.org/").blocked
    again = EgressPolicy.from_json(ALLOWLIST.to_json())
    assert again == ALLOWLIST and again.allow == ALLOWLIST.allow
    reordered = EgressPolicy("none", (), list(reversed(ALLOWLIST.allow or ())))
    assert reordered.digest == ALLOWLIST.digest
    with pytest.raises(PolicyError, match=r"allow"):
        EgressPolicy.from_json(ALLOWLIST.to_json().replace('"allow":[', '"allow":[1,'))


def test_bad_allowlist_entries_are_named_with_the_fix():
    with pytest.raises(PolicyError) as info:
        EgressPolicy("none", (), ["pypi.org", "pypi.org:443", "*.10.0.0.1", "10.0.0.1/8"])
    where = [p.where for p in info.value.problems]
    assert where == ["allowed_hosts[1]", "allowed_hosts[2]", "allowed_hosts[3]"]
