"""A local OpenAI-compatible chat-completions server for tests: each test supplies only its reply rule."""
from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: reply(body) -> a JSON-able completion dict (HTTP 200) or (status, raw bytes) for an error.
Reply = Callable[[dict[str, Any]], "dict[str, Any] | tuple[int, bytes]"]


@contextlib.contextmanager
def chat_endpoint(reply: Reply, suffix: str = "") -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Serve ``reply`` on 127.0.0.1; yields (base URL + ``suffix``, the requests seen: path, auth, body)."""
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server API
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
            out = reply(body)
            status, data = out if isinstance(out, tuple) else (200, json.dumps(out).encode())
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{suffix}", seen
    finally:
        server.shutdown()
        server.server_close()
