"""A stand-in for the public internet in e2e/tests/egress.rs: one HTTP and one
HTTPS listener (a self-signed certificate for pkgs.test and other.test) on
every address of this host, serving a greeting, a PEP 503 index with one
wheel, and an npm registry with one package. Prints its ports and CA as one
JSON line, then serves until killed."""

import hashlib
import http.server
import io
import json
import os
import ssl
import subprocess
import sys
import tarfile
import tempfile
import threading
import zipfile

WORK = tempfile.mkdtemp(prefix="sr-egress-")
CERT, KEY = os.path.join(WORK, "cert.pem"), os.path.join(WORK, "key.pem")
subprocess.run(
    ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
     "-subj", "/CN=pkgs.test", "-addext", "subjectAltName=DNS:pkgs.test,DNS:other.test",
     "-keyout", KEY, "-out", CERT],
    check=True, capture_output=True,
)


def wheel():
    body = {
        "srdemo/__init__.py": b"VALUE = 42\n",
        "srdemo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: srdemo\nVersion: 1.0\n",
        "srdemo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in body) + "srdemo-1.0.dist-info/RECORD,,\n"
    body["srdemo-1.0.dist-info/RECORD"] = record.encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in body.items():
            z.writestr(name, data)
    return buf.getvalue()


def tarball():
    files = {
        "package/package.json": json.dumps({"name": "srdemo", "version": "1.0.0", "main": "index.js"}).encode(),
        "package/index.js": b"module.exports = 42;\n",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


WHEEL, TGZ = wheel(), tarball()
PORTS = {}


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        host = (self.headers.get("Host") or "").split(":")[0]
        path = self.path.split("?")[0]
        if path == "/hello":
            return self.send(200, "text/plain", f"hello from {host}\n".encode())
        if path in ("/simple/srdemo/", "/simple/srdemo"):
            sha = hashlib.sha256(WHEEL).hexdigest()
            link = f'<a href="/files/srdemo-1.0-py3-none-any.whl#sha256={sha}">srdemo-1.0-py3-none-any.whl</a>'
            return self.send(200, "text/html", f"<html><body>{link}</body></html>".encode())
        if path == "/files/srdemo-1.0-py3-none-any.whl":
            return self.send(200, "application/octet-stream", WHEEL)
        if path == "/srdemo":
            url = f"http://pkgs.test:{PORTS['http']}/files/srdemo-1.0.0.tgz"
            meta = {
                "name": "srdemo",
                "dist-tags": {"latest": "1.0.0"},
                "versions": {"1.0.0": {"name": "srdemo", "version": "1.0.0",
                                       "dist": {"tarball": url, "shasum": hashlib.sha1(TGZ).hexdigest()}}},
            }
            return self.send(200, "application/json", json.dumps(meta).encode())
        if path == "/files/srdemo-1.0.0.tgz":
            return self.send(200, "application/octet-stream", TGZ)
        self.send(404, "text/plain", b"not found\n")

    def send(self, code, kind, body):
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serve(tls):
    srv = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(CERT, KEY)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    PORTS["https" if tls else "http"] = srv.server_address[1]
    threading.Thread(target=srv.serve_forever, daemon=True).start()


serve(False)
serve(True)
with open(CERT) as f:
    print(json.dumps({"http": PORTS["http"], "https": PORTS["https"], "ca": f.read()}), flush=True)
sys.stdin.read()
