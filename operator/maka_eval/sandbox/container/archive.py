"""Tar archives, the engine's way of copying files in and out of a container: built in
memory for an upload, and unpacked from a download without ever following or making a
link (a container's content is the subject's)."""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath


class TarBuilder:
    """A tar archive built in memory (uid/gid 0: what the relay puts in is root's)."""

    def __init__(self) -> None:
        self.buffer = io.BytesIO()
        self.archive = tarfile.TarFile(fileobj=self.buffer, mode="w", format=tarfile.PAX_FORMAT)
        self.empty = True

    def folder(self, name: str, mode: int) -> None:
        info = tarfile.TarInfo(name.strip("/") + "/")
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, int(time.time())
        self.archive.addfile(info)
        self.empty = False

    def data(self, name: str, content: bytes, mode: int) -> None:
        info = tarfile.TarInfo(name.strip("/"))
        info.size, info.mode, info.mtime = len(content), mode, int(time.time())
        self.archive.addfile(info, io.BytesIO(content))
        self.empty = False

    def tree(self, source: Path, prefix: str) -> None:
        """A host folder's content under `prefix` (links kept as links)."""
        for path in sorted(source.rglob("*")):
            name = f"{prefix.strip('/')}/{path.relative_to(source).as_posix()}".strip("/")
            info = self.archive.gettarinfo(str(path), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.isreg():
                with path.open("rb") as handle:
                    self.archive.addfile(info, handle)
            elif info.isdir() or info.issym():
                self.archive.addfile(info)
            self.empty = False

    def file(self, source: Path, name: str, mode: int) -> None:
        self.data(name, source.read_bytes(), mode)  # links followed: the program itself

    def bytes(self) -> bytes:
        self.archive.close()
        return self.buffer.getvalue()


def _safe_members(archive: tarfile.TarFile, strip: int) -> Iterator[tuple[tarfile.TarInfo, str]]:
    """Regular files and folders with a plain relative name, `strip` leading parts off."""
    for member in archive:
        if member.name.startswith("/"):
            continue
        parts = PurePosixPath(member.name).parts[strip:]
        if not parts or ".." in parts:
            continue
        if member.isreg() or member.isdir():
            yield member, "/".join(p for p in parts if p != ".")


def extract_into(data: bytes, target: Path, strip: int, limit: int) -> int:
    """Unpack the files of a tar into `target` (never following or making links)."""
    written = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        for member, name in _safe_members(archive, strip):
            if not name:
                continue
            path = target / name
            if member.isdir():
                path.mkdir(parents=True, exist_ok=True)
                continue
            if written + member.size > limit:
                break
            source = archive.extractfile(member)
            if source is None:
                continue
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            except OSError:
                continue  # a name twice, or a file where a folder was: the first one stands
            with os.fdopen(fd, "wb") as handle:
                handle.write(source.read())
            written += member.size
    return written


def read_stream(chunks: Iterable[bytes], limit: int) -> bytes:
    """A downloaded archive's bytes, read up to a little more than `limit` (what is cut
    off is past the limit `extract_into` keeps anyway)."""
    data = bytearray()
    for chunk in chunks:
        data += chunk
        if len(data) > limit + (1 << 20):
            break
    return bytes(data)


def inner_file(data: bytes, limit: int) -> bytes | None:
    """The one regular file a get_archive of a file holds."""
    with (
        contextlib.suppress(tarfile.TarError),
        tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive,
    ):
        for member in archive:
            if member.isreg() and member.size <= limit:
                handle = archive.extractfile(member)
                return handle.read() if handle is not None else None
    return None
