"""A market run's configuration as typed, immutable inputs: what every later phase reads.

:func:`~dpmarket.actors.config.market.load_market_config` parses and checks a TOML file once
into a :class:`MarketConfig` (frozen): sections, keys and values checked, paths resolved, the
budget stores opened and checked, placements and ``[[requests]]`` parsed. The run reads it and
never the raw TOML.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

from dpmarket.actors.budgets.gate import OwnerBudget
from dpmarket.actors.config.checks import selected_mechanism
from dpmarket.actors.config.placement import Placement
from dpmarket.actors.config.remote import RemoteConfig
from dpmarket.actors.config.requests import Request
from dpmarket.actors.randomness import NoiseSource
from dpmarket.protocol.summary.allocate import plan_allocation
from dpmarket.protocol.summary.curator import CuratorParams
from dpmarket.protocol.summary.params import MARKET_MECHANISMS, ParamError
from dpmarket.protocol.summary.plan import plan_releases
from dpmarket.protocol.summary.random_select import default_budget, plan_random_select
from dpmarket.streams.records.files import Schema

__all__ = ["PLAN_EPS_OWNER", "PLAN_EPS_VALIDATION", "FaultConfig", "MarketConfig"]

PLAN_EPS_OWNER, PLAN_EPS_VALIDATION = 1.0, 3.0  # the default plan's budgets (at [privacy].delta)


@dataclass(frozen=True)
class FaultConfig:
    """Simulated faults: owners killed at an epoch (``kill``: each in an actor of its own;
    ``kill_actor``: the actor process hosting the owner, with every owner co-located in it by
    ``owners_per_actor``), slow owners (seconds of delay per reply), colluding owners, and the
    epoch at which the curator process is killed (then resumed)."""

    kill: dict[str, int] = field(default_factory=dict)
    slow: dict[str, float] = field(default_factory=dict)
    colluders: tuple[str, ...] = ()
    kill_curator_at: int | None = None
    kill_compute: tuple[str, ...] = ()
    kill_actor: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class MarketConfig:
    """Everything public about one market run (K, M, T, p, budgets, kernel, data, faults)."""

    source: str
    name: str = "run"
    seed: int = 0  # public randomness only: simulated data, h1, sketches, exploration
    reproducible_noise: bool = False  # simulation switch: noise from noise_seed (not private)
    noise_seed: int = 0
    out: str = "out/run"
    deadline_seconds: float = 5.0
    owners: int = 5
    compute_nodes: int = 3
    owners_per_actor: int = 1
    dca_shares: str = "derived"
    tolerance: int = 1
    summary_size: int = 50
    data: dict[str, Any] = field(default_factory=dict)
    delta: float = 1e-5
    overrides: dict[str, Any] = field(default_factory=dict)
    faults: FaultConfig = field(default_factory=FaultConfig)
    secure: dict[str, Any] = field(default_factory=dict)
    path: str = "<memory>"
    budgets: dict[str, OwnerBudget] = field(default_factory=dict)  # actors/config/budgets.py
    consumer_budget: OwnerBudget | None = None  # the validation set's store and cap
    placement: dict[str, Placement] = field(default_factory=dict)  # [owners.NAME] (placement.py)
    requests: tuple[Request, ...] = ()  # [[requests]]: consumers' purchases (requests.py)
    schema: Schema | None = None  # a files market's record schema, checked once at parse
    written_data: dict[str, Any] = field(default_factory=dict)  # [data] as the file wrote it
    remote: RemoteConfig | None = None  # [remote]: parties that are agents (config/remote.py)
    text: str = ""  # the TOML text parsed (journaled by a run: actors/config/journaled.py)
    sets: tuple[str, ...] = ()  # the --set overrides applied on top of ``text``, in order

    @property
    def noise(self) -> NoiseSource:
        """Where the run's noise generators come from: OS entropy unless the simulation switch
        ``[run].reproducible_noise`` is on (see actors/randomness.py)."""
        if self.reproducible_noise:
            return NoiseSource.reproducible(self.noise_seed)
        return NoiseSource.secure()

    @property
    def owner_names(self) -> tuple[str, ...]:
        return tuple(f"owner-{k + 1}" for k in range(self.owners))

    def curator_params(self, gamma: float, m: int) -> CuratorParams:
        """The curator's parameters for a validation set of ``m`` points: the recommended
        mechanism's plan, with the config's ``[summary]`` overrides on top.

        The plan (protocol/summary/plan.py ``plan_releases``: herding, every bidder asked,
        oversample then select; eps_owner 1 and eps_validation 3 at ``[privacy].delta``) gives
        d (from m), the validation noise, clip norm and ``max_epochs`` (from p). A
        ``[summary].eps_validation`` re-plans the Gaussian validation release at that budget.
        The mechanism (``[summary].mechanism``, actors/config/checks.py ``selected_mechanism``):
        allocate-select (``mechanism = "allocate-select"``, ``allocate = true``, or a
        ``max_points`` or an allocation key without ``allocate = false``) adds its plan
        (``max_points`` 1.5 p unless given; the histogram's noise spends eps_owner);
        random-select (``mechanism = "random-select"``, and the default: no ``[summary]``, or
        one without a steering key) adds its plan (``max_points`` the default budget (K + 1) p
        unless given; no summary or validation release, protocol/summary/random_select.py).
        """
        eps_validation = self.overrides.get("eps_validation", PLAN_EPS_VALIDATION)
        if (
            isinstance(eps_validation, bool)
            or not isinstance(eps_validation, int | float)
            or not (math.isfinite(eps_validation) and eps_validation > 0)
        ):
            raise ParamError(
                "eps_validation", f"expected a finite number > 0, got {eps_validation!r}"
            )
        plan = plan_releases(
            max(2, self.summary_size),
            m,
            self.owners,
            PLAN_EPS_OWNER,
            eps_validation,
            self.delta,
            summary="herding",
            auction="all",
            select=True,
        )
        base = CuratorParams(
            p=self.summary_size,
            gamma=gamma,
            h1_seed=self.seed,
            phase_timeout=self.deadline_seconds,
            max_lost=self.tolerance,
            known_colluders=len(self.faults.colluders),
        )
        extra: dict[str, Any] = {}
        mechanism = selected_mechanism(self.overrides)
        if mechanism not in MARKET_MECHANISMS:
            raise ParamError("mechanism", f"expected one of {list(MARKET_MECHANISMS)}, got "
                             f"{self.overrides.get('mechanism')!r}")  # fmt: skip
        budget = self.overrides.get("max_points")
        p = max(2, self.summary_size)
        budget = budget if isinstance(budget, int) and budget >= p else None
        if mechanism == "allocate-select":  # summary/allocate.py
            rule = "mixture" if self.overrides.get("allocation_rule") == "mixture" else "histogram"
            extra = plan_allocation(PLAN_EPS_OWNER, self.delta, p, budget, rule)
        elif mechanism == "random-select":  # summary/random_select.py
            extra = plan_random_select(p, budget or default_budget(p, self.owners))
        flags = {"random_purchase": mechanism == "random-select",
                 "allocate": mechanism == "allocate-select"}  # fmt: skip
        for key, expected in flags.items():
            given = self.overrides.get(key)
            if isinstance(given, bool) and given != expected:
                raise ParamError(key, f"{key} = {str(given).lower()} contradicts the mechanism "
                                 f"selected, {mechanism} (mechanism names it, or it follows from "
                                 "the other [summary] keys: actors/config/checks.py "
                                 f"selected_mechanism); {key} = {str(expected).lower()} passes",
                                 passing=(key, expected))  # fmt: skip
        overrides = {k: v for k, v in self.overrides.items() if k != "mechanism"}
        return dataclasses.replace(base, **(plan.overrides() | extra | overrides))

    def for_request(self, request: Request) -> MarketConfig:
        """The market config of one request: run ``RUN.NAME`` (its actors, session and outputs),
        its files, p, summary overrides and consumer; every owner's store and cap unchanged. A
        reproducible simulation keys each request's noise from its own public seed (distinct
        requests never replay each other's noise)."""
        files = {"validation": request.validation, "seed_set": request.seed_set}
        own = {key: path for key, path in files.items() if path is not None}
        noise_seed = self.noise_seed
        if self.reproducible_noise:
            digest = hashlib.sha256(f"{self.noise_seed}:{request.name}".encode()).digest()
            noise_seed = int.from_bytes(digest[:4], "little")
        return dataclasses.replace(
            self,
            name=f"{self.name}.{request.name}",
            data=self.data | own,
            written_data=self.written_data | own if self.written_data else {},
            summary_size=request.summary_size or self.summary_size,
            overrides=self.overrides | request.summary,
            consumer_budget=request.consumer or self.consumer_budget,
            noise_seed=noise_seed,
            requests=(),
        )

    def public_record(self) -> dict[str, Any]:
        """The configuration as recorded in report.json (all of it is public)."""
        record = dataclasses.asdict(self)
        record["faults"] = dataclasses.asdict(self.faults)
        # [data] as written (paths as the operator gave them, not the driver's absolute ones);
        # the schema is derived from it
        record["data"] = dict(self.written_data or self.data)
        for derived in ("schema", "written_data", "text", "sets"):
            record.pop(derived)
        for key in ("budgets", "consumer_budget"):  # caps are public, stores' paths are not
            record[key] = _caps(record[key])
        record["requests"] = [r.public() for r in self.requests]
        if self.remote is not None:  # who is remote and how they are admitted (no key paths)
            record["remote"] = {
                "owners": list(self.remote.owners),
                "nodes": list(self.remote.nodes),
                "fingerprints": dict(self.remote.fingerprints),
                "listen": self.remote.listen,
            }
        return record


def _caps(value: Any) -> Any:
    """Budgets as report.json records them: without the stores' paths."""
    if value is None or "ledger" in value:
        return None if value is None else {k: v for k, v in value.items() if k != "ledger"}
    return {name: _caps(b) for name, b in value.items()}
