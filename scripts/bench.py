#!/usr/bin/env python3
"""Overhead of script-runner over the bare `docker run` floor.

Against a running service (./scripts/run-local.sh, ideally with release binaries),
through the official MCP Python SDK, it measures:
  - run_script latency (the call returns before any container exists),
  - submit -> final state for `true`, polled every 20 ms, one task at a time,
  - the floor: `docker run --rm <image> true` in this same process,
and prints the figures and the ratio to the floor. Results go in BENCHMARKS.md.

  SCRIPT_RUNNER_TOKEN=... .venv/bin/python scripts/bench.py \
      --url http://127.0.0.1:8080/mcp --image script-runner-test/python:3.13-trixie
"""

import argparse
import asyncio
import base64
import os
import statistics
import subprocess
import time

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


async def measure_service(url, token, runtime, runs):
    submit, total = [], []
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            command = base64.b64encode(b"true").decode()
            for _ in range(runs):
                start = time.perf_counter()
                r = await client.call_tool("run_script", {"runtime": runtime, "command_base64": command})
                submit.append(time.perf_counter() - start)
                task_id = r.structured_content["task_id"]
                while True:
                    s = await client.call_tool("get_task_status", {"task_id": task_id, "tail_bytes": 0})
                    if s.structured_content["state"] not in ("queued", "running"):
                        break
                    await asyncio.sleep(0.02)
                if s.structured_content["state"] != "succeeded":
                    raise SystemExit(f"task {task_id} ended {s.structured_content}")
                total.append(time.perf_counter() - start)
    return submit, total


def measure_floor(image, runs):
    floor = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(["docker", "run", "--rm", image, "true"], check=True)
        floor.append(time.perf_counter() - start)
    return floor


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080/mcp")
    ap.add_argument("--runtime", default="python3.13")
    ap.add_argument("--image", default="script-runner-test/python:3.13-trixie", help="the image that runtime uses")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    token = os.environ["SCRIPT_RUNNER_TOKEN"]

    measure_floor(args.image, 2)  # warm the engine's caches
    submit, total = asyncio.run(measure_service(args.url, token, args.runtime, args.runs))
    floor = measure_floor(args.image, args.runs)

    ms = lambda v: f"{v * 1000:7.1f}"  # noqa: E731
    print(f"runs: {args.runs}")
    print(f"{'':32} {'median':>8} {'p95':>8}  (ms)")
    print(f"{'run_script call':32} {ms(statistics.median(submit))} {ms(pct(submit, 95))}")
    print(f"{'submit -> succeeded (true)':32} {ms(statistics.median(total))} {ms(pct(total, 95))}")
    print(f"{'docker run --rm (floor)':32} {ms(statistics.median(floor))} {ms(pct(floor, 95))}")
    print(f"ratio to the floor (median): {statistics.median(total) / statistics.median(floor):.2f}")


if __name__ == "__main__":
    main()
