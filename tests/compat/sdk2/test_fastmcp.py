"""FastMCP's client (`fastmcp.Client` over `StreamableHttpTransport`)."""

from __future__ import annotations

from typing import Any

from checks import lists_every_tool, run, runs_python_and_node_and_reads_a_file
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from harness.stack import Stack


def test_lists_the_tools_runs_python_and_node_and_reads_a_file(stack: Stack) -> None:
    async def go() -> None:
        transport = StreamableHttpTransport(stack.mcp_url, headers={"Authorization": f"Bearer {stack.token}"})
        async with Client(transport) as client:
            lists_every_tool(t.name for t in await client.list_tools())

            async def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
                # raise_on_error (the default): a tool error fails the test.
                result = await client.call_tool(name, args)
                assert isinstance(result.structured_content, dict), result
                return result.structured_content

            await runs_python_and_node_and_reads_a_file(call, "fastmcp")

    run(go())
