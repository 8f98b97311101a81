"""A PEP 503 simple index on 127.0.0.1 over a few directories of wheels and ``*-variants.json`` files.

    python3 bench/variant_index.py PORTFILE DIR... [--timeout S]

Serves ``/simple/<project>/`` (one page per normalized distribution name, the
project's ``*-variants.json`` linked beside its wheels, as PEP 825 asks of an
index) and ``/files/<name>``. Writes the port it got into PORTFILE, and stops by
itself after ``--timeout`` seconds (default 600). For bench/variant_wheels_gpu.sh;
tests/test_variant_wheels.py serves the same layout from inside the test.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import http.server
import re
import threading
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("portfile", type=Path)
    p.add_argument("dirs", type=Path, nargs="+")
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args()
    files = {f.name: f for d in args.dirs for f in sorted(d.glob("*")) if f.suffix in (".whl", ".json")}
    projects: dict[str, list[str]] = {}
    for name in files:
        projects.setdefault(re.sub(r"[-_.]+", "-", name.split("-")[0]).lower(), []).append(name)
    digests = {n: hashlib.sha256(f.read_bytes()).hexdigest() for n, f in files.items()}

    class Handler(http.server.BaseHTTPRequestHandler):
        def _send(self, body: bytes, ctype: str, head: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _serve(self, head: bool) -> None:
            parts = [x for x in self.path.split("?")[0].split("/") if x]
            if parts[:1] == ["simple"] and len(parts) == 2 and parts[1] in projects:
                links = "".join(
                    f'<a href="/files/{html.escape(n)}#sha256={digests[n]}">{html.escape(n)}</a><br>\n'
                    for n in sorted(projects[parts[1]])
                )
                self._send(f"<!DOCTYPE html><html><body>\n{links}</body></html>".encode(), "text/html", head)
            elif parts[:1] == ["files"] and len(parts) == 2 and parts[1] in files:
                self._send(files[parts[1]].read_bytes(), "application/octet-stream", head)
            else:
                self.send_error(404)

        def do_GET(self) -> None:
            self._serve(False)

        def do_HEAD(self) -> None:
            self._serve(True)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    timer = threading.Timer(args.timeout, server.shutdown)
    timer.daemon = True
    timer.start()
    args.portfile.write_text(str(server.server_address[1]))
    print(f"variant_index: {len(files)} files, {sorted(projects)} on port {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
