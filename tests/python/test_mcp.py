"""seeker's MCP server through the official `mcp` Python client.

Run by scripts/api-tests.sh against `cargo run --example api_server` (the real
HTTP server with a scripted policy that searches the default corpus, then
answers "Leonardo da Vinci"). The client initializes over the streamable HTTP
transport, lists the tools and calls both, with the server's API key.
"""

import asyncio
import os

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

URL = os.environ["SEEKER_URL"]
KEY = os.environ["SEEKER_KEY"]


async def with_session(work):
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        async with streamable_http_client(f"{URL}/mcp", http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                info = await session.initialize()
                assert info.server_info.name == "seeker"
                return await work(session)


def test_the_client_lists_both_tools_with_their_schemas():
    async def work(session):
        return (await session.list_tools()).tools

    tools = {t.name: t for t in asyncio.run(with_session(work))}
    assert set(tools) == {"search", "research"}
    assert tools["search"].input_schema["required"] == ["queries"]
    assert tools["research"].input_schema["required"] == ["question"]
    assert "answer" in tools["research"].output_schema["properties"]


def test_search_returns_each_querys_documents():
    async def work(session):
        return await session.call_tool(
            "search", {"queries": ["Mona Lisa painter", "Louvre museum"], "top_k": 2}
        )

    result = asyncio.run(with_session(work))
    assert not result.is_error, result.content
    results = result.structured_content["results"]
    assert [r["query"] for r in results] == ["Mona Lisa painter", "Louvre museum"]
    assert all(len(r["documents"]) == 2 for r in results)
    first = results[0]["documents"][0]
    assert first["title"] == "Mona Lisa" and first["url"].startswith("seeker://")


def test_research_answers_with_citations():
    async def work(session):
        return await session.call_tool("research", {"question": "Who painted the Mona Lisa?"})

    result = asyncio.run(with_session(work))
    assert not result.is_error, result.content
    out = result.structured_content
    assert out["answer"] == "Leonardo da Vinci"
    assert out["searches"] == 1 and out["documents"]
    assert out["citations"], "a document holds the answer"
    c = out["citations"][0]
    assert out["answer"][c["start_index"] : c["end_index"]] == "Leonardo da Vinci"
    assert c["url"] in {d["url"] for d in out["documents"]}


def test_bad_arguments_are_tool_errors_not_failures():
    async def work(session):
        return await session.call_tool("search", {"queries": []})

    result = asyncio.run(with_session(work))
    assert result.is_error
    assert "queries" in result.content[0].text
