"""``dpmarket owner serve OWNER.toml``: an owner on its own machine, deciding what it releases.

The agent holds everything that is the owner's (actors/remote/agentconfig.py): its files and
their tailers, its parties (the same :class:`~dpmarket.actors.parties.owner.OwnerHost` a local
owner actor runs), its ledger store and cap, its acceptance policy, its TLS key, and the
compute nodes' key fingerprints it was given out of band. It dials out to the market
(actors/remote/agent.py) and answers the market's control calls.

What it trusts from the market: nothing it has not checked. A purchase begins with the market's
offer (``begin``: the secure-sum session and round plan, the curator's public parameters, the
schema, the ledger run). The owner prices every round itself (protocol/agents/policy.py
``price_rounds``: its own sensitivity of what it sends, its own relation, the least T it
accepts) and reviews the offer against its own policy and its store's cap; any excess declines
the whole purchase: every later call of it is answered ``declined``, no frame leaves, nothing is
charged, and the market counts the owner as lost (T). An accepted offer is held to: the
secure-sum client takes the node pins from the owner's configuration (a relayed key that does
not match is refused), the plan it accepted bounds every round (count, sigma floor, clipping),
no round is served before every pinned node has attested the roster (``dca_roster``: the offer
is priced again at the attested roster, and declined if it no longer fits), the gate charges the
owner's own price of each round (never the spec's declared sensitivity), the Owner party refuses
a profile below its floor and any point past ``max_points``, and the gate charges the owner's
own store before any frame leaves. Noise comes from the OS (``[simulation]`` alone makes it
reproducible).

Purchases and resumes: a purchase is known by the ledger run its offer names. An offer without
one, or naming a run this owner saw finish (``STATE/purchases.jsonl``), is declined: a market
cannot have new releases recorded under an old purchase's release ids. An offer naming an
interrupted run is that purchase resumed: the secure-sum rounds the owner's store shows it
already paid for count against the plan it accepts again, so a resumed market cannot ask for
a round twice, and a release the store already holds is not charged again. The summary phase
trusts the curator as every market does (the curator adds the noise of its releases); its
planned charge is made once per purchase.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from dpmarket.actors.budgets.gate import ROUND_LABELS, BudgetGate, OwnerBudget, summary_plan
from dpmarket.actors.budgets.store import LedgerStore
from dpmarket.actors.parties.dcaowner import OperatorTrust
from dpmarket.actors.parties.owner import OwnerHost
from dpmarket.actors.remote.agent import Declined, serve
from dpmarket.actors.remote.agentconfig import OwnerAgentConfig
from dpmarket.actors.remote.tls import sign_identity
from dpmarket.protocol.agents.policy import RoundPrice, planned_purchase, price_rounds, review
from dpmarket.protocol.agents.records import from_record
from dpmarket.protocol.privacy.filter import RenyiFilter
from dpmarket.protocol.privacy.ledger import MechanismEvent
from dpmarket.protocol.securesum.plan import SecureSumPlan
from dpmarket.protocol.securesum.spec import DcaConfig
from dpmarket.protocol.summary.params import CuratorParams
from dpmarket.protocol.wire.errors import RemoteProtocolError
from dpmarket.streams.records.files import Schema

__all__ = ["OwnerAgent", "serve_owner", "software"]

OFFER_KEYS = frozenset({"market", "run", "params", "dca", "plan", "ledger_run", "schema"})


def software() -> str:
    try:
        return f"dpmarket {version('dpmarket')}"
    except PackageNotFoundError:  # pragma: no cover - a source tree
        return "dpmarket (source tree)"


def _say(name: str, line: str) -> None:
    print(f"dpmarket {name}: {line}", file=sys.stderr, flush=True)


class OwnerAgent:
    """The owner's side of every control call (module docstring)."""

    def __init__(self, config: OwnerAgentConfig) -> None:
        self.config = config
        self.name = config.name
        self.host: OwnerHost | None = None
        self.purchases = 0
        self.declined: str | None = None  # why the current purchase was declined
        self.run: str | None = None
        self.ledger_run = ""
        self.accepted: list[str] = []  # ledger runs accepted while serving, in order
        self.session = ""  # the accepted secure-sum session (its DcaConfig.run)
        # the accepted offer's session, plan, parameters and feature count: what the owner
        # prices again when its nodes attest the roster (dca_roster)
        self.offer: tuple[DcaConfig, SecureSumPlan, CuratorParams, int] | None = None
        Path(config.state).mkdir(parents=True, exist_ok=True)

    @property
    def ledger(self) -> str:
        return str(Path(self.config.state) / "ledger.sqlite")

    # ------------------------------------------------------------------ the offer
    def _schema(self, raw: object) -> Schema:
        if not isinstance(raw, dict):
            raise RemoteProtocolError("offer.schema: expected a map")
        try:
            offered = Schema(
                int(raw["n_features"]),
                tuple(float(v) for v in raw["lower"]),
                tuple(float(v) for v in raw["upper"]),
                None if raw.get("label_column") is None else int(raw["label_column"]),
                str(raw.get("policy", "clip")),  # type: ignore[arg-type]
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RemoteProtocolError(f"offer.schema: {exc}") from None
        return offered

    def _schema_reasons(self, offered: Schema) -> list[str]:
        own = self.config.schema
        if not own:
            return []
        k = int(own.get("features", offered.n_features))
        expected = {
            "features": k,
            "label_column": own.get("label_column", offered.label_column),
            "lower": _bounds(own.get("lower", offered.lower), k),
            "upper": _bounds(own.get("upper", offered.upper), k),
            "policy": own.get("policy", offered.policy),
        }
        got = {
            "features": offered.n_features,
            "label_column": offered.label_column,
            "lower": tuple(offered.lower),
            "upper": tuple(offered.upper),
            "policy": offered.policy,
        }
        return [
            f"schema: the market's {key} is {got[key]!r}, this owner's {expected[key]!r}"
            for key in expected
            if got[key] != expected[key]
        ]

    def _cap_reasons(self, events: list[MechanismEvent], ledger_run: str) -> list[str]:
        """Whether the purchase's whole planned charge fits the cap after every other run."""
        if self.config.block_records > 0:
            return []  # with blocks an owner never declines (actors/budgets/gate.py)
        policy = self.config.policy
        cap = RenyiFilter(policy.epsilon, policy.delta)
        store = LedgerStore(self.ledger, self.name, cap)
        try:
            past = [
                MechanismEvent.from_dict(e)
                for row in store.rows()
                if row["run"] != ledger_run and row["state"] == "charged"
                for e in row["events"]
            ]
        finally:
            store.close()
        need = cap.spent([*past, *events])
        if need > policy.epsilon:  # the figures stay here: the market learns only the reason
            _say(
                self.name,
                f"the purchase could bring epsilon to {need:.4g}, over the cap "
                f"{policy.epsilon:g} (spent {cap.spent(past):.4g})",
            )
            return ["cap: the purchase's planned charge does not fit the owner's budget"]
        return []

    async def begin(self, offer: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(offer) - OFFER_KEYS)
        if unknown or not {"run", "params", "ledger_run", "schema", "market"} <= set(offer):
            raise RemoteProtocolError(f"offer: unexpected or missing keys {unknown}")
        run, ledger_run = offer["run"], offer["ledger_run"]
        if not isinstance(run, str) or not run or not isinstance(ledger_run, str):
            raise RemoteProtocolError("offer.run, offer.ledger_run: expected strings")
        if offer["market"] != self.config.link.market:
            raise RemoteProtocolError(f"offer.market: {offer['market']!r} is not this owner's")
        params = from_record(CuratorParams, offer["params"], "offer.params")
        dca = None if offer.get("dca") is None else from_record(DcaConfig, offer["dca"], "dca")
        plan = (
            None if offer.get("plan") is None else from_record(SecureSumPlan, offer["plan"], "plan")
        )
        schema = self._schema(offer["schema"])
        policy = self.config.policy
        # every price from what this owner will send: its k features, the plan's rounds
        k = schema.n_features
        reasons = review(policy, plan, params, dca, k) + self._schema_reasons(schema)
        prices = price_rounds(policy, plan, dca, k)[0]
        if policy.purchases is not None and self.purchases >= policy.purchases:
            reasons.append(f"purchases: the policy admits {policy.purchases}, all taken part in")
        if (dca is None) != (plan is None):
            reasons.append("secure sum: a session without a plan (or a plan without a session)")
        if dca is not None:
            if self.name not in dca.clients:
                reasons.append(f"secure sum: {self.name} is not in the session's roster")
            unpinned = sorted(set(dca.nodes) - set(self.config.pins))
            if unpinned:
                reasons.append(
                    f"secure sum: no pinned key fingerprint for compute nodes {unpinned}"
                )
        if not ledger_run:
            reasons.append("ledger run: the offer names none")
        elif ledger_run in self.finished_runs() or (
            ledger_run in self.accepted and ledger_run != self.ledger_run
        ):  # a purchase that ended (or an earlier one of this market) is not reopened
            reasons.append(f"ledger run {ledger_run}: a purchase this owner already finished")
        if not reasons:
            events = planned_purchase(prices, plan, params, policy.neighbouring)
            reasons = self._cap_reasons(events, ledger_run)
        self.run = run
        if reasons:
            self.declined = "; ".join(reasons)
            _say(self.name, f"declined purchase {run}: {self.declined}")
            raise Declined(self.declined)
        self.declined = None
        await self._accept(run, ledger_run, params, dca, plan, schema)
        self.session = dca.run if dca is not None else ""
        self.offer = None if dca is None or plan is None else (dca, plan, params, k)
        if prices:  # its gate charges its own figures, never the round specs' declared ones
            assert self.host is not None
            await self.host.price_rounds(self.name, prices)
        if dca is not None:  # a resumed purchase: rounds already contributed stay used
            assert self.host is not None
            await self.host.rounds_used(self.name, self._rounds_in_store(ledger_run))
        if ledger_run != self.ledger_run:
            self.purchases += 1  # a resume of the current purchase is not another one
        self.ledger_run = ledger_run
        self.accepted.append(ledger_run)
        priced = f"; priced {_prices_note(prices)}" if prices else ""
        _say(
            self.name,
            f"accepted purchase {run} (p = {params.p}, max {policy.max_points} points{priced})",
        )
        return {"accepted": True, "reasons": []}

    def _attempt(self) -> Path:
        """A fresh folder for this process's tailers (offsets, rejects): an agent started
        again reads its files from the start, as a local owner actor of a new attempt does
        (its store ties every position to its record, so a file rewritten is refused)."""
        base = Path(self.config.state) / "ingest"
        attempt = len(list(base.glob("attempt-*"))) if base.exists() else 0
        return base / f"attempt-{attempt}"

    def _rounds_in_store(self, ledger_run: str) -> dict[str, int]:
        """Secure-sum rounds of ``ledger_run`` in the owner's store, by plan label."""
        labels = {v: k for k, v in ROUND_LABELS.items()}
        store = LedgerStore(
            self.ledger,
            self.name,
            RenyiFilter(self.config.policy.epsilon, self.config.policy.delta),
        )
        try:
            rows = {r["release"]: r for r in store.rows(ledger_run)}  # once per release
        finally:
            store.close()
        used: Counter[str] = Counter()
        for row in rows.values():
            for event in row["events"]:
                label = labels.get(str(event.get("label")))
                if label is not None:
                    used[label] += 1
        return dict(used)

    @property
    def _purchases_file(self) -> Path:
        return Path(self.config.state) / "purchases.jsonl"

    def finished_runs(self) -> set[str]:
        """Ledger runs of purchases this owner saw finish (a market may not reopen them)."""
        if not self._purchases_file.exists():
            return set()
        lines = self._purchases_file.read_text(encoding="utf-8").splitlines()
        return {json.loads(line)["ledger_run"] for line in lines if line.strip()}

    def record_finished(self) -> None:
        """The market finished: never accept any of its purchases' runs again."""
        done = self.finished_runs()
        with self._purchases_file.open("a", encoding="utf-8") as fh:
            for run in dict.fromkeys(self.accepted):
                if run not in done:
                    entry = {"market": self.config.link.market, "ledger_run": run}
                    fh.write(json.dumps(entry) + "\n")

    async def _accept(
        self,
        run: str,
        ledger_run: str,
        params: CuratorParams,
        dca: DcaConfig | None,
        plan: SecureSumPlan | None,
        schema: Schema,
    ) -> None:
        policy, config = self.config.policy, self.config
        trust = None
        if dca is not None and plan is not None:
            pins = {n: config.pins[n] for n in dca.nodes}  # the owner's own, never relayed
            trust = OperatorTrust(dca, pins, plan, {}, attest=policy.attested_roster)
        budget = OwnerBudget(self.ledger, policy.epsilon, policy.delta, config.block_records)
        gate = BudgetGate(budget, ledger_run, summary_plan(params), config.block_records)
        floor = params.allocation_sigma if params.allocate else None  # reviewed against policy
        if self.host is None:
            self.host = OwnerHost(
                run, {self.name: (schema.n_features, None)}, config.noise, None, trust,
                {self.name: gate}, floor, policy.max_points,
            )  # fmt: skip
            headers = config.files if config.header else ()
            await self.host.start_ingest(
                self.name, list(config.files), schema, str(self._attempt()), headers=tuple(headers)
            )
        else:
            await self.host.begin_request(
                run, config.noise, trust, {self.name: gate}, floor, policy.max_points
            )

    # ------------------------------------------------------------------ every other call
    def _host(self, method: str) -> OwnerHost:
        if self.declined is not None:
            raise Declined(self.declined)
        if self.host is None:
            raise RuntimeError(f"{method}: no purchase has begun")
        return self.host

    async def dispatch(self, method: str, args: dict[str, Any]) -> Any:
        name = self.name
        if method == "begin":
            return await self.begin(args["offer"])
        if method == "warm_up":
            return 0.0 if self.host is None else await self.host.warm_up()
        if method == "ingest_status":
            if self.host is None:  # no purchase (or declined): its tailers start with one
                return {"records": 0, "rejected": 0, "caught_up": True, "failed": [],
                        "missing": [], "gaps": 0, "gap_bytes": 0}  # fmt: skip
            return await self.host.ingest_status(name)
        if method == "status":
            if self.host is None:
                return {"name": name, "state": "idle", "records": 0, "epochs_seen": 0,
                        "asks": 0, "errors": []}  # fmt: skip
            status = await self.host.status(name)
            return status | ({"declined": self.declined} if self.declined else {})
        if method == "budget_view":
            if self.declined is not None:
                return {"declined": self.declined}
            return await self._host(method).budget_view(name)
        host = self._host(method)
        if method == "dca_identity":  # its key, signed for the session by its TLS key
            public = await host.dca_identity(name)
            link = self.config.link
            return {
                "key": public,
                "certificate": link.certificate,
                "signature": sign_identity(link.key, self.session, name, public),
            }
        if method == "dca_setup":
            return await host.dca_setup(name, args["config"], args["node_keys"])
        if method == "dca_roster":
            return await self.roster(host, args["attestations"])
        if method == "dca_contribute":
            return await host.dca_contribute(name, args["spec"], args["what"], args["options"])
        if method == "handle":
            return await host.handle({name: args["frames"]})
        raise RemoteProtocolError(f"method: no owner method {method!r}")

    async def roster(self, host: OwnerHost, attestations: dict[str, Any]) -> int:
        """The pinned nodes' roster attestations (actors/parties/dcaowner.py): every round is
        priced again at the roster they attest (never the offer's), and the purchase is
        declined, before any round, when a node did not check the owners' signatures (unless
        the policy admits it), or a round's guaranteed noise or the planned charge no longer
        fits the policy or the cap."""
        if self.offer is None:
            raise RuntimeError("dca_roster: the accepted purchase has no secure sum")
        dca, plan, params, k = self.offer
        policy = self.config.policy
        answer = await host.dca_roster(self.name, attestations)  # a bad one: nothing recorded
        try:  # from here any failure declines: no round at a price the roster did not confirm
            roster, reasons = int(answer["roster"]), []
            if policy.attested_roster and answer["unchecked"]:
                reasons.append(
                    f"roster: compute nodes {answer['unchecked']} did not check every owner's "
                    "signature (the policy needs an attested roster)"
                )
            prices, priced = price_rounds(policy, plan, dca, k, roster)
            reasons += priced
            if not reasons:
                events = planned_purchase(prices, plan, params, policy.neighbouring)
                reasons = self._cap_reasons(events, self.ledger_run)
            if not reasons:
                await host.price_rounds(self.name, prices)
        except Exception as exc:
            reasons = [f"roster: {type(exc).__name__}: {exc}"]
        if reasons:
            self.declined = "; ".join(reasons)
            _say(self.name, f"declined purchase {self.run} at the attested roster: {self.declined}")
            raise Declined(self.declined)
        _say(self.name, f"roster attested by {len(dca.nodes)} node(s): {roster} owners")
        return roster


def _prices_note(prices: dict[str, RoundPrice]) -> str:
    return ", ".join(f"{p.label} x{p.multiplier:.3g}" for p in prices.values())


def _bounds(value: object, k: int) -> tuple[float, ...]:
    if isinstance(value, (list, tuple)):
        return tuple(float(v) for v in value)
    return (float(value),) * k  # type: ignore[arg-type]


def serve_owner(config: OwnerAgentConfig, give_up: float = 600.0) -> int:
    """Run the owner agent until the market ends (the exit code of actors/remote/agent.py)."""
    agent = OwnerAgent(config)
    _say(config.name, f"serving market {config.link.market!r} at {config.link.address}")
    try:
        code = asyncio.run(serve(config.link, agent.dispatch, software(), give_up=give_up))
    except KeyboardInterrupt:
        _say(config.name, "stopped (interrupted); its store keeps what it paid")
        return 130
    if code == 0:
        agent.record_finished()
    return code
