"""TLS for the gateway's gRPC port: ``--tls-cert``/``--tls-key`` serve TLS only, and with
``--tls-client-ca`` every client must present a certificate signed by that CA (mutual TLS).
Files are read once at start-up; an unreadable file is a clear error naming its flag."""

from __future__ import annotations

import grpc


def read_pem(path: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ValueError(f"cannot read {flag} {path}: {exc.strerror or exc}") from None


def server_credentials(
    cert: str | None, key: str | None, client_ca: str | None = None
) -> grpc.ServerCredentials | None:
    """The server's TLS credentials, or None without a certificate (plaintext)."""
    if not cert:
        return None
    pair = (read_pem(key, "--tls-key"), read_pem(cert, "--tls-cert"))
    ca = read_pem(client_ca, "--tls-client-ca") if client_ca else None
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=bool(ca))
