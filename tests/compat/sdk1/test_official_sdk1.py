"""The official MCP Python SDK 1.x (`mcp` 1.x: `streamable_http_client` and
`ClientSession`), which frameworks such as langchain-mcp-adapters still pin. The 2.x SDK is
tests/python's client, and sdk2/test_official_sdk2.py's."""

from __future__ import annotations

from typing import Any

import httpx
from checks import lists_every_tool, run, runs_python_and_node_and_reads_a_file
from harness.stack import Stack
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


def test_lists_the_tools_runs_python_and_node_and_reads_a_file(stack: Stack) -> None:
    async def go() -> None:
        headers = {"Authorization": f"Bearer {stack.token}"}
        async with (
            httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30.0, read=60.0)) as http,
            streamable_http_client(stack.mcp_url, http_client=http) as (read, write, _),
        ):
            async with ClientSession(read, write) as session:
                await session.initialize()
                lists_every_tool(t.name for t in (await session.list_tools()).tools)

                async def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
                    result = await session.call_tool(name, args)
                    assert not result.isError, result
                    assert isinstance(result.structuredContent, dict), result
                    return result.structuredContent

                await runs_python_and_node_and_reads_a_file(call, "the MCP SDK 1.x")

    run(go())
