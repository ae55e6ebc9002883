"""LangChain's own MCP adapter (`langchain.mcp.MCPAdapter`, on fastmcp): the tools
as LangChain tools, called as a LangGraph agent's ToolNode calls them. Unlike
langchain-mcp-adapters (sdk1/), it keeps no argument of its own, so run_script's
`runtime` reaches the server."""

from __future__ import annotations

from typing import Any

from checks import lists_every_tool, run, runs_python_and_node_and_reads_a_file
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from harness.stack import Stack
from langchain.mcp import MCPAdapter
from langchain_core.messages import ToolMessage


def test_lists_the_tools_runs_python_and_node_and_reads_a_file(stack: Stack) -> None:
    async def go() -> None:
        transport = StreamableHttpTransport(stack.mcp_url, headers={"Authorization": f"Bearer {stack.token}"})
        async with MCPAdapter(Client(transport)) as adapter:
            tools = {t.name: t for t in await adapter.list_tools()}
            lists_every_tool(tools)

            async def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
                message = await tools[name].ainvoke({"name": name, "args": args, "id": "call-1", "type": "tool_call"})
                assert isinstance(message, ToolMessage) and message.status == "success", message
                return message.artifact["structured_content"]

            await runs_python_and_node_and_reads_a_file(call, "langchain.mcp")

    run(go())
