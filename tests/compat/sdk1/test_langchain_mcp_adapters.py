"""LangChain's MCP adapters (langchain-mcp-adapters) against the real server: the
tools as LangChain tools, called the way a LangGraph agent calls them (a tool call
in, a ToolMessage out).

The adapter keeps a tool argument named `runtime` for LangGraph's injection
(`call_tool(runtime=..., **arguments)`), so run_script's `runtime` never reaches
the server through it. run_script also takes the same argument as
`runtime_name`, and a call that lost its runtime is told so, naming
`runtime_name`, so an agent corrects itself on its next call.
"""

from __future__ import annotations

import json
from typing import Any

from checks import b64, lists_every_tool, run, runs_python_and_node_and_reads_a_file
from harness.stack import Stack
from langchain_core.messages import ToolMessage
from langchain_core.messages.utils import convert_to_openai_messages
from langchain_core.tools import BaseTool
from langchain_mcp_adapters.client import MultiServerMCPClient


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


async def tool_call(tool: BaseTool, args: dict[str, Any]) -> ToolMessage:
    """Calls `tool` as LangGraph's ToolNode does."""
    message = await tool.ainvoke({"name": tool.name, "args": args, "id": "call-1", "type": "tool_call"})
    assert isinstance(message, ToolMessage), message
    return message


def test_lists_the_tools_and_runs_python_and_node_through_runtime_name(stack: Stack) -> None:
    async def go() -> None:
        tools = await langchain_tools(stack)
        lists_every_tool(tools)
        schema = tools["run_script"].args_schema
        assert isinstance(schema, dict) and {"runtime", "runtime_name"} <= set(schema["properties"])

        async def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
            message = await tool_call(tools[name], args)
            assert message.status == "success", message
            return message.artifact["structured_content"]

        await runs_python_and_node_and_reads_a_file(call, "langchain-mcp-adapters", runtime_arg="runtime_name")

    run(go())


def test_a_runtime_the_adapter_swallowed_is_named_back_to_the_agent(stack: Stack) -> None:
    """What an agent that fills in `runtime` meets: the adapter keeps it, the
    server sees no runtime and says to use runtime_name. No task is made."""

    async def go() -> None:
        tools = await langchain_tools(stack)
        message = await tool_call(tools["run_script"], {"runtime": "python3.13", "command_base64": b64("true")})
        assert message.status == "error", message
        text = "".join(b.get("text", "") for b in message.content if isinstance(b, dict))
        assert "runtime is missing" in text and "runtime_name" in text, text
        with_json = [b for b in message.content if isinstance(b, dict) and b.get("text", "").startswith("{")]
        assert not any("task_id" in json.loads(b["text"]) for b in with_json), message

    run(go())


def test_collected_files_reach_an_openai_model_as_text(stack: Stack) -> None:
    """get_task_files through the adapter, then the ToolMessage as LangChain
    sends it to OpenAI Chat Completions: only text, so nothing is refused (a
    resource_link would become a file block, which that API refuses for a
    non-http URL). The file's uri is in the JSON, for resources/read."""

    async def go() -> None:
        tools = await langchain_tools(stack)
        made = await tool_call(
            tools["run_script"],
            {
                "runtime_name": "python3.13",
                "command_base64": b64("echo x > out.txt"),
                "collect": ["out.txt"],
                "wait_seconds": 30,
            },
        )
        ran = made.artifact["structured_content"]
        assert ran["state"] == "succeeded", ran
        message = await tool_call(tools["get_task_files"], {"task_id": ran["task_id"]})
        assert message.status == "success", message
        [file] = message.artifact["structured_content"]["files"]
        assert file["uri"] == f"task://{ran['task_id']}/files/out.txt", file
        sent = convert_to_openai_messages([message])
        assert sent[0]["role"] == "tool", sent

    run(go())
