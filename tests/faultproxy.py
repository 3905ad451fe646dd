"""A TCP proxy that breaks the network between a daemon and PostgreSQL, on demand.

`FaultProxy(target_port)` listens on 127.0.0.1 at a free port and forwards every
connection to the private PostgreSQL's TCP address (tests/postgres.py). While the daemon
runs, a test switches what the network does:

- `heal()`: bytes pass (the start). A connection whose client closed it during a
  blackhole keeps its server side open, silent, for good: what a middlebox does (a
  connection pooler, a TCP proxy, a NAT keeping state), which answers the server's
  keepalives itself. `heal(middlebox=False)` is a plain network instead: the client's
  kernel answers the server's next packet on such a connection with a reset, so the
  server side is reset at the heal.
- `blackhole()`: connections stay open and bytes are taken and dropped, both ways, on
  the connections open now and on new ones (accepted, never forwarded): what a partition
  looks like to both ends, which see no error, only silence.
- `delay(seconds)`: each chunk waits that long before it is passed on.
- `reset()`: every open connection is closed with a TCP reset (new ones pass).
- `cut_inside_transaction(after="UPDATE nodes")`: the next time the server tells a
  client that a transaction is open (ReadyForQuery, status T) after a statement holding
  `after`, the proxy turns into a blackhole right after passing that answer on: the client
  thinks its statement done and waits for its COMMIT's answer forever, while the server
  holds the transaction's row locks for a client it will not hear from again.
- `cut_at_commit(after="UPDATE jobs SET state")`: once a connection has sent a statement
  holding `after`, the COMMIT it sends next reaches the server, and the proxy turns into a
  blackhole right after passing it on: the write is applied, its answer never arrives.
- `cut_mid_pipeline(after="INSERT INTO timeline_points")`: the next Execute a client
  sends of a statement holding `after` reaches the server, and the proxy turns into a
  blackhole right after it, dropping the rest of that chunk: a pipeline (psycopg's
  `executemany`: a Bind and an Execute per row, one Sync at the end) cut before its
  Sync. The server then counts that backend `active`, waiting on its client, and none of
  its own bounds ends it (gpusched.store.abandoned).

It reads PostgreSQL's framing (a type byte and a length), which is why the daemon's URL
disables TLS and GSSAPI (tests/postgres.py `tcp_url`). Pure Python, a thread per direction.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

PASS, BLACKHOLE, DELAY = "pass", "blackhole", "delay"
# The armed cuts' texts: inside a transaction, at its commit, in a pipeline.
_Cuts = tuple[str | None, str | None, str | None]


class _Frames:
    """PostgreSQL's messages in a byte stream: (type, body); the first may have no type."""

    def __init__(self, typed: bool) -> None:
        self._buf = bytearray()
        self._typed = typed
        self._fed = 0  # bytes fed so far
        self._consumed = 0  # bytes of whole messages yielded so far
        self.chunk_start = 0  # where the chunk now being fed starts in the stream

    def ends_in_chunk(self) -> int:
        """How many bytes of the chunk being fed end the message just yielded."""
        return self._consumed - self.chunk_start

    def feed(self, data: bytes) -> Iterator[tuple[bytes, bytes]]:
        self._buf += data
        self.chunk_start = self._fed
        self._fed += len(data)
        while True:
            head = 5 if self._typed else 4
            if len(self._buf) < head:
                return
            kind = bytes(self._buf[:1]) if self._typed else b""
            length = int.from_bytes(self._buf[head - 4 : head], "big")
            total = length + (1 if self._typed else 0)
            if len(self._buf) < total:
                return
            body = bytes(self._buf[head:total])
            del self._buf[:total]
            self._consumed += total
            self._typed = True
            yield kind, body


class _Pair:
    def __init__(self, client: socket.socket, server: socket.socket | None) -> None:
        self.client = client
        self.server = server
        self.after_statement = False  # the last statement held the cut's text
        self.prepared: dict[bytes, bytes] = {}  # statement name -> its text (psycopg prepares)
        self.commit_armed = False  # sent a statement holding cut_at_commit's text
        self.bound = b""  # the text of the statement last bound (for its Execute)
        self.client_gone = False  # the client closed its end during a blackhole

    def close(self, reset: bool = False) -> None:
        for sock in (self.client, self.server):
            if sock is None:
                continue
            with contextlib.suppress(OSError):
                if reset:  # linger 0: close() sends RST, not FIN
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                # A pump thread may be blocked in recv() on it, which holds the socket
                # past close(); shutting down its reading side wakes that thread first.
                sock.shutdown(socket.SHUT_RD)
            with contextlib.suppress(OSError):
                sock.close()


class FaultProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._mode = PASS
        self._delay_s = 0.0
        self._cut_after: str | None = None
        self._commit_after: str | None = None
        self._pipeline_after: str | None = None
        self.cut = threading.Event()  # set when an armed cut (any of the three) cut
        self._pairs: set[_Pair] = set()
        self._closed = False
        threading.Thread(target=self._accept, name="faultproxy", daemon=True).start()

    # -- what the network does ----------------------------------------------------------------

    def heal(self, middlebox: bool = True) -> None:
        with self._lock:
            self._mode, self._cut_after, self._commit_after = PASS, None, None
            self._pipeline_after = None
            gone = {pair for pair in self._pairs if pair.client_gone}
            if not middlebox:
                self._pairs -= gone
        if not middlebox:
            for pair in gone:
                pair.close(reset=True)

    def blackhole(self) -> None:
        with self._lock:
            self._mode = BLACKHOLE

    def delay(self, seconds: float) -> None:
        with self._lock:
            self._mode, self._delay_s = DELAY, seconds

    def reset(self) -> None:
        with self._lock:
            pairs, self._pairs = set(self._pairs), set()
        for pair in pairs:
            pair.close(reset=True)

    def kept(self) -> int:
        """Connections whose client closed them during a blackhole, their server side
        kept open (a middlebox's heal)."""
        with self._lock:
            return sum(pair.client_gone for pair in self._pairs)

    def describe(self) -> str:
        """What the network does now, for a failure report: pass, blackhole, delay N s,
        and a cut still armed."""
        with self._lock:
            mode = f"delay {self._delay_s:g} s" if self._mode == DELAY else self._mode
            cuts = (self._cut_after, self._commit_after, self._pipeline_after)
            armed = [f"cut armed after {a!r}" for a in cuts if a]
            total, gone = len(self._pairs), sum(pair.client_gone for pair in self._pairs)
        return ", ".join([mode, *armed, f"{total} connections ({gone} kept for a client gone)"])

    def cut_inside_transaction(self, after: str = "UPDATE nodes") -> threading.Event:
        with self._lock:
            self.cut.clear()
            self._cut_after = after
        return self.cut

    def cut_at_commit(self, after: str = "UPDATE jobs SET state") -> threading.Event:
        with self._lock:
            self.cut.clear()
            self._commit_after = after
        return self.cut

    def cut_mid_pipeline(self, after: str = "INSERT INTO timeline_points") -> threading.Event:
        with self._lock:
            self.cut.clear()
            self._pipeline_after = after
        return self.cut

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):  # shutdown: close() alone leaves accept() waiting
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        self.reset()

    # -- forwarding ---------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                mode = self._mode
            server = None
            if mode != BLACKHOLE:
                try:
                    server = socket.create_connection(self.target, timeout=5)
                    server.settimeout(None)
                except OSError:
                    client.close()  # the server is down: refused, as it would be
                    continue
            pair = _Pair(client, server)
            with self._lock:
                self._pairs.add(pair)
            threading.Thread(target=self._pump, args=(pair, True), daemon=True).start()
            if server is not None:
                threading.Thread(target=self._pump, args=(pair, False), daemon=True).start()

    def _pump(self, pair: _Pair, upstream: bool) -> None:
        source = pair.client if upstream else pair.server
        sink = pair.server if upstream else pair.client
        assert source is not None
        frames = _Frames(typed=not upstream)
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                with self._lock:
                    mode, delay_s = self._mode, self._delay_s
                    cuts: _Cuts = (self._cut_after, self._commit_after, self._pipeline_after)
                # Framing is followed on every byte, so that a cut armed later starts in step.
                keep = self._watch(pair, upstream, frames, data, cuts)
                if mode == BLACKHOLE or sink is None:
                    continue  # taken and dropped
                if mode == DELAY:
                    time.sleep(delay_s)
                sink.sendall(data if keep is None else data[:keep])
                if keep is not None:
                    with self._lock:
                        self._mode, self._cut_after, self._commit_after = BLACKHOLE, None, None
                        self._pipeline_after = None
                    self.cut.set()
        except OSError:
            pass
        with self._lock:
            if self._mode == BLACKHOLE and pair in self._pairs:
                pair.client_gone = pair.client_gone or upstream
                return  # silence: the other end must not learn that this one closed
            self._pairs.discard(pair)
        pair.close()

    @staticmethod
    def _watch(
        pair: _Pair, upstream: bool, frames: _Frames, data: bytes, cuts: _Cuts
    ) -> int | None:
        """How much of this chunk to pass on before a cut, None for no cut: all of it
        when it is the server saying a transaction is open after `after` or the
        client's COMMIT after `commit_after`; up to the end of the first Execute of a
        statement holding `pipeline_after`."""
        after, commit_after, pipeline_after = cuts
        cut = False
        for kind, body in frames.feed(data):
            in_pipeline = pipeline_after is not None and pipeline_after.encode() in pair.bound
            if upstream and kind == b"E" and in_pipeline:
                return frames.ends_in_chunk()
            text = None
            if kind == b"Q":  # a simple query
                text = body
            elif kind == b"P":  # Parse: statement name, text
                name, _, rest = body.partition(b"\0")
                pair.prepared[name] = rest.partition(b"\0")[0]
            elif kind == b"B":  # Bind: portal name, statement name (its text from Parse)
                statement = body.split(b"\0", 2)[1]
                text = pair.bound = pair.prepared.get(statement, b"")
            elif kind == b"Z" and pair.after_statement and body[:1] == b"T":
                cut = cut or after is not None
            if text is None:
                continue
            pair.after_statement = after is not None and after.encode() in text
            if commit_after is None:
                pair.commit_armed = False
            elif commit_after.encode() in text:
                pair.commit_armed = True
            elif pair.commit_armed and text.lstrip().upper().startswith(b"COMMIT"):
                cut = True
        return len(data) if cut else None
