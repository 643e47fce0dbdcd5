"""``otel-replay ui``: the report pages served over loopback, read-only, GET only.

A :class:`~http.server.ThreadingHTTPServer` over one open
:class:`~otel_replay.query.store.Store`. It runs only the shipped queries
(through the same model builders the ``report`` command uses): an id from a
path or the search box is checked against :data:`ID_PATTERN` and only ever
bound as a query parameter. It serves no file, so no path can reach one.
Every response carries the page's Content-Security-Policy as a header too.

Bound to loopback (the default), it answers only requests whose ``Host`` is a
loopback name or address with its port: a web page whose own name was made to
resolve to 127.0.0.1 (DNS rebinding) gets a 403, not the dataset; so does a
request another site's page makes other than by a link followed (an image,
a frame, a ``fetch``: ``Sec-Fetch-*`` headers). A client
that sends nothing is dropped after :attr:`ReportServer.request_timeout`
seconds, so a stalled connection does not hold a thread for good.

Routes: ``/`` (index), ``/chain/TYPE/ID``, ``/decision/ID``,
``/rerun/SESSION_ID``, ``/search?id=ID`` (a redirect to the page of what the
id names), and, when the server was given contracts, ``/contracts`` and
``/contracts/SESSION_ID`` (the backtest ``contracts check`` runs, over the
dataset or one session). Anything else is 404; a method other than GET is 405.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from otel_replay import semconv as sc
from otel_replay.contracts.backtest import backtest
from otel_replay.contracts.model import ContractSet
from otel_replay.contracts.recorded import recorded_sessions
from otel_replay.errors import OtelReplayError, RecordNotFound
from otel_replay.query.chains import CHAIN_TYPES, ReplayBuilder
from otel_replay.query.store import Store
from otel_replay.report import contracts as contracts_model
from otel_replay.report import html, model

__all__ = ["ID_PATTERN", "LOOPBACK", "ReportServer", "find", "make_server"]

_log = logging.getLogger(__name__)

ID_PATTERN = re.compile(r"[^\x00-\x1f\x7f-\x9f]{1,256}")
"""What an id in a path or the search box may be: 1 to 256 characters, none a control character.

Any id a recording used is reachable (``/`` and ``%`` and other scripts included, percent-encoded in the
path): an id is only ever a query parameter, and a narrower pattern let a recording keep its chain off the
UI by its choice of id.
"""
LOOPBACK = "127.0.0.1"
"""The address the UI binds to unless told otherwise."""
_LINKS = html.UiLinks()


class ReportServer(ThreadingHTTPServer):
    """The UI's HTTP server: one store, read under a lock (one DuckDB connection serves every page)."""

    daemon_threads = True
    request_timeout: float = 30.0
    """Seconds a connection may stay silent (reading a request or taking a response) before it is dropped."""

    def __init__(self, address: tuple[str, int], store: Store, contracts: ContractSet | None = None) -> None:
        """Bind ``address`` and serve pages of ``store`` (and its backtest under ``contracts``, when given)."""
        super().__init__(address, _Handler)
        self.store = store
        self.contracts = contracts
        self.lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed outside a page (a client gone mid-response, a socket error): logged, not printed.

        The base class prints the traceback to stderr, the terminal ``otel-replay ui`` runs in; a page's own
        failure is answered (500) and logged in the handler, so what reaches here is the connection's.
        """
        _log.debug("otel-replay ui: the connection from %s failed", client_address, exc_info=True)

    @property
    def url(self) -> str:
        """The server's base URL."""
        host, port = self.server_address[:2]
        return f"http://{host if isinstance(host, str) else host.decode()}:{port}/"


def make_server(
    store: Store, host: str = LOOPBACK, port: int = 0, *, contracts: ContractSet | None = None
) -> ReportServer:
    """A :class:`ReportServer` for ``store`` bound to ``host:port`` (port 0: a free one); not yet serving.

    With ``contracts`` (:func:`~otel_replay.contracts.loader.load_contracts`'s), the index links to the
    dataset's backtest under them.
    """
    return ReportServer((host, port), store, contracts)


def _loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this machine's loopback."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_allowed(server: ReportServer, header: str | None) -> bool:
    """Whether a request with ``Host: header`` may be answered: any, unless the server is bound to loopback.

    Bound to loopback, the header must name a loopback host and the server's
    port; a request without one (not a browser's) is answered.
    """
    bound, port = server.server_address[:2]
    if header is None or not _loopback(bound if isinstance(bound, str) else bound.decode()):
        return True
    name, colon, given = header.strip().rpartition(":")
    if not colon or name.endswith(":") or (header.startswith("[") and not name.endswith("]")):
        name, given = header.strip(), "80"  # no port: a bare name or a bare IPv6 address
    return _loopback(name) and given == str(port)


def _from_another_site(headers: Any) -> bool:
    """Whether a browser sent this request for another site's page other than by following a link to here.

    A link followed (a top-level navigation) is answered: the page opens in its own tab, where no other site
    reads it. An image, script, frame or ``fetch`` another site's page asks for is refused, so that page
    cannot set the server to work (a contracts backtest, a search) however often it asks. Requests without
    ``Sec-Fetch-Site`` (not a browser's, or an old one's) are answered.
    """
    if headers.get("Sec-Fetch-Site") not in ("cross-site", "same-site"):
        return False
    return not (headers.get("Sec-Fetch-Mode") == "navigate" and headers.get("Sec-Fetch-Dest") == "document")


def find(store: Store, ident: str) -> str | None:
    """The UI path of what ``ident`` names: a decision, a recorded session, a session's or a trade's chain."""
    if any(row.name == sc.SPAN_DECISION for row in store.record_rows(record_id=ident)):
        return _LINKS.decision(ident)
    if any(str(row.get("session_id")) == ident for row in store.run("rerun_sessions")):
        return _LINKS.rerun(ident)
    if store.traces(session_id=ident, limit=1):
        return _LINKS.chain("session", ident)
    if store.traces(correlation_id=ident, limit=1) or store.audit_entries(ident, limit=1):
        return _LINKS.chain("trade", ident)
    return None


class _NotFound(Exception):
    pass


class _Handler(BaseHTTPRequestHandler):
    server: ReportServer
    server_version = "otel-replay-ui"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.request_timeout)  # a silent client's read times out, then it is closed

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        _log.debug("otel-replay ui: " + format, *args)

    def do_GET(self) -> None:  # noqa: N802 - the base class's naming
        if not _host_allowed(self.server, self.headers.get("Host")):
            message = "this server answers only to its loopback address (another Host header was sent)"
            self._send(HTTPStatus.FORBIDDEN, html.message_page("forbidden", message, _LINKS), None)
            return
        if _from_another_site(self.headers):
            message = "another site's page may link here, not load this as part of itself"
            self._send(HTTPStatus.FORBIDDEN, html.message_page("forbidden", message, _LINKS), None)
            return
        parts = urlsplit(self.path)
        try:
            segments = [unquote(s, errors="strict") for s in parts.path.split("/")[1:]]
            status, body, location = self._route(segments, parts.query)
        except _NotFound as exc:
            status, body, location = HTTPStatus.NOT_FOUND, html.message_page("not found", str(exc), _LINKS), None
        except UnicodeDecodeError:
            status, body, location = HTTPStatus.NOT_FOUND, html.message_page("not found", "bad path", _LINKS), None
        except RecordNotFound as exc:
            status, body, location = HTTPStatus.NOT_FOUND, html.message_page("not found", str(exc), _LINKS), None
        except OtelReplayError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            status, body, location = (
                HTTPStatus.UNPROCESSABLE_ENTITY,
                html.message_page("cannot show", first, _LINKS),
                None,
            )
        except Exception:  # noqa: BLE001 - a bug: one line to the browser, the traceback to the log
            _log.exception("otel-replay ui: %s failed", self.path)
            status, body = HTTPStatus.INTERNAL_SERVER_ERROR, html.message_page("internal error", "see the log", _LINKS)
            location = None
        self._send(status, body, location)

    def _route(self, segments: list[str], query: str) -> tuple[HTTPStatus, str, str | None]:
        store = self.server.store
        with self.server.lock:
            if segments in ([""], []):
                store.refresh()
                shown = None if self.server.contracts is None else str(self.server.contracts.directory)
                return HTTPStatus.OK, html.index_page(model.index_view(store), _LINKS, shown), None
            if segments[0] == "contracts" and len(segments) <= 2 and self.server.contracts is not None:
                session_id = _checked(segments[1]) if len(segments) == 2 else None
                sessions = recorded_sessions(store, session_id)
                if session_id is not None and not sessions:
                    raise _NotFound(f"no recorded session {session_id!r}: no model call carries that id")
                result = backtest(self.server.contracts, sessions)
                view_c = contracts_model.contracts_view(result, sessions)
                return HTTPStatus.OK, html.contracts_page(view_c, _LINKS), None
            if segments == ["search"]:
                values = parse_qs(query, keep_blank_values=True).get("id", [""])
                ident = _checked(values[0].strip())
                where = find(store, ident)
                if where is None:
                    raise _NotFound(f"nothing in this dataset is named {ident!r}")
                return HTTPStatus.SEE_OTHER, "", where
            if len(segments) == 3 and segments[0] == "chain" and segments[1] in CHAIN_TYPES:
                chain = ReplayBuilder(store).build(segments[1], _checked(segments[2]))
                if chain.empty:
                    raise _NotFound(f"no {segments[1]} chain {segments[2]!r}: nothing was recorded under that id")
                return HTTPStatus.OK, html.chain_page(model.chain_view(chain, store), _LINKS), None
            if len(segments) == 2 and segments[0] == "decision":
                view = model.decision_view(store, _checked(segments[1]))
                return HTTPStatus.OK, html.decision_page(view, _LINKS), None
            if len(segments) == 2 and segments[0] == "rerun":
                view_r = model.session_rerun_view(store, _checked(segments[1]))
                return HTTPStatus.OK, html.rerun_page(view_r, _LINKS), None
        raise _NotFound("no such page")

    def _send(self, status: HTTPStatus, body: str, location: str | None) -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        if location is not None:
            self.send_header("Location", location)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Security-Policy", html.csp(form=True))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def _refuse(self) -> None:
        data = html.message_page("method not allowed", "this server is read-only: GET only", _LINKS).encode()
        self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
        self.send_header("Allow", "GET")
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_TRACE = do_CONNECT = _refuse


def _checked(ident: str) -> str:
    """``ident`` when it is a well-formed id, else a 404 naming nothing of it but its length."""
    if not ID_PATTERN.fullmatch(ident):
        raise _NotFound(f"not an id (1 to 256 characters, no control characters; got {len(ident)} characters)")
    return ident
