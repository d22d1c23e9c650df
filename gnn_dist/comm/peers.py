"""Who is lost when a job dies: each rank watches its ring neighbours over plain TCP, beside MPI.

When a host vanishes, MPI does not say who went: the launcher tears the job down within a second and kills
the surviving ranks (Hydra prints only `assert (!closed) failed`). So every rank opens one listening socket,
the ranks swap (rank, host, port) once at set-up (the only collective here, through the communicator), and
each rank keeps a TCP connection to the next rank and one from the previous. A process that dies closes its
sockets (the kernel does that even for SIGKILL), so its neighbours see the connection end within
milliseconds, before the launcher's teardown reaches them, and print one line naming the rank and host they
lost. A rank that finishes or fails on purpose says so on its connections first (one byte), so only a silent
loss is reported.

A cut link closes nothing. The watchdog (gnn_dist.resilience.watchdog) catches that stall; it then asks `unreachable()`,
which tries to connect to every peer with a short timeout, and names the ranks that do not answer.
"""
from __future__ import annotations

import select
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

BYE, FAILING = b"B", b"F"
PROBE_TIMEOUT = 3.0


@dataclass(frozen=True)
class Peer:
    rank: int
    host: str
    port: int


class PeerMonitor:
    def __init__(self, rank: int, listener: socket.socket, roster: list[Peer]):
        self.rank, self.roster = rank, roster
        self.host = roster[rank].host
        self._listener = listener
        self._links: dict[socket.socket, Peer] = {}
        self._said: set[socket.socket] = set()  # neighbours that said they were leaving
        self._closing = threading.Event()
        self.lost: list[str] = []
        self._reported: set[int] = set()

    @classmethod
    def start(cls, comm) -> PeerMonitor | None:
        """Collective: the listener, the roster and the ring connections (None on one rank)."""
        if comm.size < 2:
            return None
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("0.0.0.0", 0))
        listener.listen(16)
        me = Peer(comm.rank, socket.gethostname(), listener.getsockname()[1])
        monitor = cls(comm.rank, listener, [Peer(*p) for p in comm.allgather_object((me.rank, me.host, me.port))])
        monitor._connect()
        threading.Thread(target=monitor._watch, name="gnn-dist-peers", daemon=True).start()
        return monitor

    def _connect(self) -> None:
        size = len(self.roster)
        successor = self.roster[(self.rank + 1) % size]
        outgoing = socket.create_connection((successor.host, successor.port), timeout=30)
        outgoing.sendall(self.rank.to_bytes(4, "little"))
        self._links[outgoing] = successor  # at P = 2 the successor is the predecessor too: two links, both watched
        self._listener.settimeout(30)
        incoming, _ = self._listener.accept()
        self._links[incoming] = self.roster[int.from_bytes(_exactly(incoming, 4), "little")]
        for link in self._links:
            link.settimeout(None)
            link.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        self._listener.settimeout(None)
        threading.Thread(target=self._answer_probes, name="gnn-dist-probes", daemon=True).start()

    def _answer_probes(self) -> None:
        """Accept and drop: a probe only needs the connection to be accepted."""
        while not self._closing.is_set():
            try:
                connection, _ = self._listener.accept()
                connection.close()
            except OSError:
                return

    def _watch(self) -> None:
        links = list(self._links)
        while links and not self._closing.is_set():
            ready, _, _ = select.select(links, [], [], 1.0)
            for link in ready:
                try:
                    data = link.recv(1)
                except OSError:
                    data = b""
                if data in (BYE, FAILING):
                    self._said.add(link)
                    continue
                if data:
                    continue
                links.remove(link)
                peer = self._links[link]
                if link not in self._said and not self._closing.is_set() and peer.rank not in self._reported:
                    self._reported.add(peer.rank)  # at P = 2 both links lead to the one peer
                    line = (f"gnn-dist train: error on rank {self.rank} ({self.host}): lost rank {peer.rank} on host "
                            f"{peer.host}: its connection closed without a word (the process or its host died); "
                            f"the job stops")
                    self.lost.append(line)
                    print(line, file=sys.stderr, flush=True)

    def unreachable(self) -> list[str]:
        """Peers that do not accept a connection within PROBE_TIMEOUT, as 'rank R on HOST (why)'."""
        def probe(peer: Peer) -> str | None:
            try:
                socket.create_connection((peer.host, peer.port), timeout=PROBE_TIMEOUT).close()
                return None
            except TimeoutError:
                return f"rank {peer.rank} on {peer.host} (no answer in {PROBE_TIMEOUT:g} s: host or link down)"
            except OSError as err:
                return f"rank {peer.rank} on {peer.host} ({err.strerror or err})"

        others = [p for p in self.roster if p.rank != self.rank]
        with ThreadPoolExecutor(max_workers=min(32, max(1, len(others)))) as pool:
            return [found for found in pool.map(probe, others) if found]

    def close(self, failing: bool = False) -> None:
        """Tell the neighbours this rank leaves on purpose, then close."""
        self._closing.set()
        for link in self._links:
            try:
                link.sendall(FAILING if failing else BYE)
            except OSError:
                pass
        for link in self._links:
            try:
                link.close()
            except OSError:
                pass
        try:
            self._listener.close()
        except OSError:
            pass


def _exactly(connection: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = connection.recv(count - len(data))
        if not chunk:
            raise ConnectionError("a peer closed its connection during set-up")
        data += chunk
    return data
