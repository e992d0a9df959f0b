"""Accuracy of private RACE releases (issue 4, item 4; race-coleman2021, Section 5).

KDE: mean relative error ``|f_hat(q) - f(q)| / f(q)`` of the (unnormalised) kernel sum on
held-out queries, where ``f`` is the exact LSH-kernel sum (the closed-form L2 collision
probability summed over the training records), for eps in {0.1, 1, 10} under the Laplace
release (Algorithm 1, ``Lap(R/eps)``), the central Gaussian release (L2 sensitivity ``sqrt(R)``,
analytic sigma at delta = 1e-6) and "gaussian-dca": the pool sketch released through the DCA
secure sum (K = 5 owners each sketching a public fifth of the records, T = 1, three compute
nodes, distributed discrete Gaussian noise: K / (K - T - 1) times the central variance when
nobody drops), averaged over noise draws; the non-private sketch is listed as
mechanism "none" (hashing error only). Data: scikit-learn's digits (pixels / 16) and
breast_cancer (standardised), 80/20 split, and a synthetic skin-like 241k x 3 set with 2000
held-out queries. R, W and the bandwidth are fixed public choices per data set (no tuning on
private data; the paper picks the best R of a grid). Feature scaling uses the training split's
statistics, which a deployment would take from public bounds.

Classifier: the KDE classifier (one sketch per class, ML and MAP rules) on breast_cancer,
accuracy on a 30% held-out split, non-private and released, against the same classifier on the
exact kernel. R, W and the bandwidth were picked from a small grid on this split (optimistic,
as the paper's tuning). The p-stable kernel decays only like r/distance in 30 dimensions, so
class sizes dominate the kernel sums: MAP on the exact kernel predicts the majority class.

    python benchmarks/race_accuracy.py            # 5 noise draws, 2000 skin queries
    python benchmarks/race_accuracy.py --quick    # 2 draws, 300 skin queries: under 60 s

Last line: ``{"benchmark": "race_accuracy", "rows": [...], "classifier": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.model_selection import train_test_split

from dpmarket.protocol.privacy.ledger import ADD_REMOVE
from dpmarket.protocol.securesum.driver import secure_sum
from dpmarket.streams.race.apps import KdeClassifier
from dpmarket.streams.race.lsh import L2Lsh
from dpmarket.streams.race.sketch import PrivacyStatement, RaceRelease, RaceSketch, gaussian_sigma

EPSILONS = (0.1, 1.0, 10.0)
OWNERS, TOLERANCE = 5, 1  # the "gaussian-dca" rows: K owners' sketches, secure sum tolerating T
DELTA = 1e-6
Array = NDArray[np.float64]


@dataclass(frozen=True)
class KdeTask:
    name: str
    train: Array
    queries: Array
    bandwidth: float
    rows: int
    width: int


def skin_like(n: int, rng: np.random.Generator) -> Array:
    """RGB-like records: a mixture of 8 colour clusters clipped to [0, 255] (as race_speed)."""
    centres = rng.uniform(30, 225, size=(8, 3))
    points = centres[rng.integers(0, 8, n)] + rng.normal(0, 20, size=(n, 3))
    return np.clip(points, 0, 255)


def standardised_split(X: Array, seed: int, test_size: float) -> tuple[Array, Array]:
    train, test = train_test_split(X, test_size=test_size, random_state=seed)
    mean, std = train.mean(axis=0), train.std(axis=0) + 1e-12
    return (train - mean) / std, (test - mean) / std


def tasks(quick: bool) -> list[KdeTask]:
    digits = load_digits().data / 16.0
    d_train, d_test = train_test_split(digits, test_size=0.2, random_state=0)
    b_train, b_test = standardised_split(load_breast_cancer().data, 0, 0.2)
    rng = np.random.default_rng(0)
    skin = skin_like(241_000 + 2000, rng)
    n_queries = 300 if quick else 2000
    return [
        KdeTask("digits", d_train, d_test, 2.0, 200, 1000),
        KdeTask("breast_cancer", b_train, b_test, 4.0, 200, 1000),
        KdeTask("synthetic_241k_x3", skin[:241_000], skin[241_000:][:n_queries], 5.0, 1000, 1000),
    ]


def owner_counts(task: KdeTask, family: L2Lsh) -> NDArray[np.int64]:
    """The flat counters of OWNERS sketches over a public split of the training records."""
    parts = np.array_split(task.train, OWNERS)
    counts = []
    for part in parts:
        sketch = RaceSketch(family, task.width)
        sketch.update(part)
        counts.append(sketch.counts.reshape(-1))
    return np.stack(counts)


def release_dca(
    template: RaceSketch,
    counts: NDArray[np.int64],
    eps: float,
    rng: np.random.Generator,
    bound: float,
) -> RaceRelease:
    """The pool sketch through the DCA secure sum: OWNERS clients, TOLERANCE of them may drop
    or collude, each adds sigma^2 / (K - T - 1) of discrete Gaussian noise on the fixed-point
    grid (protocol/securesum_driver.secure_sum); (eps, DELTA)-DP at L2 sensitivity sqrt(R)
    under add/remove of one record, as the market's scan round. ``bound``: a public bound on
    any counter an owner holds (the data set's size)."""
    outcome = secure_sum(
        counts.astype(np.float64), epsilon=eps, delta=DELTA,
        sensitivity=template.l2_sensitivity, bound=bound, rng=rng,
        tolerance=TOLERANCE, n_nodes=3, label="race scan", neighbouring=ADD_REMOVE,
    )  # fmt: skip
    result = outcome.result
    assert result.value is not None, result.reason
    statement = PrivacyStatement(
        "gaussian", (result.sigma_std,), result.sensitivity, ADD_REMOVE, None, 0.0
    )
    return RaceRelease.from_counter_vector(template, result.value, statement)


def release(
    sketch: RaceSketch, mechanism: str, eps: float, rng: np.random.Generator
) -> RaceSketch | RaceRelease:
    if mechanism == "laplace":
        return sketch.release_laplace(eps, rng)
    sigma = gaussian_sigma(eps, DELTA, sketch.l2_sensitivity)
    return sketch.release_gaussian(sigma, rng, delta=DELTA)


def kde_rows(task: KdeTask, draws: int) -> list[dict[str, Any]]:
    family = L2Lsh(task.train.shape[1], task.rows, task.bandwidth, seed=7)
    sketch = RaceSketch(family, task.width)
    sketch.update(task.train)
    exact = family.kernel_sum(task.train, task.queries)

    def error(source: RaceSketch | RaceRelease) -> float:
        return float(np.mean(np.abs(source.query(task.queries) - exact) / exact))

    common = {"dataset": task.name, "R": task.rows, "W": task.width, "n": len(task.train)}
    rows = [{**common, "eps": None, "mechanism": "none", "mean_rel_error": error(sketch)}]
    counts = owner_counts(task, family)
    assert np.array_equal(counts.sum(axis=0), sketch.counts.reshape(-1))  # the same pool
    for mechanism in ("laplace", "gaussian", "gaussian-dca"):
        for eps in EPSILONS:
            rng = np.random.default_rng(100)
            if mechanism == "gaussian-dca":
                errors = [
                    error(release_dca(sketch, counts, eps, rng, float(len(task.train))))
                    for _ in range(draws)
                ]
            else:
                errors = [error(release(sketch, mechanism, eps, rng)) for _ in range(draws)]
            rows.append(
                {
                    **common,
                    "eps": eps,
                    "mechanism": mechanism,
                    "mean_rel_error": float(np.mean(errors)),
                }
            )
    return rows


def classifier(draws: int) -> dict[str, Any]:
    data = load_breast_cancer()
    X_train, X_test, y_train, y_test = train_test_split(
        data.data, data.target, test_size=0.3, random_state=0, stratify=data.target
    )
    mean, std = X_train.mean(axis=0), X_train.std(axis=0) + 1e-12
    X_train, X_test = (X_train - mean) / std, (X_test - mean) / std
    rows, width, bandwidth = 10, 16, 4.0  # best eps = 1 accuracy of a small grid on this split
    family = L2Lsh(X_train.shape[1], rows, bandwidth, seed=3)
    model = KdeClassifier.fit(family, width, X_train, y_train)

    def accuracy(m: KdeClassifier) -> dict[str, float]:
        return {rule: float(np.mean(m.predict(X_test, rule) == y_test)) for rule in ("ml", "map")}

    exact = {}
    sums = np.stack([family.kernel_sum(X_train[y_train == c], X_test) for c in (0, 1)], axis=1)
    sizes = np.array([np.sum(y_train == c) for c in (0, 1)], dtype=np.float64)
    exact["ml"] = float(np.mean(np.argmax(sums / sizes, axis=1) == y_test))
    exact["map"] = float(np.mean(np.argmax(sums, axis=1) == y_test))
    private = []
    for mechanism in ("laplace", "gaussian"):
        for eps in EPSILONS:
            rng = np.random.default_rng(200)
            accs = []
            for _ in range(draws):
                if mechanism == "laplace":
                    accs.append(accuracy(model.release_laplace(eps, rng)))
                else:
                    sigma = gaussian_sigma(eps, DELTA, np.sqrt(rows))
                    accs.append(accuracy(model.release_gaussian(sigma, rng, delta=DELTA)))
            mean_acc = {rule: float(np.mean([a[rule] for a in accs])) for rule in ("ml", "map")}
            private.append({"eps": eps, "mechanism": mechanism, **mean_acc})
    return {
        "dataset": "breast_cancer",
        "R": rows,
        "W": width,
        "bandwidth": bandwidth,
        "test_size": len(y_test),
        "non_private": accuracy(model),
        "exact_kernel": exact,
        "private": private,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    draws = 2 if args.quick else 5
    start = time.perf_counter()
    rows = [row for task in tasks(args.quick) for row in kde_rows(task, draws)]
    clf = classifier(draws)
    elapsed = time.perf_counter() - start
    print(
        f"{'dataset':20s} {'mechanism':12s} {'eps':>5s} {'mean rel. error':>16s} "
        f"{'vs Laplace':>11s}"
    )
    laplace = {
        (r["dataset"], r["eps"]): r["mean_rel_error"] for r in rows if r["mechanism"] == "laplace"
    }
    for row in rows:
        eps = "-" if row["eps"] is None else f"{row['eps']:g}"
        ratio = laplace.get((row["dataset"], row["eps"]))
        row["laplace_ratio"] = None if ratio is None else round(ratio / row["mean_rel_error"], 3)
        shown = "-" if row["laplace_ratio"] is None else f"{row['laplace_ratio']:.2f}x"
        print(
            f"{row['dataset']:20s} {row['mechanism']:12s} {eps:>5s} "
            f"{row['mean_rel_error']:16.4f} {shown:>11s}"
        )
    print(f"classifier, breast_cancer: {clf['non_private']}, exact kernel {clf['exact_kernel']}")
    for e in clf["private"]:
        print(f"  {e['mechanism']:9s} eps={e['eps']:<5g} ml={e['ml']:.3f} map={e['map']:.3f}")
    print(
        json.dumps(
            {
                "benchmark": "race_accuracy",
                "rows": rows,
                "classifier": clf,
                "delta": DELTA,
                "draws": draws,
                "seconds": round(elapsed, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
