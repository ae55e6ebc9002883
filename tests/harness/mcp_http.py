"""MCP as plain JSON-RPC over HTTP: one `tools/call` per POST on the stateless
Streamable HTTP transport, as README's curl example and wrk send it.

Plain HTTP rather than the Python SDK's session where each failure (refused,
reset, 502, timeout) must surface as one exception on one call, which a fault
run counts and retries exactly, and where a benchmark must send the very bytes
wrk sends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx2

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def tools_call(tool: str, arguments: dict[str, Any], request_id: int = 1) -> str:
    """The JSON-RPC body of one `tools/call`, compact."""
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    return json.dumps(body, separators=(",", ":"))


class Unreachable(Exception):
    """The request did not get an MCP answer: connection refused or reset, a
    timeout, or an HTTP error status from a proxy. It may or may not have been
    applied by the server."""


class ProtocolError(Exception):
    """A JSON-RPC error answer (not a tool error)."""


@dataclass
class ToolResult:
    is_error: bool
    text: str
    structured: dict[str, Any] | None


def parse_answer(status: int, text: str) -> ToolResult:
    """A tool call's HTTP answer as a ToolResult; Unreachable or ProtocolError
    when there is no tool result in it."""
    if status != 200:
        raise Unreachable(f"HTTP {status}: {text[:200]}")
    try:
        msg = json.loads(text)
    except ValueError as e:
        raise Unreachable(f"not JSON: {text[:200]}") from e
    if "error" in msg:
        raise ProtocolError(json.dumps(msg["error"])[:300])
    result = msg["result"]
    joined = "\n".join(c.get("text", "") for c in result.get("content", []) if c.get("type") == "text")
    return ToolResult(bool(result.get("isError")), joined, result.get("structuredContent"))


def call_once(mcp_url: str, token: str, body: str, timeout: float = 30.0) -> ToolResult:
    """One POST of a prepared `tools/call` body, blocking (no initialize before:
    the transport is stateless)."""
    try:
        resp = httpx2.post(mcp_url, content=body, headers=HEADERS | {"Authorization": f"Bearer {token}"}, timeout=timeout)
    except httpx2.TransportError as e:
        raise Unreachable(f"{type(e).__name__}: {e}") from e
    return parse_answer(resp.status_code, resp.text)


class Mcp:
    """An async client making one POST per tool call, on a pool of connections."""

    def __init__(self, base_url: str, token: str, timeout: float = 15.0, connections: int = 32) -> None:
        self.url = f"{base_url}/mcp"
        self._id = 0
        self.http = httpx2.AsyncClient(
            headers=HEADERS | {"Authorization": f"Bearer {token}"},
            timeout=httpx2.Timeout(timeout),
            limits=httpx2.Limits(max_connections=connections, max_keepalive_connections=connections),
        )

    async def close(self) -> None:
        await self.http.aclose()

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolResult:
        self._id += 1
        try:
            resp = await self.http.post(self.url, content=tools_call(tool, arguments, self._id))
        except httpx2.TransportError as e:
            raise Unreachable(f"{type(e).__name__}: {e}") from e
        return parse_answer(resp.status_code, resp.text)


def http_status(url: str, timeout: float = 2.0) -> int:
    """The status of a GET (raises on a connection failure)."""
    return httpx2.get(url, timeout=timeout).status_code
