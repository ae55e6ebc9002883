"""The repository's `server.json`, the listing the official MCP registry reads: valid
against the registry's own schema (a copy in tests/schemas, with its source and
date), and true of the server: the version it reports, the transport, the path,
and the header a client must send, which a real client sends as the listing
says and gets in with, and without which it is refused."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx2
import pytest
from conftest import Stack
from jsonschema import Draft7Validator, FormatChecker
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "tests/schemas/mcp-registry-server.schema.json").read_text())
SERVER = json.loads((ROOT / "server.json").read_text())


def validator() -> Draft7Validator:
    return Draft7Validator(SCHEMA, format_checker=FormatChecker())


def render(template: str, values: dict[str, str]) -> str:
    """A registry template with its `{variables}` filled in, as a client does."""
    return re.sub(r"\{([a-z_]+)\}", lambda m: values[m.group(1)], template)


def test_server_json_is_valid_against_the_registry_schema() -> None:
    Draft7Validator.check_schema(SCHEMA)
    assert SERVER["$schema"] == SCHEMA["$id"]
    errors = sorted(validator().iter_errors(SERVER), key=str)
    assert not errors, [e.message for e in errors]
    # The validator does refuse: a name without its namespace, and no version.
    broken: dict[str, Any] = {k: v for k, v in SERVER.items() if k != "version"} | {"name": "script-runner"}
    assert {e.validator for e in validator().iter_errors(broken)} >= {"pattern", "required"}


def test_server_json_says_what_the_server_is() -> None:
    version = re.search(r'^version = "([^"]+)"', (ROOT / "api/Cargo.toml").read_text(), re.M)
    assert version and SERVER["version"] == version.group(1)
    [remote] = SERVER["remotes"]
    assert remote["type"] == "streamable-http"
    # The registry holds a remote's host to the listing's namespace (its
    # reverse DNS): one listing per deployment, never a template host.
    assert remote["url"].endswith("/mcp") and "{" not in remote["url"]
    host = remote["url"].removeprefix("https://").split("/")[0]
    domain = ".".join(reversed(SERVER["name"].split("/")[0].split(".")))
    assert host == domain or host.endswith("." + domain), (SERVER["name"], host)
    [header] = remote["headers"]
    assert header["name"] == "Authorization" and header["isRequired"] and header["isSecret"]


async def test_a_client_sending_the_listed_header_gets_in_and_one_without_is_refused(stack: Stack) -> None:
    [remote] = SERVER["remotes"]
    [header] = remote["headers"]
    headers = {header["name"]: render(header["value"], {"api_key": stack.token})}
    async with httpx2.AsyncClient(headers=headers, timeout=30.0) as http:
        async with Client(streamable_http_client(stack.mcp_url, http_client=http)) as client:
            assert client.server_info is not None and client.server_info.version == SERVER["version"]
            tools = await client.list_tools()
            assert "run_script" in {t.name for t in tools.tools}
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    accept = {"Accept": "application/json, text/event-stream"}
    assert httpx2.post(stack.mcp_url, json=ping, headers=accept).status_code == 401
