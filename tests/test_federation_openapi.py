"""The pure parts of federation: configuration, OpenAPI operations as tools, MCP results as outputs."""

from __future__ import annotations

import json

import pytest

from apollia_nb.errors import BadInput
from apollia_nb.federation.config import parse_host, parse_mcp_server
from apollia_nb.federation.mcp import tool_hints, tool_output
from apollia_nb.federation.rest import build_request, family_for, is_local, operations
from apollia_nb.governance.decision import Family
from apollia_nb.federation import open_sources
from apollia_nb.runtime import Runtime
from runtime_helpers import manifest
from test_federation_support import REPO, write_config

SHIPPED = json.loads((REPO / "examples" / "host_notes" / "openapi.json").read_text())


def doc(paths, components=None):
    return {"openapi": "3.0.3", "info": {"title": "t", "version": "1"}, "paths": paths,
            "components": components or {}}


# --- configuration -----------------------------------------------------------------------


def test_an_mcp_server_entry_is_checked_key_by_key():
    server = parse_mcp_server("notes", {"command": "python", "args": ["-m", "notes"], "families": {"search": "read"},
                                        "timeout_secs": 5})
    assert (server.transport, server.args, server.families, server.timeout_secs) == (
        "stdio", ("-m", "notes"), {"search": Family.READ}, 5.0)
    assert parse_mcp_server("web", {"url": "http://127.0.0.1:9000/mcp", "token_env": "WEB_TOKEN"}).transport == "http"
    assert (server.roots, server.input_timeout_secs) == (True, 300.0)
    host = parse_mcp_server("files", {"command": "x", "roots": False, "input_timeout_secs": 60,
                                      "families": {"resources/read": "read", "sampling/createMessage": "send"}})
    assert (host.roots, host.input_timeout_secs) == (False, 60.0)
    assert host.families == {"resources/read": Family.READ, "sampling/createMessage": Family.SEND}


@pytest.mark.parametrize("name, table, words", [
    ("notes", {}, "give either command (stdio) or url"),
    ("notes", {"command": "x", "url": "http://h/mcp"}, "give either command (stdio) or url"),
    ("notes", {"command": "x", "familes": {}}, "unknown key 'familes'"),
    ("notes", {"command": "x", "families": {"search": "reed"}}, "families.search: unknown family 'reed'"),
    ("notes", {"command": "x", "timeout_secs": 0}, "timeout_secs must be a positive number"),
    ("notes", {"command": "x", "args": "-m notes"}, "args must be an array of strings"),
    ("notes", {"url": "ftp://h/mcp"}, "must be an http:// or https:// URL"),
    ("notes", {"url": "http://h/mcp", "args": []}, "args applies to a stdio server"),
    ("notes", {"command": "x", "token_env": "T"}, "token_env applies to a streamable HTTP server"),
    ("no/tes", {"command": "x"}, "the name must be letters, digits"),
    ("notes", {"command": "x", "roots": "no"}, "roots must be true or false"),
    ("notes", {"command": "x", "input_timeout_secs": -1}, "input_timeout_secs must be a positive number"),
])
def test_a_broken_mcp_server_entry_names_the_key(name, table, words):
    with pytest.raises(BadInput, match=None) as caught:
        parse_mcp_server(name, table)
    assert words in caught.value.message


@pytest.mark.parametrize("table, words", [
    ({"base_url": "http://h"}, "openapi is required"),
    ({"openapi": "o.json", "base_url": "h:80"}, "must be an http:// or https:// URL"),
    ({"openapi": "o.json", "token_env": "not a name"}, "must name an environment variable"),
    ({"openapi": "o.json", "families": {"createSummary": "mail"}}, "unknown family 'mail'"),
])
def test_a_broken_host_entry_names_the_key(table, words):
    with pytest.raises(BadInput) as caught:
        parse_host("crm", table)
    assert words in caught.value.message


@pytest.mark.anyio
async def test_a_broken_entry_leaves_only_its_own_tools_unresolved(home):
    write_config(home, servers={"bad": {"command": "x", "families": {"search": "reed"}}},
                 hosts={"crm": {"openapi": "missing.json", "base_url": "http://127.0.0.1:9"}})
    async with Runtime(home, tool_sources=open_sources) as rt:
        untouched = await rt.register_agent(manifest(name="plain", required=["read_file"]))
        assert untouched.state.state.value == "active"
        agent = await rt.register_agent(manifest(optional=["mcp:bad/search", "rest:crm/createNote"]))
        assert agent.state.state.value == "degraded"
        joined = "\n".join(agent.warnings)
        assert "mcp:bad: [mcp.servers.bad] families.search: unknown family 'reed'" in joined
        assert "rest:crm: the OpenAPI document" in joined and "missing.json cannot be read" in joined


# --- OpenAPI operations ------------------------------------------------------------------


def test_the_example_hosts_operations():
    found, skipped = operations(SHIPPED)
    assert skipped == []
    by_id = {op.operation_id: op for op in found}
    create = by_id["createSummary"]
    assert (create.method, create.path, create.body, create.body_fields) == (
        "POST", "/summaries", "flat", ("title", "text", "note_ids"))
    assert create.schema["required"] == ["title", "text"]
    assert create.schema["properties"]["note_ids"] == {
        "type": "array", "items": {"type": "string"}, "description": "The notes it summarises."}
    assert create.schema["additionalProperties"] is False
    assert by_id["listSummaries"].schema["properties"] == {}


def test_families_follow_method_and_locality_unless_overridden():
    found, _ = operations(SHIPPED)
    by_id = {op.operation_id: op for op in found}
    assert family_for(by_id["listSummaries"], local=False, overrides={}) is Family.READ
    assert family_for(by_id["createSummary"], local=True, overrides={}) is Family.WRITE
    assert family_for(by_id["createSummary"], local=False, overrides={}) is Family.SEND
    assert family_for(by_id["createSummary"], local=True, overrides={"createSummary": Family.SEND}) is Family.SEND


@pytest.mark.parametrize("url, local", [
    ("http://localhost:8000", True), ("http://api.localhost", True), ("http://127.0.0.1:1", True),
    ("http://127.9.9.9", True), ("http://[::1]:8000/v1", True),
    ("https://crm.example.com", False), ("http://10.0.0.5", False), ("http://192.168.1.2:80", False),
])
def test_a_host_is_local_only_on_the_loopback(url, local):
    assert is_local(url) is local


def test_parameters_come_in_path_query_header_order_then_the_body():
    spec = doc({
        "/notes/{id}/tags": {
            "parameters": [{"$ref": "#/components/parameters/Id"}],
            "put": {
                "operationId": "tagNote",
                "parameters": [
                    {"name": "X-Request", "in": "header", "schema": {"type": "string"}},
                    {"name": "Authorization", "in": "header", "required": True, "schema": {"type": "string"}},
                    {"name": "dry", "in": "query", "schema": {"type": "boolean"}},
                ],
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"type": "object", "properties": {"tags": {"type": "array"}}, "required": ["tags"]}}}},
            },
        },
    }, components={"parameters": {"Id": {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}}})
    [op], _ = operations(spec)
    assert list(op.schema["properties"]) == ["id", "dry", "X-Request", "tags"]  # no Authorization argument
    assert op.schema["required"] == ["id", "tags"]
    request = build_request(op, "http://127.0.0.1:8000/api/", {"id": "a b/c", "dry": True, "X-Request": "r1",
                                                               "tags": ["x"]})
    assert request.url == "http://127.0.0.1:8000/api/notes/a%20b%2Fc/tags"
    assert (request.method, request.params, request.headers, request.json) == (
        "PUT", {"dry": "true"}, {"X-Request": "r1"}, {"tags": ["x"]})


def test_a_body_that_cannot_be_flattened_is_one_argument():
    spec = doc({
        "/batch": {"post": {"operationId": "importNotes", "requestBody": {"required": True, "content": {
            "application/json": {"schema": {"type": "array", "items": {"type": "string"}}}}}}},
        "/items/{id}": {"patch": {"operationId": "patchItem", "parameters": [
            {"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}],
            "requestBody": {"content": {"application/json": {"schema": {
                "type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}}}}}},
    })
    found, _ = operations(spec)
    by_id = {op.operation_id: op for op in found}
    assert by_id["importNotes"].body == "whole" and by_id["importNotes"].schema["required"] == ["body"]
    assert by_id["patchItem"].body == "whole"  # a property named like a parameter: no flattening
    assert list(by_id["patchItem"].schema["properties"]) == ["id", "body"]
    request = build_request(by_id["patchItem"], "http://h", {"id": 7, "body": {"id": 7, "name": "n"}})
    assert (request.url, request.json, request.has_body) == ("http://h/items/7", {"id": 7, "name": "n"}, True)


def test_operations_that_cannot_be_tools_are_left_out_with_a_reason():
    spec = doc({
        "/a": {"get": {"responses": {}}},
        "/b": {"post": {"operationId": "upload", "requestBody": {"required": True, "content": {
            "multipart/form-data": {"schema": {"type": "object"}}}}}},
        "/c": {"get": {"operationId": "withCookie", "parameters": [
            {"name": "session", "in": "cookie", "required": True}]}},
        "/d": {"get": {"operationId": "fine"}},
    })
    found, skipped = operations(spec)
    assert [op.operation_id for op in found] == ["fine"]
    assert skipped == ["GET /a: no usable operationId", "upload: only JSON request bodies are supported",
                       "withCookie: required cookie parameter 'session' is not supported"]


@pytest.mark.parametrize("spec, words", [
    ({"swagger": "2.0", "paths": {}}, "not an OpenAPI 3 document"),
    ({"openapi": "3.1.0"}, "has no \"paths\""),
    (doc({"/a": {"get": {"operationId": "x"}}, "/b": {"get": {"operationId": "x"}}}), "'x' is used twice"),
    (doc({"/a": {"get": {"operationId": "x", "parameters": [{"$ref": "#/components/parameters/Nope"}]}}}),
     "points to nothing"),
    (doc({"/a": {"get": {"operationId": "x", "parameters": [{"$ref": "other.json#/P"}]}}}),
     "only local references"),
])
def test_a_document_that_cannot_be_read_is_bad_input(spec, words):
    with pytest.raises(BadInput) as caught:
        operations(spec)
    assert words in caught.value.message


# --- MCP results -------------------------------------------------------------------------


def test_mcp_results_become_json_outputs():
    import mcp_types as t

    text = t.TextContent(text="hello")
    image = t.ImageContent(data="aGVsbG8=", mime_type="image/png")
    resource = t.EmbeddedResource(
        resource=t.TextResourceContents(uri="file:///n.txt", text="note", mime_type="text/plain"))
    assert tool_output(t.CallToolResult(content=[text], structured_content={"a": 1})) == {"a": 1}
    assert tool_output(t.CallToolResult(content=[text])) == "hello"
    assert tool_output(t.CallToolResult(content=[])) is None
    assert tool_output(t.CallToolResult(content=[text, image, resource])) == [
        "hello",
        # not an image's bytes: described by size and digest, never passed on
        {"type": "image", "mime_type": "image/png", "bytes": 5,
         "sha256": "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"},
        {"type": "resource", "uri": "file:///n.txt", "mime_type": "text/plain", "text": "note"},
    ]


def test_annotations_become_hints_with_their_wire_names():
    import mcp_types as t

    tool = t.Tool(name="rm", input_schema={"type": "object"}, title="Remove",
                  annotations=t.ToolAnnotations(destructive_hint=True, open_world_hint=False))
    assert tool_hints(tool) == {"destructiveHint": True, "openWorldHint": False, "title": "Remove"}
    assert tool_hints(t.Tool(name="x", input_schema={"type": "object"})) is None


@pytest.mark.anyio
async def test_a_missing_token_for_an_http_server_is_reported_without_connecting(home, monkeypatch):
    monkeypatch.delenv("WIKI_TOKEN", raising=False)
    write_config(home, servers={"wiki": {"url": "http://127.0.0.1:9/mcp", "token_env": "WIKI_TOKEN"}})
    async with Runtime(home, tool_sources=open_sources) as rt:
        agent = await rt.register_agent(manifest(optional=["mcp:wiki/lookup"]))
        assert agent.state.state.value == "degraded"
        assert any("mcp:wiki: the environment variable WIKI_TOKEN is not set" in w for w in agent.warnings)
