"""``dpmarket run``, ``simulate``, ``validate`` and ``resume``: a market on Ray
(actors/run/market.py), its outcome and privacy printed from the reports (actors/run/report.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dpmarket.actors.commands.study import add_study_arguments, run_study_command
from dpmarket.actors.config.market import MarketConfig
from dpmarket.actors.config.validate import check_inputs, check_out_in_job, resolve_out
from dpmarket.actors.randomness import NOISE_WARNING
from dpmarket.actors.run.preflight import RunPlan, check_plan, plan_lines
from dpmarket.actors.studies.config import is_study_file

__all__ = [
    "add_market_parsers",
    "check_plan",
    "print_gaps",
    "print_plan",
    "print_rejects",
    "print_report",
]


def _ray_line(info: dict[str, Any]) -> None:
    from dpmarket.actors.cluster.connect import describe

    print(describe(info), file=sys.stderr)


def print_plan(plan: RunPlan) -> None:
    """Each release's expected signal, noise, signal-to-noise and cost, before the run."""
    print("\n".join(plan_lines(plan)))


def _market(args: argparse.Namespace) -> int:
    """run / simulate / validate / resume: the Python API's functions (api/api.py, the package
    dpmarket), their results printed."""
    import dpmarket.api as api
    from dpmarket.actors.run.market import resume_market

    if args.command == "simulate" and is_study_file(args.config):
        return run_study_command(args)  # a [study] table: a sweep of markets (commands/study.py)
    outcome: Any
    if args.command == "resume":
        check_out_in_job(args.out, "resume OUT")  # relative: inside a job, Ray's cache
        outcome = resume_market(Path(args.out), args.address, connected=_ray_line)
    else:
        config = api.load_config(args.config, args.set)
        if args.command == "validate":
            return _validate(config, args.out)
        # warns of noise from a public seed; [[requests]]: one purchase after another
        outcome = api.run_market(
            config, args.out, address=args.address, strict=args.strict, connected=_ray_line
        )
    if outcome.report:
        print_report(outcome.report, outcome.consumer_report)
    for name, each in outcome.requests.items():  # [[requests]]: one purchase each
        print(f"request {name}:")
        if each.report:
            print_report(each.report, each.consumer_report)
        print_rejects(each.rejects)
        print_gaps(each.consumer_report)
    print_rejects(outcome.rejects)
    print_gaps(outcome.consumer_report)
    print(outcome.message, file=sys.stderr if outcome.exit_code else sys.stdout)
    return int(outcome.exit_code)


def _validate(config: MarketConfig, out: str | None) -> int:
    """Print the configuration and, for a files market, what each input file showed."""
    if config.reproducible_noise:
        print(f"dpmarket: WARNING: {NOISE_WARNING}", file=sys.stderr)
    print(json.dumps(config.public_record(), indent=2, default=str))
    if config.source == "files":
        checked = [check_inputs(config)]
        print("\n".join(checked[0].describe()))
        for request in config.requests:  # each request's consumer files
            print(f"request {request.name}:")
            checked.append(check_inputs(config.for_request(request)))
            print("\n".join(checked[-1].describe()))
        for warning in dict.fromkeys(w for each in checked for w in each.warnings):
            print(f"dpmarket: WARNING: {warning}", file=sys.stderr)
    if config.remote is not None:  # what is theirs is checked by their agents, not here
        remote = config.remote
        for what, names, own in (
            ("owners", remote.owners, "their own files, caps, ledgers and policies"),
            ("compute nodes", remote.nodes, "their own X25519 keys"),
        ):
            if names:
                print(f"remote {what}: {', '.join(names)} ({own}: checked by their agents)")
        print(
            f"remote: the market listens on {remote.listen} with {remote.certificate}; agents' "
            f"certificates from {remote.client_ca}, pinned by fingerprint; join deadline "
            f"{remote.join_deadline:g} s"
        )
    print(f"out: {resolve_out(config, out)} (--out or [run].out, from the working directory)")
    skipped = sorted(o for o in config.data.get("files", {}) if o in config.placement)
    if config.source == "files" and skipped:  # their paths are on their nodes
        print(
            f"{config.path}: valid; NOT CHECKED: the files of placed owners "
            f"{', '.join(skipped)} (paths on their nodes, checked there by their actors at run "
            "time, before any secure sum)",
            file=sys.stderr,
        )
        return 0
    print(f"{config.path}: valid", file=sys.stderr)
    return 0


def print_rejects(rejects: dict[str, tuple[int, str]]) -> None:
    """Records rejected per party that read files (owners, validation, seed set)."""
    if rejects:
        print("rejected records (each kept with its source and byte offset in its rejects file):")
    for party, (count, path) in rejects.items():
        print(f"  {party:<12} {count:>6}  {path}")


def print_gaps(consumer: dict[str, Any] | None) -> None:
    """A warning per owner whose files showed places where records may have been lost (a
    copytruncate's unreadable bytes, a truncation regrown before a poll: tail.py "Limits")."""
    for owner, status in ((consumer or {}).get("owners") or {}).items():
        if status.get("ingest_gaps"):
            print(
                f"dpmarket: WARNING: {owner}: {status['ingest_gaps']} gap(s) in its input files "
                "(truncated or copytruncated while written): records written there may be "
                "missing from the purchase; none was read twice",
                file=sys.stderr,
            )


def _epsilon(value: float | str | None) -> str:
    """A report's epsilon cell: a number, "inf" (also a schema-1 null) or "n/a"."""
    if value is None:
        return "inf"
    return value if isinstance(value, str) else f"{value:.3f}"


def print_stopped(report: dict[str, Any]) -> None:
    """A stopped run's report: where it stopped, who was lost, what each owner was charged."""
    outcome, faults = report["outcome"], report["faults"]
    print(f"stopped in {outcome.get('phase') or 'the run'} (exit 3)")
    if faults.get("lost") or faults.get("nodes"):
        print(
            f"  lost or declined owners {faults.get('lost', [])}; nodes {faults.get('nodes', [])}"
        )
    for owner, charged in sorted(report.get("charged", {}).items()):
        print(f"  {owner:<12} charged eps {_epsilon(charged.get('pld'))}")


def print_report(report: dict[str, Any], consumer: dict[str, Any] | None = None) -> None:
    """Print the public ``report`` and, when given, the consumer's utility
    (actors/run/report.py)."""
    if report["outcome"]["state"] == "refused":  # a stopped run's (actors/run/stopped.py)
        print_stopped(report)
        return
    outcome, parsimony = report["outcome"], report["parsimony"]
    bought = f" ({parsimony['mechanism']})" if parsimony.get("mechanism") else ""
    print(f"state {outcome['state']} after {outcome['epochs']} epochs{bought}: {outcome['reason']}")
    accessed = (consumer or {}).get("parsimony") or parsimony  # schema 2 before issue 24: public
    if "distinct_points" in accessed:
        print(
            f"summary {parsimony['summary_size']} points; curator saw "
            f"{accessed['distinct_points']} distinct points of max_points "
            f"{parsimony.get('max_points') or 'unbounded'} in {accessed['total_transfers']} "
            f"transfers (rho {accessed['rho']:.2f})"
        )
    else:  # the points accessed are the consumer's (actors/run/report.py)
        print(
            f"summary {parsimony['summary_size']} points; max_points "
            f"{parsimony.get('max_points') or 'unbounded'}"
        )
    delta = report["privacy"]["delta"]
    print(f"{'protected party':<16} {'eps (PLD)':>10} {'Theorem 7':>10} {'paper count':>12}")
    for party, entry in report["privacy"]["parties"].items():
        text = [_epsilon(entry[k]) for k in ("pld", "theorem7", "paper")]
        line = f"{party:<16} {text[0]:>10} {text[1]:>10} {text[2]:>12}   (delta {delta:g})"
        if "against_colluders" in entry:
            line += f"; vs colluders {_epsilon(entry['against_colluders'])}"
        print(line)
        if "note" in entry:
            print(f"  {party}: {entry['note']}")
    utility = (consumer or {}).get("utility", {})
    if utility:
        print(
            "utility on the harness's test set (simulation): the private summary; "
            + (
                f"random = {utility['random']['points']} points bought at random, then the "
                "same exact selection; "
                if "random" in utility
                else ""
            )
            + "uniform = p points sampled uniformly; greedy = exact greedy over the whole pool"
        )
    ends = [utility.get(k, {}).get("mmd2") for k in ("uniform", "greedy")]
    for name, row in utility.items():
        line = f"utility {name:<8} MMD^2 {row['mmd2']:.5f}  LinearSVC {row['svm_accuracy']:.3f}"
        if None not in ends and ends[0] > ends[1] and name in ("private", "random"):
            line += f"  (closes {(ends[0] - row['mmd2']) / (ends[0] - ends[1]):.2f} of the gap)"
        print(line)
    lost = report["faults"]["lost"]
    if lost:
        print(f"tolerated: owners lost {lost}")


def add_market_parsers(sub: Any) -> None:
    for name, text in (
        ("run", "run a market on Ray (embedded local instance unless --address)"),
        (
            "simulate",
            "run a simulated market with the faults its config declares, or a study (a file "
            "with [study]: a sweep of fault scenarios in-process on Ray; see README)",
        ),
        ("validate", "check a configuration file and print what it records"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("config", help="TOML market configuration (see configs/)")
        if name == "simulate":
            add_study_arguments(cmd)
        cmd.add_argument(
            "--out",
            help="output directory (default: [run].out); relative paths, here and in [run].out, "
            "are taken from the working directory (data paths from the config's directory); inside "
            "`ray job submit` it must be absolute",
        )
        cmd.add_argument("--address", help="Ray address, or 'auto' (default: RAY_ADDRESS/local)")
        if name != "validate":
            cmd.add_argument(
                "--strict",
                action="store_true",
                help="refuse (exit 2) a run whose releases' noise exceeds what they can measure",
            )
        cmd.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="SECTION.KEY=VALUE",
            help="override a configuration value (TOML syntax), repeatable",
        )
        cmd.set_defaults(func=_market)
    resume = sub.add_parser("resume", help="continue a refused or crashed run from OUT/.journal")
    resume.add_argument("out", help="the output directory of the run")
    resume.add_argument("--address", help="Ray address, or 'auto'")
    resume.set_defaults(func=_market)
