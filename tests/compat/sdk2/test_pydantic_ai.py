"""Pydantic AI's MCP toolset (`pydantic_ai.mcp.MCPToolset`, on fastmcp): its direct
calls, and an agent whose model (Pydantic AI's FunctionModel: a script in place
of an LLM) calls run_script through the agent's own tool loop, which checks the
call against the tool's schema and may take the MCP tasks path."""

from __future__ import annotations

import json
from typing import Any

from checks import b64, lists_every_tool, run, runs_python_and_node_and_reads_a_file
from harness.stack import Stack
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel


def toolset(stack: Stack) -> MCPToolset[Any]:
    # A string is sent as the bearer token.
    return MCPToolset(stack.mcp_url, auth=stack.token, tool_error_behavior="error")


def test_lists_the_tools_runs_python_and_node_and_reads_a_file(stack: Stack) -> None:
    async def go() -> None:
        async with toolset(stack) as tools:
            lists_every_tool(t.name for t in await tools.list_tools())

            async def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
                answer = await tools.direct_call_tool(name, args)
                assert isinstance(answer, dict), answer
                return answer

            await runs_python_and_node_and_reads_a_file(call, "Pydantic AI")

    run(go())


def test_an_agent_calls_run_script_through_its_tool_loop(stack: Stack) -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
        if not returns:
            assert "run_script" in {t.name for t in info.function_tools}, info.function_tools
            args = {"runtime": "python3.13", "command_base64": b64("python3 -c 'print(6 * 7)'"), "wait_seconds": 30}
            return ModelResponse(parts=[ToolCallPart("run_script", args)])
        content = returns[-1].content
        return ModelResponse(parts=[TextPart(content if isinstance(content, str) else json.dumps(content))])

    async def go() -> None:
        agent = Agent(FunctionModel(model), toolsets=[toolset(stack)])
        async with agent:
            result = await agent.run("Print 6 * 7 in Python.")
        answer = json.loads(result.output)
        assert answer["state"] == "succeeded" and answer["stdout_tail"] == "42\n", answer

    run(go())
