"""The one place fastsim uses joblib.

Every multi-scenario entry point (:func:`fastsim._sweep.sweep`,
:func:`fastsim._compare.compare`) runs its tasks through :func:`run_parallel`,
so every worker gets the same treatment (the habit of scikit-learn's
``utils/parallel.py``):

* **Thread budget.** Each replication batch is itself parallel (a thread
  pool of ``numba.get_num_threads()`` threads running the nogil kernel), so
  ``workers x Numba threads`` must not exceed the available cores. On a
  local backend each worker gets ``cores // workers`` Numba threads (at least 1),
  set with ``numba.set_num_threads`` around every task; loky workers are also
  started with ``NUMBA_NUM_THREADS`` (and the BLAS/OpenMP variables) at that
  value through joblib's ``inner_max_num_threads``.
* **Warning filters.** The caller's :data:`warnings.filters` at dispatch time
  are installed around each task, so ``warnings.simplefilter("error")`` or a
  ``pytest.warns`` filter applies inside worker processes too.
* **Order.** Results come back in task order whatever order the workers
  finish in, so the output never depends on ``n_jobs``.
* **Progress.** One tqdm bar over tasks (not replications).

With ``n_jobs=1`` (or a single task) everything runs in this process, with no
worker processes, under the current Numba thread count.
"""

from __future__ import annotations

import numbers
import warnings
from contextlib import contextmanager

import joblib

__all__ = ["check_n_jobs", "effective_n_jobs", "available_cores", "run_parallel"]


def check_n_jobs(n_jobs) -> int:
    """Return ``n_jobs`` if it is an integer >= 1 or -1 (all cores), else raise ``ValueError``."""
    if (not isinstance(n_jobs, numbers.Integral) or isinstance(n_jobs, bool)
            or not (n_jobs >= 1 or n_jobs == -1)):
        raise ValueError(f"n_jobs must be an integer >= 1, or -1 for all cores, got {n_jobs!r}")
    return int(n_jobs)


def available_cores() -> int:
    """Cores this process may use (joblib's count: CPU affinity and cgroup quotas respected)."""
    return max(1, int(joblib.cpu_count()))


def effective_n_jobs(n_jobs, n_tasks: int | None = None) -> int:
    """Worker processes that :func:`run_parallel` starts on a local backend:
    ``n_jobs`` (-1: all cores), capped by the cores and by the number of tasks."""
    n_jobs = check_n_jobs(n_jobs)
    cores = available_cores()
    n = cores if n_jobs == -1 else min(n_jobs, cores)
    if n_tasks is not None:
        n = min(n, max(int(n_tasks), 1))
    return max(n, 1)


def threads_per_worker(n_workers: int) -> int:
    """Numba threads each of ``n_workers`` workers may use: ``cores // n_workers`` (>= 1)."""
    return max(1, available_cores() // max(int(n_workers), 1))


@contextmanager
def _numba_threads(n_threads):
    """Set Numba's thread count (the CPU kernel's default thread count) for a block."""
    import numba

    if n_threads is None:
        yield
        return
    old = numba.get_num_threads()
    numba.set_num_threads(n_threads)
    try:
        yield
    finally:
        numba.set_num_threads(old)


class _WorkerCall:
    """``func`` wrapped with the dispatching process's warning filters and a
    Numba thread count; picklable, so it travels to loky workers."""

    def __init__(self, func, n_threads, warning_filters):
        self.func = func
        self.n_threads = n_threads
        self.warning_filters = warning_filters

    def __call__(self, *args):
        n_threads = self.n_threads
        if n_threads is not None:
            import numba

            # A worker started with a smaller NUMBA_NUM_THREADS cannot go above it.
            n_threads = max(1, min(n_threads, numba.config.NUMBA_NUM_THREADS))
        with warnings.catch_warnings():
            warnings.filters[:] = self.warning_filters
            with _numba_threads(n_threads):
                return self.func(*args)


def run_parallel(func, tasks, n_jobs: int = 1, *, progress: bool = False, desc: str = "tasks") -> list:
    """Call ``func(*task)`` for every task, in parallel processes; results in task order.

    Parameters
    ----------
    func : callable
        A module-level function (picklable, for worker processes).
    tasks : iterable of tuple
        The positional arguments of each call.
    n_jobs : int
        Worker processes (an integer >= 1, or -1 for all cores); capped by the
        number of tasks and, on a local backend, by the cores. With one worker
        the calls run in this process. On a local backend each worker runs
        Numba with ``cores // workers`` threads; on a remote one (Dask) the
        workers are not this machine's, and their thread counts are left
        alone. joblib's active backend is used (loky unless set otherwise
        with ``joblib.parallel_config``).
    progress : bool
        Show a tqdm progress bar over tasks.
    desc : str
        The progress bar's label.

    Returns
    -------
    list
        ``[func(*task) for task in tasks]``, in that order.

    Raises
    ------
    ValueError
        If ``n_jobs`` is not an integer >= 1 or -1.
    """
    n_jobs = check_n_jobs(n_jobs)
    tasks = [tuple(t) for t in tasks]
    if not tasks:
        return []
    backend, _ = joblib.parallel.get_active_backend()
    local = isinstance(backend, (joblib.parallel.LokyBackend, joblib.parallel.ThreadingBackend,
                                 joblib.parallel.MultiprocessingBackend))
    if local:
        n_workers = effective_n_jobs(n_jobs, len(tasks))
    else:
        # A remote backend (e.g. dask.distributed): the workers are not this
        # machine's cores, so neither cap their number by them nor split this
        # machine's cores between them.
        n_workers = len(tasks) if n_jobs == -1 else min(n_jobs, len(tasks))
    filters = list(warnings.filters)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(tasks), desc=desc, unit="task", leave=False)
    results = []
    try:
        if n_workers == 1:
            # In process: keep the caller's Numba thread count (all cores by default).
            call = _WorkerCall(func, None, filters)
            for task in tasks:
                results.append(call(*task))
                if bar is not None:
                    bar.update(1)
        else:
            n_threads = threads_per_worker(n_workers) if local else None
            call = _WorkerCall(func, n_threads, filters)
            config = {}
            if (isinstance(backend, joblib.parallel.LokyBackend)
                    and getattr(backend, "inner_max_num_threads", None) is None):
                # loky (the default) and no explicit user choice: start the workers
                # with NUMBA_NUM_THREADS (and the BLAS/OpenMP variables) = n_threads.
                config = {"backend": "loky", "inner_max_num_threads": n_threads}
            with joblib.parallel_config(**config):
                parallel = joblib.Parallel(n_jobs=n_workers, return_as="generator")
                for result in parallel(joblib.delayed(call)(*task) for task in tasks):
                    results.append(result)
                    if bar is not None:
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return results
