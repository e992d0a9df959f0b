"""Audit scenarios for the DCA secure sum (:mod:`.securesum`): colluders in the adversary.

The adversary of Theorem 1 (Heikkilä et al. 2017) is a coalition: ``colluders`` clients that
withhold their noise (behaviour ``"withhold"``), one curious client that knows its own noise
(``"reveal"``: the simulation hands it to the adversary), and knowledge of every value but the
target's. Client 0 is the target and holds -1 (D) or +1 (D'): replace-one, L2 sensitivity 2 on
one coordinate in [-1, 1]. The score is the released sum minus the known values and the curious
client's noise, i.e. ``value_0 + (the honest clients' noise)``: for a Gaussian release that is
the projection onto the difference, the likelihood-ratio statistic.

Correct configuration: the round's tolerance T counts the colluders, so each client adds
variance ``sigma_std^2 / (N - T - 1)`` (Theorem 1) and the N - T - 1 honest clients other than
the curious one still sum to ``sigma_std^2``: the release is exactly the (eps, delta) Gaussian
mechanism the ledger charges (with N = T + 2 only the target's own noise is left: a tight
audit). Broken: ``tolerance = 0`` while the colluders withhold (their noise counted but never
added), or the round run at a larger epsilon than claimed.

Sampling. ``reference`` runs the real protocol (:class:`~.driver.DcaSession`: X25519,
sealing, the codec, the compute nodes and the aggregator), one round per trial (a few ms each);
``sample`` draws the same released distribution vectorised through the same code: the real
calibration (:meth:`DcaConfig.spec`, :meth:`DcaConfig.client_grid_sigma`), the real discrete
Gaussian sampler, fixed-point codec and the colluders' rules (withheld noise is zero, revealed
noise is known). It omits only the secret sharing, which is exact (the shares sum to grid value
plus noise modulo 2^64, and the ring cannot wrap: :meth:`DcaConfig.check_round`).
tests/test_audit.py compares the two distributions.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.privacy.audit import AuditScenario
from dpmarket.protocol.privacy.dgauss import sample_discrete_gaussian
from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.securesum.driver import DcaSession
from dpmarket.protocol.securesum.fixedpoint import grid_sensitivity
from dpmarket.protocol.securesum.spec import DcaConfig, RoundSpec

__all__ = ["securesum_scenario"]

F64 = npt.NDArray[np.float64]
_SENSITIVITY = 2.0  # replace-one on one coordinate in [-1, 1]


def _config(clients: int, tolerance: int, frac_bits: int) -> DcaConfig:
    names = tuple(f"client-{i}" for i in range(clients))
    nodes = ("compute-0", "compute-1", "compute-2")
    return DcaConfig("audit", names, nodes, tolerance=tolerance, bound=1.0, frac_bits=frac_bits)


def _claim(config: DcaConfig, spec: RoundSpec, delta: float) -> float:
    """The epsilon the aggregator's ledger charges for a released round of ``spec``."""
    ledger = PrivacyLedger("dca-clients")
    sens = grid_sensitivity(spec.sensitivity, spec.d, config.frac_bits)
    ledger.gaussian(spec.sigma_std, sens, neighbouring=spec.neighbouring)
    return ledger.epsilon(delta)


def securesum_scenario(
    epsilon: float, claimed_epsilon: float | None = None, clients: int = 6, colluders: int = 4,
    tolerance: int | None = None, delta: float = 1e-5, frac_bits: int = 24,
) -> AuditScenario:  # fmt: skip
    """A secure-sum round at ``epsilon`` with ``colluders`` withholding clients (1..colluders)
    and a curious last client; the round's ``tolerance`` defaults to ``colluders`` (correct).
    The claim is the ledger of the same round at ``claimed_epsilon`` (default ``epsilon``)."""
    if not 0 <= colluders <= clients - 2:
        raise ValueError(f"need 0 <= colluders <= clients - 2, got {colluders}, {clients}")
    tolerance = colluders if tolerance is None else tolerance
    config = _config(clients, tolerance, frac_bits)
    spec = config.spec(1, 1, epsilon, delta, _SENSITIVITY)
    claimed = _claim(
        config, config.spec(1, 1, claimed_epsilon or epsilon, delta, _SENSITIVITY), delta
    )
    withheld = list(range(1, colluders + 1))
    curious = clients - 1
    behaviour = {f"client-{i}": "withhold" for i in withheld}
    behaviour[f"client-{curious}"] = "reveal"
    resolution = config.codec.resolution

    def values(neighbour: bool) -> F64:
        x = np.zeros((clients, 1))
        x[0, 0] = 1.0 if neighbour else -1.0
        return x

    def sample(neighbour: bool, n: int, rng: np.random.Generator) -> F64:
        config.check_round(spec)
        grid = config.codec.to_grid(values(neighbour))[:, 0]
        noise = sample_discrete_gaussian(config.client_grid_sigma(spec), (n, clients), rng)
        noise[:, withheld] = 0  # what Client.contribute does for "withhold"
        ring = (grid.sum() + noise.sum(axis=1)).view(np.uint64)  # no wrap: check_round
        released = config.codec.decode(ring)
        return np.asarray(released - noise[:, curious] * resolution, dtype=np.float64)

    def reference(neighbour: bool, n: int, rng: np.random.Generator) -> F64:
        session = DcaSession(config, batch=1, behaviour=behaviour)
        x, scores = values(neighbour), np.empty(n)
        for r in range(n):
            round_spec = config.spec(r + 1, 1, epsilon, delta, _SENSITIVITY)
            out = session.run_round(round_spec, x, rng)
            if out.value is None:
                raise ValueError(f"the secure sum released nothing: {out.result.reason}")
            known = float(out.revealed[f"client-{curious}"][0]) * resolution
            scores[r] = float(out.value[0]) - known
        return scores

    if claimed_epsilon is not None and claimed_epsilon != epsilon:
        name = f"securesum-eps{epsilon:g}-claimed-{claimed_epsilon:g}"
    elif tolerance < colluders:
        name = "securesum-colluders-uncounted"
    else:
        name = "securesum-gaussian"
    return AuditScenario(
        name, sample, claimed, delta,
        f"DCA secure sum, {clients} clients, {colluders} withholding + 1 curious, T "
        f"{tolerance}, eps {epsilon:g}; vectorised (real calibration, discrete-Gaussian "
        "sampler and codec; shares omitted)",
        reference,
    )  # fmt: skip
