"""The official MCP Python SDK 2.x (`mcp.Client` over `streamable_http_client`),
as tests/python drives it, held to what every client in this suite must do."""

from __future__ import annotations

from typing import Any

import httpx2
from checks import lists_every_tool, run, runs_python_and_node_and_reads_a_file
from harness.stack import Stack
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


def test_lists_the_tools_runs_python_and_node_and_reads_a_file(stack: Stack) -> None:
    async def go() -> None:
        headers = {"Authorization": f"Bearer {stack.token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=60.0)) as http:
            async with Client(streamable_http_client(stack.mcp_url, http_client=http)) as client:
                lists_every_tool(t.name for t in (await client.list_tools()).tools)

                async def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
                    result = await client.call_tool(name, args)
                    assert not result.is_error, result
                    assert isinstance(result.structured_content, dict), result
                    return result.structured_content

                await runs_python_and_node_and_reads_a_file(call, "the MCP SDK 2.x")

    run(go())
