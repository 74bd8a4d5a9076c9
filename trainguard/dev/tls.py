"""A throwaway certificate authority and server certificate for the secured dev broker.

The CA signs one certificate for ``127.0.0.1``/``localhost`` (the listeners' addresses); the
broker reads its key and chain as PEM (Kafka's ``ssl.keystore.type=PEM``) and trusts the CA for
its own inter-broker connections; clients trust the CA (``TRAINGUARD_KAFKA_SSL_CAFILE``). The
CA's key is not kept: nothing else can ever be signed by it. Development only.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class TlsFiles:
    ca: Path          # the CA certificate: what clients trust
    keystore: Path    # the server's key (PKCS#8), its certificate and the CA's, PEM


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_tls_files(directory: Path, days: int = 365) -> TlsFiles:
    """A new CA and a server certificate signed by it, written under ``directory`` (0600)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (x509.CertificateBuilder()
               .subject_name(_name("trainguard dev CA")).issuer_name(_name("trainguard dev CA"))
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5))
               .not_valid_after(now + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(
                   digital_signature=False, content_commitment=False, key_encipherment=False,
                   data_encipherment=False, key_agreement=False, key_cert_sign=True,
                   crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(_name("127.0.0.1")).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                                                  x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    files = TlsFiles(directory / "ca.pem", directory / "broker-keystore.pem")
    _write(files.ca, ca_cert.public_bytes(pem))
    _write(files.keystore, key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption())
           + cert.public_bytes(pem) + ca_cert.public_bytes(pem))
    return files


def tls_files(directory: Path) -> TlsFiles:
    return TlsFiles(directory / "ca.pem", directory / "broker-keystore.pem")


def _write(path: Path, data: bytes) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
