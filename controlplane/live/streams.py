"""One Envoy's ADS stream (State of the World), as a state machine over plain values: what it
subscribed to, what was sent with which nonce, what it accepted. No I/O: controlplane/live/ads.py
moves the messages, controlplane/live/ledger.py decides what every stream is sent."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from controlplane.live.snapshot import PUSH_ORDER, WILDCARD_TYPES, Snapshot


class Verdict(Enum):
    NONE = "none"  # a first request, a subscription change, or a stale nonce
    ACK = "ack"
    NACK = "nack"


@dataclass(frozen=True)
class Sent:
    serial: int
    nonce: str
    names: frozenset[str]  # the resources the response held


@dataclass
class TypeState:
    subscribed: bool = False
    names: frozenset[str] | None = None  # None: every resource (listeners, clusters)
    sent: Sent | None = None
    acked: Sent | None = None


@dataclass(frozen=True)
class Heard:
    """What one DiscoveryRequest meant."""

    verdict: Verdict
    answer: bool  # send this type's resources now (first request, or other names wanted)
    serial: int | None = None  # the serial acked or nacked
    error: str = ""


@dataclass
class EnvoyStream:
    id: int
    peer: str
    node: str = ""
    types: dict[str, TypeState] = field(default_factory=dict)
    _nonces: itertools.count = field(default_factory=lambda: itertools.count(1))

    def hear(self, type_url: str, names: list[str], nonce: str, error: str) -> Heard:
        ts = self.types.setdefault(type_url, TypeState())
        if nonce and (ts.sent is None or nonce != ts.sent.nonce):
            # An answer to a response superseded since: the request for the newer one follows.
            return Heard(Verdict.NONE, answer=False)
        wanted = None if type_url in WILDCARD_TYPES else frozenset(names)
        changed = not ts.subscribed or wanted != ts.names
        ts.subscribed, ts.names = True, wanted
        if not nonce:
            return Heard(Verdict.NONE, answer=True)
        assert ts.sent is not None
        if error:
            return Heard(Verdict.NACK, answer=changed, serial=ts.sent.serial, error=error)
        ts.acked = ts.sent
        return Heard(Verdict.ACK, answer=changed, serial=ts.sent.serial)

    def respond(self, type_url: str, serial: int, snap: Snapshot) -> discovery_pb2.DiscoveryResponse | None:
        """This type's resources of `snap` for this stream (those it asked for), or None when it asked for none."""
        ts = self.types.setdefault(type_url, TypeState())
        have = snap.of(type_url)
        names = sorted(have) if ts.names is None else sorted(n for n in ts.names if n in have)
        if ts.names is not None and not ts.names:
            return None
        nonce = f"{serial}-{next(self._nonces)}"
        ts.sent = Sent(serial, nonce, frozenset(names))
        return discovery_pb2.DiscoveryResponse(
            version_info=version_info(serial, snap), type_url=type_url, nonce=nonce,
            resources=[any_pb2.Any(type_url=type_url, value=snap.encoded(type_url, n)) for n in names])

    def respond_all(self, serial: int, snap: Snapshot) -> list[discovery_pb2.DiscoveryResponse]:
        """A push: every subscribed type, clusters first (make before break)."""
        out = []
        for t in PUSH_ORDER:
            if t in self.types and self.types[t].subscribed:
                r = self.respond(t, serial, snap)
                if r is not None:
                    out.append(r)
        return out

    def settled(self, serial: int, snap: Snapshot) -> bool:
        """Envoy accepted every type of `snap` as of `serial`, endpoints and routes for every name in it."""
        for t in snap.required_types():
            ts = self.types.get(t)
            if ts is None or ts.acked is None or ts.acked.serial != serial:
                return False
            if t not in WILDCARD_TYPES and not set(snap.of(t)) <= ts.acked.names:
                return False
        return True


def version_info(serial: int, snap: Snapshot) -> str:
    return f"{snap.version}.{serial}"
