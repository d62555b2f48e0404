"""Request classes: a label per request, from its length band, its priority
or a trace column, and the per-class reduction of per-request results
(``ReplicateResult.summary(by="class")``).

The class is a function of the drawn request stream (never of the engine),
so it is computed here from what `sample_requests` gives; the per-class
metrics are the kernel's definitions (``docs/engine-model.md``, "Metrics")
restricted to the class's measured requests, over the run's window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._validation import MAX_COUNT, check_choice
from .kernel.layout import METRICS

BY = ("prompt_len", "output_len", "total_len", "priority", "trace")
#: The per-request metrics reported per class: the kernel's metrics up to the
#: preemptions per request, less the pooled inter-token latencies (system-wide
#: time averages, swaps and prefix hits are not split by class either).
CLASS_METRICS = tuple(m for m in METRICS[:METRICS.index("preemptions_per_request") + 1]
                      if not m.startswith("itl_"))
CLASS_COUNTS = ("n_arrived", "n_measured", "n_completed")


@dataclass(frozen=True)
class RequestClasses:
    """How a request's class is decided.

    Parameters
    ----------
    by : {"prompt_len", "output_len", "total_len", "priority", "trace"}
        A length band (``total_len``: prompt + output), the priority class,
        or the trace's class column (``Workload.from_trace(..., class_column=...)``).
    edges : sequence of int
        With a length band: strictly increasing upper edges ``e_1 < ... <
        e_{B-1}``; band ``j`` holds the lengths in ``[e_j, e_{j+1})``
        (``e_0 = 1``, ``e_B = inf``).
    names : sequence of str, optional
        A name per band (default ``"<64"``, ``"64-255"``, ``">=256"``).
    priorities : sequence of int, optional
        With a length band: the priority of each band (``policy="priority"``
        serves lower first), instead of priorities drawn at random.
    """

    by: str
    edges: tuple = ()
    names: tuple | None = None
    priorities: tuple | None = None

    def __post_init__(self):
        check_choice("classes.by", self.by, BY)
        s = object.__setattr__
        band = self.by.endswith("_len")
        e = np.asarray(self.edges)
        if band:
            if (e.ndim != 1 or e.size == 0 or e.dtype.kind not in "iu" or np.any(e < 2)
                    or np.any(np.diff(e) <= 0) or np.any(e > MAX_COUNT)):
                raise ValueError(f"classes.edges must be a non-empty, strictly increasing sequence of integers "
                                 f">= 2 (the bands' upper edges) with by={self.by!r}, got {self.edges!r}")
            s(self, "edges", tuple(int(x) for x in e))
        elif e.size:
            raise ValueError(f"classes.edges is only used with a length band (by='prompt_len', 'output_len' "
                             f"or 'total_len'), got edges={self.edges!r} with by={self.by!r}")
        nb = len(self.edges) + 1
        if self.names is not None:
            names = tuple(str(x) for x in self.names)
            if not band or len(names) != nb or len(set(names)) != nb:
                raise ValueError(f"classes.names must be {nb} distinct names, one per band, got {self.names!r}")
            s(self, "names", names)
        if self.priorities is not None:
            pri = np.asarray(self.priorities)
            if not band or pri.shape != (nb,) or pri.dtype.kind not in "iu" or np.any(np.abs(pri) > MAX_COUNT):
                raise ValueError(f"classes.priorities must be {nb} integers, one per length band, got "
                                 f"{self.priorities!r} with by={self.by!r}")
            s(self, "priorities", tuple(int(x) for x in pri))

    @property
    def is_band(self) -> bool:
        return self.by.endswith("_len")

    def band_names(self) -> tuple:
        if self.names is not None:
            return self.names
        e = self.edges
        out = [f"<{e[0]}"] + [f"{lo}-{hi - 1}" for lo, hi in zip(e[:-1], e[1:])] + [f">={e[-1]}"]
        return tuple(out)

    def label(self, requests, trace=None) -> np.ndarray:
        """The class of every request of a stream (a frame from `sample_requests`)."""
        if self.is_band:
            p = np.asarray(requests["prompt_len"])
            o = np.asarray(requests["output_len"])
            x = p if self.by == "prompt_len" else (o if self.by == "output_len" else p + o)
            return np.asarray(self.band_names(), dtype=object)[np.searchsorted(self.edges, x, side="right")]
        if self.by == "priority":
            return np.asarray(requests["priority"])
        if trace is None or trace.classes is None:
            raise ValueError("classes by='trace' needs a request trace with a class column "
                             "(Workload.from_trace(..., class_column=...))")
        return np.asarray(trace.classes)[np.asarray(requests["trace_row"])]

    def order(self, labels) -> list:
        """The classes in report order: the bands' order, else sorted."""
        if self.is_band:
            return list(self.band_names())
        return sorted(set(labels.tolist()), key=str)


def as_classes(value):
    """``None``, a `RequestClasses`, ``"priority"``/``"trace"`` or a
    ``(by, edges)`` pair."""
    if value is None or isinstance(value, RequestClasses):
        return value
    if isinstance(value, str):
        return RequestClasses(value)
    if isinstance(value, dict):
        try:
            return RequestClasses(**value)
        except TypeError as exc:   # (a missing or an unknown key)
            raise ValueError(f"classes: {exc} (its keys: by, edges, priorities), got {value!r}") from None
    if isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], str):
        edges = value[1]
        if not isinstance(edges, (tuple, list, np.ndarray)):   # (an int raised a bare TypeError)
            raise ValueError(f"classes: the edges of a (by, edges) pair must be a sequence of lengths such as "
                             f"[256, 1024], got {edges!r}")
        return RequestClasses(value[0], tuple(edges))
    raise ValueError(f"classes must be None, a fastsim.RequestClasses, 'priority', 'trace' or a (by, edges) pair "
                     f"such as ('prompt_len', [256, 1024]), got {value!r}")


def class_rows(labels, order, arrival, output, status, first, finish, npre, warmup, window, overhead,
               ttft_slo, tpot_slo, tpot_first=None):
    """Per-class metric rows of one replication (dicts in ``order``): the
    kernel's definitions (`kernel.metrics._reduce`) on the class's measured
    requests; throughputs over the run's ``window`` (s). ``tpot_first``:
    where each request's TPOT starts, if not at ``first`` (a disaggregated
    server's decode side, `kernel.disagg._reduce_disagg`)."""
    tfirst = first if tpot_first is None else tpot_first
    n = arrival.size
    meas = np.arange(n) >= warmup
    rows = []
    for cls in order:
        m = meas & (labels == cls)
        nm = int(m.sum())
        done = m & (status == 0)
        ttft = first[done] - arrival[done] + overhead
        e2e = finish[done] - arrival[done] + overhead
        o = output[done]
        multi = o > 1
        tpot = (finish[done][multi] - tfirst[done][multi]) / (o[multi] - 1)
        good = np.ones(ttft.size, bool)
        if ttft_slo is not None:
            good &= ttft <= ttft_slo
        if tpot_slo is not None:
            tp = np.full(ttft.size, -np.inf)
            tp[multi] = tpot
            good &= tp <= tpot_slo

        def pct(x, q):
            return float(np.percentile(x, q)) if x.size else np.nan

        row = {"class": cls,
               "ttft_mean": float(ttft.mean()) if ttft.size else np.nan, "ttft_p50": pct(ttft, 50),
               "ttft_p90": pct(ttft, 90), "ttft_p95": pct(ttft, 95), "ttft_p99": pct(ttft, 99),
               "tpot_mean": float(tpot.mean()) if tpot.size else np.nan, "tpot_p50": pct(tpot, 50),
               "tpot_p99": pct(tpot, 99),
               "e2e_mean": float(e2e.mean()) if e2e.size else np.nan, "e2e_p50": pct(e2e, 50),
               "e2e_p99": pct(e2e, 99)}
        ok = window > 0
        row["request_throughput"] = int(done.sum()) / window if ok else np.nan
        row["output_throughput"] = float(o.sum()) / window if ok else np.nan
        row["goodput"] = int(good.sum()) / window if ok else np.nan
        row["blocking_probability"] = float(np.isin(status[m], (1, 2)).sum()) / nm if nm else np.nan
        row["drop_probability"] = float((status[m] == 3).sum()) / nm if nm else np.nan
        row["preemptions_per_request"] = float(npre[m].sum()) / nm if nm else np.nan
        row["n_arrived"] = int((labels == cls).sum())
        row["n_measured"] = nm
        row["n_completed"] = int(((labels == cls) & (status == 0)).sum())   # (counts: all requests, as the kernel's)
        rows.append(row)
    return rows
