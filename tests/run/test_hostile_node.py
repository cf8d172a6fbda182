"""A node that says hostile things, through the CLI on the local provider: the job itself writes
its node's status.json (signed with the node's own key, which it can read, or unsigned as any
holder of the channel grant can) and prints hostile log lines. Nothing it writes reaches the
terminal or a GitHub runner as an escape sequence or a workflow command, and no exit code it
names turns a failure into exit 0 (docs/SECURITY.md, "What a machine says")."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import cli
from tests.support.local_runs import run_id_of, write_job

# The job finds its status URL in the manifest beside its folder, signs a document with the node's
# key (as the agent does: openssl pkeyutl over a file) and keeps writing it for `seconds`.
FORGE = r"""
import base64, json, os, re, subprocess, sys, time
path = re.search(r"^status_put file://(.*)$", open("../manifest").read(), re.M).group(1)
doc, sign, seconds = json.load(open("forged.json")), sys.argv[1] == "sign", float(sys.argv[2])
raw = (json.dumps(doc, separators=(",", ":")) + "\n").encode()
body = raw
if sign:
    while not os.path.exists("../claim.published"):
        time.sleep(0.05)
    open("forge.raw", "wb").write(raw)
    sig = subprocess.run(["openssl", "pkeyutl", "-sign", "-rawin", "-inkey", "../.vmkey", "-in", "forge.raw"],
                         capture_output=True, check=True).stdout
    body = raw.rstrip(b"\n")[:-1] + b',"sig":"' + base64.b64encode(sig) + b'"}\n'
end = time.time() + seconds
while time.time() < end:
    with open(path + ".forge", "wb") as fh:
        fh.write(body)
    os.replace(path + ".forge", path)
    time.sleep(0.05)
"""
HOSTILE = "\n::error::pwned\x1b]0;retitled\x07\x1b[2J ##[set-env name=A;]b \u202edone"


def forged(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "run_id": "x",
        "rank": 0,
        "state": "failed",
        "stage": "done",
        "stages": {},
        "heartbeat": int(time.time()),
        "exit_code": 3,
        "message": "",
        "log_parts": 0,
        "log_bytes": 0,
        "artifacts_sha256": "",
    }
    return {**doc, **over}


def run_forging(tmp_path: Path, doc: dict[str, Any], run: str) -> Any:
    files = {"forge.py": FORGE, "forged.json": json.dumps(doc)}
    return cli("run", str(write_job(tmp_path / "job", {"name": "forge", "run": run}, files)), cwd=tmp_path, timeout=120)


def assert_fenced(text: str) -> None:
    """No escape, control or bidi character, no line a GitHub runner would read as a command."""
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]", text), repr(text)
    assert "##[" not in text
    own = re.compile(r"::group::[a-z_]+|::endgroup::")  # gpucloud's own phase groups under GitHub Actions
    bad = [line for line in text.split("\n") if line.lstrip().startswith("::") and not own.fullmatch(line)]
    assert not bad, bad


@pytest.mark.parametrize("code", [256, -1, "0", 1e9, True])
def test_a_signed_exit_code_outside_a_byte_is_exit_65(code: Any, gpucloud_home: Path, tmp_path: Path) -> None:
    res = run_forging(tmp_path, forged(exit_code=code), "python3 forge.py sign 60")
    assert res.returncode == 65, res.stderr
    assert "`exit_code`" in res.stderr and "0 to 255" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_a_signed_final_message_is_fenced_in_run_and_status(gpucloud_home: Path, tmp_path: Path) -> None:
    res = run_forging(tmp_path, forged(message=HOSTILE), "python3 forge.py sign 60")
    assert res.returncode == 3, res.stderr
    assert "pwned" in res.stderr and "\\x1b]0;retitled" in res.stderr, res.stderr
    assert_fenced(res.stderr)
    shown = cli("status", run_id_of(res.stderr), cwd=tmp_path)
    assert "pwned" in shown.stdout + shown.stderr
    assert_fenced(shown.stdout + shown.stderr)


def test_an_unsigned_progress_status_is_checked_and_fenced(gpucloud_home: Path, tmp_path: Path) -> None:
    """Anyone with the status grant (a user-data reader) can write a progress status."""
    doc = forged(
        state="running",
        stage=HOSTILE,
        stages={HOSTILE: {"start": 1, "end": 2}, "run": {"start": "x", "end": 10**400}},
        heartbeat="soon",
        exit_code=None,
    )
    res = run_forging(tmp_path, doc, "python3 forge.py plain 3")
    assert res.returncode == 0, res.stderr
    assert "ignored" in res.stderr and "`heartbeat`" in res.stderr, res.stderr
    assert not re.search(r"\] \S*pwned", res.stderr), res.stderr  # an unknown stage is named in a note, not run as one
    assert_fenced(res.stderr)


HOSTILE_LOG = (
    "echo '::stop-commands::mine'; echo '::00000000000000000000000000000000::'; echo '::mine::';"
    " echo '::add-mask::secret'; printf 'a\\033]0;retitled\\007b\\033[2Jc\\r::error::cr\\n'; echo '  ##[error]x'"
)


def test_ci_log_lines_cannot_end_the_fence_or_print_escapes(
    gpucloud_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under GitHub Actions the job's lines sit between `::stop-commands::<token>` and `::<token>::`
    (its own stop-commands and a guessed token are just text) and its escapes are shown as text."""
    spec = write_job(tmp_path / "job", {"name": "loud", "run": HOSTILE_LOG})
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    res = cli("run", str(spec), cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "\x1b" not in res.stdout and "\r" not in res.stdout and "\\x1b]0;retitled" in res.stdout
    token = None
    for line in res.stdout.split("\n"):
        if token is None:
            m = re.fullmatch(r"::stop-commands::([0-9a-f]{32})", line)
            assert m or not line.lstrip().startswith("::") and "##[" not in line, line
            token = m[1] if m else None
        elif line == f"::{token}::":
            token = None
    assert token is None, "the fence was left open"
    assert "::add-mask::secret" in res.stdout and "::error::cr" in res.stdout
    assert_fenced(res.stderr)


def test_refused_archive_member_names_are_fenced_in_run_and_collect(gpucloud_home: Path, tmp_path: Path) -> None:
    """A member refused (a link) whose name carries an escape and a workflow command on a line of its own."""
    name = "$(printf 'x\\033]0;retitled\\007\\n::error::member ##[y')"
    spec = write_job(
        tmp_path / "job",
        {"name": "members", "run": f'mkdir -p out; ln -s /etc/hostname "out/{name}"', "artifacts": ["out/"]},
    )
    res = cli("run", str(spec), cwd=tmp_path, timeout=120)
    assert "retitled" in res.stderr, res.stderr  # the refused member is named...
    assert_fenced(res.stderr)  # ...as text
    again = cli("collect", run_id_of(res.stderr), cwd=tmp_path, timeout=120)
    assert_fenced(again.stderr)
