"""A self-signed certificate for 127.0.0.1/localhost, made with `cryptography` (TLS tests)."""

from __future__ import annotations

import datetime
import ipaddress
import pathlib


def self_signed_cert(d: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """(cert.pem, key.pem) written into ``d``; the certificate is its own CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    (d / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return d / "cert.pem", d / "key.pem"


def openssl_pki(d: pathlib.Path, server_san: str = "DNS:localhost,IP:127.0.0.1",
                client_san: str = "DNS:localhost,IP:127.0.0.1") -> pathlib.Path:
    """A CA (``ca.pem``) that signed a server and a client certificate (``server.pem``/``.key``,
    ``client.pem``/``.key``), made by the openssl command in ``d``; returns ``d``."""
    import subprocess

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
            "-subj", "/CN=trtspec-test-ca")
    for name, san in (("server", server_san), ("client", client_san)):
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={'localhost' if name == 'server' else 'client'}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext")
    return d
