"""A throwaway TLS certificate for a dev cluster's TLS listener, made with the JDK's keytool.

One self-signed RSA key and certificate for ``127.0.0.1`` (and ``localhost``), in a PKCS12
keystore the brokers read (password :data:`~kafkakv.dev.layout.TLS_STORE_PASSWORD`),
and the certificate as PEM for clients (``ssl.ca.location``): the certificate is its own CA.
librdkafka checks that the broker's address is in the certificate, so the address is.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kafkakv.dev.errors import ClusterError
from kafkakv.dev.layout import HOST, TLS_STORE_PASSWORD

__all__ = ["TlsFiles", "make_certificate", "tls_files"]

_ALIAS = "kafkakv-dev-cluster"
_VALID_DAYS = 3650  # a dev cluster's state directory may live long; nothing else trusts it
_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class TlsFiles:
    keystore: Path
    """PKCS12: the brokers' key and certificate."""
    ca_location: Path
    """PEM: the certificate, for a client's ``ssl.ca.location``."""


def tls_files(directory: Path) -> TlsFiles:
    """Where :func:`make_certificate` keeps its files in ``directory`` (absolute paths)."""
    directory = directory.absolute()
    return TlsFiles(directory / "broker.p12", directory / "ca.pem")


def make_certificate(java: str, directory: Path) -> TlsFiles:
    """The keystore and PEM in ``directory``, made with the ``keytool`` beside ``java`` unless
    both exist already. Raises :class:`~kafkakv.dev.errors.ClusterError` with keytool's output
    when it is missing or fails."""
    files = tls_files(directory)
    if files.keystore.is_file() and files.ca_location.is_file():
        return files
    keytool = Path(os.path.realpath(java)).with_name("keytool")
    if not os.access(keytool, os.X_OK):
        raise ClusterError(f"no keytool beside {java}: the TLS listener needs a full JDK")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ClusterError(f"cannot make {directory}: {exc}") from exc
    files.keystore.unlink(missing_ok=True)  # a half-made pair from an interrupted run
    store = ["-keystore", str(files.keystore), "-storetype", "PKCS12"]
    store += ["-storepass", TLS_STORE_PASSWORD, "-alias", _ALIAS]
    _keytool(
        [
            str(keytool),
            "-genkeypair",
            *store,
            "-keypass",
            TLS_STORE_PASSWORD,
            "-keyalg",
            "RSA",
            "-keysize",
            "2048",
            "-validity",
            str(_VALID_DAYS),
            "-dname",
            f"CN={HOST}",
            "-ext",
            f"SAN=ip:{HOST},dns:localhost",
        ]
    )
    _keytool([str(keytool), "-exportcert", "-rfc", *store, "-file", str(files.ca_location)])
    return files


def _keytool(command: list[str]) -> None:
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"keytool failed: {exc}") from exc
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()
        raise ClusterError(f"keytool {command[1]} failed (exit {done.returncode}): {output}")
