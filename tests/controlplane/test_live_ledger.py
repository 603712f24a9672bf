"""ADS bookkeeping, driven with the requests an Envoy sends: subscriptions, ACKs, NACKs, stale nonces,
and what the control plane serves after Envoy refuses a config."""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.rpc import status_pb2

from controlplane.live.ledger import Ledger
from controlplane.live.snapshot import CLUSTER, ENDPOINT, LISTENER, ROUTE, Snapshot
from controlplane.live.streams import EnvoyStream


def snap(version: str, clusters: tuple[str, ...]) -> Snapshot:
    return Snapshot(version, {
        CLUSTER: {c: cluster_pb2.Cluster(name=c, type=cluster_pb2.Cluster.EDS) for c in clusters},
        ENDPOINT: {c: endpoint_pb2.ClusterLoadAssignment(cluster_name=c) for c in clusters},
        LISTENER: {"modelyard": listener_pb2.Listener(name="modelyard")},
        ROUTE: {"modelyard": route_pb2.RouteConfiguration(name="modelyard")},
    })


def req(type_url: str, nonce: str = "", names: tuple[str, ...] = (), error: str = "") -> discovery_pb2.DiscoveryRequest:
    r = discovery_pb2.DiscoveryRequest(type_url=type_url, response_nonce=nonce, resource_names=list(names))
    r.node.id = "envoy-1"
    if error:
        r.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
    return r


class FakeEnvoy:
    """Answers like Envoy: ACKs every response, subscribes endpoints for every cluster it got."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.stream = ledger.open("ipv4:127.0.0.1:1")
        self.clusters: tuple[str, ...] = ()

    def connect(self) -> None:
        for t in (CLUSTER, LISTENER):
            self.take(self.ledger.hear(self.stream, req(t))[0])

    def take(self, responses: list[discovery_pb2.DiscoveryResponse], refuse: str = "") -> bool:
        """Process responses, ACK (or NACK) each; returns whether a rollback was asked for."""
        rollback = False
        for r in responses:
            names: tuple[str, ...] = ()
            if r.type_url == CLUSTER and not refuse:
                self.clusters = tuple(sorted(cluster_pb2.Cluster.FromString(a.value).name for a in r.resources))
                names = self.clusters
            if r.type_url == ENDPOINT:
                names = self.clusters
            if r.type_url in (LISTENER, ROUTE):
                names = ("modelyard",) if r.type_url == ROUTE else ()
            answers, rb = self.ledger.hear(self.stream, req(r.type_url, r.nonce, names, refuse if r.type_url == CLUSTER else ""))
            rollback = rollback or rb
            if r.type_url == CLUSTER and not refuse:
                answers += self.ledger.hear(self.stream, req(ENDPOINT, self._nonce(ENDPOINT), self.clusters))[0]
            if r.type_url == LISTENER:
                answers += self.ledger.hear(self.stream, req(ROUTE, self._nonce(ROUTE), ("modelyard",)))[0]
            rollback = self.take(answers) or rollback
        return rollback

    def _nonce(self, type_url: str) -> str:
        ts = self.stream.types.get(type_url)
        return ts.sent.nonce if ts and ts.sent else ""


def test_first_snapshot_is_settled_once_every_type_is_acked() -> None:
    ledger = Ledger()
    first = ledger.publish(snap("v1", ("a",)))
    envoy = FakeEnvoy(ledger)
    assert not ledger.settled(first.serial)
    envoy.connect()
    assert ledger.settled(first.serial)
    assert ledger.good == first
    assert ledger.stream_version(envoy.stream) == "v1"


def test_a_new_cluster_is_settled_only_once_its_endpoints_were_acked() -> None:
    ledger = Ledger()
    ledger.publish(snap("v1", ("a",)))
    envoy = FakeEnvoy(ledger)
    envoy.connect()
    second = ledger.publish(snap("v2", ("a", "b")))
    pushed = ledger.push_all()[envoy.stream.id]
    assert [r.type_url for r in pushed] == [CLUSTER, ENDPOINT, LISTENER, ROUTE]  # make before break
    # Envoy ACKs everything pushed, endpoints still for the old names: not settled yet.
    for r in pushed:
        names = ("a",) if r.type_url == ENDPOINT else ("modelyard",) if r.type_url == ROUTE else ()
        ledger.hear(envoy.stream, req(r.type_url, r.nonce, names))
    assert not ledger.settled(second.serial)
    # Then it asks for b's endpoints too; the answer holds them; its ACK settles the version.
    answer, _ = ledger.hear(envoy.stream, req(ENDPOINT, envoy._nonce(ENDPOINT), ("a", "b")))
    assert [endpoint_pb2.ClusterLoadAssignment.FromString(a.value).cluster_name for a in answer[0].resources] == ["a", "b"]
    ledger.hear(envoy.stream, req(ENDPOINT, answer[0].nonce, ("a", "b")))
    assert ledger.settled(second.serial) and ledger.good == second


def test_a_stale_nonce_is_ignored() -> None:
    ledger = Ledger()
    ledger.publish(snap("v1", ("a",)))
    envoy = FakeEnvoy(ledger)
    envoy.connect()
    old_nonce = envoy._nonce(CLUSTER)
    ledger.publish(snap("v2", ("a", "b")))
    ledger.push_all()
    answers, rollback = ledger.hear(envoy.stream, req(CLUSTER, old_nonce, (), error="late complaint"))
    assert answers == [] and not rollback and ledger.last_nack is None


def test_a_nack_puts_the_last_good_snapshot_back() -> None:
    ledger = Ledger()
    good = ledger.publish(snap("v1", ("a",)))
    envoy = FakeEnvoy(ledger)
    envoy.connect()
    bad = ledger.publish(snap("v2", ("a", "b")))
    rollback = envoy.take(ledger.push_all()[envoy.stream.id], refuse="cluster b: Invalid path: /nope")
    assert rollback
    nack = ledger.refused(bad.serial)
    assert nack is not None and nack.version == "v2" and "Invalid path" in nack.message and nack.node == "envoy-1"
    assert ledger.current == good and ledger.good == good
    # Envoy may have taken part of the refused update: the good one is pushed again, and settles.
    envoy.take(ledger.push_all()[envoy.stream.id])
    assert ledger.settled(good.serial)
    assert ledger.stream_version(envoy.stream) == "v1"
    # A stream that opens now is served the good config, never the refused one.
    late = FakeEnvoy(ledger)
    late.connect()
    assert late.clusters == ("a",)
    assert ledger.last_nack is not None  # reported until a later apply succeeds
    ledger.clear_nack()
    assert ledger.last_nack is None


def test_settled_needs_every_connected_envoy() -> None:
    ledger = Ledger()
    ledger.publish(snap("v1", ("a",)))
    one, two = FakeEnvoy(ledger), FakeEnvoy(ledger)
    one.connect()
    two.connect()
    second = ledger.publish(snap("v2", ("a",)))
    one.take(ledger.push_all()[one.stream.id])
    assert not ledger.settled(second.serial)
    ledger.close(two.stream)  # gone: no longer waited for
    assert ledger.settled(second.serial)


def test_empty_endpoint_subscription_gets_no_response() -> None:
    stream = EnvoyStream(1, "peer")
    stream.hear(ENDPOINT, [], "", "")
    assert stream.respond(ENDPOINT, 1, snap("v1", ("a",))) is None
