"""numba loaded only where it pays (streams/race/kernels.py ``"auto"``, streams/records/text.py):
a process that hashes and parses little never imports it, one that does a lot switches to it,
and the counters and records are the same either way. Each case runs in a fresh interpreter,
where nothing else has imported numba yet."""

from __future__ import annotations

import pytest

from tests.test_packaging import _fresh  # a fresh interpreter's last JSON line

pytest.importorskip("numba")  # with numba missing, "auto" is numpy (tests/test_packaging.py)


SKETCH = """
import json, sys
import numpy as np
from dpmarket.streams.race import kernels
from dpmarket.streams.race.lsh import make_family
from dpmarket.streams.race.sketch import RaceSketch

family = make_family("l2", 13, 64, 3, bandwidth=2.0)
X = np.random.default_rng(0).normal(size=({n}, 13)).astype(np.float32)
auto = RaceSketch(family, 32)
loaded = []
for chunk in np.array_split(X, {chunks}):
    auto.update(chunk)
    loaded.append("numba" in sys.modules)
queried = auto.query(X[:50])
plain = RaceSketch(family, 32, backend="numpy")
plain.update(X)
print(json.dumps({{
    "backend": auto.backend,
    "loaded": loaded,
    "same_counts": bool(np.array_equal(auto.counts, plain.counts)),
    "same_query": bool(np.array_equal(queried, plain.query(X[:50]))),
    "per_record": int(family.projections.size),
    "threshold": kernels.NUMBA_FROM,
}}))
"""


def test_a_small_sketch_never_loads_numba_and_counts_what_numba_counts() -> None:
    out = _fresh(SKETCH.format(n=2000, chunks=4))
    assert out["backend"] == "auto" and out["loaded"] == [False] * 4
    assert out["same_counts"] and out["same_query"]
    assert 2000 * int(out["per_record"]) < int(out["threshold"])  # the case is a small one


def test_hashing_past_the_threshold_switches_to_numba_with_the_same_counters() -> None:
    """Records in 8 chunks whose total projection work passes NUMBA_FROM: the chunks before it
    are hashed with numpy, then numba is loaded and kept; the counters equal numpy's alone."""
    per_record = 13 * 64  # the family above: dim x rows
    n = -(-(1 << 28) // per_record) + 8000  # past the threshold within the last chunks
    out = _fresh(SKETCH.format(n=n, chunks=8))
    loaded = list(out["loaded"])  # type: ignore[call-overload]
    assert loaded[0] is False and loaded[-1] is True
    assert loaded == sorted(loaded)  # once loaded, kept
    assert out["same_counts"] and out["same_query"]


CSV = """
import json, sys
import numpy as np
from dpmarket.streams.records import text
from dpmarket.streams.records.schema import Schema
from dpmarket.streams.records.text import CsvDecoder

k = 13
rows = np.random.default_rng(1).normal(size=({n}, k))
buf = ("\\n".join(",".join(f"{{v:.6f}}" for v in r) for r in rows) + "\\n").encode()
schema = Schema(k, (-1e6,) * k, (1e6,) * k)
loaded, parts = [], []
step = -(-len(buf) // {chunks})
decoder = CsvDecoder(schema)
cut, rest = 0, b""
while cut < len(buf):
    piece = rest + buf[cut : cut + step]
    cut += step
    done = decoder.decode(piece, final=cut >= len(buf))
    parts.append(done.batch.features)
    rest = done.remainder
    loaded.append("numba" in sys.modules)
whole = CsvDecoder(schema, jit=False).decode_all(buf)
print(json.dumps({{
    "loaded": loaded,
    "same": bool(np.array_equal(np.concatenate(parts), whole.features)),
    "bytes": len(buf),
    "threshold": text.JIT_FROM_BYTES,
}}))
"""


def test_a_small_csv_is_parsed_without_numba() -> None:
    out = _fresh(CSV.format(n=3000, chunks=3))
    assert out["loaded"] == [False] * 3 and out["same"]
    assert int(out["bytes"]) < int(out["threshold"])


def test_parsing_past_the_threshold_loads_the_compiled_scanner_with_the_same_records() -> None:
    out = _fresh(CSV.format(n=110_000, chunks=4))  # about 12 MB: past 8 MiB in the third part
    assert int(out["bytes"]) > int(out["threshold"])
    loaded = list(out["loaded"])  # type: ignore[call-overload]
    assert loaded[0] is False and loaded[-1] is True and loaded == sorted(loaded)
    assert out["same"]


HELD = """
import asyncio, json, sys
import numpy as np
from dpmarket.streams.race import kernels
kernels.NUMBA_FROM = 1 << 12  # tiny: the scan below passes it hundreds of times over
from dpmarket.actors.parties.owner import OwnerHost
from dpmarket.actors.randomness import NoiseSource
from tests.actors.test_dcaowner import OWNERS, _session

config, nodes, solo = _session()
trust = solo[OWNERS[0]].trust
rng = np.random.default_rng(0)
host = OwnerHost("run-dca", {{o: (rng.uniform(-3, 3, (500, 2)), None) for o in OWNERS}},
                 NoiseSource.secure(), dca=trust)
keys = {{n: node.public_key for n, node in nodes.items()}}

async def main():
    for owner in OWNERS:
        await host.dca_setup(owner, config, keys)
    {late}
    await host.warm_up()
    warmed = "numba" in sys.modules
    hashed = {{o: [c.n for c in host._hosted[o].dca.columns.values()] for o in OWNERS}}
    spec, options = trust.plan.spec("scan", 1), trust.plan.options("scan")
    calls = {{o: (spec, "sketch", options) for o in OWNERS}}
    answers = await host.for_owners("dca_contribute", calls)
    return warmed, hashed, answers

warmed, hashed, answers = asyncio.run(main())
print(json.dumps({{"warmed": warmed, "after": "numba" in sys.modules, "hashed": hashed,
                  "answered": sorted(answers.results), "errors": answers.errors}}))
"""


@pytest.mark.parametrize(
    "late",
    ["pass", "host._hosted[OWNERS[0]].dca.columns.clear()"],
    ids=["hashed on arrival", "hashed by the warm-up"],
)
def test_an_owner_host_never_loads_numba_for_the_secure_sums(late: str) -> None:
    """Four owners whose scan hashes far past NUMBA_FROM: their records were hashed with
    numpy when they arrived (or, for records not hashed then, by the warm-up), and the round
    only counts the kept columns, so neither the warm-up nor the round loads numba, and every
    owner answers."""
    out = _fresh(HELD.format(late=late))
    assert out["warmed"] is False and out["after"] is False
    assert out["hashed"] == {o: [500] for o in ("owner-0", "owner-1", "owner-2", "owner-3")}
    assert out["answered"] == ["owner-0", "owner-1", "owner-2", "owner-3"] and not out["errors"]
