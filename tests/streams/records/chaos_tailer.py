"""The tailer process of the chaos test (test_tail_chaos.py), started as a fork server.

Run as a script, it imports the tailer once and then reads commands on stdin: each line
``DIR INCARNATION SEED`` forks a child that tails ``DIR/x.log*`` (state and rejects in ``DIR``)
and answers with the child's PID, so the test can SIGKILL and restart tailers without paying
for the imports each time. Children are reaped automatically (SIGCHLD ignored).

The child is the consumer: for each batch it appends one JSON line per record (``i`` id, ``o``
offset, ``s`` source) to ``DIR/out.INCARNATION``, commits the batch, then appends a commit
marker (``{"c": seq}``). Records after the last marker of a killed incarnation were maybe not
committed and may be delivered again; a record before a marker never may. Once ``DIR/done``
exists and a whole read timed out with nothing new, the child exits 0 (``DIR/exit.N``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import traceback
from pathlib import Path

from dpmarket.streams.records.files import CsvDecoder, Schema
from dpmarket.streams.records.tail import FileTailer

SCHEMA = Schema.box(2, 0.0, 1e6)


async def consume(directory: Path, incarnation: int, seed: int) -> None:
    rng = random.Random(seed)
    tailer = FileTailer(
        directory / "x.log",
        CsvDecoder(SCHEMA),
        directory / "state.json",
        pattern="x.log*",
        poll_interval=0.02,
        rotate_wait=0.2,
        chunk_size=rng.choice([64, 256, 1024, 1 << 16]),
        rejects=directory / "rejects.jsonl",
        fsync=False,
    )
    out = os.open(directory / f"out.{incarnation}", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            finishing = (directory / "done").exists()
            try:
                batch = await asyncio.wait_for(anext(tailer), 0.15)
            except TimeoutError:
                if finishing and tailer.caught_up():
                    return
                continue
            ids = batch.features[:, 0].astype(int).tolist()
            lines = [
                json.dumps({"i": i, "o": int(o), "s": batch.source}) + "\n"
                for i, o in zip(ids, batch.records.offsets.tolist(), strict=True)
            ]
            if lines:
                os.write(out, "".join(lines).encode())
            if rng.random() < 0.3:
                await asyncio.sleep(rng.random() * 0.004)  # widen the take-then-commit window
            await tailer.commit(batch)
            os.write(out, (json.dumps({"c": batch.seq}) + "\n").encode())
    finally:
        os.close(out)
        tailer.close()


def main() -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    for line in sys.stdin:
        directory, incarnation, seed = line.split()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                asyncio.run(consume(Path(directory), int(incarnation), int(seed)))
                Path(directory, f"exit.{incarnation}").write_text("0")
                code = 0
            except BaseException:
                Path(directory, f"error.{incarnation}").write_text(traceback.format_exc())
            finally:
                os._exit(code)
        print(pid, flush=True)


if __name__ == "__main__":
    main()
