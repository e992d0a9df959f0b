"""The RACE sketch: R x W counters indexed by LSH codes, one pass, mergeable (race-coleman2021).

Theory of operation
-------------------
Row ``r`` of a :class:`RaceSketch` counts the records whose code ``l_r(x)`` falls in column
``l_r(x) mod W`` (Section 2.4). ``S[r, l_r(q) mod W]`` is then an unbiased estimator of
``f_D(q) = sum_x k(x, q)`` plus the collisions modulo W (about ``(N - f_D(q))/W`` when the codes
spread over more than W values; none for SRP with ``W >= 2^bits``), with variance at most
``(sum_x sqrt k(x, q))^2`` (Theorem 2.5). :meth:`~RaceQueries.query` averages the R rows
(Algorithm 2) or takes the median of group means (Lemma 3.3).

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

Speed. The numba kernels fuse hashing and counting (rows in parallel, records in blocks of
column-major input, power-of-two widths masked, other widths reduced by an exact float
reciprocal); the numpy fallback computes the same float32 projections in the same order and
gives identical counts. Kernels compile on first use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from dpmarket.protocol.errors import RemoteProtocolError
from dpmarket.protocol.messages import Body, Message, decode, encode, register
from dpmarket.streams.lsh import (
    LshFamily,
    as_points,
    gather_sums,
    insert_counts,
    make_family,
    mean_of_rows,
    resolve_backend,
)

if TYPE_CHECKING:  # importing dp_accounting costs about a second; only the ledger needs it
    from dpmarket.protocol.accounting import PrivacyLedger

__all__ = [
    "ADD_REMOVE",
    "ESTIMATORS",
    "MECHANISMS",
    "PrivacyStatement",
    "RaceRelease",
    "RaceReleaseBody",
    "RaceSketch",
    "RaceSketchBody",
    "gaussian_epsilon",
    "gaussian_sigma",
]

ESTIMATORS = ("mean", "median_of_means")
DEFAULT_GROUPS = 24  # median of means: k = ceil(8 ln(1/0.05)) groups (Lemma 3.3, delta = 0.05)
MAX_WIDTH = 2**30
_ALL_ROWS = np.zeros(0, dtype=np.int64)  # row -> group map for one group (never read)
ADD_REMOVE = "add/remove one record"  # the neighbouring relation, as accounting.ADD_REMOVE
_MAX_EPSILON = 512.0  # keeps exp(epsilon) finite in the Gaussian calibration
_MAX_RELEASED = 2.0**62  # released counters are int64
MECHANISMS = ("laplace", "gaussian")


# ------------------------------------------------------------------------------- privacy
def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _gaussian_delta(sigma: float, sensitivity: float, epsilon: float) -> float:
    """Exact delta of the Gaussian mechanism at epsilon (Balle & Wang 2018, Theorem 8)."""
    a = sensitivity / (2.0 * sigma)
    b = epsilon * sigma / sensitivity
    return _normal_cdf(a - b) - math.exp(epsilon) * _normal_cdf(-a - b)


def _check_positive(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def _check_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


def gaussian_epsilon(sigma: float, sensitivity: float, delta: float) -> float:
    """Smallest epsilon for which ``N(0, sigma^2)`` noise on a query of L2 ``sensitivity`` is
    ``(epsilon, delta)``-DP (analytic Gaussian mechanism, exact up to 1e-9 relative)."""
    sigma = _check_positive(sigma, "sigma")
    sensitivity = _check_positive(sensitivity, "sensitivity")
    delta = _check_delta(delta)
    if _gaussian_delta(sigma, sensitivity, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while _gaussian_delta(sigma, sensitivity, hi) > delta:
        if hi >= _MAX_EPSILON:
            raise ValueError(f"sigma = {sigma} gives epsilon above {_MAX_EPSILON} at {delta=}")
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-9 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _gaussian_delta(sigma, sensitivity, mid) > delta else (lo, mid)
    return hi


def gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest sigma making the Gaussian mechanism ``(epsilon, delta)``-DP (analytic)."""
    epsilon = _check_positive(epsilon, "epsilon")
    sensitivity = _check_positive(sensitivity, "sensitivity")
    delta = _check_delta(delta)
    if epsilon > _MAX_EPSILON:
        raise ValueError(f"epsilon must be at most {_MAX_EPSILON}, got {epsilon!r}")
    lo, hi = 1e-6 * sensitivity, sensitivity
    while _gaussian_delta(hi, sensitivity, epsilon) > delta:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-9 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _gaussian_delta(mid, sensitivity, epsilon) > delta else (lo, mid)
    return hi


@dataclass(frozen=True)
class PrivacyStatement:
    """What a release cost, next to the release.

    ``mechanism`` "laplace" (``noise`` holds the scale b of each delta release, ``sensitivity``
    is L1) or "gaussian" (``noise`` holds each sigma, ``sensitivity`` is L2); one entry per
    accumulated delta release over disjoint record sets. ``epsilon``/``delta``: the guarantee
    against ``neighbouring`` (parallel composition: the least private part; ``epsilon`` None for
    a Gaussian release made without a delta: account it with a :class:`PrivacyLedger`).
    """

    mechanism: str
    noise: tuple[float, ...]
    sensitivity: float
    neighbouring: str
    epsilon: float | None
    delta: float

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {MECHANISMS}, got {self.mechanism!r}")
        if not self.noise or not all(math.isfinite(v) and v > 0 for v in self.noise):
            raise ValueError(f"noise must hold positive noise scales, got {self.noise!r}")
        _check_positive(self.sensitivity, "sensitivity")
        if self.epsilon is not None and not (math.isfinite(self.epsilon) and self.epsilon >= 0):
            raise ValueError(f"epsilon must be None or a finite number >= 0, got {self.epsilon!r}")
        if not 0.0 <= self.delta < 1.0:
            raise ValueError(f"delta must be in [0, 1), got {self.delta!r}")

    @property
    def noise_variance(self) -> float:
        """Variance of the noise on every counter: the parts' variances add (each part about
        ``2 b^2`` or ``sigma^2``, plus 1/12 for rounding to an integer)."""
        factor = 2.0 if self.mechanism == "laplace" else 1.0
        return float(sum(factor * s * s + 1.0 / 12.0 for s in self.noise))

    @property
    def releases(self) -> int:
        """Number of delta releases accumulated."""
        return len(self.noise)

    def combine(self, other: PrivacyStatement) -> PrivacyStatement:
        """Statement of the sum of two releases of disjoint record sets."""
        for name in ("mechanism", "sensitivity", "neighbouring"):
            if getattr(self, name) != getattr(other, name):
                raise ValueError(f"cannot accumulate releases: {name} differs")
        eps = (
            None
            if self.epsilon is None or other.epsilon is None
            else max(self.epsilon, other.epsilon)
        )
        return PrivacyStatement(
            self.mechanism, self.noise + other.noise, self.sensitivity, self.neighbouring, eps,
            max(self.delta, other.delta),
        )  # fmt: skip

    def record(self, ledger: PrivacyLedger, label: str = "RACE sketch release") -> None:
        """Charge every part to ``ledger`` (sequential composition: safe, possibly loose)."""
        for noise in self.noise:
            if self.mechanism == "laplace":
                ledger.laplace(noise, self.sensitivity, label=label, neighbouring=self.neighbouring)
            else:
                ledger.gaussian(
                    noise, self.sensitivity, label=label, neighbouring=self.neighbouring
                )


def _neighbouring(weight_bound: int) -> str:
    if weight_bound == 1:
        return ADD_REMOVE
    return f"add/remove one record of |weight| <= {weight_bound}"


def _row_groups(rows: int, groups: int) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Contiguous split of the rows into ``groups`` nearly equal groups: (group of row, sizes)."""
    sizes = np.full(groups, rows // groups, dtype=np.int64)
    sizes[: rows % groups] += 1
    return np.repeat(np.arange(groups, dtype=np.int64), sizes), sizes.astype(np.float64)


# --------------------------------------------------------------------------------- queries
class RaceQueries:
    """Queries shared by a sketch and a release (Algorithm 2). Subclasses hold the counters."""

    family: LshFamily
    width: int
    weight_bound: int
    backend: str
    _counts: NDArray[Any]

    @property
    def rows(self) -> int:
        """R, the number of rows (independent hash functions)."""
        return self.family.rows

    @property
    def counts(self) -> NDArray[Any]:
        """The R x W counters (a read-only view)."""
        view = self._counts.view()
        view.setflags(write=False)
        return view

    def estimated_size(self) -> float:
        """``N_hat = sum of all counters / R`` (the optional normalisation of Algorithm 2)."""
        return float(self._counts.sum()) / self.rows

    def columns(self, Q: npt.ArrayLike) -> NDArray[np.int64]:
        """Column ``l_r(q) mod W`` of every query in every row (``int64[n, R]``)."""
        return np.mod(self.family.hash(Q).astype(np.int64), self.width)

    def query(
        self,
        Q: npt.ArrayLike,
        estimator: str = "mean",
        normalize: bool = False,
        groups: int | None = None,
    ) -> NDArray[np.float64]:
        """Estimate ``f_D(q)`` (or the KDE ``f_D(q)/N_hat`` if ``normalize``) per query row.

        ``"mean"``: the average of the R row estimates (Algorithm 2); each row is unbiased for
        the kernel sum plus the mod-W collisions, variance <= ``f~^2`` (Theorem 2.5) plus the
        release noise. ``"median_of_means"``: the median of ``groups`` (default 24) group means;
        with ``groups = 8 ln(1/delta)`` it is within ``sqrt(32 sigma^2 ln(1/delta)/R)`` of the
        mean with probability ``1 - delta`` (Lemma 3.3, Theorem 3.4).
        """
        points = as_points(Q, self.family.dim, "Q")
        if estimator == "mean" and not normalize:
            fast = mean_of_rows(self.family, points, self._counts, self.backend)
            if fast is not None:
                return fast
        estimate: NDArray[np.float64]
        if estimator == "mean":
            estimate = gather_sums(self.family, points, self._counts, _ALL_ROWS, 1, self.backend)[0]
            estimate /= self.family.rows
        elif estimator == "median_of_means":
            k = min(self.rows, DEFAULT_GROUPS) if groups is None else groups
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.rows:
                raise ValueError(f"groups must be an integer in [1, {self.rows}], got {groups!r}")
            row_group, sizes = _row_groups(self.rows, k)
            sums = self._group_sums(points, row_group, k)
            estimate = np.asarray(np.median(sums / sizes[:, None], axis=0), np.float64)
        else:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
        if normalize:
            size = self.estimated_size()
            if not size > 0:
                raise ValueError(f"cannot normalize: estimated size N_hat = {size} is not positive")
            estimate = estimate / size
        return estimate

    def _group_sums(
        self, points: NDArray[np.float32], row_group: NDArray[np.int64], groups: int
    ) -> NDArray[np.float64]:
        return gather_sums(self.family, points, self._counts, row_group, groups, self.backend)

    def _mismatch(self, other: RaceQueries) -> str | None:
        """Which public parameter differs from ``other`` (None when compatible)."""
        mine, theirs = self.family, other.family
        checks: Sequence[tuple[str, object, object]] = (
            ("families", mine.name, theirs.name),
            ("dimensions", mine.dim, theirs.dim),
            ("rows", mine.rows, theirs.rows),
            ("widths", self.width, other.width),
            ("seeds", mine.seed, theirs.seed),
            ("hash parameters", mine.params(), theirs.params()),
            ("weight bounds", self.weight_bound, other.weight_bound),
        )
        for name, a, b in checks:
            if a != b:
                return f"{name} differ ({a!r} != {b!r})"
        return None


# ---------------------------------------------------------------------------------- sketch
def _check_width(width: object) -> int:
    if isinstance(width, bool) or not isinstance(width, int | np.integer):
        raise ValueError(f"width must be a positive integer, got {width!r}")
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"width must be in [1, {MAX_WIDTH}], got {width!r}")
    return int(width)


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
        self.width = _check_width(width)
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
        epsilon = _check_positive(epsilon, "epsilon")
        scale = self.l1_sensitivity / epsilon
        noise = rng.laplace(0.0, scale, size=self._counts.shape)
        statement = PrivacyStatement(
            "laplace", (scale,), self.l1_sensitivity, _neighbouring(self.weight_bound), epsilon, 0.0
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
        sigma = _check_positive(sigma, "sigma")
        eps = None if delta is None else gaussian_epsilon(sigma, self.l2_sensitivity, delta)
        noise = rng.normal(0.0, sigma, size=self._counts.shape)
        statement = PrivacyStatement(
            "gaussian", (sigma,), self.l2_sensitivity, _neighbouring(self.weight_bound), eps,
            0.0 if delta is None else float(delta),
        )  # fmt: skip
        return RaceRelease(self, self._counts + noise, statement)

    def to_bytes(self) -> bytes:
        """One msgpack frame (``race.sketch`` body) of the project's codec."""
        return encode(_envelope(RaceSketchBody(**_family_fields(self), counts=self._counts)))

    @classmethod
    def from_bytes(cls, data: bytes, backend: str = "auto") -> RaceSketch:
        """Inverse of :meth:`to_bytes`; any bad frame raises ``RemoteProtocolError``."""
        body = _body_of(data, RaceSketchBody, "<i8")
        sketch = cls(_family_of(body), body.width, weight_bound=body.weight_bound, backend=backend)
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
        s = self.statement
        body = RaceReleaseBody(
            **_family_fields(self), counts=self._counts, mechanism=s.mechanism, noise=s.noise,
            sensitivity=s.sensitivity, neighbouring=s.neighbouring, epsilon=s.epsilon,
            delta=s.delta,
        )  # fmt: skip
        return encode(_envelope(body))

    @classmethod
    def from_bytes(cls, data: bytes, backend: str = "auto") -> RaceRelease:
        """Inverse of :meth:`to_bytes`; any bad frame raises ``RemoteProtocolError``."""
        body = _body_of(data, RaceReleaseBody, "<i8")
        template = RaceSketch(
            _family_of(body), body.width, weight_bound=body.weight_bound, backend=backend
        )
        try:
            statement = PrivacyStatement(
                body.mechanism, body.noise, body.sensitivity, body.neighbouring, body.epsilon,
                body.delta,
            )  # fmt: skip
        except ValueError as exc:
            raise RemoteProtocolError(f"{body.KIND}: {exc}") from None
        return cls(template, body.counts, statement)


# ------------------------------------------------------------------------------ wire bodies
@register("race.sketch")
@dataclass(frozen=True, slots=True)
class RaceSketchBody(Body):
    """A RACE sketch: the public family parameters and the int64 counters (rows x width)."""

    family: str
    dim: int
    rows: int
    width: int
    seed: int
    bits: int
    weight_bound: int
    bandwidth: float | None
    counts: NDArray[Any]


@register("race.release")
@dataclass(frozen=True, slots=True)
class RaceReleaseBody(Body):
    """A released sketch: family parameters, noisy int64 counters and the privacy statement."""

    family: str
    dim: int
    rows: int
    width: int
    seed: int
    bits: int
    weight_bound: int
    bandwidth: float | None
    counts: NDArray[Any]
    mechanism: str
    noise: tuple[float, ...]
    sensitivity: float
    neighbouring: str
    epsilon: float | None
    delta: float


def _check_body_counts(body: RaceSketchBody | RaceReleaseBody, dtype: str) -> None:
    shape = (body.rows, body.width)
    if body.counts.dtype.str != dtype or body.counts.shape != shape:
        raise ValueError(f"counts must be {dtype} of shape {shape}, got {body.counts.shape}")
    if body.weight_bound < 1:
        raise ValueError(f"weight_bound must be positive, got {body.weight_bound}")
    _check_width(body.width)


def _family_fields(sketch: RaceQueries) -> dict[str, Any]:
    f = sketch.family
    return {
        "family": f.name, "dim": f.dim, "rows": f.rows, "width": sketch.width, "seed": f.seed,
        "bits": f.bits, "weight_bound": sketch.weight_bound,
        "bandwidth": getattr(f, "bandwidth", None),
    }  # fmt: skip


def _family_of(body: RaceSketchBody | RaceReleaseBody) -> LshFamily:
    try:
        return make_family(
            body.family, body.dim, body.rows, body.seed, bandwidth=body.bandwidth, bits=body.bits
        )
    except ValueError as exc:
        raise RemoteProtocolError(f"{body.KIND}: {exc}") from None


def _envelope(body: Body) -> Message:
    return Message(run="race", round=0, sender="sketch", recipient="sketch", seq=0, body=body)


def _body_of(data: bytes, kind: type[Any], dtype: str) -> Any:
    """Decode a frame of body ``kind`` and check what the codec cannot: counter dtype and shape,
    width and weight bound (semantic checks live here, not in the body, so that the codec's
    property tests can build arbitrary bodies)."""
    body = decode(data).body
    if not isinstance(body, kind):
        raise RemoteProtocolError(f"kind: expected {kind.KIND}, got {body.KIND}")
    try:
        _check_body_counts(body, dtype)
    except ValueError as exc:
        raise RemoteProtocolError(f"{body.KIND}: {exc}") from None
    return body
