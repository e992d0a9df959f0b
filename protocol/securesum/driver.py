"""In-process DCA: whole sessions and rounds through the real parties and the wire codec.

Pure (no threads, no clocks): a simulated clock advances to each deadline, and every message is
encoded and decoded with a per-recipient :class:`ReplayGuard`, exactly what would cross process
boundaries. Faults are injected at the "network": ``absent`` clients' frames never arrive (a
dropout), ``lost`` frames miss only some nodes. Colluders are simulated by the clients'
``behaviour`` (reveal or withhold their noise,
:class:`~dpmarket.protocol.securesum.client.Client`).

:func:`secure_sum` is the one-call form other protocol modules use (e.g. the DP regression):
a fresh session over N clients' rows, one noisy round, the released sum and the bookkeeping.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.privacy.dgauss import client_sigma, gaussian_sigma
from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.securesum.aggregator import Aggregator
from dpmarket.protocol.securesum.client import Client
from dpmarket.protocol.securesum.fixedpoint import choose_frac_bits, noise_tail_bound
from dpmarket.protocol.securesum.messages import SharesBody
from dpmarket.protocol.securesum.node import ComputeNode
from dpmarket.protocol.securesum.plan import SecureSumPlan
from dpmarket.protocol.securesum.sealing import key_fingerprint
from dpmarket.protocol.securesum.spec import REPLACE_ONE, DcaConfig, RoundResult, RoundSpec
from dpmarket.protocol.wire.codec import Message, ReplayGuard, decode, encode
from dpmarket.protocol.wire.errors import RemoteProtocolError
from dpmarket.protocol.wire.parties import Party

__all__ = ["DcaSession", "RoundOutcome", "secure_sum"]

I64 = npt.NDArray[np.int64]


@dataclass
class RoundOutcome:
    """A finished round: the aggregator's result plus what the simulation observed.

    ``frames``/``bytes`` count encoded messages, ``kinds`` counts them by kind; ``revealed``
    holds colluders' noise (grid units) for ``"reveal"`` members; ``rejected`` lists frames
    nodes refused row by row as (node, client, reason); ``refused`` lists whole messages a
    party refused as (recipient, error).
    """

    result: RoundResult
    frames: int = 0
    bytes: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    rejected: list[tuple[str, str, str]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    revealed: dict[str, I64] = field(default_factory=dict)

    @property
    def value(self) -> npt.NDArray[np.float64] | None:
        return self.result.value


class DcaSession:
    """A session: M compute nodes, an aggregator, the roster in client parties of ``batch``.

    Construction runs the session set-up (key pairs, X25519 per pair, registration frames).
    ``plan`` (optional) is the operator's round plan, given to every compute node.
    """

    def __init__(
        self,
        config: DcaConfig,
        *,
        batch: int = 64,
        behaviour: Mapping[str, str] | None = None,
        ledger: PrivacyLedger | None = None,
        plan: SecureSumPlan | None = None,
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.config, self.now = config, 0.0
        self.nodes = {name: ComputeNode(config, name, plan=plan) for name in config.nodes}
        keys = {name: node.public_key for name, node in self.nodes.items()}
        pins = {name: key_fingerprint(key) for name, key in keys.items()}  # the operator's pins
        behaviour = dict(behaviour or {})
        self.clients: list[Client] = []
        for start in range(0, config.n_clients, batch):
            members = config.clients[start : start + batch]
            mine = {m: b for m, b in behaviour.items() if m in members}
            name = f"client-party-{start // batch}"
            self.clients.append(Client(config, name, keys, members, mine, pinned=pins))
        self.aggregator = Aggregator(config, ledger)
        parties: list[Party] = [*self.nodes.values(), self.aggregator, *self.clients]
        self.parties: dict[str, Party] = {p.name: p for p in parties}
        self._guards = {name: ReplayGuard() for name in self.parties}
        self._frames, self._bytes = 0, 0
        self._kinds: Counter[str] = Counter()
        self.refused: list[tuple[str, str]] = []
        self._drop: dict[str, frozenset[int]] = {}
        for client in self.clients:
            self.deliver(client.start())

    def run_round(
        self,
        spec: RoundSpec,
        values: npt.ArrayLike,
        rng: np.random.Generator,
        *,
        absent: Collection[str] = (),
        lost: Mapping[str, Collection[str]] | None = None,
        timeout: float = 1.0,
    ) -> RoundOutcome:
        """One round over ``values`` (shape (N, d), roster order), through every deadline.

        ``absent`` clients drop out (no frame arrives); ``lost[client]`` names the nodes that
        client's frames do not reach. Rounds must be run in increasing ``spec.round``.
        """
        cfg = self.config
        x = np.asarray(values, dtype=np.float64)
        if x.shape != (cfg.n_clients, spec.d):
            raise ValueError(f"values: expected shape ({cfg.n_clients}, {spec.d}), got {x.shape}")
        self._drop = _drop_sets(cfg, absent, lost or {})
        self._frames, self._bytes, self.refused, self._kinds = 0, 0, [], Counter()
        deadline = self.now + timeout
        self.deliver(self.aggregator.open_round(spec, deadline))
        if self.aggregator.result(spec.round) is not None:  # refused at the open
            return self._collect(spec)
        start = 0
        for client in self.clients:
            rows = x[start : start + len(client.members)]
            start += len(client.members)
            self.deliver(client.contribute(spec, rows, rng))
        for now in (deadline, deadline + cfg.agreement_timeout, deadline + cfg.result_timeout):
            self.now = max(self.now, now)
            for party in self.parties.values():
                self.deliver(party.expire(self.now))
        return self._collect(spec)

    def _collect(self, spec: RoundSpec) -> RoundOutcome:
        self._drop = {}  # the round's losses end with it
        result = self.aggregator.result(spec.round)
        if result is None:  # pragma: no cover - the last deadline always ends the round
            raise RuntimeError(f"round {spec.round} did not finish")
        outcome = RoundOutcome(result, self._frames, self._bytes, self._kinds.copy())
        outcome.refused = list(self.refused)
        for node in self.nodes.values():
            outcome.rejected += [
                (node.name, c, why) for r, c, why in node.rejected if r == spec.round
            ]
        for client in self.clients:
            outcome.revealed.update(client.revealed.get(spec.round, {}))
        return outcome

    def deliver(self, messages: Iterable[Message]) -> None:
        """Deliver FIFO through the codec (and the current round's losses) until no party has
        anything more to send; refusals are kept for the round's outcome."""
        queue = deque(messages)
        while queue:
            sent = queue.popleft()
            msg = _filtered(sent, self._drop.get(sent.recipient, frozenset()))
            if msg is None:
                continue
            frame = encode(msg)
            self._frames, self._bytes = self._frames + 1, self._bytes + len(frame)
            self._kinds[msg.kind] += 1
            try:
                decoded = decode(frame, self._guards[msg.recipient])
                queue.extend(self.parties[msg.recipient].receive(decoded))
            except RemoteProtocolError as exc:
                self.refused.append((msg.recipient, str(exc)))


def _drop_sets(
    config: DcaConfig, absent: Collection[str], lost: Mapping[str, Collection[str]]
) -> dict[str, frozenset[int]]:
    """Per node: roster indices whose frames to that node are lost."""
    index = config.index
    unknown = [c for c in [*absent, *lost] if c not in index]
    if unknown:
        raise ValueError(f"absent/lost: unknown clients {unknown[:5]}")
    gone = {index[c] for c in absent}
    return {
        node: frozenset(gone | {index[c] for c, nodes in lost.items() if node in nodes})
        for node in config.nodes
    }


def _filtered(msg: Message, drop: frozenset[int]) -> Message | None:
    """``msg`` without the share rows of clients in ``drop``; None if no row is left."""
    body = msg.body
    if not drop or not isinstance(body, SharesBody):
        return msg
    lost = np.array(sorted(drop), dtype=np.uint32)
    keep_v = ~np.isin(body.value_clients, lost)
    keep_s = ~np.isin(body.seed_clients, lost)
    if not (keep_v.any() or keep_s.any()):
        return None
    new_body = SharesBody(
        body.value_clients[keep_v],
        body.value_frames[keep_v],
        body.seed_clients[keep_s],
        body.seed_frames[keep_s],
    )
    return replace(msg, body=new_body)


def secure_sum(
    values: npt.ArrayLike,
    *,
    epsilon: float,
    delta: float,
    sensitivity: float,
    bound: float,
    rng: np.random.Generator,
    tolerance: int = 0,
    n_nodes: int = 3,
    method: str = "analytic",
    frac_bits: int | None = None,
    ledger: PrivacyLedger | None = None,
    label: str = "",
    neighbouring: str = REPLACE_ONE,
    run: str = "dca",
) -> RoundOutcome:
    """One (epsilon, delta)-DP secure sum of the rows of ``values`` (one row per client).

    The release is sum_i values[i] + N_Z noise of total standard deviation >= sigma_std, with
    sigma_std calibrated by ``method`` at L2 ``sensitivity`` plus the grid's rounding
    (:meth:`DcaConfig.spec`); it stays (epsilon, delta)-DP with up to ``tolerance`` clients
    colluding. ``bound`` is the largest |value| any client may hold (values beyond it are refused,
    not clipped: clip first). ``frac_bits=None`` picks the finest grid that cannot wrap. One
    Gaussian event goes to ``ledger`` (a fresh one if None; see ``outcome.result``).
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 2 or len(x) < 2:
        raise ValueError(f"values: expected shape (N >= 2, d), got {x.shape}")
    n, d = x.shape
    if frac_bits is None:
        frac_bits = _auto_frac_bits(n, d, epsilon, delta, sensitivity, bound, tolerance, method)
    clients = tuple(f"client-{i}" for i in range(n))
    nodes = tuple(f"compute-{k}" for k in range(n_nodes))
    config = DcaConfig(run, clients, nodes, tolerance=tolerance, bound=bound, frac_bits=frac_bits)
    spec = config.spec(1, d, epsilon, delta, sensitivity, method, label, neighbouring)
    session = DcaSession(config, batch=max(1, math.ceil(n / 8)), ledger=ledger)
    return session.run_round(spec, x, rng)


def _auto_frac_bits(
    n: int,
    d: int,
    epsilon: float,
    delta: float,
    sensitivity: float,
    bound: float,
    tolerance: int,
    method: str,
) -> int:
    """The finest grid with 2 spare bits whose per-client noise is 4..2^48 grid units."""
    sigma = gaussian_sigma(epsilon, delta, sensitivity + math.sqrt(d) * 2.0**-8, method)
    per_client = client_sigma(sigma, n, tolerance)
    noise = noise_tail_bound(per_client * math.sqrt(n), d)
    finest = choose_frac_bits(n, bound, noise)
    return max(0, min(finest, math.floor(math.log2(2.0**47 / per_client))))
