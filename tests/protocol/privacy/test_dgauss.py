"""Gaussian calibration (classical, analytic) and the discrete Gaussian sampler."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import gaussian_mechanism

from dpmarket.protocol.privacy.dgauss import (
    analytic_sigma,
    classical_sigma,
    client_sigma,
    gaussian_sigma,
    sample_discrete_gaussian,
)


def exact_moments(sigma: float) -> tuple[float, float]:
    """Variance and fourth moment of N_Z(0, sigma^2), by summing the pmf."""
    k = np.arange(-int(40 * sigma) - 40, int(40 * sigma) + 41, dtype=np.float64)
    p = np.exp(-(k**2) / (2 * sigma**2))
    p /= p.sum()
    return float((p * k**2).sum()), float((p * k**4).sum())


def test_classical_sigma_is_eq_1_and_refuses_large_epsilon() -> None:
    assert classical_sigma(0.5, 1e-5, 2.0) == pytest.approx(
        2.0 * math.sqrt(2 * math.log(1.25e5)) / 0.5
    )
    with pytest.raises(ValueError, match="epsilon < 1"):
        classical_sigma(1.0, 1e-5, 1.0)
    with pytest.raises(ValueError, match="delta"):
        classical_sigma(0.5, 0.0, 1.0)


@pytest.mark.parametrize("epsilon", [0.05, 0.5, 1.0, 4.0, 20.0])
@pytest.mark.parametrize("delta", [1e-2, 1e-5, 1e-10])
def test_analytic_sigma_matches_dp_accounting(epsilon: float, delta: float) -> None:
    sigma = analytic_sigma(epsilon, delta, 3.0)
    assert sigma == pytest.approx(
        3.0 * gaussian_mechanism.get_sigma_gaussian(epsilon, delta), rel=1e-6
    )
    # and it really achieves (epsilon, delta): the exact epsilon at that sigma is <= epsilon
    assert gaussian_mechanism.get_epsilon_gaussian(sigma / 3.0, delta) <= epsilon * (1 + 1e-9)
    if epsilon < 1:
        assert sigma < classical_sigma(epsilon, delta, 3.0)


def test_gaussian_sigma_selects_the_method() -> None:
    assert gaussian_sigma(0.5, 1e-5, 1.0, "classical") == classical_sigma(0.5, 1e-5, 1.0)
    assert gaussian_sigma(0.5, 1e-5, 1.0) == analytic_sigma(0.5, 1e-5, 1.0)
    with pytest.raises(ValueError, match="method"):
        gaussian_sigma(0.5, 1e-5, 1.0, "laplace")


def test_client_sigma_is_theorem_1() -> None:
    assert client_sigma(6.0, 13, 3) == pytest.approx(6.0 / 3.0)  # N - T - 1 = 9
    assert client_sigma(2.0, 2, 0) == 2.0
    with pytest.raises(ValueError, match="n_clients"):
        client_sigma(1.0, 4, 3)
    with pytest.raises(ValueError, match="tolerance"):
        client_sigma(1.0, 4, -1)


@pytest.mark.parametrize("sigma", [0.7, 1.0, 4.0, 1e3, 3e9])
def test_sampler_variance_and_mean(sigma: float) -> None:
    """Sample variance within 5 standard errors of the exact one: a factor-2 error in sigma
    (a factor 4 in variance), or even 10% in variance, is far outside."""
    n = 400_000
    y = sample_discrete_gaussian(sigma, n, np.random.default_rng(11))
    var, fourth = exact_moments(sigma) if sigma < 1e4 else (sigma**2, 3 * sigma**4)
    se = math.sqrt((fourth - var**2) / n)
    assert y.dtype == np.int64
    assert abs(float(np.mean(y.astype(np.float64) ** 2)) - var) < 5 * se
    assert 5 * se < 0.1 * var  # the window is narrower than a 10% variance error
    assert abs(float(y.mean())) < 5 * math.sqrt(var / n)


def test_sampler_pmf_matches_the_discrete_gaussian() -> None:
    sigma, n = 1.5, 300_000
    y = sample_discrete_gaussian(sigma, n, np.random.default_rng(5))
    k = np.arange(-6, 7)
    p = np.exp(-(k**2) / (2 * sigma**2))
    p /= np.exp(-(np.arange(-60, 61) ** 2) / (2 * sigma**2)).sum()
    counts = np.array([(y == v).sum() for v in k])
    expected = n * p
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 45.0  # 13 cells: the 1e-5 quantile of chi-square(12) is about 41
    assert (np.abs(y) > 6).sum() < 5 * n * (1 - p.sum()) + 10
    # a continuous Gaussian rounded would put 0.2611 at 0; the discrete one puts 0.2660
    assert abs(counts[6] / n - p[6]) < 5 * math.sqrt(p[6] * (1 - p[6]) / n)


def test_sampler_is_reproducible_and_shaped() -> None:
    a = sample_discrete_gaussian(50.0, (3, 4), np.random.default_rng(9))
    b = sample_discrete_gaussian(50.0, (3, 4), np.random.default_rng(9))
    assert a.shape == (3, 4)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, sample_discrete_gaussian(50.0, (3, 4), np.random.default_rng(10)))
    assert not sample_discrete_gaussian(0.0, 5, np.random.default_rng(0)).any()
    with pytest.raises(ValueError, match="sigma"):
        sample_discrete_gaussian(-1.0, 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match="2\\^48"):
        sample_discrete_gaussian(2.0**49, 3, np.random.default_rng(0))
