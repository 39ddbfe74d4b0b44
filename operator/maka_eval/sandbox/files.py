"""Copying files into and out of folders a subject can write, without following its links.

The relay runs as root; a subject may have left a symbolic link where the relay is about
to write (a step's workdir files) or read (/logs/agent). Every folder here is opened
relative to its parent with O_NOFOLLOW, and every file is created with O_EXCL, so a link
never sends the relay's write or read anywhere else.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from pathlib import Path, PurePosixPath

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_folder(name: str, dir_fd: int | None = None) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):  # a file or a link where a folder goes
            raise OSError(exc.errno, f"{name} is not a folder (a link or a file?)") from None
        raise


def _write_file(source: Path, dir_fd: int, name: str) -> None:
    """`source` as the file `name` in the folder `dir_fd`, replacing a file there."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        why = f"{name} is a folder; a file of the same name cannot replace it"
        raise OSError(errno.EISDIR, why) from None
    mode = stat.S_IMODE(source.stat().st_mode)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, mode, dir_fd=dir_fd)
    with os.fdopen(fd, "wb") as sink, source.open("rb") as handle:
        shutil.copyfileobj(handle, sink)
    os.chmod(name, mode, dir_fd=dir_fd, follow_symlinks=False)


def _copy_folder(source: Path, dir_fd: int) -> None:
    for entry in sorted(os.scandir(source), key=lambda e: e.name):
        path = Path(entry.path)
        if entry.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.name, dir_fd=dir_fd)
            os.symlink(os.readlink(path), entry.name, dir_fd=dir_fd)
        elif entry.is_dir():
            with contextlib.suppress(FileExistsError):
                os.mkdir(entry.name, stat.S_IMODE(entry.stat().st_mode), dir_fd=dir_fd)
            child = _open_folder(entry.name, dir_fd)
            try:
                _copy_folder(path, child)
            finally:
                os.close(child)
        elif entry.is_file():
            _write_file(path, dir_fd, entry.name)


def copy_into(source: Path, target: str) -> None:
    """A host file to `target`, or a host folder's content merged into the folder
    `target` (made when missing); OSError when a link or a file is in the way."""
    if source.is_dir():
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(target, 0o755)
        fd = _open_folder(target)
        try:
            _copy_folder(source, fd)
        finally:
            os.close(fd)
        return
    parent, name = os.path.split(target)
    fd = _open_folder(parent or ".")
    try:
        _write_file(source, fd, name)
    finally:
        os.close(fd)


def copy_out(source: str, target: Path, max_bytes: int) -> int:
    """The regular files under the folder `source` into the folder `target` (made),
    skipping links and anything past `max_bytes` in all; the bytes copied."""
    try:
        fd = _open_folder(source)
    except OSError:
        return 0
    target.mkdir(parents=True, exist_ok=True)
    try:
        return _copy_out(fd, target, max_bytes)
    finally:
        os.close(fd)


def _copy_out(dir_fd: int, target: Path, budget: int) -> int:
    copied = 0
    for name in sorted(os.listdir(dir_fd)):
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode):
            try:
                child = _open_folder(name, dir_fd)
            except OSError:
                continue
            try:
                copied += _copy_out(child, target / name, budget - copied)
            finally:
                os.close(child)
        elif stat.S_ISREG(info.st_mode) and copied + info.st_size <= budget:
            try:
                fd = _open_file(name, dir_fd)
            except OSError:
                continue
            target.mkdir(parents=True, exist_ok=True)
            with os.fdopen(fd, "rb") as handle, (target / name).open("xb") as sink:
                data = handle.read(budget - copied + 1)
                sink.write(data[: budget - copied])
            copied += min(len(data), budget - copied)
    return copied


_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def _open_file(name: str, dir_fd: int) -> int:
    """A regular file, opened for reading. Checked on the open file, not only before:
    a process the subject left may swap it for a FIFO (whose open would wait forever
    for a writer; O_NONBLOCK returns at once) or a device between the look and the
    open."""
    fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{name} is no longer a regular file")
    return fd


def copy_path_out(root: str, relative: str, target: Path, max_bytes: int) -> str | None:
    """What is at `relative` under the host folder `root` -- a regular file, or a
    folder's regular files (at most `max_bytes` in all) -- to the new host path `target`,
    every folder on the way opened without following links; why nothing was copied
    (missing, a link, not a file or folder), or None."""
    parts = [part for part in PurePosixPath(relative).parts if part not in ("/", ".")]
    if ".." in parts:  # task.toml's are refused when read; never leave `root` anyway
        return "it names '..' (a path may not leave its folder)"
    try:
        fd = _open_folder(root)
    except OSError as exc:
        return f"cannot open {root}: {exc.strerror or exc}"
    try:
        for part in parts[:-1]:
            child = _open_folder(part, fd)
            os.close(fd)
            fd = child
        if not parts:
            _copy_out(fd, target, max_bytes)
            return None
        info = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            child = _open_folder(parts[-1], fd)
            try:
                target.mkdir(parents=True, exist_ok=True)
                _copy_out(child, target, max_bytes)
            finally:
                os.close(child)
            return None
        if not stat.S_ISREG(info.st_mode):
            return "it is a link or a special file (links are never followed)"
        if info.st_size > max_bytes:
            return f"it holds {info.st_size} bytes, more than the {max_bytes} allowed"
        source = _open_file(parts[-1], fd)
        target.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(source, "rb") as handle, target.open("xb") as sink:
            sink.write(handle.read(max_bytes))
        return None
    except FileNotFoundError:
        return "it does not exist"
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        os.close(fd)
