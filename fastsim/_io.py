"""Reading and writing result tables (.csv, .json, .parquet), in one place."""

from __future__ import annotations

from pathlib import Path

TABLE_SUFFIXES = (".csv", ".json", ".parquet")


def check_table_path(path, name: str = "path", *, writing: bool = False) -> Path:
    """``path`` as a Path if its suffix is a table format (and, ``writing``,
    its directory exists), else a ValueError naming ``name``."""
    path = Path(path)
    if path.suffix.lower() not in TABLE_SUFFIXES:
        raise ValueError(f"{name} must end in .csv, .json or .parquet, got {str(path)!r}")
    if writing:
        check_output_dir(path, name)
    return path


def check_output_dir(path, name: str = "path") -> Path:
    """``path`` as a Path if the directory it is to be written in exists, else
    a ValueError naming ``name`` (a URL such as ``s3://...`` is left to pandas)."""
    if "://" in str(path):
        return Path(path)
    path = Path(path)
    if not path.expanduser().parent.is_dir():
        raise ValueError(f"{name}: directory {str(path.parent)!r} does not exist (for {str(path)!r})")
    return path


def save_table(frame, path, name: str = "path") -> Path:
    """Write a DataFrame by suffix; a named index becomes the first column."""
    path = check_table_path(path, name, writing=True)
    if frame.index.name is not None:
        frame = frame.reset_index()
    suffix = path.suffix.lower()
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    elif suffix == ".json":
        frame.to_json(path, orient="records", indent=2)
    else:
        frame.to_parquet(path, index=False)
    return path


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
