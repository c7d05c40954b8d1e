"""File safety in one place: what the tool reads and what it writes.

- `check_input_file(path, flag)`: a regular, readable file (a FIFO would block forever, a
  directory or device is not a model), optionally text.
- `check_output_path(path, flag, inputs=...)`: called BEFORE the work, so a bad output path
  fails in a second rather than after minutes of profiling: not a directory, a folder that
  exists and is writable, not under /proc or /sys, no name over 255 bytes, not one of the
  run's own inputs.
- `resolve_inside(folder, name, where)`: a path written inside a file (a catalogue's kernel
  table, a sweep spec's target file, a model's external data) resolved against that file's
  folder, symlinks followed, and refused unless it stays inside the folder.
- `plan_outputs(inputs, outputs, folders=...)`: called once per command BEFORE the work with
  every file the run will write (sidecars, plots, pages included): each one checked as above,
  none the same file as an input, no two the same file, no input inside an output folder.
- `write_output(path, data)`: a regular file is written atomically through a unique temporary
  name in its folder (`tempfile.mkstemp` + `os.replace`), so concurrent writers never share
  a temporary and a reader never sees half a file; a symlink is followed (its target is
  written, the link stays); a special file (a device such as /dev/null) is written through;
  ``-`` is standard output where the caller allows it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from dabench_ir.errors import UserError

__all__ = [
    "MAX_NAME_BYTES",
    "check_input_file",
    "check_output_dir",
    "check_output_path",
    "plan_outputs",
    "read_text_file",
    "resolve_inside",
    "stdout_fails",
    "write_output",
    "write_with",
]

MAX_NAME_BYTES = 255
"""The longest file name (one path component) Linux file systems take, in bytes."""

_SYSTEM_ROOTS = ("/proc", "/sys")


def _show(path: str | os.PathLike[str]) -> str:
    """A path as text that is safe to print (undecodable bytes escaped)."""
    text = os.fsdecode(path)
    return text.encode("utf-8", "backslashreplace").decode("utf-8") if _has_surrogates(text) else text


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _flag(flag: str | None) -> str:
    return f"{flag} " if flag else ""


def check_input_file(path: str | os.PathLike[str], flag: str | None = None, *, text: bool = False) -> Path:
    """``path`` as a Path to a regular readable file, or a UserError saying why not.

    ``text``: also refuse a file whose first KiB holds NUL bytes or is not UTF-8.
    """
    p = Path(path)
    where = f"{_flag(flag)}{_show(p)}"
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise UserError(f"{where}: no such file") from None
    except OSError as exc:
        raise UserError(f"{where}: cannot read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{where}: is a directory; give a file")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{where}: not a regular file (a pipe, socket or device); give a file")
    if not os.access(p, os.R_OK):
        raise UserError(f"{where}: permission denied; make it readable")
    if text:
        try:
            with open(p, "rb") as fh:
                head = fh.read(4096)
        except OSError as exc:
            raise UserError(f"{where}: cannot read ({exc.strerror or exc})") from None
        if b"\0" in head or not _utf8_prefix(head):
            raise UserError(f"{where}: a binary file, expected text; is it the right file?")
    return p


def _utf8_prefix(head: bytes) -> bool:
    """True when ``head`` is UTF-8, allowing a multi-byte character cut at the end."""
    for cut in range(4):
        try:
            head[: len(head) - cut].decode("utf-8")
            return True
        except UnicodeDecodeError:
            continue
    return False


def read_text_file(path: str | os.PathLike[str], flag: str | None = None) -> str:
    """The text of a regular UTF-8 file, or one UserError line."""
    p = check_input_file(path, flag, text=True)
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{_flag(flag)}{_show(p)}: not UTF-8 text; is it the right file?") from None
    except OSError as exc:
        raise UserError(f"{_flag(flag)}{_show(p)}: cannot read ({exc.strerror or exc})") from None


def resolve_inside(folder: str | os.PathLike[str], name: str, where: str = "") -> Path:
    """``name`` (a path written inside a file) resolved against ``folder`` with symlinks
    followed; a UserError (its line starting with ``where``) when it is absolute or lands
    outside ``folder``. Opens no file."""
    base = Path(os.path.realpath(folder))
    target = Path(os.path.realpath(base / name))
    if os.path.isabs(name):
        raise UserError(
            f"{where + ': ' if where else ''}{_show(name)!r} is an absolute path; a file named in a file is read "
            f"relative to its folder ({_show(base)}) and never points outside it: give a path relative to that folder"
        )
    if not target.is_relative_to(base):
        raise UserError(
            f"{where + ': ' if where else ''}{_show(name)!r} points outside {_show(base)}; refusing to read it "
            "(give a path inside that folder, e.g. move the file beside the one that names it)"
        )
    return target


def _identity(p: str | os.PathLike[str]) -> tuple:
    """What makes two paths one file: device and inode when it exists, else its resolved path."""
    try:
        st = os.stat(p)
        return ("inode", st.st_dev, st.st_ino)
    except OSError:
        return ("path", os.path.realpath(p))


def plan_outputs(
    inputs: Iterable[str | os.PathLike[str]],
    outputs: Iterable[tuple[str | os.PathLike[str], str]],
    *,
    folders: Iterable[tuple[str | os.PathLike[str], str]] = (),
    creates: Iterable[tuple[str | os.PathLike[str], str]] = (),
    allow_stdout: bool = False,
) -> None:
    """Refuse, before any work, a run whose outputs would overwrite an input or each other.

    ``outputs``: (path, how messages name it) for EVERY file the run writes, derived ones
    (a CSV's ``.roles.csv``, per-target files, plot files) included; ``folders``: (folder,
    flag) of output folders whose files are not listed one by one: no input may lie in one.
    Each output is also checked as `check_output_path` does; ``creates``: (folder, flag) of
    folders the run creates (checked as `check_output_dir` does, each its own folder only: its
    parent must exist, as an output file's must): a file inside one that does not exist yet
    needs no existing parent, and they are created once every check passed.
    """
    inputs = [Path(i) for i in inputs if os.fspath(i) not in ("", "-")]
    creates = list(creates)
    made = []
    for folder, flag in creates:
        check_output_dir(folder, flag, parents=False)
        made.append(Path(os.path.realpath(folder)))
    seen: dict[tuple, str] = {}
    for path, flag in outputs:
        if allow_stdout and os.fspath(path) == "-":
            key: tuple = ("stdout",)
            if stdout_fails():
                raise UserError(f"{flag} -: standard output refuses writes (a full disk?); give an output file")
        else:
            parent = Path(os.path.realpath(Path(path).parent))
            if not parent.exists() and any(parent.is_relative_to(m) for m in made):
                _output_where(path, flag, "file")  # its folder is created by the run
            else:
                check_output_path(path, flag, inputs=inputs)
            key = _identity(path)
            for other in inputs:
                if _identity(other) == key:
                    raise UserError(
                        f"{flag} {_show(path)}: is an input of this run; refusing to overwrite it (choose another name)"
                    )
        if key in seen:
            raise UserError(f"{flag} {_show(path)}: {seen[key]} writes the same file; give each output its own name")
        seen[key] = f"{flag} {_show(path)}" if key != ("stdout",) else flag
    for folder, flag in folders:
        base = os.path.realpath(folder)
        for other in inputs:
            if Path(os.path.realpath(other)).is_relative_to(base):
                raise UserError(
                    f"{flag} {_show(folder)}: input {_show(other)} lies inside this output folder, whose files "
                    "the run writes; move the input or choose another folder"
                )
    for folder, flag in creates:
        check_output_dir(folder, flag, create=True, parents=False)


def stdout_fails() -> bool:
    """Whether standard output refuses writes (a full disk behind it): probed with an empty
    write, which writes nothing. False when stdout is no file descriptor (a test's capture)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return False
    return not _writes(fd)


def _writes(fd: int) -> bool:
    try:
        os.write(fd, b"")
    except OSError:
        return False
    return True


def _device_refuses(p: Path) -> str | None:
    """Why a device cannot take a write (``/dev/full``: no space), probed with an empty write; None if it can."""
    try:
        fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        return exc.strerror or str(exc)
    try:
        os.write(fd, b"")
    except BlockingIOError:
        return None
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        os.close(fd)
    return None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _check_name(p: Path, where: str) -> None:
    for part in p.parts:
        if len(os.fsencode(part)) > MAX_NAME_BYTES:
            raise UserError(f"{where}: a name in the path is over {MAX_NAME_BYTES} bytes; shorten it")


def _check_system(p: Path, where: str) -> None:
    resolved = os.path.realpath(p)
    for root in _SYSTEM_ROOTS:
        if resolved == root or resolved.startswith(root + "/"):
            raise UserError(f"{where}: refusing to write under {root}; give a file in a normal folder")


def _output_where(path: str | os.PathLike[str], flag: str | None, kind: str) -> tuple[Path, str]:
    """The path and how messages name it, after the checks every output shares: a name at
    all, no over-long part, nothing under a system folder."""
    if not os.fspath(path):
        raise UserError(f"{_flag(flag)}: empty path; give a {kind} name")
    p = Path(path)
    where = f"{_flag(flag)}{_show(p)}"
    _check_name(p, where)
    _check_system(p, where)
    return p, where


def check_output_path(
    path: str | os.PathLike[str],
    flag: str | None = None,
    *,
    inputs: Iterable[str | os.PathLike[str]] = (),
    allow_stdout: bool = False,
    suffixes: Iterable[str] | None = None,
) -> Path:
    """Refuse, before any work, an output file that cannot or must not be written.

    ``inputs``: the run's input files; writing over one of them is refused.
    ``suffixes``: the allowed file suffixes (lower case, with the dot), when the writer
    picks a format by suffix.
    """
    if allow_stdout and os.fspath(path) == "-":
        return Path("-")
    p, where = _output_where(path, flag, "file")
    if suffixes is not None:
        allowed = tuple(suffixes)
        if p.suffix.lower() not in allowed:
            raise UserError(f"{where}: unknown suffix {p.suffix or '(none)'!r}; use one of {', '.join(allowed)}")
    try:
        st = os.stat(p)  # follows a symlink: its target is what gets written
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise UserError(f"{where}: cannot use it ({exc.strerror or exc})") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise UserError(f"{where}: is a directory; give a file name")
        if stat.S_ISREG(st.st_mode) and not os.access(p, os.W_OK):
            raise UserError(f"{where}: not writable; choose another file")
        for other in inputs:
            if _same_file(p, Path(other)):
                raise UserError(f"{where}: is an input of this run; refusing to overwrite it (choose another name)")
        if not stat.S_ISREG(st.st_mode):
            if stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode):
                raise UserError(f"{where}: a pipe or socket; give a file name")
            why = _device_refuses(p)
            if why:
                raise UserError(f"{where}: the device refuses writes ({why}); give another file")
            return p  # a device: written through
    elif p.is_symlink():
        raise UserError(f"{where}: a symlink to a missing folder or file; give another name")
    parent = Path(os.path.realpath(p)).parent if st is not None else p.absolute().parent
    if not parent.is_dir():
        raise UserError(f"{where}: folder {_show(parent)} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{where}: folder {_show(parent)} is not writable; choose another folder")
    return p


def check_output_dir(
    path: str | os.PathLike[str], flag: str | None = None, *, create: bool = False, parents: bool = True
) -> Path:
    """Refuse, before any work, an output folder that is a file or cannot be created or written.

    ``parents``: missing folders above it are created too (a sweep's or a study's ``-o``, a tree of
    its own); False: only the folder itself, whose parent must exist as an output file's must (a
    profile's ``--plots DIR``, ``--json DIR/``), so that a typo in the path is refused, not built."""
    p, where = _output_where(path, flag, "folder")
    if p.exists():
        if not p.is_dir():
            raise UserError(f"{where}: exists and is not a folder; give a folder name")
        if not os.access(p, os.W_OK | os.X_OK):
            raise UserError(f"{where}: folder is not writable; choose another folder")
        return p
    if p.is_symlink():  # a dangling link: mkdir would say "File exists"
        raise UserError(
            f"{where}: a symlink to a missing folder ({_show(os.readlink(p))}); create that folder or give another name"
        )
    ancestor = p.absolute().parent
    if not parents and not ancestor.is_dir():
        raise UserError(f"{where}: folder {_show(ancestor)} does not exist; create it first")
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UserError(f"{where}: {_show(ancestor)} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UserError(f"{where}: cannot create it ({_show(ancestor)} is not writable)")
    if create:
        try:
            p.mkdir(parents=parents, exist_ok=True)
        except OSError as exc:
            raise UserError(f"{where}: cannot create it ({exc.strerror or exc})") from None
    return p


def write_with(path: str | os.PathLike[str], write: Callable[[IO[Any]], None], *, binary: bool = False) -> Path:
    """Call ``write(fh)`` on a file handle whose contents end up at ``path`` (see the module doc).

    OSError becomes a one-line UserError naming the path.
    """
    mode = "wb" if binary else "w"
    kwargs: dict[str, Any] = {} if binary else {"encoding": "utf-8", "newline": ""}
    if os.fspath(path) == "-":
        if binary:
            write(sys.stdout.buffer)
            sys.stdout.buffer.flush()
        else:
            write(sys.stdout)
            sys.stdout.flush()
        return Path("-")
    p = Path(path)
    try:
        real = Path(os.path.realpath(p))  # a symlink's target is written; the link stays
        try:
            st = os.stat(real)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            if stat.S_ISDIR(st.st_mode):
                raise UserError(f"{_show(p)}: is a directory; give a file name")
            with open(real, mode, **kwargs) as fh:  # a device: written through, never replaced
                write(fh)
            return p
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name[:200]}.", suffix=".tmp", dir=real.parent)
        try:
            with os.fdopen(fd, mode, **kwargs) as fh:
                write(fh)
            if st is not None:
                with contextlib.suppress(OSError):
                    os.chmod(tmp, stat.S_IMODE(st.st_mode))
            else:
                umask = os.umask(0)
                os.umask(umask)
                with contextlib.suppress(OSError):
                    os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, real)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise UserError(f"{_show(p)}: cannot write it ({exc.strerror or exc})") from None
    return p


def write_output(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` safely: see the module doc."""
    binary = isinstance(data, bytes)
    return write_with(path, lambda fh: fh.write(data), binary=binary)


def meminfo_bytes(field: str) -> int | None:
    """A ``/proc/meminfo`` figure in bytes (``MemTotal``, ``MemAvailable``); None where unreadable."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
