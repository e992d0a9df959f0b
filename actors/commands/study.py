"""``dpmarket simulate STUDY --out DIR``: a dropout and collusion study (actors/study_*.py).

``dpmarket simulate`` decides by the file's content: a file with a ``[study]`` table is a study
(this module), any other a market config (actors/commands/market.py, one simulated market).
Exit codes: 0 done; 2 a bad study file, base config or results directory (the message names
the file and the key or the cell); 1 when ``--actors`` found a verdict that disagrees; 130
when interrupted (finished trials are kept: the same command resumes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dpmarket.actors.studies.config import load_study

__all__ = ["add_study_arguments", "run_study_command"]


def add_study_arguments(cmd: Any) -> None:
    """The flags ``simulate`` takes for a study (ignored for a market config)."""
    cmd.add_argument("--trials", type=int, help="study: trials per cell (default [study].trials)")
    cmd.add_argument(
        "--serial", action="store_true", help="study: run the trials in this process, not on Ray"
    )
    cmd.add_argument("--batch", type=int, default=2, help="study: trials per Ray task (default 2)")
    cmd.add_argument(
        "--actors",
        type=int,
        default=0,
        metavar="N",
        help="study: also run N sampled cells as real markets on actors and compare verdicts",
    )
    cmd.add_argument(
        "--actors-trials", type=int, default=1, help="study: trials per sampled cell (--actors)"
    )


def _ray_line(info: dict[str, Any]) -> None:
    from dpmarket.actors.cluster.connect import describe

    print(describe(info), file=sys.stderr)


def run_study_command(args: argparse.Namespace) -> int:
    """``simulate STUDY``: the Python API's ``simulate`` (api/api.py, the package dpmarket),
    its cells printed."""
    import dpmarket.api as api
    from dpmarket.actors.config.market import ConfigError
    from dpmarket.actors.studies.run import RESULTS_FILE

    if args.set:
        raise ConfigError(
            f"{args.config}: --set applies to market configs; a study has [study].set"
        )
    if args.trials is not None and args.trials < 1:
        raise ConfigError(f"--trials: expected an integer >= 1, got {args.trials}")
    if args.batch < 1 or args.actors < 0 or args.actors_trials < 1:
        raise ConfigError("--batch and --actors-trials must be >= 1, --actors >= 0")
    study = load_study(args.config, args.trials)
    out = Path(args.out or study.out)
    print(
        f"study {study.name}: {len(study.cells)} cells x {study.trials} trials -> {out}",
        file=sys.stderr,
    )
    try:
        found = api.simulate(
            study, out, serial=args.serial, batch=args.batch, address=args.address,
            connected=_ray_line,
        )  # fmt: skip
    except KeyboardInterrupt:
        print(
            f"dpmarket: interrupted; finished trials are kept in {out / RESULTS_FILE}: "
            f"run the same command again to resume",
            file=sys.stderr,
        )
        return 130
    results, doc = found.trials, found.document
    _print_table(found.cells)
    for line in found.smallest_t:
        if line["t_interval"] is not None or line["t_estimate"] is not None:
            print(
                f"K {line['owners']} M {line['compute_nodes']} q {line['dropout']:g} slow "
                f"{line['slow_fraction']:g}x{line['slow_delay']:g}s c {line['colluders']} "
                f"{line['who_fails']}: smallest T "
                f"finishing w.p. {line['target']}: {line['t_interval']} (95% interval), "
                f"{line['t_estimate']} (estimate)"
            )
    code = 0
    if args.actors:
        from dpmarket.actors.studies.actors import compare_with_actors

        check = compare_with_actors(study, results, out, args.actors, args.actors_trials)
        (out / "actors.json").write_text(json.dumps(check, indent=1), encoding="utf-8")
        print(f"actors: {check['agree']} of {check['compared']} verdicts agree (actors.json)")
        code = 0 if check["agree"] == check["compared"] else 1
    print(f"dpmarket: study written to {out} ({', '.join(doc['files'])})")
    return code


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def _print_table(table: list[dict[str, Any]]) -> None:
    print(
        f"{'cell':<46} {'n':>5} {'P(done)':>8} {'95% CI':>15} {'epochs':>7} {'gap':>6} "
        f"{'eps':>6} {'eps|c':>6} {'T used':>7} {'closed form':>13}"
    )
    for r in table:
        ci = f"[{r['p_low']:.3f},{r['p_high']:.3f}]"
        print(
            f"{r['cell']:<46} {r['trials']:>5} {_fmt(r['p_complete']):>8} {ci:>15} "
            f"{_fmt(r['epochs_mean']):>7} {_fmt(r['gap_closed_mean'], 2):>6} "
            f"{_fmt(r['eps_max']):>6} {_fmt(r['eps_coalition_max']):>6} "
            f"{_fmt(r['t_used_mean'], 2):>4}/{r['tolerance']} {_closed(r):>13}"
        )


def _closed(row: dict[str, Any]) -> str:
    """The closed-form completion probability, or its bounds (no closed form: closedform.py)."""
    if row["p_closed_form"] is not None:
        return f"{row['p_closed_form']:.3f}"
    return f"[{row['p_bound_low']:.2f},{row['p_bound_high']:.2f}]"
