"""One guest connection to a host port: qemu's user-mode network runs this per connection of a
`guestfwd` rule (the guest's socket is stdin/stdout), so a guest isolated with `restrict=on`
reaches exactly the test services it is given and nothing else (never the host's own metadata).

    python3 guest_relay.py PORT
"""

from __future__ import annotations

import os
import socket
import sys
import threading


def _pump(read: int, write: socket.socket) -> None:
    while data := os.read(read, 65536):
        write.sendall(data)
    write.shutdown(socket.SHUT_WR)


def main() -> None:
    conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    threading.Thread(target=_pump, args=(0, conn), daemon=True).start()
    while data := conn.recv(65536):
        while data:
            data = data[os.write(1, data) :]


if __name__ == "__main__":
    main()
