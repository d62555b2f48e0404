"""Numba disk-cache faults (issue 43, item 3) recover with a warning.

Each case runs in a subprocess with its own temporary ``NUMBA_CACHE_DIR``
and a small module of functions compiled with fastsim's options
(`fastsim._numba_options.njit`): the cache is written by a first run, then
damaged as the issue found it (truncated or corrupted index and data
files), or made unwritable, and the next run must give the right result,
exit 0 and warn, naming the cache directory."""

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MODULE = textwrap.dedent("""
    from fastsim._numba_options import njit

    @njit
    def total(n):
        s = 0
        for i in range(n):
            s += i * i
        return s
""")

RUN = textwrap.dedent("""
    import warnings
    warnings.simplefilter("always")
    {patch}
    import toymod
    print("RESULT", toymod.total(100))
""")

EXPECTED = sum(i * i for i in range(100))


@pytest.fixture
def sandbox(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "toymod.py").write_text(MODULE)
    return tmp_path


def run(sandbox, patch=""):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(sandbox / "cache"),
               PYTHONPATH=os.pathsep.join([str(sandbox / "src"), str(ROOT)]))
    proc = subprocess.run([sys.executable, "-c", RUN.format(patch=patch)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"RESULT {EXPECTED}" in proc.stdout
    return proc.stderr


def cache_files(sandbox, suffix):
    files = sorted((sandbox / "cache").rglob(f"toymod.total-*{suffix}"))
    assert files, list((sandbox / "cache").rglob("*"))
    return files


DAMAGE = {
    "index truncated": (".nbi", lambda b: b[:len(b) // 2]),
    "index emptied": (".nbi", lambda b: b""),
    "data truncated": (".nbc", lambda b: b[:len(b) // 3]),
    "data garbage": (".nbc", lambda b: bytes(range(256)) * 8),
    "data wrong pickle": (".nbc", lambda b: pickle.dumps(("not", "a", "library"))),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_entry_is_dropped_and_compiled_again(sandbox, case):
    assert "Numba" not in run(sandbox)   # the cold run writes the cache, quietly
    suffix, damage = DAMAGE[case]
    for f in cache_files(sandbox, suffix):
        f.write_bytes(damage(f.read_bytes()))
    err = run(sandbox)
    cache_dir = str(cache_files(sandbox, ".nbi")[0].parent)
    assert "an entry of Numba's disk cache in" in err and cache_dir in err, err
    assert "could not be loaded" in err and "it was dropped and the function is compiled again" in err
    assert "could not be loaded" not in run(sandbox)   # written again: the next run loads it


def test_an_unwritable_cache_compiles_in_memory(sandbox):
    # a full disk: every write of a cache file fails
    patch = textwrap.dedent("""
        import errno
        from numba.core import caching
        def full(self, *args):
            raise OSError(errno.ENOSPC, "No space left on device")
        caching.IndexDataCacheFile._save_index = full
        caching.IndexDataCacheFile._save_data = full
    """)
    err = run(sandbox, patch)
    assert "cannot write Numba's disk cache in" in err and "No space left on device" in err, err
    assert "compiling in memory" in err


def test_import_needs_no_writable_location(sandbox):
    # no cache location can be created (a read-only install and home): Numba
    # raises "no locator available" when a cached function is defined
    patch = textwrap.dedent("""
        from numba.core import caching
        def nowhere(self):
            raise PermissionError(13, "Permission denied")
        caching._CacheLocator.ensure_cache_path = nowhere
        import fastsim   # defines every kernel function
    """)
    err = run(sandbox, patch)
    assert "no writable location for its disk cache" in err and "no locator available" in err, err
    assert "Traceback" not in err
