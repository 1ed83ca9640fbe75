"""Every file slimming writes, written one way: atomically, never through a planted symlink,
never left half-written by a crash or a signal; and one run per folder.

- ``atomic_path(path)`` yields a temporary path in the same folder; when the block succeeds the
  file is fsynced and renamed over ``path`` (``os.replace``: a symlink planted at ``path`` is
  replaced, never followed), then the folder is fsynced. When it fails, or a signal interrupts
  it, the temporary file is removed. ``write_bytes``/``write_text``/``append_line`` build on it.
- ``RunLock(folder)`` holds an exclusive ``flock`` on ``folder/.slimming.lock`` for a run; the
  kernel drops it when the process ends in any way (even SIGKILL), so a lock is never stale;
  the file only records who held it last, for the message.
- ``handle_signals()`` turns SIGTERM and SIGHUP into ``SystemExit(128 + signal)`` (SIGINT is
  already KeyboardInterrupt), so cleanup code runs instead of the process vanishing mid-write.
- ``sweep_temporaries(folder)`` removes what a SIGKILL (which nothing can catch) left behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from ..errors import SlimmingError

LOCK_NAME = ".slimming.lock"
# ".{target name, its first 40 characters}.{8 random characters from mkstemp}.tmp{target suffix}"
_TEMPORARY = re.compile(r"\..+\.[A-Za-z0-9_]{8}\.tmp(\.[A-Za-z0-9]+)?")


def default_file_mode() -> int:
    """0o666 less the umask: what ``open()`` would give a new file (mkstemp gives 0o600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def fsync_dir(folder: str | os.PathLike) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temporary path beside ``path`` (same suffix, so writers that look at the
    extension are content); on success it replaces ``path`` atomically and durably."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # the temporary's name stays short: a legal 255-byte name must not make an illegal one
        fd, name = tempfile.mkstemp(prefix=f".{path.name[:40]}.", suffix=f".tmp{path.suffix[:16]}",
                                    dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise _naming(e, path) from None
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, default_file_mode())
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:  # a full disk, a folder gone: the file it was for, named
        tmp.unlink(missing_ok=True)
        raise _naming(e, path) from None
    except BaseException:  # an error, Ctrl-C or a signal: leave the old file, no temporary
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _naming(e: OSError, path: Path) -> OSError:
    """``e`` as the same kind of error about ``path`` (what the user asked to write), not about
    a temporary or no file at all ("error: : No space left on device")."""
    if e.errno is None:
        return OSError(f"{path}: {e}")
    return OSError(e.errno, e.strerror or os.strerror(e.errno), str(path))


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one line by rewriting the (small) file atomically: a crash leaves the file with
    or without the line, never with half of it."""
    path = Path(path)
    old = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
    if old and not old.endswith(b"\n"):
        old += b"\n"
    write_bytes(path, old + line.rstrip("\n").encode("utf-8") + b"\n")


def read_regular(path: str | os.PathLike, cap: int) -> bytes:
    """The bytes of ``path`` where it is a regular file of at most ``cap`` bytes (a symlink is
    not followed, a FIFO or a device is not opened for reading); OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > cap:
            raise OSError(errno.EINVAL, "not a regular file of at most the cap", str(path))
        data = f.read(cap + 1)
    if len(data) > cap:  # grew since the check
        raise OSError(errno.EFBIG, "over the cap", str(path))
    return data


def sweep_temporaries(folder: str | os.PathLike) -> None:
    """Remove the temporary files of writes that a SIGKILL interrupted in ``folder``."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    for p in folder.iterdir():
        if _TEMPORARY.fullmatch(p.name) and p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)


class RunLock:
    """``with RunLock(folder, "--save"):`` one run at a time in ``folder``; a second one is
    refused with one line naming the process that holds it."""

    def __init__(self, folder: str | os.PathLike, flag: str = "--save"):
        self.folder, self.flag, self.fd = Path(folder), flag, None

    def __enter__(self) -> RunLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:  # O_NOFOLLOW: a symlink planted where the lock goes
                raise SlimmingError(f"{path} is a symlink, not slimming's lock file: remove it") from None
            raise SlimmingError(f"cannot write in {self.folder} ({e.strerror}): choose another "
                                f"{self.flag}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise SlimmingError(f"{self.folder} is in use by {holder}: wait for it to end or "
                                f"choose another {self.flag}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"process {os.getpid()} ({' '.join(sys.argv[:3])[:200]})\n".encode())
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock
            self.fd = None


@contextlib.contextmanager
def handle_signals() -> Iterator[None]:
    """While inside: SIGTERM and SIGHUP raise ``SystemExit(128 + signum)`` in the main thread,
    so ``finally`` blocks and ``atomic_path`` clean up. A signal the process was started
    ignoring stays ignored (``nohup slimming train ... &`` outlives its terminal). Outside the
    main thread: a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)
           if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def human_bytes(nbytes: int) -> str:
    """``nbytes`` for a message: "1.5 GiB", "12.0 MiB", "512 bytes"."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} bytes"
