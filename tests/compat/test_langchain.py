"""LangChain's MCP adapters (langchain-mcp-adapters) against the real server: the
tools as LangChain tools, called the way a LangGraph agent calls them (a tool call
in, a ToolMessage out).

The adapter keeps a tool argument named `runtime` for LangGraph's injection
(`call_tool(runtime=..., **arguments)`), so run_script's `runtime` never reaches
the server through it. run_script also takes the same argument as
`runtime_name`, and a call that lost its runtime is told so, naming
`runtime_name`, so an agent corrects itself on the next call.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from harness.stack import Stack
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langchain_mcp_adapters.client import MultiServerMCPClient

TOOLS = {
    "run_script", "get_task_status", "get_task_files", "kill_task", "list_tasks",
    "list_workspaces", "get_workspace", "fork_workspace", "delete_workspace", "read_files", "write_files",
}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def langchain_tools(stack: Stack) -> dict[str, BaseTool]:
    client = MultiServerMCPClient(
        {
            "script-runner": {
                "transport": "streamable_http",
                "url": stack.mcp_url,
                "headers": {"Authorization": f"Bearer {stack.token}"},
            }
        }
    )
    return {t.name: t for t in await client.get_tools()}


async def tool_call(tool: BaseTool, args: dict[str, Any]) -> tuple[ToolMessage, dict[str, Any]]:
    """Calls `tool` as LangGraph's ToolNode does; the message, and the answer's
    JSON (the structured content, or the text of an error)."""
    message = await tool.ainvoke({"name": tool.name, "args": args, "id": "call-1", "type": "tool_call"})
    assert isinstance(message, ToolMessage), message
    if message.artifact and message.artifact.get("structured_content") is not None:
        return message, message.artifact["structured_content"]
    text = "".join(block.get("text", "") for block in message.content if isinstance(block, dict))
    try:
        return message, json.loads(text)
    except ValueError:
        return message, {"error": text}


def test_tools_are_listed_with_their_schemas(stack: Stack) -> None:
    tools = asyncio.run(langchain_tools(stack))
    assert set(tools) == TOOLS
    schema = tools["run_script"].args_schema
    assert isinstance(schema, dict) and {"runtime", "runtime_name", "command_base64"} <= set(schema["properties"])


def test_run_script_runs_python_and_node_through_runtime_name(stack: Stack) -> None:
    async def go() -> None:
        tools = await langchain_tools(stack)
        for runtime, command in [
            ("python3.13", "python3 -c 'print(6 * 7)'"),
            ("node24", "node -e 'console.log(6 * 7)'"),
        ]:
            message, answer = await tool_call(
                tools["run_script"],
                {"runtime_name": runtime, "command_base64": b64(command), "wait_seconds": 30},
            )
            assert message.status == "success", message
            assert answer["state"] == "succeeded", answer
            assert answer["runtime"] == runtime, answer
            assert answer["stdout_tail"] == "42\n", answer

    asyncio.run(go())


def test_a_runtime_the_adapter_swallowed_is_named_back_to_the_agent(stack: Stack) -> None:
    """What an agent that fills in `runtime` meets: the adapter keeps it, the
    server sees no runtime and says to use runtime_name. No task is made."""

    async def go() -> None:
        tools = await langchain_tools(stack)
        message, answer = await tool_call(
            tools["run_script"], {"runtime": "python3.13", "command_base64": b64("true")}
        )
        assert message.status == "error", message
        assert "runtime is missing" in answer["error"] and "runtime_name" in answer["error"], answer

    asyncio.run(go())


def test_a_file_a_task_wrote_is_read_back(stack: Stack) -> None:
    async def go() -> None:
        tools = await langchain_tools(stack)
        _, ran = await tool_call(
            tools["run_script"],
            {
                "runtime_name": "python3.13",
                "command_base64": b64("echo 'hello from langchain' > notes.txt"),
                "workspace": "new",
                "wait_seconds": 30,
            },
        )
        assert ran["state"] == "succeeded" and ran["workspace_version"] == 1, ran
        _, read = await tool_call(tools["read_files"], {"workspace_id": ran["workspace_id"], "paths": ["notes.txt"]})
        files = {f["path"]: f for f in read["files"]}
        assert files["notes.txt"]["content"] == "hello from langchain\n", read

    asyncio.run(go())
