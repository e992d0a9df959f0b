"""The secure-sum phases of a market run (actors/market.py drives them before the epochs).

The operator's side of the DCA: compute-node actors and their keys (each node's key made here
and handed to its actor only; fingerprints and owners' keys pinned directly, never through the
curator that relays), the normalise and scan rounds through the curator's hub (actors/dca.py),
and the standardisation h1 uses afterwards (post-processing of the normalise release).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from dpmarket.actors.config import MarketConfig
from dpmarket.actors.dca import moments_sensitivity
from dpmarket.actors.runner import OwnerInputs, RayMarket, actor_options, unique_actors
from dpmarket.streams.synthetic import median_heuristic_gamma

__all__ = ["progress", "secure_phases", "standardize"]


def progress(line: str) -> None:
    print(f"\r{line:<78}", end="", file=sys.stderr, flush=True)


def secure_phases(
    config: MarketConfig, inputs: OwnerInputs, gamma: float, market: RayMarket, snapshot: Any
) -> dict[str, Any]:
    """Spawn the compute nodes and run normalise + scan through the curator's hub; with
    ``[privacy].refresh_every`` the nodes stay up for the refresh rounds (actors/refresh.py)."""
    import ray

    from dpmarket.protocol.securesum.driver import _auto_frac_bits
    from dpmarket.protocol.securesum.spec import DcaConfig

    secure = config.secure
    if not secure["enabled"] or snapshot is not None:
        return {"skipped": "disabled" if not secure["enabled"] else "resumed run"}
    owners = list(inputs.owners)
    k = inputs.validation.shape[1]
    bound = float(config.data.get("bound", 10.0))
    n_max = float(config.data.get("n_points", 1_000_000))
    value_bound = n_max * max(1.0, bound, bound**2)
    rows, width = secure["rows"], secure["width"]
    delta = config.delta
    frac = min(
        _auto_frac_bits(len(owners), d, eps, delta, sens, value_bound, config.tolerance, "analytic")
        for d, eps, sens in (
            (2 * k + 1, secure["eps_normalise"], moments_sensitivity(k, bound)),
            (rows * width, secure["eps_scan"], float(np.sqrt(rows))),
            (rows * width, secure["eps_refresh"], float(np.sqrt(rows))),
        )
    )
    nodes = tuple(f"compute-{i + 1}" for i in range(config.compute_nodes))
    dca = DcaConfig(
        f"{config.name}-dca",
        tuple(owners),
        nodes,
        tolerance=config.tolerance,
        bound=value_bound,
        frac_bits=frac,
        shares=config.dca_shares,
        colluders=tuple(config.faults.colluders),  # they count against T in every round
    )
    handles = _spawn_nodes(dca, market)
    plan = {
        "config": dca,
        "behaviours": {o: "withhold" for o in config.faults.colluders},
        "n_features": k,
        "bound": bound,
        "eps_normalise": secure["eps_normalise"],
        "eps_scan": secure["eps_scan"],
        "refresh_every": secure["refresh_every"],
        "eps_refresh": secure["eps_refresh"],
        "delta": delta,
        "timeout": max(2.0, config.deadline_seconds),
        "sketch": {
            "family": "l2",
            "rows": rows,
            "width": width,
            "seed": config.seed,
            "bandwidth": secure.get("bandwidth", 1.0 / np.sqrt(gamma)),
        },
    }
    for name in config.faults.kill_compute:  # simulated compute-node crash
        if name in handles:
            ray.kill(handles[name], no_restart=True)
    progress("owners: compiling sketch kernels")
    ray.get([h.warm_up.remote() for h in unique_actors(market.owners)])
    progress("secure sums: normalise and scan")
    market.compute_nodes = handles  # killed with the market
    result: dict[str, Any] = ray.get(
        market.curator.secure_phases.remote(handles, market.owners, plan)
    )
    if not secure["refresh_every"]:  # no refresh rounds later: the nodes can go now
        for handle in handles.values():
            ray.kill(handle)
        market.compute_nodes = {}
    print(file=sys.stderr)
    return result


def _spawn_nodes(dca: Any, market: RayMarket) -> dict[str, Any]:
    """The operator's key handling: each compute node's X25519 key is made here and handed to
    its actor only; its SHA-256 fingerprint goes to every owner directly (never through the
    curator, which relays the keys); each owner's key is pinned at the nodes the same way."""
    import ray

    from dpmarket.actors.compute import ComputeNodeActor
    from dpmarket.protocol.securesum.sealing import generate_keypair, key_fingerprint

    owners = market.owners
    publics = ray.get([owners[o].dca_identity.remote(o) for o in dca.clients])
    client_keys = dict(zip(dca.clients, publics, strict=True))
    handles, pins = {}, {}
    for name in dca.nodes:
        private, public = generate_keypair()
        pins[name] = key_fingerprint(public)
        handles[name] = ComputeNodeActor.options(  # type: ignore[attr-defined]
            **actor_options(market.run_id, name)
        ).remote(dca, name, private.private_bytes_raw(), client_keys)
    ray.get([owners[o].dca_pin.remote(o, pins) for o in dca.clients])
    return handles


def standardize(
    config: MarketConfig, inputs: OwnerInputs, market: RayMarket, secure: Any, snapshot: Any
) -> dict[str, Any]:
    """Standardise the features h1 hashes with the normalise round's DP means and spreads.

    Post-processing of a release every owner was already charged for; the spreads are floored
    at 1e-3 of the public clip bound so a (noisy) constant feature cannot blow up. The kernel
    width is then the median heuristic on the public seed set in standardised units, unless
    the config fixes ``[data].gamma``.
    """
    import ray

    normalise = secure.get("normalise", {}) if isinstance(secure, dict) else {}
    if snapshot is not None:
        return {"applied": False, "reason": "resumed run: the journal holds the standardisation"}
    if not config.secure["standardize"] or normalise.get("status") != "released":
        reason = "disabled" if not config.secure["standardize"] else "no normalise release"
        return {"applied": False, "reason": reason}
    bound = float(config.data.get("bound", 10.0))
    center = np.asarray(normalise["mean"], dtype=np.float64)
    scale = np.maximum(np.asarray(normalise["std"], dtype=np.float64), 1e-3 * bound)
    if "gamma" in config.data:
        gamma = float(config.data["gamma"])
    else:
        gamma = median_heuristic_gamma((inputs.seed_set - center) / scale)
    ray.get(market.curator.standardize.remote(center.tolist(), scale.tolist(), gamma))
    return {"applied": True, "center": center.tolist(), "scale": scale.tolist(), "gamma": gamma}
