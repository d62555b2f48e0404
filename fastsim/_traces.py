"""Request traces: recorded arrivals with their lengths, block identities
and classes, read from the public formats, for :meth:`Workload.from_trace`.

Formats (``format="auto"`` tells them apart by the file's suffix and its
first record):

* ``"csv"``: a timestamp column and prompt/output length columns, found by
  name (the Azure LLM inference traces 2023: ``TIMESTAMP``,
  ``ContextTokens``, ``GeneratedTokens``; or ``arrival_s``, ``prompt_len``,
  ``output_len``). Timestamps are seconds, or date-times.
* ``"mooncake"``: JSON lines with ``timestamp`` (milliseconds),
  ``input_length``, ``output_length`` and ``hash_ids`` (the identity of each
  512-token block of the prompt).
* ``"token_ids"``: JSON lines with ``arrival_time_ns`` (or ``arrival_s``),
  ``input_toks``, ``output_toks`` and ``input_tok_ids`` (the prompt's token
  ids), hashed into blocks of ``block_size`` tokens as vLLM does: only full
  blocks, each block's hash chained to its parent's (`hash_token_blocks`).

Block identities are stored as CSR: request ``r``'s blocks are
``block_hashes[block_offsets[r]:block_offsets[r + 1]]`` (int64).
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._validation import check_choice, check_float, check_int

FORMATS = ("auto", "csv", "mooncake", "token_ids")
#: Column names tried, in order, when a CSV's columns are not named.
TIME_COLUMNS = ("arrival_s", "timestamp", "TIMESTAMP", "arrival_time", "time")
PROMPT_COLUMNS = ("prompt_len", "ContextTokens", "input_length", "input_toks", "context_tokens")
OUTPUT_COLUMNS = ("output_len", "GeneratedTokens", "gen_len", "output_length", "output_toks", "generated_tokens")
#: Tokens per block of the Mooncake traces' ``hash_ids``.
MOONCAKE_BLOCK_SIZE = 512


@dataclass(frozen=True, eq=False)
class RequestTrace:
    """Recorded requests: arrival times (seconds from the first), lengths, and
    optionally block identities and a class label per request.

    Parameters
    ----------
    arrival_s : array of float
        Non-decreasing arrival times, the first at 0 (as read; a window or a
        time scale is applied by :meth:`Workload.from_trace`).
    prompt_len, output_len : array of int
    block_offsets, block_hashes : array of int64, optional
        CSR of each request's prompt block identities (``len(arrival_s) + 1``
        offsets); ``None`` when the trace has none.
    block_size : int, optional
        Tokens per identified block.
    classes : array, optional
        A class label per request (a trace column).
    source : str
        Where it was read from.
    """

    arrival_s: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    block_offsets: np.ndarray | None = None
    block_hashes: np.ndarray | None = None
    block_size: int | None = None
    classes: np.ndarray | None = None
    source: str = ""

    def __post_init__(self):
        n = len(self.arrival_s)
        for name in ("prompt_len", "output_len"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} must have one entry per arrival ({n}), got {len(getattr(self, name))}")
        if (self.block_offsets is None) != (self.block_hashes is None):
            raise ValueError("block_offsets and block_hashes must be given together")
        if self.block_offsets is not None:
            off = np.asarray(self.block_offsets, np.int64)
            if off.shape != (n + 1,) or off[0] != 0 or np.any(np.diff(off) < 0) or off[-1] != len(self.block_hashes):
                raise ValueError(f"block_offsets must be {n + 1} non-decreasing offsets from 0 to "
                                 f"len(block_hashes) = {len(self.block_hashes)}")
        if self.classes is not None and len(self.classes) != n:
            raise ValueError(f"classes must have one entry per arrival ({n}), got {len(self.classes)}")

    def __len__(self):
        return int(len(self.arrival_s))

    def blocks(self, row: int) -> np.ndarray:
        """The block identities of request ``row`` (empty without identities)."""
        if self.block_offsets is None:
            return np.zeros(0, np.int64)
        return self.block_hashes[self.block_offsets[row]:self.block_offsets[row + 1]]

    def rows(self, idx) -> "RequestTrace":
        """The requests ``idx`` (an integer array or a slice), times as they are."""
        idx = np.arange(len(self))[idx] if isinstance(idx, slice) else np.asarray(idx, np.int64)
        off = hashes = None
        if self.block_offsets is not None:
            lens = self.block_offsets[idx + 1] - self.block_offsets[idx]
            off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
            hashes = (np.concatenate([self.blocks(r) for r in idx]).astype(np.int64) if idx.size
                      else np.zeros(0, np.int64))
        return RequestTrace(self.arrival_s[idx], self.prompt_len[idx], self.output_len[idx], off, hashes,
                            self.block_size, None if self.classes is None else self.classes[idx], self.source)

    def with_times(self, arrival_s) -> "RequestTrace":
        """The same requests at other arrival times."""
        return RequestTrace(np.asarray(arrival_s, float), self.prompt_len, self.output_len, self.block_offsets,
                            self.block_hashes, self.block_size, self.classes, self.source)


def parent_steps(trace: RequestTrace, block_size: int):
    """For prefix caching by block hash: which earlier request each row of
    ``trace`` shares its leading blocks with (``docs/engine-model.md``,
    "Trace block identities").

    Hashes are chained: rows r and s share their first ``c`` hashes exactly
    when they share those ``c * hb`` tokens (``hb = trace.block_size``), so
    they share their first ``min(P_r // bs, P_s // bs, c * hb // bs)``
    engine blocks of ``block_size`` (``bs``) tokens. A request's *parent*
    is an earlier request it shares the most blocks with; its blocks are then
    its parent's up to that count, and its own after (so a block's identity
    is that of the earliest request holding the same prefix). Replaying rows
    ``row0 ..``, the parent of row r is the latest row in ``[row0, r)``
    through the deepest prefix r shares: the *steps* of row r list, deepest
    prefix first, the latest earlier row through each prefix (a row only
    when later than those listed before it) and the blocks r shares with it;
    a replay takes the first step whose row is at least ``row0``. (Exact
    when equal hashes name equal tokens, as content hashes do.)

    Returns
    -------
    start, count : int64 arrays, one per row
        Its steps in ``steps[start:start + count]``.
    steps : float64 array, shape (m, 2)
        (row, blocks shared) of each step.
    """
    hb = trace.block_size
    if trace.block_offsets is None or hb is None:
        raise ValueError("the trace has no block identities (hash_ids or token ids)")
    if hb % block_size:
        raise ValueError(f"the trace's block size ({hb} tokens per hash) must be a multiple of "
                         f"engine.block_size, got block_size={block_size}")
    k = hb // block_size
    nodes: dict = {}      # (parent prefix, hash) -> prefix id
    last: dict = {}       # prefix id -> the latest row through it
    p = np.asarray(trace.prompt_len, np.int64) // block_size
    n = len(trace)
    start, count = np.zeros(n, np.int64), np.zeros(n, np.int64)
    steps: list = []
    for r in range(n):
        path = []
        node = -1
        for h in trace.blocks(r).tolist():
            node = nodes.setdefault((node, h), len(nodes))
            path.append(node)
        start[r] = len(steps)
        newest = -1
        for d in range(len(path), 0, -1):
            s = last.get(path[d - 1], -1)
            if s > newest:
                newest = s
                shared = min(int(p[r]), int(p[s]), d * k)
                if shared > 0:
                    steps.append((s, shared))
        count[r] = len(steps) - start[r]
        for node in path:
            last[node] = r
    return start, count, np.array(steps, dtype=np.float64).reshape(-1, 2)


def stream_parents(hashes, prompt_len, hash_block_size: int, block_size: int):
    """The kernel's (``prefix_group``, ``prefix_len``) columns of a stream
    whose requests carry their trace block identities (``hashes``, one hash
    array per request, in arrival order): `parent_steps` of that stream,
    replayed from its first request. Request i's column: ``-2 - parent``
    (itself when none) and the tokens it shares with its parent."""
    tr = RequestTrace(np.zeros(len(hashes)), np.asarray(prompt_len, np.int64), np.zeros(len(hashes), np.int64),
                      np.concatenate([[0], np.cumsum([len(h) for h in hashes])]).astype(np.int64),
                      np.concatenate([np.asarray(h, np.int64) for h in hashes] + [np.zeros(0, np.int64)]),
                      hash_block_size)
    start, count, steps = parent_steps(tr, block_size)
    grp = -2 - np.arange(len(hashes), dtype=np.int64)
    plen = np.zeros(len(hashes), np.int64)
    for i in range(len(hashes)):
        if count[i]:
            s, shared = steps[start[i]]
            grp[i], plen[i] = -2 - int(s), int(shared) * block_size
    return grp, plen


def hash_token_blocks(token_ids, block_size: int) -> np.ndarray:
    """Identities of the full blocks of a prompt, as vLLM's prefix cache keys
    them: block ``j`` hashes its parent's hash with its own token ids, so two
    prompts share block ``j``'s identity exactly when they share their first
    ``(j + 1) * block_size`` tokens. (vLLM hashes a tuple with Python's hash
    or SHA-256; here BLAKE2b of the parent's 8 bytes and the tokens as int64,
    the first block's parent 0: the same sharing, reproducible across runs.)
    A partial last block has no identity (vLLM caches full blocks only)."""
    ids = np.asarray(token_ids, dtype="<i8")
    out = np.empty(ids.size // block_size, np.int64)
    parent = b"\0" * 8
    for j in range(out.size):
        h = hashlib.blake2b(parent + ids[j * block_size:(j + 1) * block_size].tobytes(), digest_size=8).digest()
        out[j] = np.frombuffer(h, dtype="<i8")[0]
        parent = h
    return out


def read_trace(path, *, format: str = "auto", block_size: int | None = None, nrows: int | None = None,
               timestamp: str | None = None, prompt: str | None = None, output: str | None = None,
               class_column: str | None = None) -> RequestTrace:
    """Read a request trace (see the module's formats). ``timestamp``,
    ``prompt``, ``output`` and ``class_column`` name CSV/JSON fields (by
    default the first known name present); ``block_size``: tokens per block
    when hashing token ids (default 16, vLLM's); ``nrows``: the first this
    many requests."""
    path = Path(path)
    check_choice("format", format, FORMATS)
    if not path.is_file():
        raise ValueError(f"path must be an existing CSV file or JSON-lines trace, got {str(path)!r}")
    nrows = check_int("nrows", nrows, low=1, optional=True)
    block_size = check_int("block_size", block_size, low=1, high=65536, optional=True)
    try:
        if format == "auto":
            format = _detect_format(path)
        if format == "csv":
            if block_size is not None:
                raise ValueError(f"block_size is only used with token ids (format='token_ids'), got {block_size} "
                                 f"for the CSV {path}")
            return _read_csv(path, nrows, timestamp, prompt, output, class_column)
        return _read_jsonl(path, format, nrows, block_size, timestamp, prompt, output, class_column)
    except UnicodeDecodeError as exc:   # (a binary file: the codec's message named no file)
        raise ValueError(f"path must be a text trace (a CSV file or JSON lines, UTF-8), got {str(path)!r}, which "
                         f"is not: {exc}") from None


def _detect_format(path):
    if path.suffix.lower() == ".csv":
        return "csv"
    with path.open() as fh:
        first = fh.readline()
    try:
        rec = json.loads(first)
    except json.JSONDecodeError:
        return "csv"
    if not isinstance(rec, dict):
        raise ValueError(f"{path}: a JSON-lines trace needs one object per line, got {first[:80]!r}")
    if "hash_ids" in rec:
        return "mooncake"
    if "input_tok_ids" in rec:
        return "token_ids"
    raise ValueError(f"{path}: cannot tell the trace's format (a JSON line with neither hash_ids nor "
                     f"input_tok_ids); its keys are {sorted(rec)}")


def _pick(header, given, candidates, what, path):
    if given is not None:
        if given not in header:
            raise ValueError(f"{path} has no {what} column {given!r}; its columns are {list(header)}")
        return given
    found = next((c for c in candidates if c in header), None)
    if found is None:
        raise ValueError(f"{path} needs a {what} column (one of {', '.join(candidates)}, or name it); "
                         f"its columns are {list(header)}")
    return found


def _times_to_seconds(values, path, col):
    """Seconds from the first arrival: numbers as seconds, else date-times."""
    try:
        t = np.array([float(v) for v in values])
    except (TypeError, ValueError):
        import pandas as pd

        try:
            stamps = pd.to_datetime(pd.Series(values))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"column {col!r} of {path} must hold seconds or date-times: {exc}") from None
        t = (stamps - stamps.iloc[0]).dt.total_seconds().to_numpy()
    return _relative_times(t, path, col)


def _relative_times(t, path, col):
    if t.size == 0:
        raise ValueError(f"{path} holds no request")
    if not np.all(np.isfinite(t)) or np.any(np.diff(t) < 0):
        raise ValueError(f"column {col!r} of {path} must hold finite, non-decreasing times")
    return t - t[0]


def _lengths(values, path, col, low=1):
    x = np.asarray(values)
    if x.dtype.kind not in "iu":
        xf = np.asarray(x, dtype=float)
        if not np.all(np.isfinite(xf)) or np.any(xf != np.floor(xf)):
            raise ValueError(f"column {col!r} of {path} must hold integers")
        x = xf.astype(np.int64)
    if x.size and x.min() < low:
        i = int(np.argmax(x < low))
        raise ValueError(f"column {col!r} of {path} must hold integers >= {low}, got {int(x[i])} in request {i}")
    return x.astype(np.int64)


def _read_csv(path, nrows, timestamp, prompt, output, class_column):
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        tcol = _pick(header, timestamp, TIME_COLUMNS, "timestamp", path)
        pcol = _pick(header, prompt, PROMPT_COLUMNS, "prompt length", path)
        ocol = _pick(header, output, OUTPUT_COLUMNS, "output length", path)
        if class_column is not None:
            _pick(header, class_column, (), "class", path)
        rows = []
        for r in reader:
            rows.append(r)
            if nrows is not None and len(rows) >= nrows:
                break
    try:
        p = [float(r[pcol]) for r in rows]
        o = [float(r[ocol]) for r in rows]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: lengths must be numbers: {exc}") from None
    # (the Azure traces hold requests with 0 generated tokens: a client that
    # got one token; a request here has at least one, so 0 is read as 1)
    return RequestTrace(_times_to_seconds([r[tcol] for r in rows], path, tcol), _lengths(p, path, pcol),
                        np.maximum(_lengths(o, path, ocol, low=0), 1),
                        classes=None if class_column is None else np.array([r[class_column] for r in rows]),
                        source=str(path))


def _number(value, path, k, column) -> float:
    """Record ``k``'s ``column`` as a float, or a ValueError naming the file, the record and the field."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{path}: record {k} ({column}): expected a number, got {value!r}") from None


def _hash_ids(ids, path, k) -> np.ndarray:
    """Record ``k``'s ``hash_ids`` as int64, or a ValueError naming the file and the record: each an
    integer in int64's range (a fraction, a string or a larger number names no block)."""
    if not isinstance(ids, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                            and -2 ** 63 <= x < 2 ** 63 for x in ids):
        raise ValueError(f"{path}: record {k} (hash_ids): expected a list of integers within int64, got "
                         f"{str(ids)[:80]}")
    return np.asarray(ids, np.int64)


def _read_jsonl(path, format, nrows, block_size, timestamp, prompt, output, class_column):
    recs = []
    with path.open() as fh:
        for i, line in enumerate(fh, 1):
            if line.strip():
                try:
                    recs.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}: line {i} is not JSON: {exc}") from None
                if nrows is not None and len(recs) >= nrows:
                    break
    if not recs:
        raise ValueError(f"{path} holds no request")
    keys = recs[0].keys()
    if format == "mooncake":
        if block_size is not None and block_size != MOONCAKE_BLOCK_SIZE:
            raise ValueError(f"block_size of a Mooncake trace is its hash_ids' {MOONCAKE_BLOCK_SIZE} tokens, "
                             f"got {block_size}")
        tcol = _pick(keys, timestamp, ("timestamp",), "timestamp", path)
        scale = 1e-3   # milliseconds
        pcol = _pick(keys, prompt, PROMPT_COLUMNS, "prompt length", path)
        ocol = _pick(keys, output, OUTPUT_COLUMNS, "output length", path)
        blocks = [_hash_ids(r.get("hash_ids", []), path, k) for k, r in enumerate(recs)]
        block_size = MOONCAKE_BLOCK_SIZE
    else:
        block_size = 16 if block_size is None else block_size
        if timestamp is not None:
            tcol, scale = _pick(keys, timestamp, (), "timestamp", path), 1.0
        elif "arrival_time_ns" in keys:
            tcol, scale = "arrival_time_ns", 1e-9
        else:
            tcol, scale = _pick(keys, None, TIME_COLUMNS, "timestamp", path), 1.0
        pcol = _pick(keys, prompt, PROMPT_COLUMNS, "prompt length", path)
        ocol = _pick(keys, output, OUTPUT_COLUMNS, "output length", path)
        blocks = [hash_token_blocks(r["input_tok_ids"], block_size) for r in recs]
    t = _relative_times(np.array([_number(r[tcol], path, k, tcol) for k, r in enumerate(recs)]) * scale, path, tcol)
    off = np.concatenate([[0], np.cumsum([b.size for b in blocks])]).astype(np.int64)
    hashes = np.concatenate(blocks).astype(np.int64) if off[-1] else np.zeros(0, np.int64)
    classes = None
    if class_column is not None:
        _pick(keys, class_column, (), "class", path)
        classes = np.array([r[class_column] for r in recs])
    return RequestTrace(t, _lengths([r[pcol] for r in recs], path, pcol),
                        np.maximum(_lengths([r[ocol] for r in recs], path, ocol, low=0), 1), off, hashes,
                        block_size, classes, str(path))


def window(trace: RequestTrace, start_s: float, duration_s: float | None, rate_scale: float) -> RequestTrace:
    """The requests arriving in ``[start_s, start_s + duration_s)`` of the
    trace, at times ``(t - start_s) / rate_scale`` (replayed ``rate_scale``
    times as fast)."""
    start_s = check_float("start_s", start_s, low=0)
    duration_s = check_float("duration_s", duration_s, low=0, low_open=True, optional=True)
    rate_scale = check_float("rate_scale", rate_scale, low=0, low_open=True)
    t = trace.arrival_s
    end = np.inf if duration_s is None else start_s + duration_s
    keep = np.flatnonzero((t >= start_s) & (t < end))
    if keep.size == 0:
        raise ValueError(f"start_s and duration_s must select at least one request of the trace (its arrivals "
                         f"span 0 to {t[-1]:.6g} s), got start_s={start_s!r}, duration_s={duration_s!r}")
    sub = trace.rows(keep)
    return sub.with_times((sub.arrival_s - start_s) / rate_scale)


def max_window_count(times, duration) -> int:
    """Most arrivals in any window ``[s, s + duration)``: at most the most in
    ``[t_i, t_i + duration)`` over the arrivals ``t_i`` (a window's requests
    lie in the one that starts at its first)."""
    ends = np.searchsorted(times, times + duration, side="left")
    return int(max(1, (ends - np.arange(times.size)).max()))
