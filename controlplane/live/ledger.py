"""Which snapshot Envoy is served, which one every Envoy accepted, and what Envoy refused.

`current` is what every stream is sent, new streams included; `good` is the last snapshot every
connected Envoy acknowledged. A NACK of the current snapshot puts `good` back as current and pushes
it again: Envoy keeps its last good config by itself, but it may have taken part of a refused
update (valid clusters added, missing ones removed), and a stream that opens later must not be
handed the refused config at all. Pure bookkeeping: the ADS shell (ads.py) sends what it returns.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from envoy.service.discovery.v3 import discovery_pb2

from controlplane.live.snapshot import Snapshot
from controlplane.live.streams import EnvoyStream, Verdict


@dataclass(frozen=True)
class Published:
    serial: int
    snapshot: Snapshot


@dataclass(frozen=True)
class Nack:
    serial: int
    version: str
    type_url: str
    node: str
    message: str
    at: float  # time.time()


@dataclass
class Ledger:
    current: Published | None = None
    good: Published | None = None
    last_nack: Nack | None = None
    streams: dict[int, EnvoyStream] = field(default_factory=dict)
    _nacks: dict[int, Nack] = field(default_factory=dict)
    _serials: itertools.count = field(default_factory=lambda: itertools.count(1))
    _stream_ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def publish(self, snap: Snapshot) -> Published:
        """Make `snap` current; the caller pushes `push_all()` to the streams."""
        self.current = Published(next(self._serials), snap)
        if not self.streams:
            # Nobody to confirm it: the first Envoy to connect gets it, and judges it.
            self.good = self.good or self.current
        return self.current

    def open(self, peer: str) -> EnvoyStream:
        stream = EnvoyStream(next(self._stream_ids), peer)
        self.streams[stream.id] = stream
        return stream

    def close(self, stream: EnvoyStream) -> None:
        self.streams.pop(stream.id, None)
        self._promote()

    def push_all(self) -> dict[int, list[discovery_pb2.DiscoveryResponse]]:
        assert self.current is not None
        return {sid: s.respond_all(self.current.serial, self.current.snapshot) for sid, s in self.streams.items()}

    def hear(self, stream: EnvoyStream, req: discovery_pb2.DiscoveryRequest) -> tuple[
            list[discovery_pb2.DiscoveryResponse], bool]:
        """(responses for this stream, whether a rollback must be pushed to every stream)."""
        if req.node.id and not stream.node:
            stream.node = req.node.id
        error = req.error_detail.message if req.HasField("error_detail") else ""
        heard = stream.hear(req.type_url, list(req.resource_names), req.response_nonce,
                            error or ("refused" if req.HasField("error_detail") else ""))
        rollback = False
        if heard.verdict is Verdict.NACK and heard.serial is not None:
            rollback = self._refused(stream, req.type_url, heard.serial, heard.error)
        elif heard.verdict is Verdict.ACK:
            self._promote()
        out = []
        if heard.answer and not rollback and self.current is not None:
            r = stream.respond(req.type_url, self.current.serial, self.current.snapshot)
            if r is not None:
                out.append(r)
        return out, rollback

    def _refused(self, stream: EnvoyStream, type_url: str, serial: int, message: str) -> bool:
        version = self.current.snapshot.version if self.current and self.current.serial == serial else "?"
        nack = Nack(serial, version, type_url, stream.node or stream.peer, message, time.time())
        self._nacks.setdefault(serial, nack)
        self.last_nack = nack
        if self.current is not None and self.current.serial == serial and self.good is not None \
                and self.good.serial != serial:
            self.current = self.good
            return True
        return False

    def _promote(self) -> None:
        cur = self.current
        if cur is not None and self.streams and cur.serial not in self._nacks and self.settled(cur.serial):
            self.good = cur

    def settled(self, serial: int) -> bool:
        """Every connected Envoy accepted `serial` (true with none connected: the next one gets current)."""
        cur = self.current
        if cur is None or cur.serial != serial:
            return False
        return all(s.settled(serial, cur.snapshot) for s in self.streams.values())

    def refused(self, serial: int) -> Nack | None:
        return self._nacks.get(serial)

    def stream_version(self, stream: EnvoyStream) -> str | None:
        """The config version this Envoy runs: the good or current snapshot it settled on."""
        for p in (self.current, self.good):
            if p is not None and stream.settled(p.serial, p.snapshot):
                return p.snapshot.version
        return None

    def clear_nack(self) -> None:
        self.last_nack = None
