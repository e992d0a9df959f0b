"""FaultProxy: a TCP proxy on 127.0.0.1 that a test starts to cut, delay or silence a connection.

The proxy runs its own asyncio loop on its own thread; the test thread switches its mode at any
time, and a switch applies to current and new connections alike (it has taken effect when the
call returns):

- ``pass_through()`` / ``restore()``: forward both ways;
- ``delay(seconds)``: every chunk is forwarded ``seconds`` after it arrived (chunks already
  held are re-timed by the new value; ``restore()`` releases them at once);
- ``drop()``: every current connection is reset (RST, SO_LINGER 0) on both sides, and new
  ones are accepted and reset at once, until ``restore()``;
- ``half_open()``: sockets stay open and nothing is forwarded either way: a silent peer. Bytes
  that arrive meanwhile are lost, so a connection that went silent stays silent after
  ``restore()`` (its TLS stream could not continue anyway); new connections after it pass.

``bytes_up`` (client to target) and ``bytes_down`` (target to client) count bytes forwarded.
``close()`` (or leaving the ``with`` block) resets every connection, closes the listener and
joins the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

__all__ = ["FaultProxy"]

_CHUNK = 65536
_TIMEOUT = 10.0


def _linger_zero(sock: socket.socket | None) -> None:
    """SO_LINGER 0: closing the socket sends RST instead of FIN."""
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@dataclass(eq=False)  # hashed by identity: the proxy keeps a set of them
class _Connection:
    sock: socket.socket  # the client's, owned from accept() on
    client: asyncio.StreamWriter | None = None
    upstream: asyncio.StreamWriter | None = None
    silenced: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def reset(self) -> None:
        """Close both sides abruptly (RST). A client socket not yet wrapped in a transport is
        closed here if nothing serves it yet, else by cancelling the task that wraps it."""
        _linger_zero(self.sock)
        for writer in (self.client, self.upstream):
            if writer is not None and not writer.transport.is_closing():
                _linger_zero(writer.get_extra_info("socket"))
                writer.transport.abort()
        if self.client is None and not self.tasks:
            self.sock.close()
        for task in self.tasks:
            task.cancel()

    def close(self) -> None:
        """Close both sides (FIN)."""
        for writer in (self.client, self.upstream):
            if writer is not None and not writer.transport.is_closing():
                writer.close()


class FaultProxy:
    """A TCP proxy from ``127.0.0.1:port`` (``.port``) to ``target`` with switchable faults."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self._mode = "pass"
        self._delay = 0.0
        self._connections: set[_Connection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)

    # -- the test thread's side ----------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(_TIMEOUT):
            raise RuntimeError("the fault proxy did not start")
        if self._error is not None:
            raise RuntimeError(f"the fault proxy did not start: {self._error}")
        return self

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def mode(self) -> str:
        return self._mode

    def pass_through(self) -> None:
        self._switch("pass", 0.0)

    def restore(self) -> None:
        self._switch("pass", 0.0)

    def delay(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a delay is not negative: {seconds}")
        self._switch("delay", seconds)

    def drop(self) -> None:
        self._switch("drop", 0.0)

    def half_open(self) -> None:
        self._switch("half_open", 0.0)

    def close(self) -> None:
        if self._loop is not None and self._thread.is_alive() and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread.is_alive():
            self._thread.join(_TIMEOUT)
        if self._thread.is_alive():
            raise RuntimeError("the fault proxy's thread did not stop")

    def _call(self, coroutine: Coroutine[Any, Any, None]) -> None:
        if self._loop is None or not self._thread.is_alive():
            coroutine.close()
            raise RuntimeError("the fault proxy is not running")
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(_TIMEOUT)

    def _switch(self, mode: str, delay: float) -> None:
        self._call(self._apply(mode, delay))

    # -- the proxy's loop ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to start(); the thread must not die silently
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._stop = asyncio.Event()
        with socket.create_server(("127.0.0.1", 0)) as listener:
            listener.setblocking(False)
            self.port = int(listener.getsockname()[1])
            accepting = self._spawn(self._accept_loop(listener))
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                await self._stop_accepting(accepting)
                for conn in list(self._connections):
                    conn.reset()
                for task in list(self._tasks):
                    task.cancel()
                await asyncio.gather(*self._tasks, return_exceptions=True)
                for _ in range(3):  # let aborted transports close their sockets
                    await asyncio.sleep(0)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _stop_accepting(self, accepting: asyncio.Task[None]) -> None:
        """End the accept loop by a connection of our own (cancelling it could lose a socket
        it has just accepted); connections still queued are reset when the listener closes."""
        self._closing = True
        if accepting.done():
            return
        with socket.socket() as waker:
            waker.setblocking(False)
            with contextlib.suppress(OSError):
                await asyncio.get_running_loop().sock_connect(waker, ("127.0.0.1", self.port))
            await asyncio.wait({accepting}, timeout=_TIMEOUT)

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(listener)
            conn = _Connection(sock)
            if self._closing:
                conn.reset()
                return
            if self._mode == "drop":
                conn.reset()
                continue
            self._connections.add(conn)
            conn.tasks.append(self._spawn(self._serve(conn)))

    async def _apply(self, mode: str, delay: float) -> None:
        self._mode, self._delay = mode, delay
        for conn in list(self._connections):
            if mode == "drop":
                self._forget(conn)
                conn.reset()
            elif mode == "half_open":
                conn.silenced = True
        assert self._changed is not None
        self._changed.set()  # wakes every held chunk to re-time it
        self._changed = asyncio.Event()

    def _forget(self, conn: _Connection) -> None:
        self._connections.discard(conn)

    async def _serve(self, conn: _Connection) -> None:
        reader, conn.client = await asyncio.open_connection(sock=conn.sock)
        if conn.silenced or self._mode == "half_open":
            conn.silenced = True
            await self._swallow(conn, reader)
            return
        try:
            up_reader, conn.upstream = await asyncio.open_connection(*self.target)
        except OSError:
            self._forget(conn)
            conn.reset()
            return
        if conn not in self._connections:  # dropped while connecting
            conn.reset()
            return
        conn.tasks += [
            self._spawn(self._pump(conn, reader, conn.upstream, up=True)),
            self._spawn(self._pump(conn, up_reader, conn.client, up=False)),
        ]

    async def _swallow(self, conn: _Connection, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(OSError):
            while await reader.read(_CHUNK):
                continue  # half-open: every byte is read and dropped
        self._end(conn)

    async def _pump(
        self,
        conn: _Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up: bool,
    ) -> None:
        """Read chunks into a queue; a second task forwards each when its time has come."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        conn.tasks.append(self._spawn(self._send(conn, queue, writer, up)))
        loop = asyncio.get_running_loop()
        try:
            while data := await reader.read(_CHUNK):
                if not conn.silenced:
                    queue.put_nowait((loop.time(), data))
        except OSError:
            return  # the connection was reset or closed: nothing more to forward
        queue.put_nowait((loop.time(), b""))  # end of stream: close after what is queued

    async def _send(
        self,
        conn: _Connection,
        queue: asyncio.Queue[tuple[float, bytes]],
        writer: asyncio.StreamWriter,
        up: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                arrived, data = await queue.get()
                while not conn.silenced:
                    remaining = arrived + self._delay - loop.time()
                    if remaining <= 0:
                        break
                    assert self._changed is not None
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), remaining)
                if not data:
                    break
                if conn.silenced:
                    continue
                writer.write(data)
                await writer.drain()
                if up:
                    self.bytes_up += len(data)
                else:
                    self.bytes_down += len(data)
        except OSError:
            return  # the connection was reset or closed: nothing more to forward
        self._end(conn)

    def _end(self, conn: _Connection) -> None:
        """One side closed: close both sides (gracefully, unless already reset)."""
        self._forget(conn)
        conn.close()
        current = asyncio.current_task()
        for task in conn.tasks:
            if task is not current:
                task.cancel()
