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
* **Interruption.** Ctrl-C raises :class:`TasksInterrupted` with the finished
  tasks' results; a local worker whose parent dies (``kill -9``) ends within
  half a second rather than finishing its task for nobody.

With ``n_jobs=1`` (or a single task) everything runs in this process, with no
worker processes, under the current Numba thread count.
"""

from __future__ import annotations

import numbers
import os
import threading
import time
import warnings
from contextlib import contextmanager

import joblib

__all__ = ["check_n_jobs", "effective_n_jobs", "available_cores", "run_parallel", "TasksInterrupted"]


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

    def __init__(self, func, n_threads, warning_filters, parent_pid=None):
        self.func = func
        self.n_threads = n_threads
        self.warning_filters = warning_filters
        self.parent_pid = parent_pid

    def __call__(self, *args):
        if self.parent_pid is not None:
            _watch_parent(self.parent_pid)

        n_threads = self.n_threads
        if n_threads is not None:
            import numba

            # A worker started with a smaller NUMBA_NUM_THREADS cannot go above it.
            n_threads = max(1, min(n_threads, numba.config.NUMBA_NUM_THREADS))
        with warnings.catch_warnings():
            warnings.filters[:] = self.warning_filters
            with _numba_threads(n_threads):
                return self.func(*args)


_WATCHED = []


def _watch_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """In a local worker process: end it within ``interval_s`` of its parent's
    death (a killed ``fastsim sweep``), instead of computing on for nobody.

    loky's workers notice a dead parent only between tasks, and a task (a
    sweep point) may run for minutes; the kernel releases the GIL, so this
    thread runs beside it. Started once per process.
    """
    if _WATCHED or os.getpid() == parent_pid:
        return
    _WATCHED.append(parent_pid)

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        os._exit(1)

    threading.Thread(target=watch, name="fastsim-parent-watch", daemon=True).start()


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
    TasksInterrupted
        On Ctrl-C (a KeyboardInterrupt): its ``done`` holds the finished tasks' results.
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
    done = {}   # task index -> result, as they finish
    try:
        if n_workers == 1:
            # In process: keep the caller's Numba thread count (all cores by default).
            call = _WorkerCall(func, None, filters)
            for i, task in enumerate(tasks):
                done[i] = call(*task)
                if bar is not None:
                    bar.update(1)
        else:
            n_threads = threads_per_worker(n_workers) if local else None
            # a worker's parent is this process on a local process backend (not on Dask)
            watch = local and not isinstance(backend, joblib.parallel.ThreadingBackend)
            call = _WorkerCall(func, n_threads, filters, os.getpid() if watch else None)
            config = {}
            if (isinstance(backend, joblib.parallel.LokyBackend)
                    and getattr(backend, "inner_max_num_threads", None) is None):
                # loky (the default) and no explicit user choice: start the workers
                # with NUMBA_NUM_THREADS (and the BLAS/OpenMP variables) = n_threads.
                config = {"backend": "loky", "inner_max_num_threads": n_threads}
            with joblib.parallel_config(**config):
                # unordered: a task that finishes early is kept even if an interrupt
                # comes before the tasks ahead of it finish
                parallel = joblib.Parallel(n_jobs=n_workers, return_as="generator_unordered")
                for i, result in parallel(joblib.delayed(_tagged)(call, i, task) for i, task in enumerate(tasks)):
                    done[i] = result
                    if bar is not None:
                        bar.update(1)
    except KeyboardInterrupt:
        # joblib has stopped the workers (loky terminates them) on the way out
        raise TasksInterrupted(done) from None
    finally:
        if bar is not None:
            bar.close()
    return [done[i] for i in range(len(tasks))]


def _tagged(call, i, task):
    """``(i, call(*task))``: results that say which task they answer."""
    return i, call(*task)


class TasksInterrupted(KeyboardInterrupt):
    """:func:`run_parallel` was interrupted; ``done`` maps the index of every
    finished task to its result."""

    def __init__(self, done: dict):
        super().__init__(f"interrupted after {len(done)} tasks")
        self.done = done
