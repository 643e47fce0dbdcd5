"""``otel-replay ui``'s server on a free loopback port: index, search, pages, 404, 405, no traversal, ids as data."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

import otel_replay
from otel_replay import DependencySnapshot, audit, correlation
from otel_replay.report import html
from otel_replay.report.server import ReportServer, make_server

from .conftest import Page


@pytest.fixture
def ui(demo_dataset: Path) -> Iterator[ReportServer]:
    with otel_replay.open(demo_dataset) as store:
        server = make_server(store, port=0)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield server
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=30)


def _get(
    server: ReportServer, path: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(str(host), int(port), timeout=60)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode("utf-8")
    finally:
        conn.close()


def _ids(demo_dataset: Path) -> tuple[str, str]:
    with otel_replay.open(demo_dataset) as store:
        (row,) = store.rows("SELECT record_id, correlation_id FROM decisions")
    return row["record_id"], row["correlation_id"]


def test_the_server_binds_loopback_on_a_free_port(ui: ReportServer) -> None:
    host, port = ui.server_address[:2]
    assert host == "127.0.0.1" and port > 0 and ui.url == f"http://127.0.0.1:{port}/"


def test_index_lists_the_decision_with_its_gate_verdict_and_links_to_its_pages(
    ui: ReportServer, demo_dataset: Path
) -> None:
    record_id, cid = _ids(demo_dataset)
    status, headers, body = _get(ui, "/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert headers["Content-Security-Policy"] == html.csp(form=True) and headers["X-Content-Type-Options"] == "nosniff"
    hrefs = [a["href"] for a in Page(body).all("a")]
    assert f"/decision/{record_id}" in hrefs and f"/chain/trade/{cid}" in hrefs
    assert "ROLLBACK" in body
    for href in (f"/decision/{record_id}", f"/chain/trade/{cid}"):
        status, _, page = _get(ui, href)
        assert status == 200 and record_id in page


def test_search_redirects_to_the_page_of_what_the_id_names(ui: ReportServer, demo_dataset: Path) -> None:
    record_id, cid = _ids(demo_dataset)
    assert _get(ui, f"/search?id={record_id}")[1]["Location"] == f"/decision/{record_id}"
    assert _get(ui, f"/search?id={cid}")[1]["Location"] == f"/chain/trade/{cid}"
    status, _, body = _get(ui, "/search?id=no-such-id")
    assert status == 404 and "nothing in this dataset is named" in body


@pytest.mark.parametrize(
    "path",
    [
        "/decision/no-such-decision",
        "/chain/trade/no-such-chain",
        "/chain/nonsense/x",
        "/rerun/no-such-session",
        "/nowhere",
        "/../../../../etc/passwd",
        "/decision/..%2f..%2fetc%2fpasswd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/decision/" + quote("x' OR '1'='1", safe=""),
        "/decision/" + quote("<script>alert(1)</script>", safe=""),
        "/search?id=" + quote("'; DROP TABLE spans; --", safe=""),
        "/search?id=" + "a" * 300,
        "/decision/%ff%fe",
        "/search?id=",
    ],
)
def test_unknown_ids_bad_ids_and_traversal_are_404_pages_that_echo_nothing_raw(ui: ReportServer, path: str) -> None:
    status, headers, body = _get(ui, path)
    assert status == 404 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert "root:" not in body and "<script>alert" not in body and "Traceback" not in body


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
def test_only_get_is_served(ui: ReportServer, method: str) -> None:
    status, headers, _ = _get(ui, "/", method)
    assert status == 405 and headers["Allow"] == "GET"


def test_the_dataset_is_unchanged_by_browsing(ui: ReportServer, demo_dataset: Path) -> None:
    record_id, cid = _ids(demo_dataset)
    for path in ("/", f"/decision/{record_id}", f"/chain/trade/{cid}", f"/search?id={cid}"):
        assert _get(ui, path)[0] in (200, 303)
    # demo_dataset's own check fails the test if anything under it changed


@pytest.mark.parametrize("host", ["evil.example:{port}", "127.0.0.1.evil.example:{port}", "127.0.0.1:1", "localhost"])
def test_a_request_naming_another_host_is_refused_so_dns_rebinding_reads_nothing(
    ui: ReportServer, demo_dataset: Path, host: str
) -> None:
    # A page on evil.example whose name was re-pointed at 127.0.0.1 reaches the server with its own Host header.
    record_id, cid = _ids(demo_dataset)
    port = ui.server_address[1]
    for path in ("/", f"/decision/{record_id}", f"/chain/trade/{cid}", f"/search?id={cid}"):
        status, headers, body = _get(ui, path, headers={"Host": host.format(port=port)})
        assert status == 403 and record_id not in body and cid not in body and "Location" not in headers
    for allowed in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
        assert _get(ui, "/", headers={"Host": allowed})[0] == 200


def test_a_silent_client_is_dropped_after_the_request_timeout(ui: ReportServer) -> None:
    ui.request_timeout = 0.5
    host, port = ui.server_address[:2]
    with socket.create_connection((str(host), int(port)), timeout=30) as silent:
        silent.sendall(b"GET / HTTP/1.1\r\n")  # and never the rest
        assert silent.recv(1024) == b""  # closed by the server, not by this read's own 30 s timeout
    assert _get(ui, "/")[0] == 200


def test_a_connection_that_fails_is_logged_not_printed_on_the_terminal(
    ui: ReportServer, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # A client gone mid-response: the socket server's default prints the traceback to the terminal `ui` runs in.
    caplog.set_level("DEBUG", logger="otel_replay.report.server")
    try:
        raise BrokenPipeError(32, "Broken pipe")
    except BrokenPipeError:
        ui.handle_error(None, ("127.0.0.1", 1))
    assert "Traceback" not in capfd.readouterr().err
    assert any(r.exc_info and r.exc_info[0] is BrokenPipeError for r in caplog.records)
    assert _get(ui, "/")[0] == 200


@pytest.mark.parametrize(
    ("site", "mode", "dest", "status"),
    [
        ("cross-site", "no-cors", "image", 403),
        ("cross-site", "cors", "empty", 403),
        ("cross-site", "navigate", "iframe", 403),
        ("same-site", "no-cors", "script", 403),
        ("cross-site", "navigate", "document", 200),
        ("same-origin", "cors", "empty", 200),
        ("none", "navigate", "document", 200),
    ],
)
def test_another_sites_page_may_link_here_but_not_load_a_page_as_its_own_part(
    ui: ReportServer, site: str, mode: str, dest: str, status: int
) -> None:
    # An <img src="http://127.0.0.1:8765/contracts"> on any site the user visits would set the server to work.
    headers = {"Sec-Fetch-Site": site, "Sec-Fetch-Mode": mode, "Sec-Fetch-Dest": dest}
    code, _, body = _get(ui, "/", headers=headers)
    assert code == status and ("Recent decisions" in body) == (status == 200)


def test_an_id_with_slashes_spaces_or_other_scripts_is_reachable_from_the_index(dataset: Path) -> None:
    # The index links every id it lists; an id outside letters, digits and ._:@+=~- led to a "not an id" 404, so
    # a recording could keep its chain off the UI by its choice of id (the CLI's `report chain` showed it).
    telemetry = otel_replay.configure(dataset, service_name="report-tests", set_global=False)
    try:
        with correlation("tenant/42 run #7 \u00e9t\u00e9", session_id="s\u200b/1", agent_id="a"):
            with audit("pay", snapshot=DependencySnapshot({"k": "v"}, version="v1")) as d:
                pass
        assert telemetry.force_flush()
    finally:
        telemetry.shutdown()
    with otel_replay.open(dataset) as store:
        server = make_server(store, port=0)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            hrefs = [str(a["href"]) for a in Page(_get(server, "/")[2]).all("a")]
            chains = sorted({h for h in hrefs if h.startswith("/chain/")})
            assert len(chains) == 2  # the trade chain and the session chain
            for href in [*chains, f"/decision/{d.record_id}"]:
                status, _, body = _get(server, href)
                assert status == 200, (href, body[-300:])
            assert _get(server, "/search?id=" + quote("tenant/42 run #7 \u00e9t\u00e9"))[0] == 303
            assert _get(server, "/chain/trade/" + quote("a\x01b", safe=""))[0] == 404  # controls stay refused
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=30)
