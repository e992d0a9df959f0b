"""DCA secure sum (Heikkilä et al. 2017, Algorithm 1): the aggregator party.

The theory of operation, the configuration and the round spec are in :mod:`.spec`, the wire
bodies in :mod:`.messages`.

Aggregator::

    idle     open_round(spec, deadline)   -> waiting, dca.open to every node
             (known colluders alone > T: insufficient at once, nothing sent -> idle)
    waiting  dca.partial (all M, same set) -> release, ledger event -> idle
    waiting  dca.abort / sets differ / missing + colluders > T -> no release -> idle
    waiting  cancel(reason)               -> cancelled, no release -> idle
    waiting  expire(now >= deadline + result_timeout) -> failed, no release -> idle

Collusion: the clients missing from the agreed set and the known colluders
(``DcaConfig.colluders``) together count against T in every round; a round where they exceed T
releases nothing and charges nothing (:meth:`DcaConfig.shortfall` states why that keeps
sigma_std^2 of honest noise against any curious client).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.securesum.fixedpoint import grid_sensitivity, ring_sum
from dpmarket.protocol.securesum.messages import AbortBody, PartialBody, unpack_set
from dpmarket.protocol.securesum.spec import DcaConfig, RoundResult, RoundSpec
from dpmarket.protocol.wire.codec import Message
from dpmarket.protocol.wire.errors import LocalProtocolError, RemoteProtocolError
from dpmarket.protocol.wire.parties import Handler, Outbox, body_of, dispatch

__all__ = ["Aggregator"]

U64 = npt.NDArray[np.uint64]


@dataclass
class _Waiting:
    spec: RoundSpec
    deadline: float
    partials: dict[str, PartialBody] = field(default_factory=dict)


class Aggregator:
    """Opens rounds, adds the compute nodes' partial sums, releases, and keeps the ledger.

    ``ledger`` receives one Gaussian event per released noisy round (sigma_std, grid
    sensitivity, the round's label and neighbouring relation); nothing for rounds that end
    without a release.
    """

    def __init__(self, config: DcaConfig, ledger: PrivacyLedger | None = None) -> None:
        self.config, self.name, self.run = config, config.aggregator, config.run
        self.ledger = ledger if ledger is not None else PrivacyLedger("dca-clients")
        self._out = Outbox(config.run, config.aggregator)
        self.state = "idle"
        self.last_round = 0
        self._waiting: _Waiting | None = None
        self.results: dict[int, RoundResult] = {}
        self.late_frames = 0
        self._table: dict[tuple[str, str], Handler] = {
            ("waiting", "dca.partial"): self._on_partial,
            ("waiting", "dca.abort"): self._on_abort,
        }

    def open_round(self, spec: RoundSpec, deadline: float) -> list[Message]:
        """Announce ``spec`` to every compute node; they close collection at ``deadline``."""
        if self.state != "idle":
            raise LocalProtocolError(f"open_round: round {self.last_round + 1} is still open")
        if spec.round <= self.last_round:
            raise LocalProtocolError(
                f"open_round: round {spec.round} is not after {self.last_round}"
            )
        if not math.isfinite(deadline):
            raise ValueError(f"deadline must be finite, got {deadline!r}")
        self.config.check_round(spec)
        self.state, self._waiting = "waiting", _Waiting(spec, deadline)
        everyone = np.ones(self.config.n_clients, dtype=np.bool_)
        if self.config.shortfall(everyone) > self.config.tolerance:  # colluders alone exceed T
            self._finish("insufficient", self.config.shortfall_reason(everyone))
            return []
        body = spec.open_body(deadline)
        return [self._out.make(node, spec.round, body) for node in self.config.nodes]

    def receive(self, msg: Message) -> list[Message]:
        if msg.sender not in self.config.nodes:
            raise RemoteProtocolError(f"from: {msg.sender!r} is not a compute node")
        if msg.round in self.results:
            self.late_frames += 1
            return []
        waiting = self._waiting
        if waiting is not None and msg.round != waiting.spec.round:
            raise RemoteProtocolError(f"round: {msg.round} is not the open round")
        return dispatch(self.name, self.run, self.state, self._table, msg)

    def expire(self, now: float) -> list[Message]:
        waiting = self._waiting
        if waiting is None or now < waiting.deadline + self.config.result_timeout:
            return []
        silent = sorted(set(self.config.nodes) - set(waiting.partials))
        self._finish("failed", f"compute nodes {silent} did not answer")
        return []

    def cancel(self, reason: str) -> None:
        """End the open round now, releasing nothing and charging nothing (status
        ``cancelled``); partials that arrive later are counted as late. No-op when idle."""
        if self._waiting is not None:
            self._finish("cancelled", reason)

    def result(self, round_: int) -> RoundResult | None:
        return self.results.get(round_)

    def _open_round(self) -> _Waiting:
        if self._waiting is None:  # pragma: no cover - the table admits these only while waiting
            raise LocalProtocolError("aggregator: no round is open")
        return self._waiting

    def _on_partial(self, msg: Message) -> list[Message]:
        body = body_of(msg, PartialBody)
        waiting = self._open_round()
        if msg.sender in waiting.partials:
            raise RemoteProtocolError(f"dca.partial: {msg.sender} already answered")
        total = body.total
        if total.dtype != np.uint64 or total.shape != (waiting.spec.d,):
            raise RemoteProtocolError(
                f"dca.partial.total: shape {total.shape}, dtype {total.dtype}"
            )
        if unpack_set(body.included, self.config.n_clients) is None:
            raise RemoteProtocolError("dca.partial.included: not a packed set of the roster")
        waiting.partials[msg.sender] = body
        if len(waiting.partials) == self.config.n_nodes:
            self._combine(waiting)
        return []

    def _on_abort(self, msg: Message) -> list[Message]:
        body = body_of(msg, AbortBody)
        status = "insufficient" if body.missing > self.config.tolerance else "failed"
        self._finish(status, f"{msg.sender}: {body.reason}")
        return []

    def _combine(self, waiting: _Waiting) -> None:
        sets = [p.included.tobytes() for p in waiting.partials.values()]
        if len(set(sets)) != 1:
            self._finish("inconsistent", "compute nodes summed different client sets")
            return
        included = unpack_set(next(iter(waiting.partials.values())).included, self.config.n_clients)
        if included is None:  # pragma: no cover - every partial's set was checked on receipt
            raise LocalProtocolError("dca.partial.included: unreadable after the check")
        if self.config.shortfall(included) > self.config.tolerance:
            self._finish("insufficient", self.config.shortfall_reason(included), included)
            return
        total = ring_sum(np.stack([p.total for p in waiting.partials.values()]))
        self._finish("released", "", included, total)

    def _finish(
        self,
        status: str,
        reason: str,
        included: npt.NDArray[np.bool_] | None = None,
        total: U64 | None = None,
    ) -> None:
        waiting = self._open_round()
        spec, cfg = waiting.spec, self.config
        sens = grid_sensitivity(spec.sensitivity, spec.d, cfg.frac_bits)
        mask = included if included is not None else np.zeros(cfg.n_clients, dtype=np.bool_)
        result = RoundResult(
            round=spec.round,
            status=status,
            reason=reason,
            value=cfg.codec.decode(total) if total is not None else None,
            ring_total=total,
            included=tuple(c for c, keep in zip(cfg.clients, mask, strict=True) if keep),
            missing=tuple(c for c, keep in zip(cfg.clients, mask, strict=True) if not keep),
            sigma_std=spec.sigma_std,
            sensitivity=sens,
        )
        if result.released and result.private:
            label = spec.label or f"dca round {spec.round}"
            self.ledger.gaussian(spec.sigma_std, sens, label=label, neighbouring=spec.neighbouring)
        self.results[spec.round] = result
        self.state, self._waiting, self.last_round = "idle", None, spec.round
