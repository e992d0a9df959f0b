"""An owner's secure-sum side: the operator's trust anchors, one session, its contributions.

The owner actor (actors/parties/owner.py) hosts one :class:`OwnerSecureSum` per owner and only
calls it.
Everything the owner trusts for the secure sum comes from the operator (the driver) when the
actor is constructed (:class:`OperatorTrust`): the session's public configuration and the
SHA-256 fingerprints of the compute nodes' keys. The curator, which relays every frame and
holds the actor's handle, can call :meth:`OwnerSecureSum.setup` and ``contribute`` but cannot
change any of it.

Guarantee: every share this owner seals is sealed to a compute-node key whose fingerprint the
operator pinned at construction (no method replaces the pins), within the one session the
operator configured (a second set-up is refused, so a relay cannot start a session under keys
of its choosing), and only for a round the operator's plan admits (its sigma floor, clipping,
sketch shape and count per label), with the noise behaviour the operator set (honest unless
the run simulates a colluder).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from dpmarket.actors.budgets.gate import OwnerGate, session_id
from dpmarket.protocol.securesum.client import Client
from dpmarket.protocol.securesum.plan import RoundAllowance, SecureSumPlan
from dpmarket.protocol.securesum.spec import DcaConfig, RoundSpec
from dpmarket.protocol.wire.codec import Message
from dpmarket.streams.race.columns import SketchColumns
from dpmarket.streams.race.lsh import LshFamily, make_family
from dpmarket.streams.race.sketch import RaceSketch

__all__ = ["OperatorTrust", "OwnerSecureSum", "gated_contribute"]


@dataclass(frozen=True)
class OperatorTrust:
    """What the operator hands every owner actor at construction, never through the curator:
    the session's configuration, each compute node's key fingerprint (node -> SHA-256 hex), the
    round plan, and the simulated colluders' behaviour (``[faults].colluders``: "withhold" or
    "reveal" their noise; a simulation fault, known to the driver only). ``attest``: the owner
    contributes to no round before every pinned node has attested the roster
    (:meth:`OwnerSecureSum.attested`; a remote owner, whose operator is the market)."""

    config: DcaConfig
    pins: dict[str, str]
    plan: SecureSumPlan
    behaviours: dict[str, str] = field(default_factory=dict)
    attest: bool = False

    def __post_init__(self) -> None:
        unpinned = sorted(set(self.config.nodes) - set(self.pins))
        if unpinned:
            raise ValueError(f"pins: no fingerprint for compute nodes {unpinned}")


@dataclass
class OwnerSecureSum:
    """One owner's secure-sum client under the operator's trust anchors (module docstring)."""

    name: str
    trust: OperatorTrust
    rng: np.random.Generator  # the owner's share of the distributed noise
    identity: X25519PrivateKey = field(default_factory=X25519PrivateKey.generate)
    client: Client | None = None
    # secure-sum round -> how many of the owner's records (a prefix: records only grow at the
    # end) its sketch contribution to that round covered; deltas start where a released one ended
    sketched: dict[int, int] = field(default_factory=dict)
    allowance: RoundAllowance = field(init=False)
    roster: int | None = None  # the fewest owners any pinned node attests (None: not yet)
    unchecked: tuple[str, ...] = ()  # nodes that attest without checking owners' signatures
    # a sketch round's public options -> the columns of this owner's records in that sketch
    # (streams/race/columns.py): each record hashed once, as it arrives (``sketch_ahead``),
    # and counted at every round; never sent anywhere
    columns: dict[tuple[Any, ...], SketchColumns] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.allowance = RoundAllowance(self.trust.plan)

    def public_key(self) -> bytes:
        """The public half of this owner's key, for the operator to pin at the compute nodes."""
        return self.identity.public_key().public_bytes_raw()

    def sketch_columns(
        self, records: npt.NDArray[np.float64], options: dict[str, Any]
    ) -> SketchColumns:
        """The columns of ``records`` in the sketch of ``options``, hashing only the records
        not hashed yet (records only grow at the end; a prefix that changed, which the owner's
        party never does, is hashed anew rather than trusted)."""
        return self._columns_of(records, _sketch_key(options, records.shape[1]))

    def sketch_current(self, records: npt.NDArray[np.float64]) -> None:
        """Hash what is not hashed yet of ``records`` (all of the owner's) for every sketch
        round of the plan; a record that cannot be hashed is left to its round (which
        refuses this owner's contribution, naming the record's problem)."""
        for key in self._planned_sketches(records):
            try:
                self._columns_of(records, key)
            except ValueError:
                del self.columns[key]

    def sketch_ahead(self, new: npt.NDArray[np.float64], start: int) -> None:
        """Hash records ``start ..`` (``new``, just arrived) for every sketch round of the
        operator's plan, so that a round only counts them: records arrive while no round is
        open, and a round's deadline then covers the noise and the sealing, not the hashing.
        Records that do not directly follow those hashed, or that cannot be hashed, are left
        to the round (which hashes what is missing, or refuses as it did without this)."""
        for key in self._planned_sketches(new):
            held = self.columns.setdefault(key, _empty_columns(key))
            if held.n != start:
                continue
            try:
                held.extend(new)
            except ValueError:  # e.g. a coordinate beyond the hash's range: the round says so
                del self.columns[key]

    def _planned_sketches(self, records: npt.NDArray[np.float64]) -> list[tuple[Any, ...]]:
        """The keys of the plan's sketch rounds for records like ``records`` (none for none)."""
        if not len(records):
            return []
        rounds = self.trust.plan.rounds.values()
        return [
            _sketch_key(dict(p.options), records.shape[1])
            for p in rounds
            if p.what in ("sketch", "sketch_delta")
        ]

    def _columns_of(self, records: npt.NDArray[np.float64], key: tuple[Any, ...]) -> SketchColumns:
        held = self.columns.get(key)
        if held is None or held.n > len(records) or not held.holds(records):
            held = self.columns[key] = _empty_columns(key)
        held.extend(records[held.n :])
        return held

    def setup(self, config: DcaConfig, node_keys: dict[str, bytes]) -> list[Message]:
        """Become the secure-sum client of the operator's session; return the registrations.

        Refused (``RuntimeError``, nothing sent) when called a second time, and (``ValueError``)
        for a configuration other than the operator's; ``NodeKeyMismatch`` when a relayed node
        key does not match its pinned fingerprint (no registration is made)."""
        if self.client is not None:
            raise RuntimeError(f"{self.name}: dca_setup: the secure-sum session is already set up")
        if config != self.trust.config:
            raise ValueError(f"{self.name}: dca_setup: not the operator's session configuration")
        behaviour = self.trust.behaviours.get(self.name)
        client = Client(
            self.trust.config,
            f"client:{self.name}",
            node_keys,
            (self.name,),
            {self.name: behaviour} if behaviour else None,
            pinned=self.trust.pins,
            identity=[self.identity],
        )
        self.client = client
        return client.start()

    def attested(self, attestations: dict[str, Any]) -> dict[str, Any]:
        """Take every pinned node's roster attestation (node -> ``ComputeNode.attest``'s entry
        for this owner) and return the roster size this owner counts on: the fewest owners any
        node attests as registered (at least one node is honest, and an owner an honest node
        did not register is absent from every round), and the nodes that did not check the
        owners' signatures (``unchecked``). ``ValueError`` naming the node when one
        is missing or does not verify (protocol/securesum/client.py ``Client.attested``);
        nothing is recorded then."""
        if self.client is None:
            raise RuntimeError(f"{self.name}: dca_roster before dca_setup")
        missing = sorted(set(self.trust.config.nodes) - set(attestations))
        if missing:
            raise ValueError(f"roster: no attestation from compute nodes {missing}")
        sizes, unchecked = [], []
        for node in self.trust.config.nodes:
            checked, names = self.client.attested(self.name, node, attestations[node])
            sizes.append(len(names))
            if not checked:
                unchecked.append(node)
        self.roster, self.unchecked = min(sizes), tuple(unchecked)
        return {"roster": self.roster, "unchecked": list(self.unchecked)}

    def contribute(
        self,
        records: npt.NDArray[np.float64],
        spec: RoundSpec,
        what: str,
        options: dict[str, Any],
        live: npt.NDArray[np.bool_] | None = None,
    ) -> list[Message]:
        """This owner's contribution to a secure-sum round (see ``OwnerActor.dca_contribute``);
        ``live`` masks out records of retired blocks (actors/budgets/gate.py). A sketch round
        counts the columns of the records hashed as they arrived (:meth:`sketch_columns`
        hashes any not hashed yet): no sketch kernel runs inside a round.

        Refused (``ValueError`` naming the label and the violated bound; nothing is computed or
        sent) unless the operator's plan admits ``spec``, ``what`` and ``options`` and the
        label has a round left: whatever the relay asks, this owner's vector enters only rounds
        at or above the plan's sigma, with the plan's clipping and shape, at most the plan's
        count per label (protocol/securesum/plan.py)."""
        if self.client is None:
            raise RuntimeError(f"{self.name}: dca_contribute before dca_setup")
        _roster_check(self)
        self.allowance.take(spec, what, options)
        held = self.sketch_columns(records, options) if what != "moments" else None
        row = contribution(
            records, spec, what, options, self.name, self.sketched, live, columns=held
        )
        return self.client.contribute(spec, row[None, :], self.rng)


def _roster_check(dca: OwnerSecureSum) -> None:
    if dca.client is None:
        raise RuntimeError(f"{dca.name}: dca_contribute before dca_setup")
    if dca.trust.attest and dca.roster is None:
        raise ValueError(f"{dca.name}: no round before the pinned compute nodes attest the roster")


def contribution(
    X: npt.NDArray[np.float64],
    spec: RoundSpec,
    what: str,
    options: dict[str, Any],
    owner: str,
    sketched: dict[int, int],
    live: npt.NDArray[np.bool_] | None = None,
    backend: str = "auto",
    columns: SketchColumns | None = None,
) -> npt.NDArray[np.float64]:
    """The vector an owner adds to a round: ``moments`` (clipped sums, sums of squares, count),
    ``sketch`` (RACE counters of every record) or ``sketch_delta`` (counters of the records
    added since the round ``options['base_rounds'][owner]``; ``sketched`` records per round how
    many records a contribution covered). Records where ``live`` is False (retired blocks) are
    never counted (nor read, without ``columns``); ``sketched`` counts positions in ``X``, so
    deltas stay disjoint. ``backend``: the sketch kernels' (the same counters with each).
    ``columns``: the records' columns in this sketch, hashed as they arrived
    (``OwnerSecureSum.sketch_columns``): counted, not hashed again, with the same counters."""
    if live is not None and live.shape != (len(X),):
        raise ValueError(f"live: expected shape ({len(X)},), got {live.shape}")
    if what == "moments":
        X = X if live is None else X[live]
        b = float(options["bound"])
        Xc = np.clip(X, -b, b)
        return np.concatenate([Xc.sum(axis=0), (Xc**2).sum(axis=0), [float(len(Xc))]])
    if what not in ("sketch", "sketch_delta"):
        raise ValueError(f"what: unknown contribution {what!r}")
    start = 0
    if what == "sketch_delta":
        base = options.get("base_rounds", {}).get(owner)
        start = sketched.get(base, 0) if base is not None else 0
    sketched[spec.round] = len(X)
    if columns is not None:
        if columns.n != len(X):
            raise ValueError(f"columns: {columns.n} records hashed, {len(X)} held")
        return columns.counters(start, live).astype(np.float64)
    X = X[start:] if live is None else X[start:][live[start:]]
    family = _family(
        str(options["family"]),
        X.shape[1],
        int(options["rows"]),
        int(options["seed"]),
        float(options["bandwidth"]),
    )
    sketch = RaceSketch(family, int(options["width"]), backend=backend)
    if len(X):
        sketch.update(X.astype(np.float32))
    return sketch.counter_vector().astype(np.float64)


def _sketch_key(options: dict[str, Any], dim: int) -> tuple[Any, ...]:
    """A sketch's public parameters: (family, dim, rows, seed, bandwidth, width)."""
    return (
        str(options["family"]),
        int(dim),
        int(options["rows"]),
        int(options["seed"]),
        float(options["bandwidth"]),
        int(options["width"]),
    )


def _empty_columns(key: tuple[Any, ...]) -> SketchColumns:
    """No record's columns yet, in the sketch of ``key`` (:func:`_sketch_key`)."""
    return SketchColumns(_family(*key[:5]), key[5])


@functools.lru_cache(maxsize=8)
def _family(name: str, dim: int, rows: int, seed: int, bandwidth: float) -> LshFamily:
    """The hash functions of a round's public sketch options, drawn once per process: the
    owners of a host share them (an ``LshFamily`` is immutable, and its draws follow from
    these public values alone)."""
    return make_family(name, dim, rows, seed, bandwidth=bandwidth)


def gated_contribute(
    dca: OwnerSecureSum,
    gate: OwnerGate | None,
    records: npt.NDArray[np.float64],
    spec: RoundSpec,
    what: str,
    options: dict[str, Any],
) -> list[Message]:
    """An owner's secure-sum contribution behind its cap: the operator's plan admits the round
    first (a round it refuses charges nothing, so a relay cannot drain the budget with rounds
    the plan does not allow), then the charge is committed, and only then are the frames
    returned to be sent; ``BudgetDeclined`` (no frames) when the cap does not admit it."""
    session = session_id(dca.trust.pins)
    _roster_check(dca)
    if gate is None or not gate.blocked:
        frames = dca.contribute(records, spec, what, options)
        if gate is not None:
            gate.secure_round(spec, session)
        return frames
    # blocks: what is read depends on which blocks can pay, so the plan's admission (and its
    # count) is checked before the charge, the charge made, and then only live blocks are read
    plan = dca.trust.plan
    plan.admit(spec, what, options)
    if dca.allowance.used[spec.label] >= plan.rounds[spec.label].max_rounds:
        raise ValueError(f"plan: round {spec.label!r}: the plan's rounds are all used")
    start = 0
    if what == "sketch_delta":  # only the records added since its base round are read
        base = options.get("base_rounds", {}).get(dca.name)
        start = dca.sketched.get(base, 0) if base is not None else 0
    live = gate.secure_round(spec, session, len(records), start)
    return dca.contribute(records, spec, what, options, live)
