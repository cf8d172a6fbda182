"""The system OpenSSH client, driven for gpucloud (docs/SSH.md).

Why the `ssh` binary and not a Python SSH library: users' `~/.ssh/config` (Host aliases, User,
Port, IdentityFile, ProxyJump), their agent and their known_hosts must work exactly as they do in
a terminal. `GPUCLOUD_SSH_CONFIG=PATH` passes another config file (`ssh -F PATH`).

Every call goes through one multiplexed connection per host (ControlMaster=auto, ControlPersist),
so a run makes one SSH handshake per host however many reads it does. Host keys: a host whose key
is unknown is refused with the fix (StrictHostKeyChecking=yes unless the user's own config says
otherwise); nothing is ever accepted silently. BatchMode=yes: no prompt ever hangs a run.
"""

from __future__ import annotations

import os
import re
import selectors
import shlex
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gpucloud.contract.provider import Unreachable
from gpucloud.errors import GpucloudError, UserError

CONFIG_ENV = "GPUCLOUD_SSH_CONFIG"  # another ssh_config file: `ssh -F PATH`
CONTROL_DIR_ENV = "GPUCLOUD_SSH_CONTROL_DIR"  # where the ControlMaster sockets live
CONTROL_PERSIST_S = 120  # the master outlives its last client this long
CONNECT_TIMEOUT_S = 15
MAX_CONTROL_DIR = 48  # sun_path is 108 bytes: dir + "/" + 40 (%C) + 17 (ssh's temp suffix)
DEFAULT_MAX_OUTPUT = 64 * 1024 * 1024  # what one call may print (reads of bigger objects pass their own cap)
UNREACHED_MEMO_S = 10.0  # a host just not reached is not tried again for this long
SSH_ERROR = 255  # ssh's own exit status (the remote command never returns it here)
_HOST_KEY_PATTERNS = (
    "Host key verification failed",
    "No ED25519 host key is known",
    "No RSA host key is known",
    "No ECDSA host key is known",
    "REMOTE HOST IDENTIFICATION HAS CHANGED",
)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_unreached: dict[str, tuple[float, str]] = {}  # host text -> (when this process last failed to reach it, why)


class SshError(GpucloudError):
    """ssh itself failed (connection, authentication): not the remote command."""

    exit_code = 75


@dataclass(frozen=True)
class SshHost:
    """One host as the user wrote it: `gpu-box`, `alice@10.0.0.7:2222` or `[::1]:2222`. Only what
    is written is passed on the command line; the rest (user, port, key) comes from ssh_config."""

    text: str
    user: str | None
    host: str
    port: int | None

    @classmethod
    def parse(cls, text: str) -> SshHost:
        user, _, rest = text.rpartition("@")
        port: int | None = None
        if rest.startswith("["):
            host, _, tail = rest[1:].partition("]")
            if tail.startswith(":"):
                port = int(tail[1:])
        elif rest.count(":") == 1:
            host, _, p = rest.partition(":")
            port = int(p)
        else:
            host = rest
        if not host or host.startswith("-") or (user and user.startswith("-")):
            raise UserError(f"{text!r} is not a host.", hint="Write [user@]host[:port] or an alias from ~/.ssh/config.")
        return cls(text=text, user=user or None, host=host, port=port)

    def shell(self, *args: str) -> str:
        """The ssh command a user types to reach this host as written, e.g. `ssh -p 2222
        alice@10.0.0.7 true`: the [user@]host[:port] form of job files is not ssh syntax."""
        cfg = os.environ.get(CONFIG_ENV, "").strip()
        where = f"{self.user}@{self.host}" if self.user else self.host
        return shlex.join(
            ["ssh", *(["-F", cfg] if cfg else []), *(["-p", str(self.port)] if self.port else []), where, *args]
        )

    def destination(self) -> list[str]:
        """argv fragment naming the host (options before the `--`-safe destination)."""
        args = ["-p", str(self.port)] if self.port else []
        if self.user:
            args += ["-l", self.user]
        return [*args, self.host]


def control_dir() -> Path:
    """Short, private folder for the master sockets (a unix socket path must stay under ~100 bytes)."""
    path = Path(os.environ.get(CONTROL_DIR_ENV) or Path(tempfile.gettempdir()) / f"gpucloud-ssh-{os.getuid()}")
    if len(str(path)) > MAX_CONTROL_DIR:  # %C is 40 characters, ssh adds a 17-character temp suffix
        raise UserError(
            f"{CONTROL_DIR_ENV}={path} is too long for ssh's control socket ({len(str(path))} > "
            f"{MAX_CONTROL_DIR} characters).",
            hint=f"Point {CONTROL_DIR_ENV} at a short folder such as /tmp/gc.",
        )
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _config_args() -> list[str]:
    cfg = os.environ.get(CONFIG_ENV, "").strip()
    if not cfg:
        return []
    if not Path(cfg).expanduser().is_file():
        raise UserError(
            f"{CONFIG_ENV}={cfg}: no such file.", hint=f"Point {CONFIG_ENV} at an ssh_config file, or unset it."
        )
    return ["-F", str(Path(cfg).expanduser())]


_effective_cache: dict[tuple[str, str], dict[str, str]] = {}


def effective_config(host: SshHost) -> dict[str, str]:
    """`ssh -G`: what ssh will use for this host after reading every config file (lower-case keys)."""
    key = (os.environ.get(CONFIG_ENV, ""), host.text)
    if key not in _effective_cache:
        proc = subprocess.run(
            ["ssh", *_config_args(), "-G", *host.destination()], capture_output=True, text=True, timeout=30, check=False
        )
        if proc.returncode != 0:
            raise UserError(
                f"ssh cannot read its configuration for {host.text}: {proc.stderr.strip()}",
                hint="Fix the ssh_config file it names (or GPUCLOUD_SSH_CONFIG).",
            )
        conf: dict[str, str] = {}
        for line in proc.stdout.splitlines():
            name, _, value = line.partition(" ")
            conf.setdefault(name.lower(), value.strip())
        _effective_cache[key] = conf
    return _effective_cache[key]


def base_args(host: SshHost) -> list[str]:
    """ssh options gpucloud adds. Command-line -o wins over config files, so StrictHostKeyChecking
    is only forced where the user's config left it at OpenSSH's default ("ask"): with BatchMode
    "ask" would refuse anyway, but "yes" says so plainly; a user's accept-new or no is kept."""
    args = [
        *_config_args(),
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={CONNECT_TIMEOUT_S}",
        "-o",
        "ControlMaster=auto",
        "-o",
        f"ControlPath={control_dir()}/%C",
        "-o",
        f"ControlPersist={CONTROL_PERSIST_S}",
        "-o",
        "ServerAliveInterval=15",
        "-o",
        "LogLevel=ERROR",
    ]
    if effective_config(host).get("stricthostkeychecking", "ask") in ("ask", "true"):
        args += ["-o", "StrictHostKeyChecking=yes"]
    return args


def host_key_fix(host: SshHost) -> str:
    """The advice for an unknown or changed host key: check the fingerprint, then trust it once."""
    conf = effective_config(host)
    name, port = conf.get("hostname", host.host), conf.get("port", "22")
    known = conf.get("userknownhostsfile", "~/.ssh/known_hosts").split()[0]
    scan = f"ssh-keyscan -p {port} {name}" if port != "22" else f"ssh-keyscan {name}"
    return (
        f"Connect once with `{host.shell()}` and compare the fingerprint with the one the machine's "
        f"owner gives you (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on it), or add the key "
        f"with `{scan} >> {known}` after checking it. gpucloud never accepts an unknown key by itself."
    )


@dataclass
class Result:
    returncode: int
    stdout: bytes
    stderr: str


class SshUnreachable(SshError, Unreachable):
    """The host could not be reached at all (connection refused, timed out, dropped): nothing on it
    was done. `down` leaves such a run `down-pending` for a later `down` or `gc`."""


class _TooMuch(Exception):
    pass


def _pump(proc: subprocess.Popen[bytes], data: bytes) -> None:
    try:
        assert proc.stdin is not None
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass


def _communicate(
    argv: list[str], data: bytes, timeout: float, max_output: int, sink: BinaryIO | None = None
) -> tuple[int, bytes, bytes]:
    """Run argv; (exit status, stdout, stderr). Raises subprocess.TimeoutExpired after `timeout`
    and _TooMuch once stdout passes `max_output` bytes (stderr keeps its last 64 KiB); either way
    the ssh client is killed first, so nothing is left running here. With `sink`, stdout is written
    there as it comes (an artifacts tarball: never whole in memory) and b"" is returned for it."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    writer = threading.Thread(target=_pump, args=(proc, data), daemon=True)
    writer.start()
    out, err = bytearray(), bytearray()
    written = 0
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None and proc.stderr is not None
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    try:
        with selectors.DefaultSelector() as sel:
            for fd in streams:
                sel.register(fd, selectors.EVENT_READ)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(argv, timeout)
                for key, _ in sel.select(min(left, 1.0)):
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    buf = streams[key.fd]
                    if buf is out and sink is not None:
                        sink.write(chunk)
                        written += len(chunk)
                        if written > max_output:
                            raise _TooMuch()
                        continue
                    buf += chunk
                    if buf is out and len(out) > max_output:
                        raise _TooMuch()
                    if buf is err and len(err) > 1 << 17:
                        del err[: len(err) - (1 << 16)]
        rc = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        proc.stdout.close()
        proc.stderr.close()
    return rc, bytes(out), bytes(err)


def run(
    host: SshHost,
    command: str,
    *,
    input: bytes | None = None,
    timeout: float = 120.0,
    retries: int = 2,
    check: bool = True,
    max_output: int = DEFAULT_MAX_OUTPUT,
    sink: BinaryIO | None = None,
) -> Result:
    """Run `command` (a POSIX shell line) on the host. ssh's own failures (exit 255) are retried
    after a short wait: a dropped master is replaced by a new one on the next call. An unknown host
    key is a UserError with the fix; other ssh failures an SshError (SshUnreachable when the host
    was never reached); with `check`, a non-zero exit of the command itself also raises SshError
    (its stderr in the message). A command that prints more than `max_output` bytes, or has not
    ended after `timeout` seconds, is stopped (SshError naming it; not retried, not blamed on the
    network); callers bound the remote side too (`timeout`, `head -c`), so nothing stays running.
    With `sink` (a file opened for writing), stdout goes there instead of into the Result."""
    argv = ["ssh", *base_args(host), *host.destination(), "--", command]
    what = f"`{clean_text(command.strip().splitlines()[0] if command.strip() else command)[:60]}`"
    last = ""
    seen = _unreached.get(host.text)
    if seen is not None and time.monotonic() - seen[0] < UNREACHED_MEMO_S:  # just failed: say so at once
        raise SshUnreachable(seen[1], hint=f"Check `ssh {host.text} true`; the run (if any) keeps going on the host.")
    for attempt in range(retries + 1):
        rc, stdout, err = _try_once(host, what, argv, input, timeout, max_output, sink)
        if rc != SSH_ERROR:
            _unreached.pop(host.text, None)
            if check and rc != 0:
                raise SshError(f"{host.text}: {what} exited {rc}: {err[-500:]}")
            return Result(rc, stdout, err)
        _refuse_login_failures(host, err)
        last = err or f"ssh exited {rc}"
        if "timed out" in last.lower():
            break  # ConnectTimeout passed: the host does not answer; another try would wait as long again
        if attempt < retries:
            time.sleep(0.5 * (attempt + 1) ** 2)
    message = f"{host.text}: cannot reach the host over ssh: {last}"
    _unreached[host.text] = (time.monotonic(), message)
    raise SshUnreachable(message, hint=f"Check `{host.shell('true')}`; the run (if any) keeps going on the host.")


def _try_once(
    host: SshHost,
    what: str,
    argv: list[str],
    input: bytes | None,
    timeout: float,
    max_output: int,
    sink: BinaryIO | None,
) -> tuple[int, bytes, str]:
    """One ssh call: (exit code, stdout, cleaned stderr). A command that hangs or prints too much is
    stopped and is an SshError at once (the network is not to blame, so it is not retried)."""
    if sink is not None:  # a retry starts the file again
        sink.seek(0)
        sink.truncate()
    try:
        rc, stdout, stderr = _communicate(argv, input if input is not None else b"", timeout, max_output, sink)
    except subprocess.TimeoutExpired:
        raise SshError(
            f"{host.text}: {what} did not end within {timeout:.0f}s (stopped)",
            hint=f"Check `ssh {host.text} true`, and that the command does not hang on the host.",
        ) from None
    except _TooMuch:
        raise SshError(
            f"{host.text}: {what} printed more than {max_output} bytes (stopped, output dropped)",
            hint="Something on the host answers with far more than gpucloud asked for.",
        ) from None
    return rc, stdout, clean_text(stderr.decode("utf-8", "replace").replace("\r\n", "\n").strip())


def _refuse_login_failures(host: SshHost, err: str) -> None:
    """An unknown host key or a refused login is the user's to fix (UserError with the fix); retrying
    would only fail the same way."""
    if any(p in err for p in _HOST_KEY_PATTERNS):
        raise UserError(
            f"{host.text}: the host key is not known (or changed), so gpucloud will not connect: "
            f"{err.splitlines()[-1] if err else 'host key verification failed'}",
            hint=host_key_fix(host),
        )
    if "Permission denied" in err:
        raise UserError(
            f"{host.text}: ssh login refused: {err.splitlines()[-1]}",
            hint=f"Check that `{host.shell('true')}` works without a prompt (key in the agent, "
            "or IdentityFile in ~/.ssh/config).",
        )


def clean_text(text: str) -> str:
    """Text from a host made safe to print: control characters other than newline and tab (terminal
    escapes, carriage returns, bells, C1 codes) become `\\xNN` / `\\uNNNN`, so a host cannot move
    the cursor, retitle the terminal or hide a line of gpucloud's own."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
