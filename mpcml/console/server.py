"""The console's HTTPS server: mutual TLS with the deployment's CA, named users only.

Why mutual TLS and not loopback-only: the deployment already has a CA and gives each
organisation's people client certificates (`mpcml certs issue --role client`); a console bound to
loopback would need a reverse proxy with its own authentication before an operator on another
machine could read it, and would let any user of the party's machine read it. Here the TLS
handshake refuses a browser without a certificate from the deployment's CA, and a certificate
that is not a client one or whose name `console_users` does not list gets 403.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import ssl
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509

from mpcml.config import ConfigError
from mpcml.console import pages
from mpcml.console.sources import Source
from mpcml.transport.address import parse
from mpcml.transport.tls import CLIENT_ROLE, TLSFiles, cert_names, cert_role

log = logging.getLogger(__name__)
_JOB = re.compile(r"^/jobs/([0-9a-f]{1,64})$")


@dataclass(frozen=True)
class ConsoleSettings:
    """`console_address` and `console_users` of a daemon's config."""

    address: str
    users: tuple[str, ...]


def settings(data: dict[str, Any], base: Path, tls: TLSFiles | None) -> ConsoleSettings | None:
    """The console's settings; None when `console_address` is not set (the default: off)."""
    address = str(data.get("console_address", ""))
    if not address:
        return None
    parse(address, "console_address")
    users = data.get("console_users", [])
    if isinstance(users, str):
        users = [u.strip() for u in users.split(",") if u.strip()]
    if not isinstance(users, list) or not users:
        raise ConfigError(
            f"the config in {base} sets console_address but console_users names nobody: list "
            "the client certificate names that may read the console"
        )
    if tls is None:
        raise ConfigError(
            f"the config in {base} sets console_address without [tls]: the console is served "
            "only over mutual TLS"
        )
    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(
            f"the config in {base} sets console_address, and the console draws its charts with "
            "matplotlib, which is not installed: pip install 'mpcml[console]'"
        )
    return ConsoleSettings(address, tuple(str(u) for u in users))


def _context(tls: TLSFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(tls.cert), str(tls.key))
    context.load_verify_locations(str(tls.ca))
    context.verify_mode = ssl.CERT_REQUIRED
    return context


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 30

    def setup(self) -> None:
        self.request.settimeout(self.timeout)
        self.request.do_handshake()  # here, on the request's thread: a slow client blocks no one
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("console: " + format, *args)

    def _send(self, status: HTTPStatus, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header(
            "Content-Security-Policy",
            "default-src 'none'; style-src 'unsafe-inline'; img-src data:",
        )
        self.end_headers()
        self.wfile.write(data)

    def _user(self) -> str | None:
        der = self.connection.getpeercert(binary_form=True)
        if not der:
            return None
        cert = x509.load_der_x509_certificate(der)
        name = cert_names(cert).common_name
        if cert_role(cert) != CLIENT_ROLE or name not in self.server.users:
            return None
        return name

    def do_GET(self) -> None:
        user = self._user()
        source = self.server.source
        if user is None:
            self._send(HTTPStatus.FORBIDDEN, "<h1>403</h1><p>Not a console user.</p>")
            return
        path = self.path.split("?", 1)[0]
        try:
            page = self._page(source, path)
        except Exception:
            log.exception("console: %s failed", path)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, "<h1>500</h1>")
            return
        if page is None:
            self._send(HTTPStatus.NOT_FOUND, pages.layout(source.title, "Not found", "", False))
            return
        heading, body = page
        self._send(HTTPStatus.OK, pages.layout(source.title, heading, body, source.party))

    def _page(self, source: Source, path: str) -> tuple[str, str] | None:
        if path == "/":
            return "Jobs", pages.jobs_page(source.jobs())
        match = _JOB.match(path)
        if match:
            result = source.job(match.group(1))
            if result is None:
                return None
            losses, where = source.losses(result)
            return f"Job {result.status.job_id}", pages.job_page(result, losses, where)
        if source.party:
            if path == "/datasets":
                return "Datasets", pages.datasets_page(source.datasets())
            if path == "/policy":
                return "Policy", pages.policy_page(source.policy())
            if path == "/audit":
                return "Audit log", pages.audit_page(source.audit())
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        source: Source,
        users: tuple[str, ...],
        context: ssl.SSLContext,
    ) -> None:
        super().__init__(address, _Handler)
        self.source, self.users, self.context = source, users, context

    def get_request(self) -> tuple[Any, Any]:
        """The connection, its TLS handshake left to the request's thread."""
        sock, address = self.socket.accept()
        return self.context.wrap_socket(
            sock, server_side=True, do_handshake_on_connect=False
        ), address

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Logged at debug: a browser without the deployment's client certificate."""
        log.debug("console: a connection from %s failed", client_address, exc_info=True)


class Console:
    """The console of one daemon, served on its own thread until `stop`."""

    def __init__(self, console: ConsoleSettings, tls: TLSFiles, source: Source) -> None:
        where = parse(console.address, "console_address")
        self._server = _Server((where.host, where.port), source, console.users, _context(tls))
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="console", daemon=True
        )

    def start(self) -> Console:
        """Serve on the console's thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()


def start(console: ConsoleSettings | None, tls: TLSFiles | None, source: Source) -> Console | None:
    """Serve the console when configured."""
    if console is None or tls is None:
        return None
    served = Console(console, tls, source).start()
    log.info("console served at https://%s for %s", console.address, ", ".join(console.users))
    return served
