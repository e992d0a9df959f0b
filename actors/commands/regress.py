"""``dpmarket regress``: DP Bayesian linear regression over clients' records via the DCA.

Each record is one client (as in the DCA paper). The fit (the paper's Algorithm 2, with or
without projection) takes its sums through the secure sum with sealed shares over
``--nodes`` compute nodes, tolerating ``--colluders``; it prints the test MAE beside the
non-private fit and the privacy spent (ledger, dp-accounting PLD).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from typing import Any

import numpy as np

from dpmarket.actors.config.market import ConfigError
from dpmarket.actors.randomness import NOISE_WARNING, NoiseSource, public_generator
from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.regression.dca import fit_dca
from dpmarket.protocol.regression.fits import fit_nonprivate
from dpmarket.protocol.regression.model import RegressionConfig

__all__ = ["add_regress_parser"]


def load_records(name: str) -> tuple[np.ndarray, np.ndarray]:
    if name == "diabetes":
        from sklearn.datasets import load_diabetes

        x, y = load_diabetes(return_X_y=True)
        # public preprocessing of a public data set (as in the paper): each column to a range
        # of 10, centred
        x = (x - x.mean(axis=0)) / np.maximum(np.ptp(x, axis=0), 1e-12) * 10
        y = (y - y.mean()) / max(float(np.ptp(y)), 1e-12) * 10
    else:
        try:
            with warnings.catch_warnings():  # an empty file: refused below, by name
                warnings.simplefilter("ignore", UserWarning)
                raw = np.loadtxt(name, delimiter=",", ndmin=2)
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"--data {name}: not UTF-8 text (byte {exc.start}); expected a numeric CSV"
            ) from None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--data {name}: cannot read a numeric CSV ({exc})") from None
        if raw.size == 0:
            raise ConfigError(f"--data {name}: holds no records")
        if raw.shape[1] < 2:
            raise ConfigError(f"--data {name}: need feature columns and a last target column")
        # private records: no statistic of the data may shape them (a mean or range computed
        # from every record would let one record move all the others); the fit clips each
        # record to the public --feature-bound / --target-bound instead
        x, y = raw[:, :-1], raw[:, -1]
        if not (np.isfinite(x).all() and np.isfinite(y).all()):
            raise ConfigError(f"--data {name}: non-finite values")
    return x, y


def _check_args(args: argparse.Namespace) -> None:
    """Every option in range before any data is read or noise drawn, named in the message."""
    finite = {"--eps": args.eps, "--feature-bound": args.feature_bound}
    finite["--target-bound"] = args.target_bound
    for flag, value in finite.items():
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{flag}: expected a finite number > 0, got {value!r}")
    for flag, value in (("--delta", args.delta), ("--test-fraction", args.test_fraction)):
        if not 0 < value < 1:
            raise ConfigError(f"{flag}: expected a number in (0, 1), got {value!r}")
    if args.nodes < 2:
        raise ConfigError(f"--nodes: expected an integer >= 2 compute nodes, got {args.nodes}")
    if args.colluders < 0:
        raise ConfigError(f"--colluders: expected an integer >= 0, got {args.colluders}")


def _regress(args: argparse.Namespace) -> int:
    _check_args(args)
    if args.reproducible_noise and args.data != "diabetes":
        raise ConfigError(
            f"--reproducible-noise: refused with --data {args.data} (noise from a public seed "
            "would make the released statistics of private records reversible)"
        )
    x, y = load_records(args.data)
    order = public_generator(args.seed).permutation(len(x))  # the public train/test split
    if args.reproducible_noise:
        print(f"dpmarket: WARNING: {NOISE_WARNING}", file=sys.stderr)
        noise = NoiseSource.reproducible(args.seed)
    else:
        noise = NoiseSource.secure()
    rng = noise.generator("regress")
    cut = int(len(x) * (1 - args.test_fraction))
    train, test = order[:cut], order[cut:]
    if len(test) < 1 or len(train) < args.colluders + 2:
        raise ConfigError(
            f"--data {args.data}: {len(x)} records give {len(train)} training clients and "
            f"{len(test)} test records at --test-fraction {args.test_fraction}; the secure sum "
            f"needs at least --colluders + 2 = {args.colluders + 2} clients and a test record"
        )
    cfg = RegressionConfig(feature_bound=args.feature_bound, target_bound=args.target_bound)
    ledger = PrivacyLedger("clients")
    post = fit_dca(
        x[train],
        y[train],
        args.eps,
        args.delta,
        rng,
        projected=not args.no_projection,
        config=cfg,
        ledger=ledger,
        colluders=args.colluders,
        n_nodes=args.nodes,
    )
    exact = fit_nonprivate(x[train], y[train], cfg)
    mae = float(np.median(np.abs(post.predict(x[test]) - y[test])))
    mae_np = float(np.median(np.abs(exact.predict(x[test]) - y[test])))
    spent = ledger.epsilon(args.delta, "pld")
    result: dict[str, Any] = {
        "clients": len(train),
        "test": len(test),
        "projection": not args.no_projection,
        "median_abs_error": mae,
        "median_abs_error_nonprivate": mae_np,
        "epsilon": spent if math.isfinite(spent) else None,
        "delta": args.delta,
        "coefficients": post.mean.tolist(),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{len(train)} clients, {args.nodes} compute nodes, T = {args.colluders}")
        print(f"median |error| on {len(test)} test records: {mae:.3f} (non-private {mae_np:.3f})")
        print(f"privacy spent: epsilon {spent:.3f} at delta {args.delta:g} (PLD)")
    return 0


def add_regress_parser(sub: Any) -> None:
    cmd = sub.add_parser(
        "regress", help="DP Bayesian linear regression via the DCA secure sum", description=__doc__
    )
    cmd.add_argument("--data", default="diabetes", help="'diabetes' or a CSV (target last)")
    cmd.add_argument("--eps", type=float, default=1.0)
    cmd.add_argument("--delta", type=float, default=1e-4)
    cmd.add_argument("--colluders", type=int, default=0, help="T: dropped or colluding clients")
    cmd.add_argument("--nodes", type=int, default=3, help="M: compute nodes")
    cmd.add_argument("--no-projection", action="store_true")
    cmd.add_argument("--test-fraction", type=float, default=0.2)
    cmd.add_argument("--seed", type=int, default=0, help="the public train/test split's seed")
    cmd.add_argument(
        "--feature-bound",
        type=float,
        default=RegressionConfig().feature_bound,
        help="public clip bound of every feature (records are clipped to it, never rescaled)",
    )
    cmd.add_argument(
        "--target-bound",
        type=float,
        default=RegressionConfig().target_bound,
        help="public clip bound of the target",
    )
    cmd.add_argument(
        "--reproducible-noise",
        action="store_true",
        help="simulation only (the bundled diabetes data): noise from --seed, not private",
    )
    cmd.add_argument("--json", action="store_true")
    cmd.set_defaults(func=_regress)
