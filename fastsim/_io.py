"""Reading and writing result tables (.csv, .json, .parquet), in one place."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

TABLE_SUFFIXES = (".csv", ".json", ".parquet")


def check_table_path(path, name: str = "path", *, writing: bool = False) -> Path:
    """``path`` as a Path if its suffix is a table format (and, ``writing``,
    its directory exists), else a ValueError naming ``name``."""
    if not isinstance(path, (str, Path)) and not hasattr(path, "__fspath__"):
        raise ValueError(f"{name} must be a file path (str or pathlib.Path), got {path!r}")
    path = Path(path)
    if path.suffix.lower() not in TABLE_SUFFIXES:
        raise ValueError(f"{name} must end in .csv, .json or .parquet, got {str(path)!r}")
    if writing:
        check_output_dir(path, name)
    return path


def check_output_dir(path, name: str = "path") -> Path:
    """``path`` as a Path if the directory it is to be written in exists and
    takes a new file (probed: a temporary file is made there and removed),
    else a ValueError naming ``name``; checked before a run so that a bad
    path loses no results (a URL such as ``s3://...`` is left to pandas)."""
    if "://" in str(path):
        return Path(path)
    path = Path(path)
    parent = path.expanduser().parent
    if not parent.is_dir():
        raise ValueError(f"{name}: directory {str(path.parent)!r} does not exist (for {str(path)!r})")
    if path.expanduser().is_dir():
        raise ValueError(f"{name} must be a file name, got the directory {str(path)!r}")
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise ValueError(f"{name}: cannot write in directory {str(path.parent)!r} "
                         f"({exc.strerror or exc}) (for {str(path)!r})") from None
    return path


def save_table(frame, path, name: str = "path") -> Path:
    """Write a DataFrame by suffix; a named index becomes the first column."""
    path = check_table_path(path, name, writing=True)
    if frame.index.name is not None:
        frame = frame.reset_index()
    suffix = path.suffix.lower()
    if "://" in str(path):
        _write(frame, path, suffix)
        return path
    # A temporary file next to the target, renamed over it when complete: an
    # interrupted or failed write never leaves a truncated table behind.
    target = path.expanduser()
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        os.chmod(tmp, 0o666 & ~_umask())   # mkstemp's 0600 would outlive the rename
        _write(frame, tmp, suffix)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write(frame, path, suffix):
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    elif suffix == ".json":
        frame.to_json(path, orient="records", indent=2)
    else:
        frame.to_parquet(path, index=False)


def read_table(path, name: str = "table"):
    """Read a table written by :func:`save_table` (or any csv/json/parquet table)."""
    import pandas as pd

    path = check_table_path(path, name)
    if not path.is_file():
        raise ValueError(f"{name} must be an existing file, got {str(path)!r}")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return pd.read_parquet(path)
    if suffix == ".csv":
        return pd.read_csv(path)
    return pd.read_json(path, orient="records")
