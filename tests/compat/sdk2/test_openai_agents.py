"""The OpenAI Agents SDK's MCP client (`agents.mcp.MCPServerStreamableHttp`): what
an `Agent(mcp_servers=[...])` lists and calls."""

from __future__ import annotations

from typing import Any

from agents.mcp import MCPServerStreamableHttp
from checks import lists_every_tool, run, runs_python_and_node_and_reads_a_file
from harness.stack import Stack


def test_lists_the_tools_runs_python_and_node_and_reads_a_file(stack: Stack) -> None:
    async def go() -> None:
        params = {"url": stack.mcp_url, "headers": {"Authorization": f"Bearer {stack.token}"}, "timeout": 30}
        async with MCPServerStreamableHttp(params=params, client_session_timeout_seconds=60) as server:
            lists_every_tool(t.name for t in await server.list_tools())

            async def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
                result = await server.call_tool(name, args)
                assert not result.is_error, result
                assert isinstance(result.structured_content, dict), result
                return result.structured_content

            await runs_python_and_node_and_reads_a_file(call, "the OpenAI Agents SDK")

    run(go())
