"""A session's shell on the node marks itself in W/sessions while it is open (a kept machine is not
idle then). A forward-only session (`gpucloud ssh RUN -N`) runs no command, and one without a
terminal gets no signal when its client goes: its wait must end with the connection that started
it, or its mark would hold a kept machine until its maximum lifetime."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpucloud.contract.session import SessionAsk, session_tail
from gpucloud.vm.agent.keep import live_sessions
from tests.support.polling import wait_until

# Stands in for the session's sshd: starts the node's shell as its child, then lives on.
CONNECTION = "import subprocess, sys, time; subprocess.Popen(['bash', '-c', sys.argv[1]]); time.sleep(120)"


def test_a_forward_only_session_ends_with_its_connection(tmp_path: Path) -> None:
    vm = tmp_path / "vm"
    env = {**os.environ, "GPUCLOUD_VM_DIR": str(vm)}
    tail = session_tail(SessionAsk(forward_only=True))
    connection = subprocess.Popen([sys.executable, "-c", CONNECTION, tail], env=env)
    try:
        assert wait_until(lambda: live_sessions(vm) == 1, 20), "the session never marked itself"
        assert wait_until(lambda: live_sessions(vm) == 1 and connection.poll() is None, 1)  # held while open
    finally:
        connection.kill()
        connection.wait()
    assert wait_until(lambda: live_sessions(vm) == 0, 10), "the session outlived its connection"
