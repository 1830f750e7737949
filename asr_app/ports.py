"""Whether a server could listen where it was asked to, checked before any model loads."""

from __future__ import annotations

import socket


def port_problem(host: str, port: int) -> str | None:
    """Why `host:port` cannot be bound (the system's words), or None when it can."""
    if not 0 <= port <= 65535:
        return f"port {port} is out of range (0-65535)"
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server itself will
            sock.bind((host, port))
    except OSError as err:
        return err.strerror or str(err)
    return None
