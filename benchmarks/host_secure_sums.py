"""One owner host's part of the secure sums at K = 1024, in process (issue 39, item 4).

An ``OwnerHost`` with ``--owners`` owners (512: one of the two owner processes of
benchmarks/owner_scale.py at K = 1024 on two cores) of 500 records x 20 features, under the
operator's trust anchors and a round plan shaped as owner_scale's (normalise: moments, d = 41;
scan: a 50 x 256 sketch, d = 12,800), with three compute-node parties in the same process. Each
step is what the market asks the host in one batched call (``for_owners``), timed alone (wall
and this process's CPU): the identities, the set-up (registrations), the roster (every node's
attestation checked by every owner), the normalise contribution and the scan contribution;
and, for the nodes, one node's handling of its registrations. No Ray: the costs of the
parties' own code, which owner_scale's phases add the relay and the processes to.

    python benchmarks/host_secure_sums.py                # 512 owners, K = 1024 roster
    python benchmarks/host_secure_sums.py --owners 64 --roster 128

Last line: ``{"benchmark": "host_secure_sums", "owners": n, "roster": K, "steps": {...}}``
with each step's ``wall_s`` and ``cpu_s``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from dpmarket.actors.parties.dcaowner import OperatorTrust
from dpmarket.actors.parties.owner import OwnerHost
from dpmarket.actors.randomness import NoiseSource
from dpmarket.protocol.privacy.ledger import ADD_REMOVE
from dpmarket.protocol.securesum.node import ComputeNode, owner_attestation
from dpmarket.protocol.securesum.plan import SecureSumPlan
from dpmarket.protocol.securesum.sealing import generate_keypair, key_fingerprint
from dpmarket.protocol.securesum.spec import DcaConfig
from dpmarket.protocol.wire.codec import decode

NODES = ("compute-1", "compute-2", "compute-3")
SKETCH = {"family": "l2", "rows": 50, "width": 256, "seed": 7, "bandwidth": 1.5}
RECORDS, FEATURES = 500, 20


async def timed(steps: dict[str, dict[str, float]], name: str, work: Awaitable[Any]) -> Any:
    wall, cpu = time.perf_counter(), time.process_time()
    out = await work
    steps[name] = {
        "wall_s": round(time.perf_counter() - wall, 4),
        "cpu_s": round(time.process_time() - cpu, 4),
    }
    return out


async def timed_call(steps: dict[str, dict[str, float]], name: str, work: Callable[[], Any]) -> Any:
    async def run() -> Any:
        return work()

    return await timed(steps, name, run())


async def host_steps(owners: int, roster: int) -> dict[str, dict[str, float]]:
    names = tuple(f"owner-{i}" for i in range(roster))
    mine = names[:owners]  # this host's owners; the rest of the roster registers elsewhere
    config = DcaConfig(
        "bench", names, NODES, tolerance=max(1, roster // 10), bound=5e5 * 9, frac_bits=20
    )
    plan = SecureSumPlan.calibrated(
        config,
        1e-5,
        {
            "normalise": ("moments", 2 * FEATURES + 1, 0.5, 3.0, 1, {"bound": 3.0}),
            "scan": ("sketch", 50 * 256, 0.25, 2.0, 1, SKETCH),
        },
        neighbouring=ADD_REMOVE,
    )
    keys = {n: generate_keypair() for n in NODES}
    trust = OperatorTrust(config, {n: key_fingerprint(pub) for n, (_, pub) in keys.items()}, plan)
    rng = np.random.default_rng(0)
    records = {o: (rng.normal(size=(RECORDS, FEATURES)).clip(-3, 3), None) for o in names}
    steps: dict[str, dict[str, float]] = {}
    host = await timed_call(
        steps,
        "construct (records hashed as they arrive)",
        lambda: OwnerHost("bench", {o: records[o] for o in mine}, NoiseSource.secure(), dca=trust),
    )
    others = OwnerHost("bench", {o: records[o] for o in names[owners:]}, NoiseSource.secure(),
                       dca=trust) if roster > owners else None  # fmt: skip
    hosts = [h for h in (host, others) if h is not None]
    identities: dict[str, bytes] = {}
    for h in hosts:
        identities |= (await h.for_owners("dca_identity", {o: () for o in h._hosted})).results
    nodes = {n: ComputeNode(config, n, keys[n][0], identities, plan=plan) for n in NODES}
    public = {n: node.public_key for n, node in nodes.items()}
    setup = await timed(
        steps, "set-up", host.for_owners("dca_setup", {o: (config, public) for o in mine})
    )
    frames = [decode(f) for o in mine for f in setup.results[o]]
    if others is not None:
        rest = await others.for_owners("dca_setup", {o: (config, public) for o in others._hosted})
        frames += [decode(f) for o in rest.results for f in rest.results[o]]
    first = [m for m in frames if m.recipient == NODES[0]]
    await timed_call(
        steps, "node: registrations", lambda: [nodes[NODES[0]].receive(m) for m in first]
    )
    for m in frames:
        if m.recipient != NODES[0]:
            nodes[m.recipient].receive(m)
    attested = {n: node.attest(True) for n, node in nodes.items()}
    parts = {o: ({n: owner_attestation(a, o) for n, a in attested.items()},) for o in mine}
    await timed(steps, "roster", host.for_owners("dca_roster", parts))
    await timed(steps, "warm-up", host.warm_up())
    for label, what in (("normalise", "moments"), ("scan", "sketch")):
        spec = plan.spec(label, 1 if label == "normalise" else 2)
        calls = {o: (spec, what, plan.options(label)) for o in mine}
        answer = await timed(
            steps, f"{label} contribution", host.for_owners("dca_contribute", calls)
        )
        if answer.errors:
            raise SystemExit(f"host_secure_sums: {label}: {list(answer.errors.items())[:2]}")
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owners", type=int, default=512)
    parser.add_argument("--roster", type=int, default=1024)
    args = parser.parse_args()
    if not 1 <= args.owners <= args.roster:
        parser.error("--owners must be between 1 and --roster")
    steps = asyncio.run(host_steps(args.owners, args.roster))
    print(f"one owner host, {args.owners} owners of a roster of {args.roster} (in process)")
    print(f"{'step':<44} {'wall s':>8} {'cpu s':>8}")
    for name, cost in steps.items():
        print(f"{name:<44} {cost['wall_s']:>8.3f} {cost['cpu_s']:>8.3f}")
    out = {"benchmark": "host_secure_sums", "owners": args.owners, "roster": args.roster}
    print(json.dumps(out | {"steps": steps}))


if __name__ == "__main__":
    main()
