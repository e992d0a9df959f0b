"""What ``run`` needs from a files market, checked in seconds without Ray (``dpmarket validate``).

The record schema of ``[data]`` (features, label column, bounds, policy, header) is checked
against the config, then every owner, validation and seed file against the schema: the file
exists and is readable, and its first rows (a bounded prefix, :func:`probe`) decode. The first
impossible thing raises :class:`ConfigError` naming the file, the line and the key; bad rows
among good ones are reported (they will go to the rejects files). ``run`` calls
:func:`check_inputs` before it connects to Ray. Data paths are relative to the configuration
file's directory; output directories (``--out``, ``[run].out``) to the working directory; both
are made absolute here, on the driver, before anything reaches a worker. The files of an owner
placed with ``[owners.NAME]`` are paths on its node: they are checked there, by its actor,
before any secure sum (actors/config/placement.py), not here.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpmarket.actors.config.checks import ConfigError
from dpmarket.actors.config.inputs import MarketConfig
from dpmarket.streams.records.files import (
    ARITY,
    RAW_LIMIT,
    Probe,
    Schema,
    SchemaError,
    format_of,
    probe,
)

__all__ = [
    "FileCheck",
    "InputsCheck",
    "check_inputs",
    "check_out_in_job",
    "check_schema",
    "check_stores_in_job",
    "data_path",
    "key_line",
    "ray_job_submission",
    "resolve_out",
    "resolved_data",
]

PROBE_ROWS, PROBE_BYTES = 50, 1 << 16
_TABLE = re.compile(r"^\s*\[\s*([^\]]+?)\s*\]")


# the job supervisor of ``ray job submit`` starts the entrypoint with this variable (its
# runtime_env and metadata, the submission id under "job_submission_id"): Ray 2.60's
# dashboard/modules/job/job_supervisor.py; a driver started by hand has no such variable
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def ray_job_submission() -> str | None:
    """The submission id (``raysubmit_...``) of the Ray job this process is the entrypoint
    of, ``"unknown"`` for a job whose metadata names none, None outside ``ray job submit``."""
    value = os.environ.get(RAY_JOB_ENV)
    if value is None:
        return None
    try:
        metadata = json.loads(value).get("metadata") or {}
    except (ValueError, AttributeError):
        return "unknown"
    return str(metadata.get("job_submission_id") or "unknown")


def check_out_in_job(out: str | Path, where: str) -> None:
    """Inside ``ray job submit`` a relative output directory is refused (ConfigError, exit 2):
    the entrypoint runs in the job's working directory, a copy Ray unpacks into its per-job
    package cache (``runtime_resources``), which Ray deletes when it needs the space and a
    restarted head forgets, so the journal a resume needs and the outputs would go with it."""
    job = ray_job_submission()
    if job is not None and not Path(out).expanduser().is_absolute():
        raise ConfigError(
            f"{where} {str(out)!r} is relative, and this is Ray job {job}, whose working "
            f"directory ({Path.cwd()}) is Ray's per-job package cache: outputs and the journal "
            "written there are lost when Ray clears it; give an absolute --out on the head "
            "(e.g. --out /srv/dpmarket/out)"
        )


def check_stores_in_job(config: MarketConfig) -> None:
    """Inside ``ray job submit`` a budget store (an owner's or a consumer's ledger) inside the
    job's working directory is refused (ConfigError, exit 2): a relative ``ledger_dir`` or
    ``ledger`` is taken from the config's directory, which in a job is Ray's package cache, and
    a store lost with it forgets what its party spent."""
    job = ray_job_submission()
    if job is None:
        return
    cache = Path.cwd().resolve()
    stores = {f"[owners.{o}] ledger": b.ledger for o, b in config.budgets.items()}
    if config.consumer_budget is not None:
        stores["the consumer's ledger"] = config.consumer_budget.ledger
    for request in config.requests:
        if request.consumer is not None:
            stores[f"[[requests]] ({request.name}) ledger"] = request.consumer.ledger
    for what, store in stores.items():
        if Path(store).resolve().is_relative_to(cache):
            raise ConfigError(
                f"{config.path}: {what} {store} is inside the working directory of Ray job "
                f"{job} ({cache}), Ray's per-job package cache: a budget store there is lost "
                "with it, and its party's spending forgotten; give [privacy].ledger_dir (or "
                "the ledger) an absolute path on the node"
            )


def resolve_out(config: MarketConfig, cli_out: str | Path | None) -> Path:
    """The output directory: ``--out`` if given, else ``[run].out``; either way a relative path
    is taken from the working directory (data paths are taken from the config's directory);
    inside ``ray job submit`` a relative one is refused (:func:`check_out_in_job`), and so is
    a budget store in the job's working directory (:func:`check_stores_in_job`)."""
    check_out_in_job(cli_out or config.out, "--out" if cli_out else "[run].out")
    check_stores_in_job(config)
    return Path(cli_out or config.out).expanduser().absolute()


def data_path(config_path: str, name: str) -> str:
    """An input file named in a config at ``config_path``, as an absolute path made on the
    driver when the config is parsed: a relative name is taken from the configuration file's
    directory (never from a worker's current directory). A placed owner opens this path on its
    own node."""
    return os.path.normpath((Path(config_path).parent / Path(name).expanduser()).absolute())


def resolved_data(config_path: str, data: dict[str, Any]) -> dict[str, Any]:
    """``[data]`` of a files market with every input path absolute (:func:`data_path`): the
    config is parsed once, and nothing later resolves a path again."""
    out = dict(data)
    for key in ("validation", "seed_set"):
        if isinstance(out.get(key), str):
            out[key] = data_path(config_path, out[key])
    files = out.get("files")
    if isinstance(files, dict):
        out["files"] = {
            owner: [data_path(config_path, n) if isinstance(n, str) else n for n in names]
            if isinstance(names, list)
            else names
            for owner, names in files.items()
        }
    return out


def key_line(config_path: str, section: str, key: str) -> int | None:
    """The line of ``key`` in table ``section`` of a TOML file (``None`` if not written there,
    e.g. set with ``--set``)."""
    try:
        text = Path(config_path).read_text(encoding="utf-8")
    except OSError:
        return None
    table, pattern = "", re.compile(rf"^\s*['\"]?{re.escape(key)}['\"]?\s*=")
    for number, line in enumerate(text.splitlines(), start=1):
        match = _TABLE.match(line)
        if match:
            table = match.group(1).replace(" ", "")
        elif table == section and pattern.match(line):
            return number
    return None


def _at(config: MarketConfig, section: str, key: str) -> str:
    """``CONFIG:LINE: [section].key`` for an error message."""
    line = key_line(config.path, section, key)
    return f"{config.path}{f':{line}' if line else ''}: [{section}].{key}"


def check_schema(config: MarketConfig) -> Schema:
    """The record schema of ``[data]``, each key checked against the others."""
    d = config.data
    k = d.get("features")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"{_at(config, 'data', 'features')}: expected an integer >= 1, got {k!r}")
    policy = d.get("policy", "clip")
    if policy not in ("clip", "reject"):
        raise ConfigError(f"{_at(config, 'data', 'policy')}: {policy!r} is not 'clip' or 'reject'")
    label = d.get("label_column")
    if label is not None and (isinstance(label, bool) or not isinstance(label, int)):
        raise ConfigError(f"{_at(config, 'data', 'label_column')}: expected an integer")
    if label is not None and not 0 <= label <= k:
        raise ConfigError(
            f"{_at(config, 'data', 'label_column')}: {_label_range(config, k, label)}"
        )
    bounds: dict[str, tuple[float, ...]] = {}
    for key in ("lower", "upper"):
        value = d.get(key)
        values: list[Any] = value if isinstance(value, list) else [value] * k
        if len(values) != k:
            raise ConfigError(
                f"{_at(config, 'data', key)}: {len(values)} values for features = {k} "
                "(give one number for every feature, or a single number for all)"
            )
        bounds[key] = tuple(float(v) for v in values)
    for i, (low, high) in enumerate(zip(bounds["lower"], bounds["upper"], strict=True)):
        if low > high:
            column = i if label is None or i < label else i + 1
            raise ConfigError(
                f"{_at(config, 'data', 'lower')}: feature {i} (column {column} of a row) has "
                f"lower {low:g} > upper {high:g} ([data].upper)"
            )
    if "header" in d and not isinstance(d["header"], bool):
        raise ConfigError(f"{_at(config, 'data', 'header')}: expected true or false")
    try:
        return Schema(k, bounds["lower"], bounds["upper"], label, policy)
    except SchemaError as exc:
        raise ConfigError(f"{_at(config, 'data', 'lower')}: {exc}") from None


def _label_range(config: MarketConfig, k: int, label: int) -> str:
    """Why ``label_column`` is out of range; when the first data file's rows are longer than
    ``features + 1``, that ``features`` is short (the usual cause), with the file named."""
    plain = (
        f"{label} is out of range: with features = {k} a record has {k + 1} columns, so the "
        f"label is a column index 0..{k}"
    )
    names = [n for names in config.data.get("files", {}).values() for n in names]
    names += [config.data[key] for key in ("validation", "seed_set") if key in config.data]
    for name in names[:1]:
        path = Path(str(name))
        try:
            columns = probe(path, Schema.box(1, 0.0, 1.0), header=config.data.get("header")).columns
        except (OSError, ValueError):
            return plain
        if columns is not None and columns > k + 1:
            more = columns - k - 1
            return (
                f"{plain}; the rows of {path} have {columns} values, {more} more than "
                f"features + 1 = {k + 1}: [data].features = {k} is {more} short (set "
                f"features = {columns - 1} for {columns - 1} features and the label)"
            )
    return plain


@dataclass(frozen=True)
class FileCheck:
    """One input file and what its first rows showed."""

    party: str  # an owner's name, "validation" or "seed_set"
    section: str
    key: str
    probe: Probe

    def describe(self) -> list[str]:
        p = self.probe
        columns = "" if p.columns is None else f", {p.columns} columns"
        header = ""
        if p.header:
            why = "[data].header = true"
            if p.header_detected:
                why = "detected: its fields are not numbers, the next line's are"
            header = f"; header line skipped ({why})"
        lines = [
            f"{self.party:<10} {p.path} ({p.format}, {p.size} bytes): {p.rows} rows probed, "
            f"{p.valid} valid, {len(p.rejects)} rejected{columns}{header}"
        ]
        lines += [
            f"{'':<10} line {line}: {r.reason} ({r.detail}): goes to the rejects file"
            for line, r in p.rejects[:5]
        ]
        return lines


@dataclass(frozen=True)
class InputsCheck:
    """The schema and the checked input files of a files market."""

    schema: Schema
    files: tuple[FileCheck, ...]
    # placed owners' files, not probed here: (owner, where it is placed, its paths)
    skipped: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    @property
    def headers(self) -> dict[str, bool]:
        """Path -> whether its first line is a header to skip."""
        return {f.probe.path: f.probe.header for f in self.files}

    @property
    def warnings(self) -> tuple[str, ...]:
        """What looks wrong in the probed rows though every row decodes: a header line that is
        all numbers (a record lost), a label column that does not look like a label."""
        out = [
            f"{f.probe.path}: [data].header = true but its first line is all numbers: it is "
            "skipped as a header and that record is lost (set header = false, or omit it to "
            "detect a header)"
            for f in self.files
            if f.probe.header_numeric
        ]
        label = label_warning(self.schema, self.files)
        return tuple(out + ([label] if label else []))

    def describe(self) -> list[str]:
        s = self.schema
        label = "none" if s.label_column is None else f"column {s.label_column}"
        lines = [
            f"schema: {s.n_features} features, label {label}, {s.n_columns} columns per row, "
            f"policy {s.policy}"
        ]
        lines += [line for f in self.files for line in f.describe()]
        return lines + [
            f"{owner:<10} {path}: NOT CHECKED here (placed on {where}: a path on its node, "
            "checked there by its actor before any secure sum)"
            for owner, where, paths in self.skipped
            for path in paths
        ]


LABEL_CLASSES = 10
"""A label column with more distinct values than this and than half the probed rows, or with
values that are not whole numbers, does not look like a class label."""


def label_warning(schema: Schema, files: tuple[FileCheck, ...]) -> str | None:
    """A warning when the declared label column does not look like a label (whole numbers,
    few distinct values) in the probed rows of every file, naming the columns that do."""
    if schema.label_column is None:
        return None
    labels = [v for f in files for v in f.probe.labels]
    rows = [r for f in files for r in f.probe.features]
    distinct = set(labels)
    whole = all(float(v).is_integer() for v in labels)
    if not labels or (whole and len(distinct) <= max(LABEL_CLASSES, len(labels) // 2)):
        return None
    shown = ", ".join(f"{v:g}" for v in sorted(distinct)[:4])
    why = "values that are not whole numbers" if not whole else "many distinct values"
    hint = ""
    if rows:
        columns = [
            i if i < schema.label_column else i + 1
            for i, values in enumerate(zip(*rows, strict=True))
            if all(float(v).is_integer() for v in values) and len(set(values)) <= LABEL_CLASSES
        ]
        if columns:
            hint = f"; column(s) {columns} hold a few whole numbers: is the label there?"
    return (
        f"[data].label_column = {schema.label_column} does not look like a label: "
        f"{len(distinct)} distinct values in {len(labels)} probed rows, {why} ({shown}, ...)"
        f"{hint} (a continuous target may ignore this)"
    )


def _values(raw: bytes, length: int) -> str:
    return str(raw.count(b",") + 1) if length <= RAW_LIMIT else "a different number of"


def _check_file(
    config: MarketConfig, schema: Schema, party: str, where: tuple[str, str], path: Path
) -> FileCheck:
    section, key = where
    at = _at(config, section, key)
    if not path.exists():
        raise ConfigError(f"{at}: {party}'s file {path} does not exist")
    if not path.is_file():  # a FIFO or device would block the probe, a directory never ends
        raise ConfigError(
            f"{at}: {party}'s file {path} cannot be read: not a regular file (a FIFO, device "
            "or directory is refused: the run reads regular files)"
        )
    if section == "data.files" and format_of(path) == "npy":  # owners' files are followed
        raise ConfigError(
            f"{at}: {party}'s file {path} is .npy, which is read whole and cannot be followed "
            "as it grows: an owner's files must be CSV, JSONL or msgpack streams (the "
            "validation and seed sets may be .npy)"
        )
    header = config.data.get("header")
    try:
        found = probe(path, schema, header=header, max_bytes=PROBE_BYTES, max_rows=PROBE_ROWS)
    except OSError as exc:
        raise ConfigError(f"{at}: {party}'s file {path} cannot be read ({exc})") from None
    except ValueError as exc:
        raise ConfigError(f"{at}: {party}'s file: {exc}") from None
    arity = [(line, r) for line, r in found.rejects if r.reason == ARITY]
    if arity and (found.valid == 0 or 2 * len(arity) > found.rows):
        line, r = arity[0]
        label = "" if schema.label_column is None else f" + label_column {schema.label_column}"
        raise ConfigError(
            f"{path}:{line}: the row has {_values(r.raw, r.length)} values, but "
            f"[data].features = {schema.n_features}{label} means {schema.n_columns} "
            f"({len(arity)} of the first {found.rows} rows have the wrong arity; set in "
            f"{config.path})"
        )
    if found.rows and found.valid == 0:
        line, r = found.rejects[0]
        raise ConfigError(
            f"{path}:{line}: none of the first {found.rows} rows is usable ({r.reason}: "
            f"{r.detail}); check [data] features, label_column, bounds and policy in {config.path}"
        )
    if party in ("validation", "seed_set") and found.rows == 0:
        raise ConfigError(f"{at}: {path} holds no records")
    return FileCheck(party, section, key, found)


def check_inputs(config: MarketConfig) -> InputsCheck:
    """The schema and every input file of a files market (see the module docstring)."""
    schema = config.schema if config.schema is not None else check_schema(config)
    checks = [
        _check_file(config, schema, owner, ("data.files", owner), Path(name))
        for owner, names in config.data.get("files", {}).items()
        # on its own node: checked there (actors/config/placement.py)
        if owner not in config.placement
        for name in names
    ]
    checks += [
        _check_file(config, schema, key, ("data", key), Path(config.data[key]))
        for key in ("validation", "seed_set")
        if key in config.data  # with [[requests]] each request may name its own
    ]
    skipped = tuple(
        (owner, config.placement[owner].describe(), tuple(str(n) for n in names))
        for owner, names in config.data.get("files", {}).items()
        if owner in config.placement
    )
    return InputsCheck(schema, tuple(checks), skipped)
