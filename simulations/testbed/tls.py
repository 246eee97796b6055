"""A private CA and the certificates an etcd that asks for client certificates
needs, made with the ``openssl`` command for the fleet's TLS tests: the CA, a
server certificate for 127.0.0.1 and localhost, a client certificate signed by
the CA, and one signed by another CA (a client the server must refuse).

Example::

    files = make_certificates(Path(tmp))
    files.ca, files.server_cert, files.server_key, files.client_cert, files.client_key
    files.stranger_cert, files.stranger_key       # signed by a CA the server does not trust

Overhead: four RSA-2048 keys, ~0.2 s.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

DAYS = "2"


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]}: {done.stderr.strip()}")


def _ca(where: Path, name: str) -> tuple[Path, Path]:
    cert, key = where / f"{name}.crt", where / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", DAYS, "-subj", f"/CN={name}",
             "-keyout", str(key), "-out", str(cert))
    return cert, key


def _signed(where: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    cert, key, request, ext = (where / f"{name}.crt", where / f"{name}.key", where / f"{name}.csr",
                               where / f"{name}.ext")
    ext.write_text(extensions)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key),
             "-out", str(request))
    _openssl("x509", "-req", "-in", str(request), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
             "-days", DAYS, "-extfile", str(ext), "-out", str(cert))
    return cert, key


def make_certificates(where: Path) -> Certificates:
    """The CA and the certificates, written under ``where`` (keys 0600)."""
    if shutil.which("openssl") is None:
        raise RuntimeError("openssl is not installed (apt:openssl, scripts/bootstrap)")
    where.mkdir(parents=True, exist_ok=True)
    ca = _ca(where, "fleet-ca")
    # clientAuth too: etcd's gateway dials the member's own gRPC server with it (etcd's docs ask for both)
    server = _signed(where, "etcd-server", ca, "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                                "extendedKeyUsage=serverAuth,clientAuth\n")
    client = _signed(where, "reflexarc-node", ca, "extendedKeyUsage=clientAuth\n")
    other = _ca(where, "other-ca")
    stranger = _signed(where, "stranger", other, "extendedKeyUsage=clientAuth\n")
    for key in where.glob("*.key"):
        key.chmod(0o600)
    return Certificates(ca[0], *server, *client, *stranger)
