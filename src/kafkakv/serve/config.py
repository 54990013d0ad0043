"""What ``kafkakv serve`` is told: :class:`ServeConfig`, and the pure checks on it.

Nothing here opens a socket or a log; the CLI builds a config, :func:`ServeConfig.check`
refuses an unsafe or impossible one with a :class:`~kafkakv.errors.ConfigError`, and the
application (:mod:`kafkakv.serve.app`) reads it.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field

from kafkakv.errors import ConfigError

__all__ = ["SERVABLE_CODECS", "ServeConfig", "is_loopback", "parse_bind", "read_token"]

SERVABLE_CODECS = frozenset({"str", "int", "bytes", "json", "msgpack"})
"""The codecs whose keys and values have a JSON form (docs/serve.md, "Keys and values")."""

MIN_TOKEN_LENGTH = 16
"""A shorter bearer token is refused: it could be guessed."""


def parse_bind(text: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:8765`` for IPv6) as a pair; ``host`` alone takes port 8765.

    >>> parse_bind("127.0.0.1:9000"), parse_bind("[::1]:80"), parse_bind("0.0.0.0")
    (('127.0.0.1', 9000), ('::1', 80), ('0.0.0.0', 8765))
    """
    host, port = text, "8765"
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ConfigError(f"--bind {text!r}: an IPv6 address goes in [brackets]")
        host, rest = text[1:end], text[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ConfigError(f"--bind {text!r} is not HOST:PORT")
            port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    if not host:
        raise ConfigError(f"--bind {text!r} has no host")
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"--bind {text!r}: the port is not a number") from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"--bind {text!r}: the port is outside 0-65535")
    return host, number


def is_loopback(host: str) -> bool:
    """Whether ``host`` only reaches this machine.

    >>> is_loopback("127.0.0.1"), is_loopback("localhost"), is_loopback("0.0.0.0")
    (True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def read_token(path: str | os.PathLike[str]) -> str:
    """The bearer token in file ``path`` (surrounding whitespace dropped). Raises
    ConfigError for a file that cannot be read, is empty, or holds a token shorter than
    :data:`MIN_TOKEN_LENGTH` characters or with whitespace inside."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the token file {os.fspath(path)!r}: {exc}") from exc
    if len(token) < MIN_TOKEN_LENGTH or any(c.isspace() for c in token):
        raise ConfigError(
            f"the token in {os.fspath(path)!r} must be at least {MIN_TOKEN_LENGTH} "
            "characters with no whitespace"
        )
    return token


@dataclass(frozen=True)
class ServeConfig:
    """How the server runs. ``target`` is an embedded log's directory or a ``kafka://``
    URL (as :func:`kafkakv.connect` takes); the rest has the defaults of docs/serve.md."""

    target: str
    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None
    max_body: int = 1 << 20
    request_timeout: float = 10.0
    drain_timeout: float = 30.0
    max_connections: int = 1000
    key_codec: str = "str"
    value_codec: str = "json"
    codecs: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Per map or directory: ``(key codec, value codec)`` overriding the two above."""
    directories: tuple[str, ...] = ()
    """Topics opened as directories at start (any other topic opens on first request)."""
    fsync: str = "interval"
    """The embedded log's fsync policy (``always``, ``interval``, ``never``); Kafka ignores it
    (its brokers decide)."""
    tls_cert: str | None = None
    tls_key: str | None = None
    heartbeat: float = 15.0
    """Seconds between keep-alive comments on an idle change stream."""

    def check(self) -> None:
        """Refuse what must not run: another address than loopback without a token, a codec
        with no JSON form, limits that are not positive, half a TLS setting."""
        if not is_loopback(self.host) and self.token is None:
            raise ConfigError(
                f"binding to {self.host} (not loopback) needs a token: --token-file FILE"
            )
        for name, (keys, values) in {"": (self.key_codec, self.value_codec), **self.codecs}.items():
            for codec in (keys, values):
                if codec not in SERVABLE_CODECS:
                    where = f" of {name!r}" if name else ""
                    raise ConfigError(
                        f"codec {codec!r}{where} has no JSON form: use one of "
                        f"{', '.join(sorted(SERVABLE_CODECS))}"
                    )
        for what, value in (
            ("max_body", self.max_body),
            ("request_timeout", self.request_timeout),
            ("drain_timeout", self.drain_timeout),
            ("max_connections", self.max_connections),
            ("heartbeat", self.heartbeat),
        ):
            if value <= 0:
                raise ConfigError(f"{what} must be > 0, not {value!r}")
        if self.fsync not in ("always", "interval", "never"):
            raise ConfigError(f"fsync is always, interval or never, not {self.fsync!r}")
        if self.fsync != "interval" and "://" in self.target:
            raise ConfigError("--fsync is the embedded log's: Kafka's brokers decide their own")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("TLS needs both --tls-cert and --tls-key")

    def codecs_of(self, name: str) -> tuple[str, str]:
        """The (key, value) codecs map or directory ``name`` is opened with."""
        return self.codecs.get(name, (self.key_codec, self.value_codec))
