"""Study files (``configs/studies/*.toml``): a base market config and the fault axes to sweep.

A study is a grid of cells (every combination of the axes' values) and a number of trials per
cell. Each trial draws its own faults from the cell's probabilities with a public seed
(``[study].seed``, the cell and the trial index), so a study is reproducible and resumable.
Every key is checked when the file is read, and every cell's market config is built and
checked through ``load_market_config`` (T <= K - 2 and the rest) before any trial runs: an
error names the file and the key (or the cell), never a trial half-way through the study.

    [study]
    name = "dropout"                  # names the results; default: the file's stem
    base = "../dropout.toml"          # the base market config, relative to this file
    set = ["data.n_points=3000"]      # overrides of the base (--set syntax), optional
    trials = 200                      # per cell
    seed = 1                          # public: faults, data and (simulated) noise per trial
    vary_data = true                  # each trial draws its own simulated data set
    out = "out/studies/dropout"       # default output directory (--out wins)

    [axes]                            # each a list; a missing axis takes its default
    owners = [20]                     # K (default: the base's)
    tolerance = [1, 2, 4]             # T (default: the base's)
    compute_nodes = [3]               # M (default: the base's)
    dropout = [0.0, 0.1]              # probability that an owner drops (independently)
    slow_fraction = [0.0, 0.05]       # probability that an owner is slow
    slow_delay = [4.0]                # seconds a slow owner adds to every reply
    colluders = [0, 1]                # colluding owners (count against T from the start)
    who_fails = ["random"]            # "random" or "highest-value" (most mass near D_v first)

    [timing]                          # when a dropping owner fails: weights over the phases
    normalise = 0.1                   # before the first secure sum (absent from every round)
    scan = 0.1                        # after normalise, before the scan round
    epochs = 0.8                      # at an epoch drawn uniformly from epoch_range
    epoch_range = [1, 20]
"""

from __future__ import annotations

import dataclasses
import itertools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpmarket.actors.config import checks as checks
from dpmarket.actors.config.market import ConfigError, MarketConfig, check_keys, load_market_config

__all__ = ["PHASES", "Cell", "StudyConfig", "is_study_file", "load_study"]

PHASES = ("normalise", "scan", "epochs")
WHO_FAILS = ("random", "highest-value")
_STUDY_KEYS = {"name", "base", "set", "trials", "seed", "vary_data", "out"}
_AXES: dict[str, str] = {  # axis -> kind
    "owners": "int",
    "tolerance": "int",
    "compute_nodes": "int",
    "dropout": "prob",
    "slow_fraction": "prob",
    "slow_delay": "seconds",
    "colluders": "int",
    "who_fails": "choice",
}
_TIMING_KEYS = {*PHASES, "epoch_range"}


@dataclass(frozen=True)
class Cell:
    """One point of the grid: the market's shape and the fault probabilities of its trials."""

    index: int
    owners: int
    tolerance: int
    compute_nodes: int
    dropout: float
    slow_fraction: float
    slow_delay: float
    colluders: int
    who_fails: str

    @property
    def key(self) -> str:
        """A stable name of the cell (results are keyed by it, so a resumed study finds them)."""
        return (
            f"K{self.owners}-T{self.tolerance}-M{self.compute_nodes}-q{self.dropout:g}"
            f"-s{self.slow_fraction:g}x{self.slow_delay:g}-c{self.colluders}-{self.who_fails}"
        )

    def axes(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("index")
        return out


@dataclass(frozen=True)
class StudyConfig:
    """A parsed study: its cells (each with its checked market config), trials and seeds."""

    path: str
    name: str
    base: MarketConfig
    base_path: str
    sets: tuple[str, ...]
    trials: int
    seed: int
    vary_data: bool
    out: str
    timing: dict[str, float]  # phase -> probability (normalised weights)
    epoch_range: tuple[int, int]
    cells: tuple[Cell, ...]
    configs: dict[str, MarketConfig] = field(default_factory=dict, repr=False)  # cell key ->

    def record(self) -> dict[str, Any]:
        """What study.json records about the study itself (all public)."""
        return {
            "path": self.path,
            "name": self.name,
            "base": self.base_path,
            "set": list(self.sets),
            "trials": self.trials,
            "seed": self.seed,
            "vary_data": self.vary_data,
            "timing": self.timing,
            "epoch_range": list(self.epoch_range),
            "cells": len(self.cells),
        }


def is_study_file(path: str | Path) -> bool:
    """Whether ``path`` is a study (a top-level ``[study]`` table) rather than a market config;
    decided by content, so ``dpmarket simulate`` takes either. Unreadable files are not
    studies (the market loader then reports them)."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    return isinstance(data.get("study"), dict)


def _axis(path: str, name: str, values: object, default: object) -> list[Any]:
    key = f"[axes].{name}"
    if values is None:
        return [default]
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{path}: {key}: expected a non-empty list, got {values!r}")
    kind, out = _AXES[name], list[Any]()
    for i, v in enumerate(values):
        item = f"{key}[{i}]"
        if kind == "int":
            low = 0 if name in ("tolerance", "colluders") else 1
            out.append(checks.integer(path, item, v, low))
        elif kind == "prob":
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0:
                raise ConfigError(f"{path}: {item}: expected a probability in [0, 1], got {v!r}")
            out.append(float(v))
        elif kind == "seconds":
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 3600.0:
                raise ConfigError(f"{path}: {item}: expected seconds in [0, 3600], got {v!r}")
            out.append(float(v))
        else:
            if v not in WHO_FAILS:
                raise ConfigError(f"{path}: {item}: expected one of {list(WHO_FAILS)}, got {v!r}")
            out.append(v)
    if len(set(out)) != len(out):
        raise ConfigError(f"{path}: {key}: repeated values {values!r}")
    return out


def _timing(path: str, table: object) -> tuple[dict[str, float], tuple[int, int]]:
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [timing]: expected a table")
    check_keys(f"{path}: timing", table, _TIMING_KEYS)
    weights: dict[str, float] = {}
    for phase in PHASES:
        w = table.get(phase, 1.0 if phase == "epochs" and not set(PHASES) & set(table) else 0.0)
        if isinstance(w, bool) or not isinstance(w, int | float) or not 0.0 <= w < 1e9:
            raise ConfigError(f"{path}: [timing].{phase}: expected a weight >= 0, got {w!r}")
        weights[phase] = float(w)
    total = sum(weights.values())
    if total <= 0:
        raise ConfigError(f"{path}: [timing]: the weights {list(PHASES)} sum to 0")
    rng = table.get("epoch_range", [1, 10])
    if (
        not isinstance(rng, list)
        or len(rng) != 2
        or not all(isinstance(e, int) and not isinstance(e, bool) for e in rng)
        or not 1 <= rng[0] <= rng[1]
    ):
        raise ConfigError(
            f"{path}: [timing].epoch_range: expected [first, last], 1 <= first <= last"
        )
    return {p: w / total for p, w in weights.items()}, (int(rng[0]), int(rng[1]))


def _grouping(base: MarketConfig, owners: int) -> list[str]:
    """A cell with more owners than the base's grouping fits in ``MAX_OWNER_ACTORS`` owner
    actors gets the smallest ``owners_per_actor`` that fits: a trial runs no actor, and only
    ``--actors`` replays (real markets) group owners by it; other cells keep the base's."""
    if -(-owners // base.owners_per_actor) <= checks.MAX_OWNER_ACTORS:
        return []
    return [f"market.owners_per_actor={-(-owners // checks.MAX_OWNER_ACTORS)}"]


def load_study(path: str | Path, trials: int | None = None) -> StudyConfig:
    """Parse and check a study file and every cell's market config; ``trials`` overrides
    ``[study].trials`` (the command's ``--trials``)."""
    name = str(path)
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{name}: cannot read study ({exc})") from None
    check_keys(f"{name}: top level", data, {"study", "axes", "timing"})
    study, axes = data.get("study"), data.get("axes", {})
    if not isinstance(study, dict):
        raise ConfigError(f"{name}: [study]: expected a table")
    if not isinstance(axes, dict):
        raise ConfigError(f"{name}: [axes]: expected a table")
    check_keys(f"{name}: study", study, _STUDY_KEYS)
    check_keys(f"{name}: axes", axes, set(_AXES))
    base_rel = study.get("base")
    if not isinstance(base_rel, str):
        raise ConfigError(f"{name}: [study].base: expected the path of a market config")
    base_path = Path(path).parent / base_rel
    if not base_path.is_file():
        raise ConfigError(f"{name}: [study].base: file {str(base_path)!r} not found")
    sets = study.get("set", [])
    if not isinstance(sets, list) or not all(isinstance(s, str) for s in sets):
        raise ConfigError(f"{name}: [study].set: expected a list of 'section.key=value'")
    n_trials = trials if trials is not None else study.get("trials", 100)
    n_trials = checks.integer(name, "[study].trials", n_trials, 1, 10**7)
    seed = checks.integer(name, "[study].seed", study.get("seed", 0), 0)
    vary = study.get("vary_data", True)
    if not isinstance(vary, bool):
        raise ConfigError(f"{name}: [study].vary_data: expected true or false")
    # the study draws the faults: the base's own [faults] are cleared
    clear = ["faults.kill={}", "faults.slow={}", "faults.colluders=[]", "faults.kill_compute=[]"]
    try:
        base = load_market_config(base_path, [*sets, *clear])
    except ConfigError as exc:
        raise ConfigError(f"{name}: [study].base: {exc}") from None
    if base.source == "files":
        raise ConfigError(f"{name}: [study].base: a study simulates its data (source 'files')")
    if base.faults.kill_curator_at is not None:
        raise ConfigError(f"{name}: [study].base: [faults].kill_curator_at is not simulated")
    if base.secure.get("refresh_every"):
        raise ConfigError(f"{name}: [study].base: [privacy].refresh_every: refresh rounds are "
                          "not simulated by a study (set it to 0 in [study].set)")  # fmt: skip
    if "stream" in base.data:
        raise ConfigError(f"{name}: [study].base: [data].stream is not simulated by a study")
    timing, epoch_range = _timing(name, data.get("timing", {}))
    defaults = {
        "owners": base.owners, "tolerance": base.tolerance,
        "compute_nodes": base.compute_nodes, "dropout": 0.0, "slow_fraction": 0.0,
        "slow_delay": 2.0 * base.deadline_seconds, "colluders": 0, "who_fails": "random",
    }  # fmt: skip
    values = [_axis(name, a, axes.get(a), defaults[a]) for a in _AXES]
    cells, configs = [], {}
    for i, combo in enumerate(itertools.product(*values)):
        cell = Cell(i, *combo)
        where = f"{name}: cell {cell.key}"
        if base.source == "digits" and cell.owners != 5:
            raise ConfigError(f"{where}: [axes].owners: the digits split has 5 owners")
        if cell.colluders > cell.owners:
            raise ConfigError(f"{where}: [axes].colluders: more colluders than owners")
        cell_sets = [
            *sets, *clear, f"market.owners={cell.owners}",
            f"market.tolerance={cell.tolerance}", f"market.compute_nodes={cell.compute_nodes}",
            *_grouping(base, cell.owners),
        ]  # fmt: skip
        try:
            config = load_market_config(base_path, cell_sets)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        cells.append(cell)
        configs[cell.key] = config
    return StudyConfig(
        path=name,
        name=str(study.get("name", Path(path).stem)),
        base=base,
        base_path=str(base_path),
        sets=tuple(sets),
        trials=n_trials,
        seed=seed,
        vary_data=vary,
        out=str(study.get("out", f"out/studies/{Path(path).stem}")),
        timing=timing,
        epoch_range=epoch_range,
        cells=tuple(cells),
        configs=configs,
    )
