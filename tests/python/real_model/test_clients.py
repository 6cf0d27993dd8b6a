"""The official clients against the real binary on the default model.

Run by scripts/api-tests.sh against `seeker serve` on the default config
(Qwen2.5-Coder-1.5B-Instruct, greedy, the default corpus and index), with an
API key. Each rollout takes tens of seconds on a CPU, so the question is one:
"When was the Taj Mahal built?", which the default model searches for.
"""

import asyncio
import json
import os

import httpx2
import openai
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionWebSearch,
    ResponseOutputMessage,
)
from openai.types.responses.response_output_text import AnnotationURLCitation

URL = os.environ["SEEKER_URL"]
KEY = os.environ["SEEKER_KEY"]
QUESTION = "When was the Taj Mahal built?"


@pytest.fixture
def client():
    return openai.OpenAI(base_url=f"{URL}/v1", api_key=KEY, max_retries=0, timeout=600)


def check(r):
    """The model's own queries, and a cited answer, in the SDK's types."""
    assert isinstance(r, Response)
    assert r.status == "completed", r.status
    calls = [i for i in r.output if isinstance(i, ResponseFunctionWebSearch)]
    assert calls, [i.type for i in r.output]
    queries = [q for c in calls for q in c.action.queries]
    assert any("taj mahal" in q.lower() for q in queries), queries
    message = r.output[-1]
    assert isinstance(message, ResponseOutputMessage)
    text = message.content[0]
    assert text.annotations, f"no citation for {text.text!r}"
    for a in text.annotations:
        assert isinstance(a, AnnotationURLCitation)
        assert 0 <= a.start_index < a.end_index <= len(text.text)
        assert a.title and a.url
    sources = {s.url for c in calls for s in (c.action.sources or [])}
    assert {a.url for a in text.annotations} <= sources
    return text.text


def test_responses_create_searches_and_cites_on_the_default_model(client):
    # One rollout (a question costs about a minute here): streamed, whose
    # last event carries the whole response as the non-streamed request
    # returns it (tests/it/responses.rs checks that the two agree).
    events = list(
        client.responses.create(
            model="default",
            input=QUESTION,
            tools=[{"type": "web_search"}],
            include=["web_search_call.action.sources"],
            stream=True,
        )
    )
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    order = [
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.web_search_call.completed",
        "response.output_text.delta",
        "response.output_text.annotation.added",
        "response.output_text.done",
    ]
    at = [types.index(t) for t in order]
    assert at == sorted(at), types
    assert isinstance(events[-1], ResponseCompletedEvent)
    r = events[-1].response
    answer = check(r)
    print(f"answer: {answer!r}; output: {[i.type for i in r.output]}")


def test_mcp_client_lists_and_calls_both_tools():
    async def session_work():
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx2.AsyncClient(headers=headers, timeout=600) as http:
            async with streamable_http_client(f"{URL}/mcp", http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    tools = {t.name for t in (await session.list_tools()).tools}
                    found = await session.call_tool("search", {"queries": ["Taj Mahal"]})
                    answer = await session.call_tool("research", {"question": QUESTION})
                    return tools, found, answer

    tools, found, answer = asyncio.run(session_work())
    assert tools == {"search", "research"}
    assert not found.is_error
    docs = found.structured_content["results"][0]["documents"]
    assert any(d["title"] == "Taj Mahal" for d in docs), [d["title"] for d in docs]
    assert not answer.is_error, answer.content
    out = answer.structured_content
    assert out["answer"] and out["searches"] >= 1 and out["documents"]
    print(f"research: {out['answer']!r}, {len(out['citations'])} citations")


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def test_a_named_client_tool_is_called_and_its_result_answered(client):
    r = client.chat.completions.create(
        model="default",
        messages=WEATHER_QUESTION,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert "paris" in json.dumps(arguments).lower(), arguments
    follow_up = WEATHER_QUESTION + [
        choice.message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}),
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees Celsius, sunny"},
    ]
    r = client.chat.completions.create(
        model="default",
        messages=follow_up,
        tools=[WEATHER],
        extra_body={"return_transcript": True},
    )
    assert r.choices[0].finish_reason == "stop"
    answer = r.choices[0].message.content
    assert "18" in answer, answer
    # The conversation continued where the call left it: most of the prompt
    # came from the prefix cache.
    cached = r.model_extra["seeker"]["rounds"][0]["prompt_tokens_cached"]
    print(f"follow-up: {answer!r}; {cached} of {r.usage.prompt_tokens} prompt tokens cached")
    assert cached > r.usage.prompt_tokens // 2


def test_with_auto_the_outcome_is_the_models_and_never_a_server_error(client):
    r = client.chat.completions.create(
        model="default", messages=WEATHER_QUESTION, tools=[WEATHER], tool_choice="auto"
    )
    choice = r.choices[0]
    assert choice.finish_reason in {"tool_calls", "stop", "length"}
    if choice.finish_reason == "tool_calls":
        for call in choice.message.tool_calls:
            json.loads(call.function.arguments)
    print(f"auto: {choice.finish_reason}, {choice.message.tool_calls or choice.message.content!r}")
