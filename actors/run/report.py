"""What a run leaves in ``--out``: a public report, the consumer's report, the summary and plots.

The outputs are split by who may read them:
- ``report.json`` is **public**: it may be handed to the owners. It holds the public
  configuration, what every owner observes while taking part, the DP releases (each charged to
  the ledgers the report shows) and post-processing of those, never a value computed from the
  exact validation set D_v or from an owner's exact data.
- ``report.private.json`` is the **consumer's**: every field computed from D_v beyond its DP
  release, or from owners' exact values. Like ``summary.csv``, ``summary.npz`` and
  ``mmd_by_epoch.png`` it must not reach an owner.

Each report has its own builder (:func:`public_report`, :func:`consumer_report`) and a table of
field -> why (:data:`PUBLIC_FIELDS`, :data:`CONSUMER_FIELDS`, :data:`PUBLIC_SECURE`,
:data:`PUBLIC_TIMINGS`). A top-level key missing from its report's table is refused when the
report is built, so a new field cannot be written without deciding its side; inside
``secure_phases`` and ``timings`` whatever the allow-lists do not name goes to the consumer.
``tests/actors/test_report.py`` checks that this docstring names every key of both tables.

Public ``report.json`` (schema 2; schema 1 was a single report mixing both sides):

- ``schema``: 2.
- ``run``: the configuration (K, M, T, p, budgets, kernel, data, faults, noise), all public;
  ``validation_size`` m (public: the neighbouring relations treat m as known), the kernel width
  ``gamma`` (median heuristic on the public seed set, or the config's), the Ray address.
- ``outcome``: ``state``, ``reason``, ``epochs``, ``exploration_epochs`` (the first epochs, in
  which every owner delivered a uniform draw and no auction ran): every owner takes part in
  every epoch and sees them. Under random-select and allocate-select ``epochs`` is the largest
  quota + 1, a function of every owner's record count (below, "Record counts").
- ``privacy``: per protected party, epsilon at ``delta`` by the ledger (``pld``, ``theorem7``;
  ``"inf"`` with a ``note`` where unbounded) and ``paper`` (as the paper counts it; ``"n/a"``
  where it counts none of the party's events), the events, and for each honest owner the guarantee
  against the simulated coalition of colluders: what each party was charged, computed from the
  events (mechanism and parameters), not from data. ``neighbouring``: the one relation every
  party's events were charged under (read from the events; null when nothing was charged),
  stated once for the run (a public setting; a report whose ledgers mix relations is refused).
- ``parsimony``: ``summary_size`` (the q every owner received last; under random-select and
  allocate-select, which send no q, the exact selection's size: p, or the points bought if
  fewer), ``validation_size`` (m),
  ``final_selection``, ``mechanism`` (the purchase mechanism's public name, e.g.
  "random-select", the default, or "herding-select"; null in reports written before it),
  ``max_points`` (null: unbounded; the curator never receives more distinct
  points), ``allocation`` (allocate-select's public ``rule``, score ``ridge``,
  ``noise_multiplier``, the hedge's ``random_share`` of max_points bought at random and the
  counts' ``floor``; null: none). The realised counts are the consumer's (below).
- ``faults``: owners lost (epoch), ``returned`` (lost owners taken back, how often) and
  ``kept_out`` (lost owners not taken back again, and why), dropped, frames late, deliveries
  rejected, the colluders,
  ``transport`` (``refused`` frames per owner, ``expelled`` and ``dead`` parties) and
  ``verdicts`` (per simulated fault: tolerated and how, or not triggered, with the T budget
  used): which parties failed and how T was spent, which owners need to check; ``remote``
  (with ``[remote]``: the remote owners and nodes, those absent at the join deadline, and the
  owners that declined the purchase by their own policy, with their reasons; ``refusals``:
  each kind of refused or replaced connection with its count; ``rejoined``: how often each
  party dialled in again after its stream ended).
- ``timings``: ``start``, ``ingest_and_summarise`` and ``summarise`` (the curator's run: its
  setup, every epoch and the finish) seconds (wall clock the owners observe).
- ``secure_phases``: the secure-sum rounds' DP releases and their noise: ``normalise`` (DP pool
  count, per-feature means and spreads; with ``standardize`` on, owners also receive the means
  and per-feature scales as h1's center and scale in the setup frame), ``scan`` and each entry of
  ``refreshes`` without their coverage (status, sigma, owners missing; a refresh's
  ``records_estimate`` reads the DP pool sketch alone), ``standardize`` (center, scale, gamma,
  per feature "dp" or "public" in ``features``: post-processing of normalise and of the
  public seed set; or ``applied`` false and the
  ``reason``, e.g. a DP count below 3 sigma), the compute nodes, T, the share
  scheme, absent owners and errors. Any key of a round outside :data:`PUBLIC_SECURE` goes to
  the consumer's report.
- ``budgets``: null, or per owner with a persistent store whether the store covers the
  curator's view of the run (``status``; ``errors``: every mismatch), its cap and delta, the
  curator's epsilon and, without blocks only, its spent, this run's charge and declines
  (actors/run/budgets.py: with blocks those depend on which blocks exist, so on the count).

Consumer's ``report.private.json`` (schema 2):

- ``schema``: 2.
- ``value``: sum of winning marginal gains per owner (value attribution). Under
  ``final_selection = "exact"`` these are exact gains against D_v; otherwise the winners' gains,
  from the owners' exact points. Paying owners by them would release a function of D_v to the
  owners: pay per delivery instead.
- ``selection``: the final selection's provenance: points kept per owner (``kept_by_owner``)
  and the files naming each kept point (owner, token, epoch). Which purchased points the exact
  selection kept is a function of D_v; which owner won an epoch, of the verified gains.
- ``secure_phases``: what the public section withholds: the scan's ``coverage`` (mean KDE of the
  DP pool sketch at the exact validation points) and each refresh's ``coverage``.
- ``parsimony``: ``distinct_points``, ``total_transfers``, rho = (distinct + m) / (p + m),
  ``purchased_pool`` (verified deliveries): the points the curator accessed (Aggregate counts).
- ``transport``: the transport's ``frames_sent``, ``bytes_sent``, ``calls`` and ``errors``.
- ``budgets``: actors/run/budgets.py's whole section: with blocks also each owner's ``spent``
  (largest block's), ``run_charged``, ``over``, ``declined`` and ``retired`` block ids.
- ``owners``: per live owner at the end: records held, records ingested from files, rejects,
  gaps in its files (``ingest_gaps``), epochs seen, times asked, errors. Exact counts of an
  owner's records (no noise), and every owner's asks (the auction's outcomes: a ledger
  charges each owner for its own ask bit, and a coalition for its members' bits, not for
  every owner's). Operational data for whoever runs
  the market with the consumer; never for another owner.
- ``timings``: seconds of the harness's ``utility`` computation (simulation).
- ``utility`` (simulation only, computed by the harness from data it generated, never by the
  curator): MMD^2 to the test set and LinearSVC accuracy of the summary, of a random purchase
  of as many points as the curator accessed followed by the same exact selection (``random``,
  with its ``points``), of uniform sampling and of exact greedy; the summary is the consumer's.

Aggregate counts. ``distinct_points``, ``total_transfers``, ``purchased_pool``, rho and the
transport's frame and byte counts depend on the owners' data beyond any DP release: whether
an asked point was delivered before (a repeat) depends on the records; an exploration draw
repeats a point with a probability set by the owner's count n_i; a record of a retired block
never bids, and an owner with nothing left to bid passes; a frame's size grows with its token
(a record's arrival position, msgpack's variable-length integers). So they are the consumer's.
Parsimony stays a promise owners can check: ``max_points`` is public and enforced by the
curator, and each owner counts its own deliveries.

Audit: every field of report.json, one question: can it be computed from public values
(the configuration, m, the public seed set) and the DP releases alone? ``no*``: not from the
releases alone, but every owner observes it while taking part, so report.json repeats it and
adds nothing; ``moved``: now in report.private.json.

- ``schema``, ``run``: yes (public configuration, m, gamma from the public seed set).
- ``outcome``: no*. Epochs and reason follow from the DP releases and from whether any owner
  bid (an owner with nothing left to bid, or every block retired, passes), and under
  random-select and allocate-select from the quotas, hence the counts ("Record counts");
  every owner receives them during the run (each epoch frame and the finish frame).
- ``privacy``: yes (the events and their parameters, never data); how many per-epoch events
  (auction steps, refreshes) follows ``outcome.epochs``.
- ``parsimony.summary_size``: no* (the q every owner received last, as ``outcome``; under
  random-select and allocate-select, p unless the whole pool held fewer records, when it
  is the pool's size, a count);
  ``validation_size``, ``final_selection``, ``max_points``, ``allocation``: yes (config);
  ``distinct_points``, ``total_transfers``, ``rho``, ``purchased_pool``: no, moved.
- ``faults``: ``lost``, ``returned``, ``kept_out``, ``dropped``, ``late_frames``, ``rejected``,
  ``verdicts``,
  ``colluders`` and ``transport.refused/expelled/dead``: no*, fault evidence kept public
  (owners must see how T was spent). A deadline reads the clock and an owner's reply time
  grows with its records, so who was dropped or late is timing, which every party observes.
  An owner dropped in the "asking" phase, or whose delivery was rejected, was asked.
  ``transport.frames_sent/bytes_sent/calls/errors``: no, moved. ``remote``: no*, who joined
  and who declined is participation, which every party sees (a declined owner is lost to all);
  a decline's reasons name the offer's public parameters and the owner's own policy limits.
- ``timings``: no* (wall clock of phases every owner takes part in).
- ``secure_phases``: yes for :data:`PUBLIC_SECURE` (DP releases; how many refreshes ran
  follows ``outcome.epochs``); coverage reads D_v: moved.
- ``budgets``: without blocks yes (public parameters, the owner's own charges and declines);
  with blocks ``status``, ``cap``, ``delta``, ``curator``, ``blocks`` yes; ``spent``,
  ``run_charged``, ``over``, ``declined``, ``retired``: no (which blocks exist and retired
  depends on the count), moved.

Record counts. None of the public fields is a record count (``parsimony.summary_size`` only
if the whole pool holds fewer than p records), and under herding-select none is
a function of one: an owner's data sets of different sizes (and numbers of blocks) with the
same releases give a byte-identical report.json (``tests/actors/test_report.py``,
``tests/actors/test_report_counts.py``). The exceptions, by mechanism
(:data:`COUNT_REVEALING_FIELDS`; the run's relation, replace one record, treats counts as
public, so none of them is an uncharged release; docs/guide/remote.md "What other parties
learn about an owner's record count" has the table, protocol/summary/counts.py the rule an
owner's policy applies):

- random-select and allocate-select: the quotas are drawn from, or capped by, the owners'
  counts, and the run lasts the largest quota + 1 epochs, so ``outcome.epochs`` and what
  follows the epochs (``privacy.parties``: the refresh rounds' charges, one every
  ``refresh_every`` epochs; ``secure_phases.refreshes``) are functions of every count. Every
  owner observes the epochs anyway (no*).
- herding-select: the same fields (:data:`EPOCH_FIELDS`, with the auction steps in
  ``privacy.parties``) only when an owner's records run out before the run ends (it passes)
  and a ``max_points`` budget is then reached later, or with ``max_deliveries`` > 1 under
  ``max_points`` (a repeated delivery buys no new point). Its plan sets no ``max_points`` and
  withdraws a record after one delivery; a run out of records at every owner ends early.
- Every mechanism: ``secure_phases.normalise.count`` and the sketches are DP releases of the
  pool (the count with Gaussian noise ``sigma``), and ``timings`` are wall clock, which grows
  with the records the owners read and with the epochs (a side channel, like traffic).

Files: ``report.json`` and ``privacy.png`` (public); ``report.private.json``, ``summary.csv``
(one row per summary point: owner, token, epoch, bid, gain, label, features), ``summary.npz``
(points or hashes, labels, provenance) and ``mmd_by_epoch.png`` (simulation) are the consumer's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from dpmarket.actors.parties.curator import write_json_atomic
from dpmarket.actors.run.budgets import public_budgets
from dpmarket.actors.run.outputs import write_plots, write_summary
from dpmarket.protocol.privacy.epsilons import epsilon_value, party_epsilons
from dpmarket.protocol.privacy.ledger import PrivacyLedger

__all__ = [
    "CONSUMER_FIELDS",
    "CONSUMER_REPORT",
    "COUNT_REVEALING_FIELDS",
    "EPOCH_FIELDS",
    "PUBLIC_FIELDS",
    "PUBLIC_REPORT",
    "PUBLIC_SECURE",
    "PUBLIC_TIMINGS",
    "REPORT_SCHEMA",
    "Reports",
    "consumer_report",
    "privacy_section",
    "public_report",
    "split_secure_phases",
    "write_outputs",
]

REPORT_SCHEMA = 2
PUBLIC_REPORT, CONSUMER_REPORT = "report.json", "report.private.json"

# Every key of each report, with the reason for its side (the module docstring in full).
PUBLIC_FIELDS: dict[str, str] = {
    "schema": "the format version",
    "run": "the configuration (all public), m, gamma from the public seed set, the Ray address",
    "outcome": "state, reason and epochs: every owner takes part in every epoch",
    "privacy": "each party's ledger: what it was charged, computed from the events",
    "parsimony": "the last q owners received, m, the mechanism, max_points, the selection",
    "faults": "lost, dropped and colluding parties, late frames, rejects, T used",
    "timings": "wall clock of the run's phases, observed by every owner",
    "secure_phases": "the secure sums' DP releases and noise (PUBLIC_SECURE)",
    "budgets": "stores against the curator's view, nothing per block (public_budgets)",
}
CONSUMER_FIELDS: dict[str, str] = {
    "schema": "the format version",
    "value": "sum of winning marginal gains per owner: gains against D_v",
    "selection": "which purchased points the final selection kept: a function of D_v",
    "secure_phases": "coverage of D_v by the DP pool sketch (scan and each refresh)",
    "parsimony": "points the curator accessed: repeats and passes depend on owners' records",
    "transport": "frame and byte counts (a token's size is its arrival position) and errors",
    "budgets": "each store's totals; with blocks, spent, declines and retired blocks",
    "owners": "exact per-owner record counts and every owner's asks",
    "timings": "the harness's utility computation",
    "utility": "MMD^2 and accuracy of the consumer's summary on the harness's test set",
}
# Keys of ``secure_phases`` whose value is public whole (None), or per round (and per refresh
# entry) the keys that are public; every other key goes to the consumer's report.
PUBLIC_SECURE: dict[str, frozenset[str] | None] = {
    "skipped": None,
    "resumed": None,
    "curator_restarts": None,
    "nodes": None,
    "tolerance": None,
    "shares": None,
    "absent": None,
    "errors": None,
    "standardize": None,
    "normalise": frozenset({"status", "reason", "count", "mean", "std", "sigma", "missing"}),
    "scan": frozenset({"status", "reason", "sigma", "missing"}),
    "refreshes": frozenset(
        {"epoch", "round", "status", "reason", "records_estimate", "releases", "sigma", "missing"}
    ),
}
PUBLIC_TIMINGS = frozenset({"start", "ingest_and_summarise", "summarise"})
# report.json fields (top-level key.key) that follow the number of epochs: the epochs, the
# ledgers' per-epoch events (auction steps; a refresh round every refresh_every epochs) and
# the refresh rounds themselves
EPOCH_FIELDS = frozenset({"outcome.epochs", "privacy.parties", "secure_phases.refreshes"})
# By mechanism (protocol/summary/counts.py), the report.json fields that are a function of an
# owner's record count (module docstring, "Record counts"; herding-select's exceptions there).
# tests/actors/test_report_counts.py changes one owner's count under each mechanism and finds
# exactly these fields changed, and the guide's table (docs/guide/remote.md) naming them.
COUNT_REVEALING_FIELDS: dict[str, frozenset[str]] = {
    "herding-select": frozenset(),
    "allocate-select": EPOCH_FIELDS,
    "random-select": EPOCH_FIELDS,
}
# transport keys that are fault evidence (public); the counters are the consumer's
PUBLIC_TRANSPORT = frozenset({"refused", "expelled", "dead"})
F64 = npt.NDArray[np.float64]


def privacy_section(
    ledgers: dict[str, dict[str, Any]], delta: float, colluders: tuple[str, ...]
) -> dict[str, Any]:
    """Epsilon per protected party by each method; for honest owners also against the coalition
    of ``colluders`` (each colluder observes its own auction bit, so a coalition of c sees c
    auction steps per epoch; the broadcast releases are the same for all and count once)."""
    out: dict[str, Any] = {"delta": delta, "neighbouring": None, "parties": {}}
    relations: set[str] = set()
    known: dict[tuple[Any, ...], dict[str, Any]] = {}  # equal events: accounted once (issue 29)
    for party, raw in sorted(ledgers.items()):
        ledger = PrivacyLedger.from_dict(raw)
        relations.update(ledger.relations())
        honest = bool(colluders) and party not in colluders and party != "validation"
        key = (ledger.value_discretization_interval, honest, *ledger.events)
        if key not in known:
            known[key] = party_epsilons(ledger, delta)
            if honest:
                times = {"auction": len(colluders)}
                pooled = [e for e in ledger.events for _ in range(times.get(e.mechanism, 1))]
                against = PrivacyLedger(party, pooled).epsilon(delta, "pld")
                known[key]["against_colluders"] = epsilon_value(against)
        out["parties"][party] = dict(known[key]) | {"events": raw}
    if len(relations) > 1:
        raise ValueError(f"privacy: the parties' events mix relations {sorted(relations)}")
    out["neighbouring"] = relations.pop() if relations else None
    return out


def split_secure_phases(secure: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``secure_phases`` as (public, consumer's) by :data:`PUBLIC_SECURE`: a refresh entry's
    withheld keys keep its ``epoch`` and ``round`` beside them in the consumer's part."""
    public: dict[str, Any] = {}
    withheld: dict[str, Any] = {}
    for key, value in secure.items():
        if key not in PUBLIC_SECURE:
            withheld[key] = value
            continue
        allowed = PUBLIC_SECURE[key]
        if allowed is None:
            public[key] = value
        elif isinstance(value, dict):
            public[key] = {k: v for k, v in value.items() if k in allowed}
            rest = {k: v for k, v in value.items() if k not in allowed}
            if rest:
                withheld[key] = rest
        elif isinstance(value, list):
            public[key] = [{k: v for k, v in e.items() if k in allowed} for e in value]
            rest_list = [
                {"epoch": e.get("epoch"), "round": e.get("round")}
                | {k: v for k, v in e.items() if k not in allowed}
                for e in value
                if set(e) - allowed
            ]
            if rest_list:
                withheld[key] = rest_list
        else:  # an unexpected shape: not provably public
            withheld[key] = value
    return public, withheld


def _checked(report: dict[str, Any], table: dict[str, str], name: str) -> dict[str, Any]:
    """Refuse a report key that its table does not place (a new field needs a decision)."""
    unplaced = sorted(set(report) - set(table))
    if unplaced:
        raise ValueError(
            f"{name}: fields {unplaced} have no documented side (actors/run/report.py)"
        )
    return report


def public_report(
    run: dict[str, Any],
    payload: dict[str, Any],
    privacy: dict[str, Any],
    colluders: tuple[str, ...],
    timings: dict[str, float],
) -> dict[str, Any]:
    """``report.json``: only public fields (:data:`PUBLIC_FIELDS`; module docstring)."""
    m = int(run.get("validation_size", 0))
    p = len(payload["provenance"])
    public_secure, _ = split_secure_phases(payload.get("secure_phases", {}))
    report = {
        "schema": REPORT_SCHEMA,
        "run": run,
        "outcome": {
            "state": payload["state"],
            "reason": payload["reason"],
            "epochs": payload["epochs"],
            "exploration_epochs": payload.get("exploration_epochs", 0),
        },
        "privacy": privacy,
        "parsimony": {
            "summary_size": p,
            "validation_size": m,
            "final_selection": payload.get("final_selection", "none"),
            "mechanism": payload.get("mechanism"),
            "max_points": payload.get("max_points"),
            "allocation": payload.get("allocation"),
        },
        "faults": {
            "lost": payload["lost"],
            "returned": payload.get("returned", {}),  # lost owners taken back: how often
            "kept_out": payload.get("kept_out", {}),  # not taken back again, and why
            "dropped": payload["dropped"],
            "late_frames": payload["late_frames"],
            "rejected": payload["rejected"],
            "colluders": list(colluders),
            "verdicts": payload.get("fault_verdicts", []),
            "transport": {k: v for k, v in payload["transport"].items() if k in PUBLIC_TRANSPORT},
            "remote": payload.get("remote"),  # agents absent or declined: seen by every party
        },
        "timings": {k: v for k, v in timings.items() if k in PUBLIC_TIMINGS},
        "secure_phases": public_secure,
        "budgets": public_budgets(payload.get("budgets")),  # null without owner budgets
    }
    return _checked(report, PUBLIC_FIELDS, PUBLIC_REPORT)


def consumer_report(
    payload: dict[str, Any],
    timings: dict[str, float],
    utility: dict[str, Any] | None,
    validation_size: int = 0,
) -> dict[str, Any]:
    """``report.private.json``: the fields derived from D_v or from owners' exact values
    (:data:`CONSUMER_FIELDS`; module docstring)."""
    _, withheld = split_secure_phases(payload.get("secure_phases", {}))
    kept = Counter(str(p["owner"]) for p in payload["provenance"])
    m, p = validation_size, len(payload["provenance"])
    report: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "value": payload["value"],
        "selection": {
            "final_selection": payload.get("final_selection", "none"),
            "kept_by_owner": dict(sorted(kept.items())),
            "provenance_files": ["summary.csv", "summary.npz"],
        },
        "secure_phases": withheld,
        "parsimony": {
            "distinct_points": payload["distinct_points"],
            "total_transfers": payload["total_transfers"],
            "rho": (payload["distinct_points"] + m) / max(p + m, 1),
            "purchased_pool": payload.get("purchased", 0),
        },
        "transport": {k: v for k, v in payload["transport"].items() if k not in PUBLIC_TRANSPORT},
        "budgets": payload.get("budgets"),
        "owners": payload.get("owners", {}),
        "timings": {k: v for k, v in timings.items() if k not in PUBLIC_TIMINGS},
    }
    if utility is not None:
        report["utility"] = utility
    return _checked(report, CONSUMER_FIELDS, CONSUMER_REPORT)


@dataclass(frozen=True)
class Reports:
    """A run's two reports: ``public`` (report.json), ``consumer`` (report.private.json)."""

    public: dict[str, Any]
    consumer: dict[str, Any]


def write_outputs(
    out: Path,
    run: dict[str, Any],
    payload: dict[str, Any],
    delta: float,
    colluders: tuple[str, ...],
    timings: dict[str, float],
    utility: dict[str, Any] | None = None,
    curves: dict[str, F64] | None = None,
) -> Reports:
    """Write the summary files, both reports and the plots into ``out``. The public report is
    written last: its presence marks a finished run (``run_market`` checks it)."""
    out.mkdir(parents=True, exist_ok=True)
    write_summary(out, payload)
    privacy = privacy_section(payload["ledgers"], delta, colluders)
    reports = Reports(
        public_report(run, payload, privacy, colluders, timings),
        consumer_report(payload, timings, utility, int(run.get("validation_size", 0))),
    )
    write_plots(out, privacy, curves or {})
    write_json_atomic(out / CONSUMER_REPORT, reports.consumer)
    write_json_atomic(out / PUBLIC_REPORT, reports.public)
    return reports
