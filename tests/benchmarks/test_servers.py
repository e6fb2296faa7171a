"""`LocalServer.stop`: Ctrl-C is heard even where the shell ignored it, and nothing
the server started outlives it (Ray's workers leave its process group)."""

from __future__ import annotations

import signal
import sys
import time
import uuid
from pathlib import Path

import psutil

from benchmarks.servers import LocalServer

SERVER = """
import http.server, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "helper", sys.argv[2]], process_group=0)

class Ok(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass

try:
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok).serve_forever()
except KeyboardInterrupt:
    print("stopped by SIGINT", flush=True)
"""
"""A server that starts a helper in a process group of its own, as Ray starts its
workers, and stops only on KeyboardInterrupt."""


class GroupLeavingServer(LocalServer):
    label = "group-leaving"

    def __init__(self, cwd: Path, marker: str, **kwargs) -> None:
        super().__init__(cwd, **kwargs)
        self.marker = marker

    def command(self) -> list[str]:
        return [sys.executable, "-c", SERVER, str(self.port), self.marker]


def helpers(marker: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[-2:] == ["helper", marker]]


def test_stop_is_heard_with_sigint_ignored_and_ends_what_left_the_group(tmp_path):
    marker = f"helper-{uuid.uuid4().hex}"
    server = GroupLeavingServer(tmp_path, marker, startup_timeout_s=30, stop_grace_s=2)
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts a background job
    try:
        server.start()
    finally:
        signal.signal(signal.SIGINT, ignored)
    assert len(helpers(marker)) == 1

    started = time.monotonic()
    server.stop()
    assert "stopped by SIGINT" in server.log_tail()
    assert helpers(marker) == []
    assert time.monotonic() - started < 15
