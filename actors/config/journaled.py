"""The effective configuration a run started with, journaled at its start and restored by resume.

A fresh run writes ``OUT/.journal/config.json`` before anything is spent (:func:`journal_config`):
the TOML text it parsed, every ``--set`` override in order, and the configuration's path (its
directory is where relative data paths are taken from). For a files market it also holds a
fingerprint of every input file the driver reads:

- the consumer's validation and seed sets are copied into ``OUT/.journal/inputs/`` under their
  SHA-256 (:func:`stage_consumer_files`, before the run reads them: the run reads the copies), so
  the run and its resume read the same bytes whatever happens to the originals;
- each owner's file (not those of owners placed on other nodes: they are checked there) is
  recorded by its size and the SHA-256 of those bytes when the run started.

``dpmarket resume`` parses that text with those overrides and nothing else (never the config
file again: :func:`restore_config`), and refuses with :class:`ConfigError` (exit 2), naming the
file, when a release could change: a consumer's copy whose bytes changed (and no identical
original left to read), or an owner's file whose recorded bytes are no longer the beginning of
the file at its path or of a rotated sibling (``NAME*``, as the tailer matches them). Records
appended since are fine: owners keep ingesting. Before the run goes on, :func:`journal_config`
restores what it wrote and compares it with the configuration the run uses; a configuration
changed in code after it was parsed (which its text cannot restore) is journaled as not
restorable, and ``resume`` refuses it by name rather than resume another run. The Python API
refuses such a configuration before anything starts (:func:`check_as_parsed`): the refusals
made when a configuration is parsed (noise from a public seed, or add/remove neighbours, on
private files) never saw it.

The same record holds the run's plan decision that depends on more than the configuration
(:func:`journaled_plan`): whether the normalise round is skipped, and the expected record
count that decided it (owners' files may grow before a resume, a rotated file may shrink the
count at its path). A resume, and a rerun of the same purchase's unreleased start, reuse it, so
the round a run planned (charged or not) is the round its resume plans.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from dpmarket.actors.config.checks import ConfigError, apply_set
from dpmarket.actors.config.inputs import FaultConfig, MarketConfig
from dpmarket.actors.config.market import parse_market_config
from dpmarket.actors.config.validate import data_path
from dpmarket.protocol.summary.params import CuratorParams

__all__ = [
    "CONFIG_FILE",
    "INPUTS_DIR",
    "changed_fields",
    "check_as_parsed",
    "check_resumed_mechanism",
    "journal_config",
    "journaled_plan",
    "released_nothing",
    "restore_config",
    "same_unreleased_start",
    "sha256_prefix",
    "stage_consumer_files",
]

CONFIG_FILE, INPUTS_DIR, VERSION = "config.json", "inputs", 1
CONSUMER_KEYS = ("validation", "seed_set")
_CHUNK = 1 << 20


def sha256_prefix(path: Path, size: int | None = None) -> tuple[int, str]:
    """(bytes hashed, SHA-256 hex) of the first ``size`` bytes of regular file ``path`` (all
    of it when ``size`` is None); fewer bytes when the file is shorter. A non-regular file (a
    FIFO would block) raises ConfigError."""
    digest, done = hashlib.sha256(), 0
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{path}: not a regular file")
        while size is None or done < size:
            chunk = os.read(fd, _CHUNK if size is None else min(_CHUNK, size - done))
            if not chunk:
                break
            digest.update(chunk)
            done += len(chunk)
    finally:
        os.close(fd)
    return done, digest.hexdigest()


def _copy_hashed(source: Path, target_dir: Path, key: str) -> tuple[Path, str]:
    """Copy ``source`` into ``target_dir`` as ``KEY-SHA16SUFFIX`` (written, then renamed)."""
    target_dir.mkdir(parents=True, exist_ok=True)
    temporary = target_dir / f".{key}.tmp"
    digest = hashlib.sha256()
    with source.open("rb") as reader, temporary.open("wb") as writer:
        while chunk := reader.read(_CHUNK):
            digest.update(chunk)
            writer.write(chunk)
        writer.flush()
        os.fsync(writer.fileno())
    sha = digest.hexdigest()
    target = target_dir / f"{key}-{sha[:16]}{source.suffix}"
    os.replace(temporary, target)
    return target, sha


def stage_consumer_files(config: MarketConfig, journal_dir: Path) -> MarketConfig:
    """A fresh files market's config with its validation and seed sets read from copies in
    ``journal_dir/inputs`` (named by their SHA-256, so an earlier run's copies stay intact);
    ``written_data`` keeps the paths as the operator wrote them."""
    if config.source != "files":
        return config
    data = dict(config.data)
    for key in CONSUMER_KEYS:
        if isinstance(data.get(key), str):
            copy, _ = _copy_hashed(Path(data[key]), journal_dir / INPUTS_DIR, key)
            data[key] = str(copy)
    return dataclasses.replace(config, data=data)


def journal_config(
    config: MarketConfig, journal_dir: Path, plan: dict[str, Any] | None = None
) -> None:
    """Write ``journal_dir/config.json`` for ``config`` (staged: :func:`stage_consumer_files`),
    then check that :func:`restore_config` gives it back (module docstring). ``plan``: the
    run's plan decision (``records``, ``normalise_skipped``: :func:`journaled_plan`)."""
    record: dict[str, Any] = {
        "version": VERSION,
        "path": str(Path(config.path).absolute()),
        "text": config.text,
        "sets": list(config.sets),
        "consumer": {},
        "owners": {},
    }
    if plan is not None:
        record["plan"] = {"records": float(plan["records"]),
                          "normalise_skipped": plan["normalise_skipped"]}  # fmt: skip
    if config.source == "files":
        for key in CONSUMER_KEYS:
            if isinstance(config.data.get(key), str):
                copy = Path(config.data[key])
                _, sha = sha256_prefix(copy)
                written = str(config.written_data.get(key, ""))  # as the operator wrote it
                record["consumer"][key] = {"copy": copy.name, "sha256": sha, "written": written}
        for owner, names in config.data.get("files", {}).items():
            if owner in config.placement:  # its files are on its node, checked there
                continue
            record["owners"][owner] = [_fingerprint(Path(n)) for n in names]
    _write(journal_dir, record)
    try:
        restored = restore_config(journal_dir, check_owner_files=False)  # just fingerprinted
        differ = changed_fields(restored, config)
        same = not differ
        why = f"the configuration was changed after it was parsed from its text: {differ}"
    except ConfigError as exc:
        same, why = False, str(exc)
    if not same:
        _write(journal_dir, record | {"restorable": False, "reason": why})


def journaled_plan(journal_dir: Path) -> dict[str, Any] | None:
    """The plan decision the run journaled at its start: ``records`` (the expected record
    count the plan used) and ``normalise_skipped`` (the plan's line, or None: the round runs);
    None when the journal holds none (a run journaled before decisions were)."""
    try:
        record = json.loads((journal_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    plan = record.get("plan") if isinstance(record, dict) else None
    if not isinstance(plan, dict):
        return None
    skipped = plan.get("normalise_skipped")
    if not isinstance(plan.get("records"), int | float) or not isinstance(skipped, str | None):
        raise ConfigError(f"{journal_dir / CONFIG_FILE}: its plan decision is malformed: {plan}")
    return {"records": float(plan["records"]), "normalise_skipped": skipped}


def changed_fields(a: MarketConfig, b: MarketConfig) -> list[str]:
    """The fields in which two configurations say different things (bookkeeping and simulated
    faults aside: :func:`_comparable`)."""
    a, b = _comparable(a), _comparable(b)
    return [f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)]


def check_as_parsed(config: MarketConfig) -> None:
    """Refuse (ConfigError naming the fields) a configuration that is not what its own text
    and overrides parse to: one changed in code after it was parsed (``dataclasses.replace``)
    skipped the refusals only parsing makes (``[run].reproducible_noise`` or
    ``neighbouring = "add_remove"`` with files: actors/config/market.py), and a run could not
    journal it for its resume either."""
    try:
        parsed = parse_market_config(config.text, config.path, list(config.sets))
    except ConfigError as exc:
        raise ConfigError(
            f"{config.path}: this configuration is not what its own text and overrides parse to "
            f"(parsing them refuses: {exc}); set every value in the TOML or as an override"
        ) from None
    if differ := changed_fields(parsed, config):
        raise ConfigError(
            f"{config.path}: the configuration was changed after it was parsed from its text: "
            f"{', '.join(differ)} differ from what its text and overrides say, so the checks "
            "made when a configuration is parsed never saw them; set them in the TOML or as "
            "overrides (load_config(path, overrides))"
        )


def _fingerprint(path: Path) -> dict[str, Any]:
    size, sha = sha256_prefix(path)
    return {"path": str(path), "size": size, "sha256": sha}


def _write(journal_dir: Path, record: dict[str, Any]) -> None:
    target = journal_dir / CONFIG_FILE
    temporary = journal_dir / f".{CONFIG_FILE}.tmp"
    temporary.write_text(json.dumps(record, indent=1), encoding="utf-8")
    os.replace(temporary, target)


def same_unreleased_start(journal_dir: Path, config: MarketConfig) -> bool:
    """Whether ``journal_dir`` holds the start of this same purchase (its journaled effective
    configuration equals ``config``, staged) that released nothing: no curator snapshot was
    ever written, or the only one is a stop before any release (:func:`released_nothing`: the
    secure sums' set-up refused, more than T owners unready or a compute node missing). The
    curator journals before its first message leaves it (the secure phases journal a round
    before running it; the epochs' first snapshot precedes the first ask), so without a
    release in the snapshot nothing derived from any release was seen by anyone, and a rerun
    may keep the purchase's ledger run: what it charged up front (the consumer's validation
    plan) is the rerun's own charge, not paid twice (docs/guide/run-and-faults.md)."""
    if not (journal_dir / CONFIG_FILE).is_file():
        return False
    snapshot = journal_dir / "journal.json"
    if snapshot.exists() and not released_nothing(snapshot):
        return False
    try:
        earlier = restore_config(journal_dir, check_owner_files=False)
    except ConfigError:  # not restorable, another version: a new purchase
        return False
    return _comparable(earlier) == _comparable(config)


def released_nothing(snapshot: Path) -> bool:
    """Whether the curator's journal ``snapshot`` shows that nothing was released: in state
    "new", or refused before the summary started (``before_start``), with no secure-sum round
    journaled (not even opened: an opened round may have released) and every ledger empty
    (each release charges one before its value is used). An unreadable snapshot is not."""
    try:
        journaled = json.loads(snapshot.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(journaled, dict):
        return False
    state, refusal = journaled.get("state"), journaled.get("refusal") or {}
    if state != "new" and not (state == "refused" and refusal.get("before_start")):
        return False
    secure = journaled.get("secure_phases") or {}
    if any(secure.get(key) for key in ("rounds", "refreshes", "summary")):
        return False
    ledgers = journaled.get("ledgers")
    return isinstance(ledgers, dict) and not any(
        (ledger or {}).get("events") for ledger in ledgers.values()
    )


def _comparable(config: MarketConfig) -> MarketConfig:
    """What a resume restores: the simulated faults already happened (resume drops them)."""
    # how it was written down (its text, --set list, path) is bookkeeping: what it says is
    # compared field by field
    return dataclasses.replace(
        config, faults=FaultConfig(), text="", sets=(), path="", written_data={}
    )


def restore_config(journal_dir: Path, check_owner_files: bool = True) -> MarketConfig:
    """The configuration journaled in ``journal_dir/config.json``, its input files checked
    (module docstring); ConfigError naming what cannot be restored."""
    where = journal_dir / CONFIG_FILE
    try:
        record = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"{where}: no journaled configuration ({exc}); a run started before configurations "
            "were journaled cannot be resumed as it was started: run it again"
        ) from None
    if not isinstance(record, dict) or record.get("version") != VERSION:
        raise ConfigError(f"{where}: unknown journaled configuration version")
    if record.get("restorable") is False:
        reason = record.get("reason")
        raise ConfigError(f"{where}: this run's configuration cannot be restored ({reason})")
    path, sets = str(record["path"]), [str(s) for s in record["sets"]]
    extra = [
        f"data.{key}={json.dumps(str(_consumer_file(journal_dir, key, entry, path)))}"
        for key, entry in record["consumer"].items()
    ]
    config = parse_market_config(str(record["text"]), path, sets + extra)
    for owner, files in record["owners"].items() if check_owner_files else ():
        for entry in files:
            _check_owner_file(path, owner, entry)
    return dataclasses.replace(
        config, sets=tuple(sets), written_data=_written_data(record["text"], sets, config)
    )


def _written_data(text: str, sets: list[str], config: MarketConfig) -> dict[str, Any]:
    """``[data]`` as the operator wrote it (the consumer's paths before they were copied)."""
    if config.source != "files":
        return config.written_data
    data = tomllib.loads(text)
    for item in sets:
        apply_set(data, item)
    return {k: v for k, v in data.get("data", {}).items() if k != "source"}


def _consumer_file(journal_dir: Path, key: str, entry: dict[str, Any], path: str) -> Path:
    """The consumer's ``key`` file a resume reads: the journaled copy if its bytes are the
    recorded ones, else the original if it still holds them."""
    copy = journal_dir / INPUTS_DIR / str(entry["copy"])
    original = Path(data_path(path, str(entry["written"]))) if entry["written"] else None
    for candidate in (copy, original):
        if candidate is not None and _holds(candidate, None, str(entry["sha256"])):
            return candidate
    raise ConfigError(
        f"{path}: [data].{key}: the consumer's file changed since the run started (neither "
        f"the journaled copy {copy} nor {original} holds the bytes the run read, SHA-256 "
        f"{entry['sha256']}); a resume would release from other data: restore it or run again"
    )


def _holds(path: Path, size: int | None, sha: str) -> bool:
    """Whether regular file ``path`` begins with ``size`` bytes (all of it: None) of ``sha``."""
    try:
        if not path.is_file() or (size is not None and path.stat().st_size < size):
            return False
        done, digest = sha256_prefix(path, size)
    except (OSError, ConfigError):
        return False
    return digest == sha and (size is None or done == size)


def _check_owner_file(path: str, owner: str, entry: dict[str, Any]) -> None:
    """An owner's file still begins with the bytes the run started from (at its path or a
    rotated sibling: ``NAME*`` in its directory, the tailer's match)."""
    name, size, sha = Path(str(entry["path"])), int(entry["size"]), str(entry["sha256"])
    siblings = sorted(name.parent.glob(glob.escape(name.name) + "*"))
    if any(_holds(p, size, sha) for p in [name, *(p for p in siblings if p != name)]):
        return
    raise ConfigError(
        f"{path}: [data.files].{owner}: {name} changed since the run started: its first "
        f"{size} bytes (SHA-256 {sha[:16]}...) are no longer at that path or a rotated "
        f"sibling (owners' files may only grow by appending); a resume would release from "
        f"other records: restore the file or run again with a new --out"
    )


def check_resumed_mechanism(snapshot: Any, params: CuratorParams, out: Path) -> None:
    """Refuse a resume whose config now selects another mechanism than the journaled curator's
    (the config's meaning changed with the default of issue 30): owners, gates and the secure
    sums would follow one plan and the restored curator another."""
    saved = snapshot.get("params") if isinstance(snapshot, dict) else None
    if not isinstance(saved, dict):
        return
    journaled = CuratorParams(**saved).mechanism
    if journaled != params.mechanism:
        raise ConfigError(
            f"{out}: the journal's purchase runs {journaled}, but its configuration now selects "
            f"{params.mechanism} (the default changed): resume it with the version that started "
            f'it, or run it again into a new --out with [summary].mechanism = "{journaled}"'
        )
