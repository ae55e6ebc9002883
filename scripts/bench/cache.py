#!/usr/bin/env python3
"""The dependency caches' effect (BENCHMARKS.md, "Dependency caches"): the same
install run twice by one owner, the first with an empty cache (cleared with
`script-runner-ctl cache clear --admin` just before), the second with what the
first left. Run through scripts/bench.sh --cache (or directly, with --bin-dir).

Task containers reach no registry here (the firewall, and CI has no internet),
so every install is offline, from what the task's zip brings:

  npm ci, no dependencies  what any npm ci costs here (npm's own start): the floor
  npm ci, test project   the e2e test project (tests/projects.rs): one dependency
                         as an `npm pack` tarball, `file:` in the lockfile
  npm ci, registry       --packages generated packages (a few files each) served
                         inside the task by a local registry on 127.0.0.1 (node's
                         http module), resolved and integrity-checked through the
                         lockfile, as a registry project installs
  pip, wheels            --packages wheels with --no-index --find-links
  pip, sdist             one sdist built by an in-tree PEP 517 backend (pip keeps
                         the built wheel in its cache)

Each figure is the install command's own time inside the task (`date +%s%N`
around it), so container start and polling are not in it. Medians of --rounds.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the shared harness package
from harness.mcp_http import call_once, tools_call  # noqa: E402
from harness.procs import HarnessError  # noqa: E402
from harness.stack import CTL_BIN, Stack, preflight  # noqa: E402

PORT = 4873

SERVE_JS = r"""
const http = require('http'), fs = require('fs'), path = require('path');
const root = path.resolve('registry');
http.createServer((req, res) => {
  const file = path.join(root, decodeURIComponent(req.url.split('?')[0]));
  if (!file.startsWith(root)) { res.statusCode = 403; return res.end(); }
  fs.readFile(file, (err, data) => {
    if (err) { res.statusCode = 404; return res.end(); }
    res.setHeader('content-type', 'application/octet-stream');
    res.end(data);
  });
}).listen(%d, '127.0.0.1', () => fs.writeFileSync('ready', ''));
""" % PORT

BACKEND = """import os, zipfile
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    fn = "demo-1.0-py3-none-any.whl"
    info = "demo-1.0.dist-info"
    with zipfile.ZipFile(os.path.join(wheel_directory, fn), "w") as z:
        for i in range(200):
            z.writestr(f"demo/m{i}.py", "X = %r\\n" % ("x" * 2000))
        z.writestr(info + "/METADATA", "Metadata-Version: 2.1\\nName: demo\\nVersion: 1.0\\n")
        z.writestr(info + "/WHEEL", "Wheel-Version: 1.0\\nGenerator: backend\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n")
        z.writestr(info + "/RECORD", "")
    return fn
"""

PYPROJECT = '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n[project]\nname = "demo"\nversion = "1.0"\n'


def timed(setup: str, command: str) -> str:
    """`setup`, then `command` timed in ms (printed as `ms=<n>`); fails with the
    command's output if it fails. First prints how many files the task's lent
    cache held (`cached=<n>`), and last leaves a mark in it (some installs
    cache nothing), so the next run can prove it was lent this run's cache."""
    return (
        "echo cached=$(find /.sr-cache -type f 2>/dev/null | wc -l); "
        f"{setup}t0=$(date +%s%N); if ! {command} >out.log 2>&1; then cat out.log; exit 1; fi; "
        "t1=$(date +%s%N); for d in /.sr-cache/*/; do touch \"$d.bench-mark\"; done; "
        "echo ms=$(( (t1 - t0) / 1000000 ))"
    )


def zip_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


def tgz(entries: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as t:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            t.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def npm_registry_project(n: int) -> bytes:
    """A project of `n` dependencies, each a package of 10 modules, served by
    the task itself: a lockfile (v3) with each tarball's URL and integrity."""
    files: dict[str, bytes] = {"serve.js": SERVE_JS.encode()}
    deps, packages = {}, {}
    for i in range(n):
        name = f"dep{i}"
        body = {f"package/lib/m{j}.js": (f"module.exports = {j};\n// " + "x" * 4000 + "\n").encode() for j in range(10)}
        body["package/package.json"] = json.dumps({"name": name, "version": "1.0.0", "main": "lib/m0.js"}).encode()
        data = tgz(body)
        files[f"registry/{name}/-/{name}-1.0.0.tgz"] = data
        deps[name] = "1.0.0"
        packages[f"node_modules/{name}"] = {
            "version": "1.0.0",
            "resolved": f"http://127.0.0.1:{PORT}/{name}/-/{name}-1.0.0.tgz",
            "integrity": "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode(),
        }
    pkg = {"name": "bench", "version": "1.0.0", "private": True, "dependencies": deps}
    lock = {"name": "bench", "version": "1.0.0", "lockfileVersion": 3, "requires": True,
            "packages": {"": {"name": "bench", "version": "1.0.0", "dependencies": deps}} | packages}  # fmt: skip
    files["package.json"] = json.dumps(pkg).encode()
    files["package-lock.json"] = json.dumps(lock, indent=2).encode()
    return zip_of(files)


def npm_test_project(tmp: Path) -> bytes:
    """The e2e test project (e2e/tests/projects.rs): `shout-cli` packed with the
    host's npm, a `file:` dependency; its lockfile from the host's npm."""
    dep, proj = tmp / "shout", tmp / "project"
    (dep / "bin").mkdir(parents=True)
    (proj / "deps").mkdir(parents=True)
    (dep / "package.json").write_text(json.dumps({"name": "shout-cli", "version": "1.0.0", "main": "index.js", "bin": {"shout": "bin/shout.js"}}))
    (dep / "index.js").write_text("module.exports = (s) => s.toUpperCase() + '!';\n")
    (dep / "bin/shout.js").write_text("#!/usr/bin/env node\nconsole.log(require('../index.js')(process.argv.slice(2).join(' ')));\n")
    (proj / "package.json").write_text(json.dumps({
        "name": "real-project", "version": "1.0.0", "private": True,
        "scripts": {"test": "shout tests pass && node test.js"},
        "dependencies": {"shout-cli": "file:deps/shout-cli-1.0.0.tgz"},
    }))  # fmt: skip
    (proj / "test.js").write_text("console.log('test.js ok');\n")
    env = os.environ | {"npm_config_cache": str(tmp / "npm-cache")}
    for argv, cwd in ((["npm", "pack", "--silent", "--pack-destination", str(proj / "deps")], dep),
                      (["npm", "install", "--package-lock-only", "--offline", "--no-audit", "--no-fund"], proj)):  # fmt: skip
        out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise HarnessError(f"{argv}: {out.stderr}")
    return zip_of({str(p.relative_to(proj)): p.read_bytes() for p in proj.rglob("*") if p.is_file()})


def wheels_project(n: int) -> bytes:
    files: dict[str, bytes] = {}
    names = []
    for i in range(n):
        name = f"pkg{i}"
        info = f"{name}-1.0.dist-info"
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for j in range(10):
                z.writestr(f"{name}/m{j}.py", f"X = {'x' * 4000!r}\n")
            z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
            z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
            z.writestr(f"{info}/RECORD", "")
        files[f"wheels/{name}-1.0-py3-none-any.whl"] = buf.getvalue()
        names.append(name)
    files["requirements.txt"] = "\n".join(names).encode()
    return zip_of(files)


def sdist_project() -> bytes:
    return zip_of({"demo-1.0/pyproject.toml": PYPROJECT.encode(), "demo-1.0/backend.py": BACKEND.encode()})


def run_task(stack: Stack, api_url: str, runtime: str, command: str, zip_bytes: bytes, warm: bool) -> int:
    """Runs a `timed` command; its time. `warm`: whether the task must have been
    lent a cache holding files (the second run) or an empty one (the first,
    after a clear). A second run that found no cache (its owner's was still
    being returned past the worker's wait, say) would be a cold run counted as
    warm: that fails the run instead."""
    args = {
        "runtime": runtime,
        "command_base64": base64.b64encode(command.encode()).decode(),
        "zip_base64": base64.b64encode(zip_bytes).decode(),
        "timeout_seconds": 600,
        "wait_seconds": 30,
    }
    r = call_once(api_url, stack.token, tools_call("run_script", args), timeout=60)
    if r.is_error:
        raise HarnessError(f"run_script: {r.text}")
    task_id = r.structured["task_id"]
    deadline = time.monotonic() + 600
    while True:
        s = call_once(api_url, stack.token, tools_call("get_task_status", {"task_id": task_id, "wait_seconds": 30}), timeout=60)
        st = s.structured or {}
        if st.get("state") in ("succeeded", "failed", "killed", "timed-out"):
            break
        if time.monotonic() > deadline:
            raise HarnessError(f"task {task_id} did not end")
    out = st.get("stdout_tail", "")
    if st.get("state") != "succeeded" or "ms=" not in out:
        raise HarnessError(f"task {task_id} ended {st.get('state')}: {out[-2000:]} {st.get('stderr_tail', '')[-2000:]}")
    cached = int(out.split("cached=", 1)[1].split()[0]) if "cached=" in out else -1
    if (cached > 0) != warm:
        want = "a cache holding files" if warm else "an empty cache"
        raise HarnessError(f"task {task_id} should have been lent {want}; it found {cached} files in /.sr-cache")
    return int(out.rsplit("ms=", 1)[1].split()[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="one round, few packages (proves the tool works)")
    ap.add_argument("--rounds", type=int, default=None, help="first/second pairs per case (default 5, quick 1)")
    ap.add_argument("--packages", type=int, default=None, help="dependencies of the generated projects (default 40, quick 3)")
    ap.add_argument("--image", default=os.environ.get("TEST_RUNTIME_IMAGE", "script-runner-test/python:3.13-trixie"))
    ap.add_argument("--node-image", default=os.environ.get("TEST_NODE_IMAGE", "script-runner-test/node:24-trixie"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rounds = args.rounds or (1 if args.quick else 5)
    n = args.packages or (3 if args.quick else 40)
    preflight(args.bin_dir, ("redis-server", "docker", "npm"), [args.image, args.node_image])
    stack = Stack(bin_dir=args.bin_dir, label="bench-cache",
                  runtime_images=f"python3.13={args.image},node24={args.node_image}")  # fmt: skip
    print(
        f"dependency caches, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}, {rounds} rounds, {n} packages; pool off, WORKER_CONCURRENCY=1"
    )
    results: dict[str, dict[str, list[int]]] = {}
    status = 1
    try:
        stack.start_redis()
        stack.add_worker("w", {"POOL_SIZE": "0", "EGRESS_POOL_SIZE": "0", "WORKER_CONCURRENCY": "1"})
        stack.start_worker("w")
        api = stack.add_api("api")
        stack.start_api("api")
        url = api.mcp_url
        npm = "npm ci --no-audit --no-fund"
        empty = zip_of({
            "package.json": json.dumps({"name": "empty", "version": "1.0.0", "private": True}).encode(),
            "package-lock.json": json.dumps({"name": "empty", "version": "1.0.0", "lockfileVersion": 3, "requires": True,
                                             "packages": {"": {"name": "empty", "version": "1.0.0"}}}).encode(),
        })  # fmt: skip
        cases = [
            ("npm ci, no dependencies", "node24", "", npm, empty),
            ("npm ci, test project", "node24", "", npm, npm_test_project(stack.tmp_dir / "fixture")),
            ("npm ci, registry", "node24",
             "(node serve.js &) ; for i in $(seq 100); do [ -f ready ] && break; sleep 0.05; done; ",
             f"{npm} --registry http://127.0.0.1:{PORT}/", npm_registry_project(n)),
            ("pip, wheels", "python3.13", "",
             "pip install --user --no-index --find-links ./wheels -r requirements.txt", wheels_project(n)),
            ("pip, sdist", "python3.13", "mkdir -p sd && python -m tarfile -c sd/demo-1.0.tar.gz demo-1.0 && ",
             "pip install --user --no-index --find-links ./sd demo", sdist_project()),
        ]  # fmt: skip
        ctl_env = os.environ | {"REDIS_URL": f"redis://127.0.0.1:{stack.redis_port}", "REDIS_KEY_PREFIX": stack.prefix}
        for name, runtime, setup, command, zip_bytes in cases:
            first, second = [], []
            for _ in range(rounds):
                cleared = subprocess.run([stack.binary(CTL_BIN), "cache", "clear", "--admin"], env=ctl_env, capture_output=True, text=True)
                if cleared.returncode != 0:
                    raise HarnessError(f"cache clear: {cleared.stderr}")
                first.append(run_task(stack, url, runtime, timed(setup, command), zip_bytes, warm=False))
                second.append(run_task(stack, url, runtime, timed(setup, command), zip_bytes, warm=True))
            results[name] = {"first_ms": first, "second_ms": second}
            f, s = statistics.median(first), statistics.median(second)
            print(f"  {name:24} first {f:7.0f} ms   second {s:7.0f} ms   second/first {s / f:.2f}   (first {first}, second {second})")
        status = 0
    except (HarnessError, TimeoutError) as e:
        print(f"\nbench cache: {e}", file=sys.stderr)
    finally:
        stack.stop_all()
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")
        if status:
            print(f"bench cache: logs kept in {stack.tmp_dir}", file=sys.stderr)
        else:
            stack.cleanup(keep=False)
    return status


if __name__ == "__main__":
    sys.exit(main())
