"""Results as MCP resources, through the official Python SDK: collected files and
workspace files come back as resource_link items, each readable on its own with
resources/read (text or blob by its content), checked against the owner; the
resource lists are paged, and the templates name both URI forms."""

from __future__ import annotations

import base64
import uuid

import pytest
from conftest import Stack, connect
from mcp import Client, MCPError
from test_api_keys import create_key, unique
from test_mcp_sdk import b64, call_ok

pytestmark = pytest.mark.anyio

# A resource that is not there: -32002 before protocol 2026-07-28, invalid
# params (-32602) from it on (rmcp follows the protocol the client speaks).
NOT_FOUND_CODES = {-32002, -32602}


def links(result: object) -> dict[str, str]:
    """A tool result's resource_link items: name -> URI."""
    return {c.name: str(c.uri) for c in result.content if c.type == "resource_link"}  # type: ignore[attr-defined]


async def not_found(client: Client, uri: str) -> tuple[int, str]:
    with pytest.raises(MCPError) as caught:
        await client.read_resource(uri)
    return caught.value.error.code, caught.value.error.message


async def test_collected_files_come_as_links_that_resources_read_returns(client: Client) -> None:
    make = "mkdir -p out && printf 'hello\\n' > out/a.txt && printf '\\000\\377\\001' > out/b.bin"
    ran = await call_ok(
        client,
        "run_script",
        {"runtime": "python3.13", "command_base64": b64(make), "collect": ["out/*"], "wait_seconds": 30},
    )
    assert ran["state"] == "succeeded", ran
    # By default only text comes back (what every framework takes), each
    # file's uri in the JSON; links when asked for.
    plain = await client.call_tool("get_task_files", {"task_id": ran["task_id"]})
    assert [c.type for c in plain.content] == ["text"], plain.content
    uris = {f["name"]: f["uri"] for f in plain.structured_content["files"]}
    files = await client.call_tool("get_task_files", {"task_id": ran["task_id"], "resource_links": True})
    found = links(files)
    assert set(found) == {"out/a.txt", "out/b.bin"}, files.content
    assert found == uris
    assert found["out/a.txt"] == f"task://{ran['task_id']}/files/out/a.txt"

    text = (await client.read_resource(found["out/a.txt"])).contents[0]
    assert text.text == "hello\n", text  # type: ignore[union-attr]
    blob = (await client.read_resource(found["out/b.bin"])).contents[0]
    assert base64.b64decode(blob.blob) == b"\x00\xff\x01", blob  # type: ignore[union-attr]

    # The list has them, newest task first; the templates name both forms.
    listed = await client.list_resources(cache_mode="refresh")
    assert found["out/a.txt"] in {str(r.uri) for r in listed.resources}, listed
    templates = await client.list_resource_templates()
    assert {t.uri_template for t in templates.resource_templates} == {
        "task://{task_id}/files/{+path}",
        "workspace://{workspace_id}@{version}/{+path}",
    }


async def test_a_workspace_file_link_from_read_files_is_read_whole(client: Client) -> None:
    line = "x" * 100_000 + "\n"
    ran = await call_ok(
        client,
        "run_script",
        {
            "runtime": "python3.13",
            "command_base64": b64("python3 -c \"open('big.txt','w').write('x' * 100000 + chr(10))\""),
            "workspace": "new",
            "wait_seconds": 30,
        },
    )
    assert ran["state"] == "succeeded" and ran["workspace_version"] == 1, ran
    read = await client.call_tool(
        "read_files",
        {"workspace_id": ran["workspace_id"], "paths": ["big.txt"], "max_bytes": 10, "resource_links": True},
    )
    assert read.structured_content["files"][0]["truncated"], read.structured_content
    uri = links(read)["big.txt"]
    assert uri == f"workspace://{ran['workspace_id']}@1/big.txt"
    # read_files gave its first 10 bytes; the resource is the whole file.
    whole = (await client.read_resource(uri)).contents[0]
    assert whole.text == line  # type: ignore[union-attr]


async def test_another_owners_resource_is_answered_like_an_unknown_one(stack: Stack, client: Client) -> None:
    ran = await call_ok(
        client,
        "run_script",
        {"runtime": "python3.13", "command_base64": b64("echo secret > s.txt"), "collect": ["s.txt"], "wait_seconds": 30},
    )
    files = await client.call_tool("get_task_files", {"task_id": ran["task_id"]})
    mine = files.structured_content["files"][0]["uri"]
    unknown = f"task://{uuid.uuid4()}/files/s.txt"
    key = create_key(stack, unique("res"))
    async with connect(stack, token=key) as other:
        theirs = await not_found(other, mine)
        never = await not_found(other, unknown)
        listed = await other.list_resources(cache_mode="refresh")
    assert theirs[0] == never[0] and theirs[0] in NOT_FOUND_CODES, (theirs, never)
    assert theirs[1] == f"no resource {mine}" and never[1] == f"no resource {unknown}"
    assert mine not in {str(r.uri) for r in listed.resources}
