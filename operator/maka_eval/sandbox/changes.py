"""What a subject changed in its container that the verifier's start-up depends on.

The subject is root in its container and may replace any file of the image. The verifier
runs after it, in that same root file system: its own shell and tools come from the
toolbox (`sandbox.toolbox`), but test.sh still runs the image's interpreters (python3,
perl, pytest, ...), which load the image's libraries through the image's loader. So the
container sandbox asks the engine for the container's changes against its image (every
path of the container's writable layer: a file written, even back to the same bytes,
stays listed) and this module says which of them the verifier's start-up depends on:

- a command on PATH changed or removed, or a new one that shadows an image command
  further down PATH (`/usr/local/bin/python3` over `/usr/bin/python3`); a link that PATH
  or the library folders go through (`/bin -> usr/bin`); test.sh's own interpreter;
- the dynamic loader, a shared library changed or removed in a library folder, a new
  one under an image library's name, `/etc/ld.so.preload`, and an `/etc/ld.so.cache`
  that sends an image library's name to another file;
- Python's start-up: `sitecustomize`/`usercustomize`, `.pth` and `._pth` files,
  `pyvenv.cfg` beside a PATH folder; its standard library changed, or a module added on
  top of it that shadows an installed one (or a compiled one beside the sources); the
  test runner (pytest and its plugins: a new `pytest11` entry point, configuration in
  `/`, the only folder above `/tests`);
- what the verifier's own tools read (`/etc/nsswitch.conf`, glibc's `gconv`), the
  configuration of the tools test.sh fetches its own dependencies with (pip, uv, npm,
  git, wget), the trusted certificates, and Perl's library.

Changes inside the subject's working folders are its work, not listed. Files that Python
compiles (`__pycache__`) are listed, never critical: the verifier's Python reads its
compiled files from a private folder (PYTHONPYCACHEPREFIX). Pure functions over data:
`wanted` names the files whose content a rule needs, `assess` applies the rules.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from maka_eval.sandbox.ldcache import CacheError, read_cache


class Kind(IntEnum):
    """The engine's change kinds (Docker's and Podman's `/containers/{id}/changes`)."""

    CHANGED = 0
    ADDED = 1
    DELETED = 2

    @property
    def letter(self) -> str:
        return "CAD"[self.value]

    @property
    def verb(self) -> str:
        return ("changed", "added", "deleted")[self.value]


@dataclass(frozen=True, order=True)
class Change:
    path: str
    kind: Kind


@dataclass(frozen=True)
class ImageFacts:
    """What the image held, read from a container of it before any subject ran."""

    path_dirs: tuple[str, ...] = ()
    """The container's PATH, in order, each folder resolved (links followed)."""
    commands: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Resolved PATH folder -> the names in it."""
    links: frozenset[str] = frozenset()
    """Links the PATH and library folders go through (`/bin`, `/lib64`, a PATH entry)."""
    site_modules: frozenset[str] = frozenset()
    """Top-level module names in the Python site folders (site-packages, dist-packages)."""
    libraries: Mapping[str, frozenset[str]] | None = field(default_factory=dict)
    """The image's /etc/ld.so.cache: library name -> paths (None: it could not be read,
    so any change of the container's counts)."""


@dataclass(frozen=True)
class Finding:
    change: Change
    why: str

    def describe(self) -> str:
        return f"{self.change.kind.verb} {self.change.path} ({self.why})"


LD_CACHE = "/etc/ld.so.cache"
ENTRY_POINTS = "entry_points.txt"
SITE_FOLDERS = frozenset({"site-packages", "dist-packages"})
PYTEST_PACKAGES = frozenset({"pytest", "_pytest", "pluggy", "iniconfig", "py"})
PYTEST_ROOT_FILES = frozenset(
    {
        "conftest.py",
        "pytest.ini",
        ".pytest.ini",
        "pytest.toml",
        ".pytest.toml",
        "pyproject.toml",
        "tox.ini",
        "setup.cfg",
    }
)
"""pytest looks for these in every folder above the tests: for /tests, that is `/`."""
TOOL_CONFIGS = frozenset(
    {
        "/etc/pip.conf",
        "/etc/xdg/pip/pip.conf",
        "/usr/pip.conf",
        "/usr/local/pip.conf",
        "/etc/uv/uv.toml",
        "/etc/xdg/uv/uv.toml",
        "/etc/npmrc",
        "/usr/etc/npmrc",
        "/usr/local/etc/npmrc",
        "/etc/gitconfig",
        "/etc/wgetrc",
    }
)
"""Machine-wide settings of the tools a test.sh fetches its own dependencies with (where
they install from, what they run): the verifier's HOME is its own, these are not."""
CA_FOLDERS = ("/etc/ssl/", "/etc/pki/", "/usr/share/ca-certificates/")
CA_ADDED_FOLDERS = ("/usr/local/share/ca-certificates/",)

_INTERPRETER = re.compile(
    r"(sh|bash|dash|ash|zsh|ksh\d*|mksh|busybox|env|python[\d.]*|pypy[\d.]*|perl[\d.]*"
    r"|node|nodejs|bun|deno|ruby[\d.]*|php[\d.]*|lua[\d.]*|luajit|tclsh[\d.]*|Rscript|R|java"
    r"|pytest|py\.test)"
)
_PIP = re.compile(r"pip(3(\.\d+)?)?")
"""pip's own commands: `pip install --upgrade pip` rewrites them, routinely (not critical)."""
_SHARED_OBJECT = re.compile(r".+\.so(\.\d+)*")
_LOADER = re.compile(r"(ld-linux[^/]*|ld64|ld-musl-[^/]*|ld)\.so(\.\d+)*")
_MUSL_PATH = re.compile(r"/etc/ld-musl-[^/]+\.path")
_LIBRARY_FOLDER = re.compile(r"/(usr/(local/)?)?lib(32|64|x32)?(/|$)")
_STDLIB = re.compile(r"(?P<root>/(.+?/)?lib(64)?/python\d+(\.\d+)?)/(?P<rest>.+)")
_PERL_FOLDER = re.compile(r".*/(perl5?|perl-base)(/.*)?")
_STARTUP_MODULES = frozenset({"sitecustomize", "usercustomize"})
_PYTHON_ZIP = re.compile(r"python\d+\.zip")
"""`<prefix>/lib/python311.zip`: on sys.path before the standard library, when it exists."""


def _in(path: str, folder: str) -> bool:
    folder = folder.rstrip("/") or "/"
    return folder == "/" or path == folder or path.startswith(folder + "/")


def _stem(name: str) -> str:
    """A module's name from a file or folder name (`json.cpython-311.so` -> `json`)."""
    return name.split(".", 1)[0]


def _is_module(name: str, modules: Collection[str]) -> bool:
    """Whether `name` is a file Python would import as one of `modules`."""
    return _stem(name) in modules and name.endswith((".py", ".pyc", ".pyo", ".so"))


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p]


def _in_site_or_node(path: str) -> bool:
    parts = _parts(path)
    return "node_modules" in parts or any(p in SITE_FOLDERS for p in parts)


@dataclass(frozen=True)
class _Context:
    facts: ImageFacts
    interpreter: str | None
    contents: Mapping[str, bytes | None]
    library_folders: frozenset[str]


Rule = Callable[[Change, _Context], str | None]


def _test_interpreter(change: Change, ctx: _Context) -> str | None:
    if ctx.interpreter is not None and change.path == ctx.interpreter:
        return "test.sh's interpreter"
    return None


def _path_command(change: Change, ctx: _Context) -> str | None:
    folder, name = posixpath.split(change.path)
    dirs = ctx.facts.path_dirs
    if folder not in dirs or _PIP.fullmatch(name):
        return None
    what = "a shell or interpreter on PATH" if _INTERPRETER.fullmatch(name) else "a command on PATH"
    if change.kind is not Kind.ADDED:
        return what
    for later in dirs[dirs.index(folder) + 1 :]:
        if name in ctx.facts.commands.get(later, frozenset()):
            return f"{what}: it shadows {later}/{name}"
    return None


def _link(change: Change, ctx: _Context) -> str | None:
    if change.path in ctx.facts.links:
        return "a link that PATH or the library folders go through"
    return None


def _loader(change: Change, ctx: _Context) -> str | None:
    name = posixpath.basename(change.path)
    if _LOADER.fullmatch(name) and not _in_site_or_node(change.path):
        return "the dynamic loader"
    if change.path == "/etc/ld.so.preload":
        return "a library preloaded into every program"
    if _MUSL_PATH.fullmatch(change.path):
        return "the musl loader's library path"
    if "gconv" in _parts(change.path)[:-1] and _LIBRARY_FOLDER.match(change.path):
        return "glibc's character set converters (programs load them, static ones too)"
    return None


def _loader_cache(change: Change, ctx: _Context) -> str | None:
    if change.path != LD_CACHE:
        return None
    if change.kind is Kind.DELETED:
        return "the dynamic loader's cache"
    if ctx.facts.libraries is None:
        return "the dynamic loader's cache (the image's could not be read to compare)"
    data = ctx.contents.get(LD_CACHE)
    if data is None:
        return "the dynamic loader's cache, which could not be read"
    try:
        now = read_cache(data)
    except CacheError as exc:
        return f"the dynamic loader's cache, which could not be read ({exc})"
    for name, paths in sorted(ctx.facts.libraries.items()):
        moved = sorted(now.get(name, frozenset()) - paths)
        if moved:
            return f"the dynamic loader's cache: it sends {name} to {moved[0]}"
    return None


def _library(change: Change, ctx: _Context) -> str | None:
    folder, name = posixpath.split(change.path)
    if not _SHARED_OBJECT.fullmatch(name) or _in_site_or_node(change.path):
        return None
    if change.kind is Kind.ADDED:
        if name in (ctx.facts.libraries or {}):
            return f"a shared library under the name of the image's {name}"
        return None
    if _LIBRARY_FOLDER.match(change.path) or folder in ctx.library_folders:
        return "a shared library"
    return None


def _python_startup(change: Change, ctx: _Context) -> str | None:
    parts = _parts(change.path)
    name = parts[-1] if parts else ""
    if any(p in _STARTUP_MODULES or _is_module(p, _STARTUP_MODULES) for p in parts):
        return "Python runs it at start-up (sitecustomize/usercustomize)"
    if name.endswith(".pth") and change.kind is not Kind.DELETED:
        return "a .pth file: Python runs it at start-up"
    if name.endswith("._pth"):
        return "a ._pth file: it sets Python's module path"
    if _PYTHON_ZIP.fullmatch(name) and _LIBRARY_FOLDER.match(change.path):
        return "a zip on Python's module path, ahead of the standard library"
    if name == "pyvenv.cfg":
        folder = posixpath.dirname(change.path)
        if any(folder == d or folder == posixpath.dirname(d) for d in ctx.facts.path_dirs):
            return "pyvenv.cfg beside a PATH folder: it moves Python's prefix"
    return None


def _python_stdlib(change: Change, ctx: _Context) -> str | None:
    match = _STDLIB.fullmatch(change.path)
    if match is None:
        return None
    rest = _parts(match["rest"])
    if rest[0] in SITE_FOLDERS or "__pycache__" in rest:
        return None
    if change.kind is not Kind.ADDED:
        return "Python's standard library"
    if rest[-1].endswith((".pyc", ".pyo")):
        return "a compiled module beside Python's standard library"
    top = rest[1] if rest[0] == "lib-dynload" and len(rest) > 1 else rest[0]
    if _stem(top) in ctx.facts.site_modules:
        return f"a module in Python's standard library that shadows the installed {_stem(top)}"
    return None


def _test_runner(change: Change, ctx: _Context) -> str | None:
    parts = _parts(change.path)
    if len(parts) == 1 and parts[0] in PYTEST_ROOT_FILES and change.kind is not Kind.DELETED:
        return "pytest's configuration in /, the folder above /tests"
    sites = [i for i, p in enumerate(parts) if p in SITE_FOLDERS]
    if not sites or sites[-1] + 1 >= len(parts):
        return None
    top = parts[sites[-1] + 1]
    if top in PYTEST_PACKAGES or (len(parts) == sites[-1] + 2 and _stem(top) in ("pytest", "py")):
        return "the test runner (pytest)"
    if (
        parts[-1] == ENTRY_POINTS
        and parts[-2].endswith((".dist-info", ".egg-info"))
        and change.kind is not Kind.DELETED
    ):
        data = ctx.contents.get(change.path)
        if data is None:
            return "a package's entry points, which could not be read (a pytest plugin?)"
        if re.search(rb"^\s*\[\s*pytest11\s*\]", data, re.MULTILINE):
            return "a pytest plugin: pytest loads it by itself"
    return None


def _configuration(change: Change, ctx: _Context) -> str | None:
    path, kind = change.path, change.kind
    if path == "/etc/nsswitch.conf":
        return "the name service configuration, which the verifier's own tools read"
    if path in TOOL_CONFIGS and kind is not Kind.DELETED:
        return "configuration of a tool test.sh may fetch its dependencies with"
    in_store = path.startswith(CA_FOLDERS) or path == "/etc/ca-certificates.conf"
    if in_store and kind is not Kind.ADDED:
        return "the trusted certificates"
    if path.startswith(CA_ADDED_FOLDERS):
        return "the trusted certificates"
    return None


def _perl(change: Change, ctx: _Context) -> str | None:
    if not change.path.endswith((".pm", ".pl")) or not _PERL_FOLDER.fullmatch(change.path):
        return None
    if change.kind is not Kind.ADDED or change.path.startswith("/etc/perl/"):
        return "Perl's library"
    return None


RULES: tuple[Rule, ...] = (
    _test_interpreter,
    _path_command,
    _link,
    _loader,
    _loader_cache,
    _python_startup,
    _python_stdlib,
    _library,
    _test_runner,
    _configuration,
    _perl,
)
"""Checked in this order; the first that names a change says why it is critical."""


def _outside(changes: Iterable[Change], working: Collection[str]) -> list[Change]:
    """The changes outside the working folders, folders that are only the parents of
    other changes left out."""
    folders = [w for w in working if w.strip("/")]  # a workdir of / excuses nothing
    changes = list(changes)
    kept = sorted({c for c in changes if not any(_in(c.path, w) for w in folders)})
    parents: set[str] = set()
    for change in changes:
        path = change.path
        while path != "/":
            path = posixpath.dirname(path)
            if path in parents:
                break
            parents.add(path)
    return [c for c in kept if not (c.kind is Kind.CHANGED and c.path in parents)]


def _everywhere(change: Change) -> bool:
    """Changes the rules see even in a working folder: a workdir of / still has no
    business configuring pytest for the folder above /tests."""
    return change.path.count("/") == 1 and change.path[1:] in PYTEST_ROOT_FILES


def wanted(changes: Iterable[Change], working: Collection[str]) -> list[str]:
    """The files whose content the rules need (the loader's cache, entry points)."""
    paths = []
    for change in _outside(changes, working):
        if change.kind is Kind.DELETED:
            continue
        name = posixpath.basename(change.path)
        parent = posixpath.basename(posixpath.dirname(change.path))
        if change.path == LD_CACHE or (
            name == ENTRY_POINTS
            and parent.endswith((".dist-info", ".egg-info"))
            and _in_site_or_node(change.path)
        ):
            paths.append(change.path)
    return paths


@dataclass(frozen=True)
class Assessment:
    outside: tuple[Change, ...]
    """Every change outside the working folders (the evidence)."""
    critical: tuple[Finding, ...]
    """Those the verifier's start-up depends on."""

    def reason(self, most: int = 3, during: Collection[str] = ()) -> str | None:
        """A short sentence naming the critical files (None: there are none); those in
        `during` appeared while the verifier ran."""
        if not self.critical:
            return None
        named = [
            f.describe() + (" while the verifier ran" if f.change.path in during else "")
            for f in self.critical[:most]
        ]
        left = len(self.critical) - len(named)
        return "; ".join(named) + (f"; and {left} more" if left else "")

    def evidence(self, header: str, most: int = 5000) -> str:
        """The evidence file: every change, the critical ones marked with their reason."""
        why = {f.change: f.why for f in self.critical}
        lines = [f"# {line}" for line in header.splitlines()]
        lines.append('# A added, C changed, D deleted; "!" marks what the verifier depends on.')
        ordered = sorted(self.outside, key=lambda c: (c not in why, c.path))
        for change in ordered[:most]:
            mark = "!" if change in why else " "
            reason = f"  {why[change]}" if change in why else ""
            lines.append(f"{mark} {change.kind.letter} {change.path}{reason}")
        if len(ordered) > most:
            lines.append(f"# ... and {len(ordered) - most} more changes, not listed")
        return "\n".join(lines) + "\n"


def assess(
    changes: Iterable[Change],
    facts: ImageFacts,
    *,
    working: Collection[str],
    ignore: Collection[Change] = (),
    interpreter: str | None = None,
    contents: Mapping[str, bytes | None] | None = None,
) -> Assessment:
    """Which changes outside `working` (and not in `ignore`: what the container held
    when it started) the verifier's start-up depends on, and why."""
    every = [c for c in changes if c not in ignore]
    outside = _outside(every, working)
    seen = set(outside)
    outside += [c for c in every if _everywhere(c) and c not in seen]
    libraries = facts.libraries or {}
    folders = frozenset(posixpath.dirname(p) for ps in libraries.values() for p in ps)
    ctx = _Context(facts, interpreter, contents or {}, folders)
    critical = []
    for change in sorted(outside):
        for rule in RULES:
            why = rule(change, ctx)
            if why is not None:
                critical.append(Finding(change, why))
                break
    return Assessment(tuple(sorted(outside)), tuple(critical))


def parse_changes(items: object) -> list[Change]:
    """The engine's answer (a JSON list of {"Path", "Kind"}, or null) as changes."""
    found = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        path, kind = item.get("Path"), item.get("Kind")
        if isinstance(path, str) and path.startswith("/") and kind in (0, 1, 2):
            found.append(Change(posixpath.normpath(path), Kind(kind)))
    return found


__all__ = [
    "Assessment",
    "Change",
    "Finding",
    "ImageFacts",
    "Kind",
    "assess",
    "parse_changes",
    "wanted",
]
