"""What the client's SSH logins send and receive, in order, recorded in-process by wrapping
paramiko's message methods for one test (monkeypatch): which messages a login pipelines ahead of
which answers."""

from __future__ import annotations


def login_order(monkeypatch, transport: type, auth: type) -> list[str]:
    """The order, filled in as the test's logins run: 'sent service-request', 'sent
    userauth-request', 'sent channel-open', 'got service-accept', 'got userauth-success'.
    `transport` and `auth`: the classes whose methods send and parse (paramiko's own, or the
    subclasses fleetops logs in with)."""
    from paramiko.common import MSG_NAMES

    order: list[str] = []
    send = transport._send_message
    accept, success = auth._parse_service_accept, auth._parse_userauth_success

    def sending(self, data):
        kind = MSG_NAMES.get(data.asbytes()[0] if hasattr(data, "asbytes") else data[0])
        if kind in ("service-request", "userauth-request", "channel-open"):
            order.append(f"sent {kind}")
        return send(self, data)

    def accepted(self, m):
        order.append("got service-accept")
        return accept(self, m)

    def logged_in(self, m):
        order.append("got userauth-success")
        return success(self, m)

    monkeypatch.setattr(transport, "_send_message", sending)
    monkeypatch.setattr(auth, "_parse_service_accept", accepted)
    monkeypatch.setattr(auth, "_parse_userauth_success", logged_in)
    return order
