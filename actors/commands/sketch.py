"""``dpmarket sketch build | merge | release | query``: RACE sketches from files.

- ``build FILE... --features K --lower L --upper U [--label-column C] --rows R --width W
  --bandwidth B --seed S --out OUT``: one pass over the files (CSV, JSONL, msgpack, .npy), records
  clipped to the public bounds, bad records to ``OUT.rejects.jsonl``.
- ``merge A B ... --out OUT``: sum sketches (refused, naming the difference, if their seeds,
  widths, families or bounds differ).
- ``release IN --eps E [--delta D] --out OUT``: Laplace(R/eps) on every counter (Algorithm 1,
  pure eps-DP, one record added or removed), or with ``--delta`` the Gaussian mechanism at L2
  sensitivity sqrt(R) calibrated to (eps, delta). Noise from a CSPRNG keyed by the OS
  (actors/randomness.py); a sketch is built from real files, so there is no seeded noise.
- ``query IN --points FILE.csv [--normalize]``: the KDE estimate at each point (sketch or release).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from dpmarket.actors.config.market import ConfigError
from dpmarket.actors.randomness import NoiseSource
from dpmarket.protocol.wire.errors import RemoteProtocolError
from dpmarket.streams.race.lsh import make_family
from dpmarket.streams.race.sketch import RaceRelease, RaceSketch, gaussian_sigma
from dpmarket.streams.records.files import RejectsWriter, Schema, SchemaError, iter_records

__all__ = ["add_sketch_parser"]


def _load(path: str) -> RaceSketch | RaceRelease:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc})") from None
    for cls in (RaceSketch, RaceRelease):
        try:
            return cls.from_bytes(data)
        except (RemoteProtocolError, ValueError):
            continue
    raise ConfigError(f"{path}: not a RACE sketch or release")


def _build(args: argparse.Namespace) -> int:
    try:
        schema = Schema.box(args.features, args.lower, args.upper, label_column=args.label_column)
    except SchemaError as exc:
        raise ConfigError(f"schema: {exc}") from None
    family = make_family("l2", args.features, args.rows, args.seed, bandwidth=args.bandwidth)
    sketch = RaceSketch(family, args.width)
    rejects = RejectsWriter(Path(args.out + ".rejects.jsonl"))
    count = 0
    for path in args.files:
        if not Path(path).is_file():
            raise ConfigError(f"{path}: no such file")
        for batch in iter_records(path, schema, rejects=rejects):
            if len(batch):
                sketch.update(batch.features)
                count += len(batch)
    Path(args.out).write_bytes(sketch.to_bytes())
    print(f"{count} records into a {args.rows} x {args.width} sketch: {args.out}")
    return 0


def _merge(args: argparse.Namespace) -> int:
    sketches = [_load(p) for p in args.sketches]
    first = sketches[0]
    if not all(isinstance(s, RaceSketch) for s in sketches) or not isinstance(first, RaceSketch):
        raise ConfigError("merge takes raw sketches (merge releases with accumulate)")
    merged = first.copy()
    for other in sketches[1:]:
        if not isinstance(other, RaceSketch):
            raise ConfigError("merge takes raw sketches")
        try:
            merged.merge(other)
        except ValueError as exc:
            raise ConfigError(f"merge: {exc}") from None
    Path(args.out).write_bytes(merged.to_bytes())
    print(f"merged {len(sketches)} sketches: {args.out}")
    return 0


def _release(args: argparse.Namespace) -> int:
    sketch = _load(args.sketch)
    if not isinstance(sketch, RaceSketch):
        raise ConfigError(f"{args.sketch}: already a release")
    if not args.eps > 0:
        raise ConfigError(f"--eps must be positive, got {args.eps}")
    rng = NoiseSource.secure().generator("sketch-release")  # never from a seed: the data is real
    if args.delta is None:
        release = sketch.release_laplace(args.eps, rng)
    else:
        sigma = gaussian_sigma(args.eps, args.delta, sketch.l2_sensitivity)
        release = sketch.release_gaussian(sigma, rng, delta=args.delta)
    Path(args.out).write_bytes(release.to_bytes())
    statement: dict[str, Any] = dataclasses.asdict(release.statement)
    print(json.dumps({"out": args.out, "statement": statement}, default=str))
    return 0


def _query(args: argparse.Namespace) -> int:
    sketch = _load(args.sketch)
    try:
        points = np.loadtxt(args.points, delimiter=",", ndmin=2, dtype=np.float32)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--points {args.points}: cannot read a numeric CSV ({exc})") from None
    try:
        values = sketch.query(points, normalize=args.normalize)
    except ValueError as exc:
        raise ConfigError(f"query: {exc}") from None
    np.savetxt(sys.stdout, values, fmt="%.6g")
    return 0


def add_sketch_parser(sub: Any) -> None:
    cmd = sub.add_parser(
        "sketch",
        help="build, merge, release and query RACE sketches",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = cmd.add_subparsers(dest="verb", required=True)
    build = verbs.add_parser("build", help="one pass over record files into a sketch")
    build.add_argument("files", nargs="+")
    build.add_argument("--features", type=int, required=True)
    build.add_argument("--lower", type=float, required=True)
    build.add_argument("--upper", type=float, required=True)
    build.add_argument("--label-column", type=int)
    build.add_argument("--rows", type=int, default=100)
    build.add_argument("--width", type=int, default=1024)
    build.add_argument("--bandwidth", type=float, default=1.0)
    build.add_argument("--seed", type=int, default=0, help="the LSH seed (public)")
    build.add_argument("--out", required=True)
    build.set_defaults(func=_build)
    merge = verbs.add_parser("merge", help="sum sketches with the same parameters")
    merge.add_argument("sketches", nargs="+")
    merge.add_argument("--out", required=True)
    merge.set_defaults(func=_merge)
    release = verbs.add_parser("release", help="a DP release of a sketch")
    release.add_argument("sketch")
    release.add_argument("--eps", type=float, required=True)
    release.add_argument("--delta", type=float, help="Gaussian mechanism at this delta")
    release.add_argument("--out", required=True)
    release.set_defaults(func=_release)
    query = verbs.add_parser("query", help="KDE estimates at points from a CSV file")
    query.add_argument("sketch")
    query.add_argument("--points", required=True)
    query.add_argument("--normalize", action="store_true")
    query.set_defaults(func=_query)
