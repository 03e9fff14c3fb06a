"""Test certificates made on the spot with ``cryptography``: a CA, a server certificate for
127.0.0.1/localhost and client certificates, written as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Issued:
    cert: str  # PEM file paths
    key: str


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(folder: Path, stem: str, cert: x509.Certificate, key) -> Issued:
    cert_path, key_path = folder / f"{stem}.crt", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Issued(str(cert_path), str(key_path))


class CertificateAuthority:
    def __init__(self, folder: Path, name: str) -> None:
        self.folder = folder
        self.name = name
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.cert = self._builder(_name(name), self.key.public_key(), _name(name)).add_extension(
            x509.BasicConstraints(ca=True, path_length=None), critical=True
        )
        self.cert = self.cert.sign(self.key, hashes.SHA256())
        self.files = _write(folder, name, self.cert, self.key)

    @staticmethod
    def _builder(subject: x509.Name, public_key, issuer: x509.Name) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.timezone.utc)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    def issue(self, stem: str, server: bool) -> Issued:
        """A leaf certificate: for 127.0.0.1 and localhost when ``server``, else a client's."""
        key = ec.generate_private_key(ec.SECP256R1())
        builder = self._builder(_name(stem), key.public_key(), self.cert.subject)
        if server:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return _write(self.folder, stem, builder.sign(self.key, hashes.SHA256()), key)


def module_pki(folder: Path) -> dict[str, str | Issued]:
    """What a TLS test module's server and clients use, made in ``folder``: ``ca`` (the test
    CA's certificate file), ``server`` (its certificate for 127.0.0.1/localhost), ``client`` (a
    client certificate it signed) and ``rogue`` (a client certificate of another CA)."""
    ca = CertificateAuthority(folder, "test-ca")
    rogue = CertificateAuthority(folder, "rogue-ca")
    return {
        "ca": ca.files.cert,
        "server": ca.issue("server", server=True),
        "client": ca.issue("client", server=False),
        "rogue": rogue.issue("rogue-client", server=False),
    }
