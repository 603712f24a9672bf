"""Throwaway certificates for TLS tests: a CA and leaf certificates it signs, made with the
`openssl` command line (no Python crypto dependency), EC P-256 so they take milliseconds."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Leaf:
    cert: Path
    key: Path


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=30)


def _key(path: Path) -> Path:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path)
    return path


class TestCA:
    """A certificate authority in `directory`; `leaf()` issues certificates it signs."""

    __test__ = False  # not a pytest test class

    def __init__(self, directory: Path, name: str = "modelyard-test-ca"):
        if shutil.which("openssl") is None:
            pytest.skip("needs the openssl command line")
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.key = _key(self.dir / f"{name}.key")
        self.cert = self.dir / f"{name}.crt"
        _openssl("req", "-x509", "-new", "-key", self.key, "-out", self.cert, "-days", "2", "-subj", f"/CN={name}",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")

    def leaf(self, name: str, sans: list[str], *, usage: str = "serverAuth") -> Leaf:
        """A certificate for `sans` ("IP:127.0.0.1", "DNS:api.example") with extended key usage `usage`."""
        key = _key(self.dir / f"{name}.key")
        csr, cert, ext = (self.dir / f"{name}.{s}" for s in ("csr", "crt", "ext"))
        ext.write_text(f"subjectAltName={','.join(sans)}\nextendedKeyUsage={usage}\n"
                       "basicConstraints=CA:FALSE\nauthorityKeyIdentifier=keyid\n")
        _openssl("req", "-new", "-key", key, "-out", csr, "-subj", f"/CN={name}")
        _openssl("x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", self.key, "-CAcreateserial",
                 "-out", cert, "-days", "2", "-extfile", ext)
        return Leaf(cert, key)
