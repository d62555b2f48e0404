"""Exact queueing formulas used as ground truth by the tests and experiments.

(The analytical models of a whole server are in :mod:`fastsim.analytical`;
these are the textbook results that the simulator reduces to in special cases.)
"""

from __future__ import annotations

from ._validation import check_float, check_int


def erlang_b(servers: int, offered_load: float) -> float:
    """Blocking probability of the M/G/c/c loss system (Erlang's B formula).

    Insensitive to the service-time law beyond its mean. Computed with the
    stable recursion ``B(k) = a B(k-1) / (k + a B(k-1))``.

    Parameters
    ----------
    servers : int
        ``c >= 1``.
    offered_load : float
        ``a = lambda E[S] >= 0`` in Erlangs.
    """
    c = check_int("servers", servers, low=1)
    a = check_float("offered_load", offered_load, low=0)
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return b


def mg1_mean_wait(arrival_rate: float, service_mean: float, service_second_moment: float) -> float:
    """Mean queueing delay of the M/G/1 queue (Pollaczek–Khinchine).

    ``E[Wq] = lambda E[S^2] / (2 (1 - rho))`` with ``rho = lambda E[S] < 1``.
    """
    lam = check_float("arrival_rate", arrival_rate, low=0, low_open=True)
    es = check_float("service_mean", service_mean, low=0, low_open=True)
    # E[S^2] >= E[S]^2 (Jensen), up to rounding for a deterministic law
    es2 = check_float("service_second_moment", service_second_moment, low=es * es * (1 - 1e-9))
    rho = lam * es
    if rho >= 1:
        raise ValueError(f"arrival_rate * service_mean must be < 1 (a stable queue), got {rho:g}")
    return lam * es2 / (2.0 * (1.0 - rho))
