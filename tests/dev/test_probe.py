"""The port probes dev clusters start and stop by."""

from __future__ import annotations

import socket

from kafkakv.dev import probe


def test_a_connection_that_met_itself_is_not_a_listener() -> None:
    """Connecting to a port nothing listens on can succeed when the kernel gives the
    connection that same port as its own (TCP's simultaneous open): a broker starting on a
    port of the ephemeral range then found its port taken, and the probe said it was up. A
    bound socket that connects to its own address makes that connection on purpose."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(5)
        sock.connect(sock.getsockname())
        assert probe.connected_to_itself(sock)
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert probe.port_accepts(port)
        with socket.create_connection(("127.0.0.1", port)) as client:
            assert not probe.connected_to_itself(client)
    assert not probe.port_accepts(port)  # closed: refused
