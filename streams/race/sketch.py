"""The RACE sketch: R x W counters indexed by LSH codes, one pass, mergeable (race-coleman2021).

Theory of operation
-------------------
A :class:`RaceSketch` holds R x W int64 counters over one LSH family; ``update`` adds each
record's weight to counter ``l_r(x) mod W`` of every row r in one pass, ``merge`` adds the
counters of a sketch of the same family, seed, width and weight bound. Queries (Algorithm 2)
are those of :class:`~dpmarket.streams.race.queries.RaceQueries`.

Privacy. Adding or removing one record of weight ``|w| <= weight_bound`` changes exactly one
counter per row by ``w``: the L1 sensitivity of the counters is ``R * weight_bound`` and the L2
sensitivity ``sqrt(R) * weight_bound``. :meth:`RaceSketch.release_laplace` adds
``Lap(R weight_bound / eps)`` to every counter (Algorithm 1, Theorem 3.2: eps-DP; the authors'
public code uses ``R/(N eps)``, N times too little). :meth:`RaceSketch.release_gaussian` adds
``N(0, sigma^2)``: the Gaussian mechanism with L2 sensitivity ``sqrt(R) weight_bound``, which is
also what a secure sum with distributed Gaussian noise releases from :meth:`counter_vector`.
The noisy counters are rounded to int64 (Algorithm 1 floors them: post-processing either way,
but the floor biases every counter by -1/2). Queries of a release cost nothing more.

Streaming refresh. Release the sketch of each new, disjoint batch of records (a delta) and
:meth:`RaceRelease.accumulate` the releases. A record lies in one delta only, so by parallel
composition the accumulated release is as private as its least private part, but the noise of
the parts adds: after T refreshes each counter carries variance ``sum_t Var_t`` (``T 2 b^2`` for
Laplace of scale b), and the mean over R rows a variance R times smaller.

The parts live in their own modules and are re-exported here: the privacy calibration and
statements (:mod:`~dpmarket.streams.race.releases`), the queries
(:mod:`~dpmarket.streams.race.queries`), the wire bodies (:mod:`~dpmarket.streams.race.wire`) and
the compiled kernels with their numpy fallback (:mod:`~dpmarket.streams.race.kernels`).
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from dpmarket.streams.race.kernels import insert_counts, resolve_backend
from dpmarket.streams.race.lsh import LshFamily, as_points
from dpmarket.streams.race.queries import ESTIMATORS, MAX_WIDTH, RaceQueries, check_width
from dpmarket.streams.race.releases import (
    ADD_REMOVE,
    MECHANISMS,
    PrivacyStatement,
    check_positive,
    gaussian_epsilon,
    gaussian_sigma,
    neighbouring_relation,
)
from dpmarket.streams.race.wire import (
    RaceReleaseBody,
    RaceSketchBody,
    decode_body,
    encode_body,
    family_fields,
    family_of,
    statement_fields,
    statement_of,
)

__all__ = [
    "ADD_REMOVE",
    "ESTIMATORS",
    "MAX_WIDTH",
    "MECHANISMS",
    "PrivacyStatement",
    "RaceQueries",
    "RaceRelease",
    "RaceReleaseBody",
    "RaceSketch",
    "RaceSketchBody",
    "gaussian_epsilon",
    "gaussian_sigma",
]

_MAX_RELEASED = 2.0**62  # released counters are int64


def _check_weights(weights: npt.ArrayLike, n: int, bound: int) -> NDArray[np.int64]:
    raw = np.asarray(weights)
    if raw.shape != (n,):
        raise ValueError(f"weights must have shape ({n},), got {raw.shape}")
    if raw.dtype.kind == "f":
        if not bool(np.isfinite(raw).all()) or not bool((raw == np.round(raw)).all()):
            raise ValueError("weights must be integers (counters are int64)")
    elif raw.dtype.kind not in "iu":
        raise ValueError(f"weights must be integers, got dtype {raw.dtype}")
    if n and float(np.abs(raw).max()) > bound:
        raise ValueError(f"weights must satisfy |w| <= weight_bound = {bound}")
    return np.ascontiguousarray(raw, dtype=np.int64)


class RaceSketch(RaceQueries):
    """Mergeable R x W int64 counters over one LSH family (datasketch-style contract).

    ``update`` is one pass over a batch (weights: integers with ``|w| <= weight_bound``; a
    negative weight deletes). ``merge`` adds another sketch's counters and refuses sketches
    with other families, seeds, widths, rows or weight bounds. State changes only after every
    argument check has passed.
    """

    def __init__(
        self, family: LshFamily, width: int, *, weight_bound: int = 1, backend: str = "auto"
    ) -> None:
        if not isinstance(family, LshFamily):
            raise ValueError(f"family must be an LshFamily, got {type(family).__name__}")
        self.family = family
        self.width = check_width(width)
        if isinstance(weight_bound, bool) or not isinstance(weight_bound, int) or weight_bound < 1:
            raise ValueError(f"weight_bound must be a positive integer, got {weight_bound!r}")
        self.weight_bound = weight_bound
        self.backend = resolve_backend(backend)
        self._counts: NDArray[np.int64] = np.zeros((family.rows, self.width), dtype=np.int64)

    __hash__: ClassVar[None]  # type: ignore[assignment]

    @property
    def l1_sensitivity(self) -> float:
        """``R * weight_bound``: one record moves one counter per row by at most the bound."""
        return float(self.rows * self.weight_bound)

    @property
    def l2_sensitivity(self) -> float:
        """``sqrt(R) * weight_bound`` (same argument, Euclidean norm)."""
        return math.sqrt(self.rows) * self.weight_bound

    def update(self, X: npt.ArrayLike, weights: npt.ArrayLike | None = None) -> None:
        """Insert the records ``X`` (``float32[n, dim]``) with optional integer weights."""
        points = as_points(X, self.family.dim)
        w = None if weights is None else _check_weights(weights, points.shape[0], self.weight_bound)
        if points.shape[0]:
            insert_counts(self.family, points, w, self._counts, self.backend)

    def merge(self, other: RaceSketch) -> None:
        """Add ``other``'s counters (the sketch of the union of the two record multisets)."""
        if not isinstance(other, RaceSketch):
            raise ValueError(f"cannot merge a {type(other).__name__} into a RaceSketch")
        problem = self._mismatch(other)
        if problem is not None:
            raise ValueError(f"cannot merge RACE sketches: {problem}")
        self._counts += other._counts

    def clear(self) -> None:
        """Reset every counter to zero (start the next delta of a streaming refresh)."""
        self._counts[:] = 0

    def copy(self) -> RaceSketch:
        """An independent sketch with equal parameters and counters."""
        twin = RaceSketch(
            self.family, self.width, weight_bound=self.weight_bound, backend=self.backend
        )
        twin._counts[:] = self._counts
        return twin

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RaceSketch):
            return NotImplemented
        return self._mismatch(other) is None and bool(np.array_equal(self._counts, other._counts))

    def __repr__(self) -> str:
        return f"RaceSketch({self.family!r}, width={self.width}, N={self.estimated_size():g})"

    def counter_vector(self) -> NDArray[np.int64]:
        """The counters as a flat ``int64[R * W]`` copy for a secure sum.

        Adding or removing one record changes R entries by at most ``weight_bound`` each:
        L2 sensitivity :attr:`l2_sensitivity`, L1 sensitivity :attr:`l1_sensitivity`.
        """
        return self._counts.reshape(-1).copy()

    def release_laplace(self, epsilon: float, rng: np.random.Generator) -> RaceRelease:
        """Algorithm 1: every counter plus ``Lap(R weight_bound / epsilon)``; epsilon-DP.

        Why private: one record changes one counter per row by at most ``weight_bound``, so the
        counters have L1 sensitivity ``R weight_bound`` (Theorem 3.2; the paper's per-row proof
        by parallel then sequential composition gives the same scale), and the Laplace
        mechanism with scale sensitivity/epsilon is epsilon-DP (Theorem 2.3).
        """
        epsilon = check_positive(epsilon, "epsilon")
        scale = self.l1_sensitivity / epsilon
        noise = rng.laplace(0.0, scale, size=self._counts.shape)
        relation = neighbouring_relation(self.weight_bound)
        statement = PrivacyStatement(
            "laplace", (scale,), self.l1_sensitivity, relation, epsilon, 0.0
        )
        return RaceRelease(self, self._counts + noise, statement)

    def release_gaussian(
        self, sigma: float, rng: np.random.Generator, *, delta: float | None = None
    ) -> RaceRelease:
        """Every counter plus ``N(0, sigma^2)``: the Gaussian mechanism, L2 sensitivity
        ``sqrt(R) weight_bound``; ``(gaussian_epsilon(sigma, sqrt(R) weight_bound, delta),
        delta)``-DP for every delta. The statement carries that epsilon when ``delta`` is given.
        Use :func:`gaussian_sigma` to calibrate sigma for a target ``(epsilon, delta)``.
        """
        sigma = check_positive(sigma, "sigma")
        eps = None if delta is None else gaussian_epsilon(sigma, self.l2_sensitivity, delta)
        noise = rng.normal(0.0, sigma, size=self._counts.shape)
        relation = neighbouring_relation(self.weight_bound)
        statement = PrivacyStatement(
            "gaussian", (sigma,), self.l2_sensitivity, relation, eps,
            0.0 if delta is None else float(delta),
        )  # fmt: skip
        return RaceRelease(self, self._counts + noise, statement)

    def to_bytes(self) -> bytes:
        """One msgpack frame (``race.sketch`` body) of the project's codec."""
        return encode_body(RaceSketchBody(**family_fields(self), counts=self._counts))

    @classmethod
    def from_bytes(cls, data: bytes, backend: str = "auto") -> RaceSketch:
        """Inverse of :meth:`to_bytes`; any bad frame raises ``RemoteProtocolError``."""
        body = decode_body(data, RaceSketchBody)
        sketch = cls(family_of(body), body.width, weight_bound=body.weight_bound, backend=backend)
        sketch._counts[:] = body.counts
        return sketch


class RaceRelease(RaceQueries):
    """A released sketch: noisy counters rounded to int64, and its :class:`PrivacyStatement`.

    Immutable. Rounding is post-processing; unlike the floor of Algorithm 1 it adds no bias.
    """

    def __init__(
        self, template: RaceQueries, counts: npt.ArrayLike, statement: PrivacyStatement
    ) -> None:
        self.family, self.width = template.family, template.width
        self.weight_bound, self.backend = template.weight_bound, template.backend
        raw = np.asarray(counts)
        if raw.dtype.kind in "iu":
            values = raw.astype(np.int64)
        else:
            floats = raw.astype(np.float64)
            if not bool((np.abs(floats) <= _MAX_RELEASED).all()):
                raise ValueError(f"released counters must be finite and at most {_MAX_RELEASED}")
            values = np.rint(floats).astype(np.int64)
        values = values.reshape(self.family.rows, self.width)
        values.setflags(write=False)
        self._counts: NDArray[np.int64] = values
        if not isinstance(statement, PrivacyStatement):
            raise ValueError(f"statement must be a PrivacyStatement, got {statement!r}")
        self.statement = statement

    __hash__: ClassVar[None]  # type: ignore[assignment]

    @classmethod
    def from_counter_vector(
        cls, template: RaceQueries, values: npt.ArrayLike, statement: PrivacyStatement
    ) -> RaceRelease:
        """A release from a noisy flat ``R * W`` vector (e.g. the output of a secure sum)."""
        flat = np.asarray(values)
        if flat.shape != (template.rows * template.width,):
            raise ValueError(f"values must have shape ({template.rows * template.width},)")
        return cls(template, flat, statement)

    def accumulate(self, other: RaceRelease) -> RaceRelease:
        """Sum with the release of a disjoint record set (streaming refresh); noise adds."""
        if not isinstance(other, RaceRelease):
            raise ValueError(f"cannot accumulate a {type(other).__name__}")
        problem = self._mismatch(other)
        if problem is not None:
            raise ValueError(f"cannot accumulate releases: {problem}")
        statement = self.statement.combine(other.statement)
        return RaceRelease(self, self._counts + other._counts, statement)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RaceRelease):
            return NotImplemented
        same = self._mismatch(other) is None and self.statement == other.statement
        return same and bool(np.array_equal(self._counts, other._counts))

    def __repr__(self) -> str:
        return f"RaceRelease({self.family!r}, width={self.width}, {self.statement})"

    def to_bytes(self) -> bytes:
        """One msgpack frame (``race.release`` body)."""
        fields = family_fields(self) | statement_fields(self.statement)
        return encode_body(RaceReleaseBody(**fields, counts=self._counts))

    @classmethod
    def from_bytes(cls, data: bytes, backend: str = "auto") -> RaceRelease:
        """Inverse of :meth:`to_bytes`; any bad frame raises ``RemoteProtocolError``."""
        body = decode_body(data, RaceReleaseBody)
        template = RaceSketch(
            family_of(body), body.width, weight_bound=body.weight_bound, backend=backend
        )
        return cls(template, body.counts, statement_of(body))
