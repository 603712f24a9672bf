"""TLS contexts for Envoy's upstream clusters: verified by default against a CA bundle, with the
server's name checked against its certificate's SANs, an optional client certificate (mTLS), and
an explicit opt-out that renders no verification at all and says so loudly."""

from __future__ import annotations

import ipaddress
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from envoy_data_plane.envoy.config.core.v3 import DataSource, TransportSocket
from envoy_data_plane.envoy.extensions.transport_sockets.tls.v3 import (
    CertificateValidationContext,
    CommonTlsContext,
    SubjectAltNameMatcher,
    SubjectAltNameMatcherSanType,
    TlsCertificate,
    UpstreamTlsContext,
)
from envoy_data_plane.envoy.type.matcher.v3 import StringMatcher
from envoy_data_plane.google.protobuf import Any as AnyMsg

from contracts.errors import ConfigError

log = logging.getLogger("modelyard.controlplane")

# Where distributions keep the system CA bundle (Debian/Ubuntu, RHEL/Fedora, Alpine/macOS, SUSE).
SYSTEM_CA_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
)


@dataclass(frozen=True)
class TlsSettings:
    """What one cluster's TLS needs, whatever configured it (a deployment, the extproc replicas)."""

    owner: str  # what an error or a warning names: "deployment demo-openai", "environment prod"
    hosts: tuple[str, ...]  # the endpoints' hosts: the names the certificate must carry
    ca_file: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None
    insecure_skip_verify: bool = False
    server_name: str | None = None  # SNI and SAN to check when it differs from the endpoint hosts
    alpn: tuple[str, ...] = ()


def system_ca_bundle() -> str:
    """The system's CA bundle on the machine rendering the bootstrap; ConfigError when none is found."""
    candidates = [os.environ.get("SSL_CERT_FILE"), ssl.get_default_verify_paths().cafile, *SYSTEM_CA_BUNDLES]
    for c in candidates:
        if c and Path(c).is_file():
            return c
    raise ConfigError("no system CA bundle found (looked for $SSL_CERT_FILE, "
                      f"{', '.join(SYSTEM_CA_BUNDLES)}): set the deployment's tls_ca_file, "
                      "or install the distribution's ca-certificates package")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def _san(host: str) -> SubjectAltNameMatcher:
    # An address endpoint must carry the address as an IP SAN; a DNS endpoint its name as a DNS SAN.
    san_type = SubjectAltNameMatcherSanType.IP_ADDRESS if _is_ip(host) else SubjectAltNameMatcherSanType.DNS
    return SubjectAltNameMatcher(san_type=san_type, matcher=StringMatcher(exact=host))


def upstream_tls_context(tls: TlsSettings) -> UpstreamTlsContext:
    names = (tls.server_name,) if tls.server_name else tls.hosts
    sni = next((n for n in names if not _is_ip(n)), None)  # SNI carries names, never addresses (RFC 6066)
    common = CommonTlsContext(alpn_protocols=list(tls.alpn))
    if tls.client_cert_file and tls.client_key_file:
        common.tls_certificates = [TlsCertificate(certificate_chain=DataSource(filename=tls.client_cert_file),
                                                  private_key=DataSource(filename=tls.client_key_file))]
    if tls.insecure_skip_verify:
        log.warning("%s: upstream TLS certificate is NOT verified (tls_insecure_skip_verify): anyone on the "
                    "path can impersonate the upstream and read its traffic", tls.owner)
    else:
        ca = tls.ca_file or system_ca_bundle()
        common.validation_context = CertificateValidationContext(
            trusted_ca=DataSource(filename=ca),
            match_typed_subject_alt_names=[_san(n) for n in dict.fromkeys(names)])
    ctx = UpstreamTlsContext(common_tls_context=common)
    if sni:
        ctx.sni = sni
    return ctx


def tls_transport_socket(tls: TlsSettings) -> TransportSocket:
    return TransportSocket(name="envoy.transport_sockets.tls", typed_config=AnyMsg.pack(upstream_tls_context(tls)))
