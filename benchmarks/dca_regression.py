"""DP Bayesian linear regression on distributed data (Heikkilä et al. 2017, Section 5, Fig. 2).

Median test MAE over random train/test splits for NP, TA, DDP, TA-proj, DDP-proj and input
perturbation at eps in {0.5, 1, 2, 4}, delta 1e-4; every client holds one record.

Data sets: scikit-learn's bundled ``load_diabetes`` (442 records, d = 10, raw units; 100 test
records per split) and a synthetic heavy-tailed set (student-t features, d = 10, 2000 + 1000).
As in the paper, each column (features and target) is centred and scaled to a range of length
10 using the whole data set (public preprocessing, not private), and the assumed bounds are
[-7.5, 7.5]. MAE is reported in the target's original units. Projection thresholds are a
public function of (n, d, budget), so they are searched once per (data set, eps) on auxiliary
data and shared by every split and by TA-proj and DDP-proj.

    python benchmarks/dca_regression.py            # 200 splits (about 15 s)
    python benchmarks/dca_regression.py --quick    # 10 splits, eps in {0.5, 2}

Last line: ``{"benchmark": "dca_regression", "rows": [{"dataset", "method", "eps",
"mae_median"}, ...]}``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from sklearn.datasets import load_diabetes

from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.regression.fits import METHODS, fit, projection_thresholds
from dpmarket.protocol.regression.model import RegressionConfig

F64 = NDArray[np.float64]
EPSILONS = (0.5, 1.0, 2.0, 4.0)
DELTA = 1e-4


@dataclass(frozen=True)
class Dataset:
    name: str
    x: F64  # centred, range 10 per column
    y: F64
    y_unit: float  # original target units per scaled unit
    n_test: int


def _scale(columns: F64) -> tuple[F64, F64]:
    span = columns.max(axis=0) - columns.min(axis=0)
    return (columns - columns.mean(axis=0)) / span * 10.0, span / 10.0


def diabetes() -> Dataset:
    data = load_diabetes(scaled=False)
    x, _ = _scale(np.asarray(data.data, dtype=np.float64))
    y, unit = _scale(np.asarray(data.target, dtype=np.float64)[:, None])
    return Dataset("diabetes", x, y[:, 0], float(unit[0]), 100)


def synthetic(seed: int = 20170) -> Dataset:
    """Student-t (3 dof) features with correlation 0.3, linear target, R^2 about 0.6."""
    rng = np.random.default_rng(seed)
    n, d = 3000, 10
    cov = 0.7 * np.eye(d) + 0.3
    gauss = rng.multivariate_normal(np.zeros(d), cov, size=n)
    x = gauss / np.sqrt(rng.chisquare(3, size=(n, 1)) / 3)
    beta = rng.normal(size=d)
    signal = x @ beta
    y = signal + rng.normal(0.0, 0.8 * float(np.std(signal)), size=n)
    xs, _ = _scale(x)
    ys, unit = _scale(y[:, None])
    return Dataset("synthetic", xs, ys[:, 0], float(unit[0]), 1000)


def _thresholds(
    data: Dataset, epsilons: tuple[float, ...], seed: int, config: RegressionConfig
) -> dict[float, tuple[float, float]]:
    n_train, d = data.x.shape[0] - data.n_test, data.x.shape[1]
    share = config.std_share
    return {
        eps: projection_thresholds(
            n_train,
            d,
            (1 - share) * eps,
            (1 - share) * DELTA,
            np.random.default_rng([seed, 7, round(eps * 1000)]),
            config,
        )
        for eps in epsilons
    }


def run(
    data: Dataset, epsilons: tuple[float, ...], splits: int, seed: int, config: RegressionConfig
) -> tuple[dict[tuple[str, float], list[float]], dict[tuple[str, float], float]]:
    """Test MAEs per (method, eps) over the splits, and the ledger epsilon of split 0."""
    thresholds = _thresholds(data, epsilons, seed, config)
    maes: dict[tuple[str, float], list[float]] = {}
    spent: dict[tuple[str, float], float] = {}
    for split in range(splits):
        rng = np.random.default_rng([seed, split])
        order = rng.permutation(data.x.shape[0])
        train, test = order[data.n_test :], order[: data.n_test]
        for eps, method in itertools.product(epsilons, METHODS):
            ledger = PrivacyLedger("clients")
            posterior = fit(
                method,
                data.x[train],
                data.y[train],
                eps,
                DELTA,
                rng,
                config,
                ledger,
                thresholds[eps],
            )
            error = np.abs(posterior.predict(data.x[test]) - data.y[test]).mean()
            maes.setdefault((method, eps), []).append(float(error) * data.y_unit)
            if split == 0 and ledger.events:
                spent[(method, eps)] = ledger.epsilon(DELTA)
    return maes, spent


def report(
    data: Dataset,
    epsilons: tuple[float, ...],
    maes: dict[tuple[str, float], list[float]],
    spent: dict[tuple[str, float], float],
) -> list[dict[str, object]]:
    """Print the table for one data set; return its JSON rows."""
    trivial = np.abs(data.y - np.median(data.y)).mean() * data.y_unit
    print(f"{'method':>10}" + "".join(f"{f'eps={e:g}':>11}" for e in epsilons))
    rows: list[dict[str, object]] = []
    for method in METHODS:
        medians = [float(np.median(maes[(method, eps)])) for eps in epsilons]
        print(f"{method:>10}" + "".join(f"{m:11.3f}" for m in medians))
        rows += [
            {"dataset": data.name, "method": method, "eps": eps, "mae_median": round(m, 4)}
            for eps, m in zip(epsilons, medians, strict=True)
        ]
    print(f"{'predict 0':>10}" + f"{trivial:11.3f}" * len(epsilons) + "   (reference)")

    def ratio(a: str, b: str) -> str:
        return ", ".join(
            f"{np.median(maes[(a, e)]) / np.median(maes[(b, e)]):.3f}" for e in epsilons
        )

    print(f"DDP / TA: {ratio('DDP', 'TA')};  DDP-proj / TA-proj: {ratio('DDP-proj', 'TA-proj')}")
    print(f"TA-proj / TA: {ratio('TA-proj', 'TA')};  DDP-proj / DDP: {ratio('DDP-proj', 'DDP')}")
    for method in ("DDP", "DDP-proj", "input"):
        values = ", ".join(f"{spent[(method, e)]:.3f}" for e in epsilons)
        print(f"ledger epsilon at delta {DELTA:g} (PLD, split 0), {method}: {values}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--splits", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calibration", choices=("analytic", "classical"), default="analytic")
    parser.add_argument("--std-share", type=float, default=RegressionConfig().std_share)
    args = parser.parse_args()
    if args.splits < 1:
        parser.error(f"--splits must be >= 1, got {args.splits}")
    splits = 10 if args.quick else args.splits
    epsilons = (0.5, 2.0) if args.quick else EPSILONS
    config = RegressionConfig(calibration=args.calibration, std_share=args.std_share)
    datasets: list[Callable[[], Dataset]] = [diabetes, synthetic]
    rows: list[dict[str, object]] = []
    start = time.perf_counter()
    for make in datasets:
        data = make()
        maes, spent = run(data, epsilons, splits, args.seed, config)
        print(
            f"\n{data.name}: n = {data.x.shape[0]} (test {data.n_test}), d = {data.x.shape[1]}, "
            f"{splits} splits, delta {DELTA}, {args.calibration} Gaussian, std share "
            f"{config.std_share}; median test MAE (target units)"
        )
        rows += report(data, epsilons, maes, spent)
    print(f"\n{time.perf_counter() - start:.1f} s")
    print(json.dumps({"benchmark": "dca_regression", "rows": rows}))


if __name__ == "__main__":
    main()
