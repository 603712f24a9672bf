"""`modelyard probe grpc|http|tcp TARGET`: a container health check that needs no curl in the image.

Exit status 0 when the target answers healthy, 1 when not (the reason on stderr): `grpc` asks the
gRPC health service (SERVING), `http` wants a 2xx, `tcp` wants the port to accept a connection.
"""

from __future__ import annotations

import argparse
import socket
import sys
import urllib.error
import urllib.request


def probe_grpc(address: str, timeout: float) -> str | None:
    """None when the server reports SERVING, else why not."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError as e:
            return f"gRPC health check failed: {e.code().name}"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return f"gRPC health: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
    return None


def probe_http(url: str, timeout: float) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - a fixed local URL
            return None if 200 <= resp.status < 300 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    except OSError as e:
        return f"HTTP probe failed: {e}"


def probe_tcp(address: str, timeout: float) -> str | None:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout).close()
    except OSError as e:
        return f"TCP connect to {address} failed: {e}"
    return None


_PROBES = {"grpc": probe_grpc, "http": probe_http, "tcp": probe_tcp}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="modelyard probe", description="container health check")
    ap.add_argument("kind", choices=sorted(_PROBES))
    ap.add_argument("target", help="host:port (grpc, tcp) or a URL (http)")
    ap.add_argument("--timeout", type=float, default=3.0)
    args = ap.parse_args(argv)
    why = _PROBES[args.kind](args.target, args.timeout)
    if why:
        print(f"modelyard probe: unhealthy: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # The HEALTHCHECK runs this module directly: `modelyard probe` would first load the whole CLI.
    raise SystemExit(main(sys.argv[1:]))
