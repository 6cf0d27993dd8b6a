"""seeker through the official `openai` Python client, unchanged.

Run by scripts/api-tests.sh against `cargo run --example api_server` (the real
HTTP server with a scripted policy that searches, then answers "Leonardo da
Vinci"). SEEKER_URL is the server root; SEEKER_KEY the API key it requires.
"""

import json
import os
import urllib.error
import urllib.request

import openai
import pytest

URL = os.environ["SEEKER_URL"]
KEY = os.environ["SEEKER_KEY"]
QUESTION = [{"role": "user", "content": "Who painted the Mona Lisa?"}]


@pytest.fixture
def client():
    return openai.OpenAI(base_url=f"{URL}/v1", api_key=KEY, max_retries=0)


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["scripted"]


def test_non_streamed_completion(client):
    r = client.chat.completions.create(model="scripted", messages=QUESTION)
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "Leonardo da Vinci"
    assert choice.finish_reason == "stop"
    # The trace and seeker's extension come through as extra fields.
    extra = r.model_extra
    assert "<search> Mona Lisa painter </search>" in choice.message.model_extra["reasoning_content"]
    assert extra["seeker"]["searches"] == 1
    assert extra["seeker"]["documents"], "citations of the spliced documents"
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.completion_tokens > 0


def test_streamed_completion_matches_the_non_streamed_one(client):
    whole = client.chat.completions.create(model="default", messages=QUESTION)
    stream = client.chat.completions.create(
        model="default",
        messages=QUESTION,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = "".join(
        c.choices[0].delta.content or "" for c in chunks if c.choices
    )
    assert content == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    # include_usage: exactly one chunk with usage, the last, with no choices.
    with_usage = [c for c in chunks if c.usage is not None]
    assert len(with_usage) == 1 and with_usage[0] is chunks[-1]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()


def test_without_include_usage_no_chunk_carries_usage(client):
    chunks = list(
        client.chat.completions.create(model="default", messages=QUESTION, stream=True)
    )
    assert chunks and all(c.usage is None for c in chunks)


def test_max_tokens_and_stop(client):
    r = client.chat.completions.create(model="default", messages=QUESTION, max_tokens=2)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens <= 2
    r = client.chat.completions.create(model="default", messages=QUESTION, stop=[" da"])
    assert r.choices[0].message.content == "Leonardo"
    assert r.choices[0].finish_reason == "stop"


def test_errors_map_to_the_clients_exceptions(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-nothing", messages=QUESTION)
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="default", messages=QUESTION, temperature=5)
    assert e.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="default", messages=QUESTION, n=2)
    assert e.value.param == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="default", messages=[])
    assert e.value.param == "messages"
    wrong = openai.OpenAI(base_url=f"{URL}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.models.list()
    assert e.value.code == "invalid_api_key"


def raw(method, path, body=None, headers=None):
    """(status, headers, JSON body) of one plain HTTP request."""
    request = urllib.request.Request(f"{URL}{path}", data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request) as r:
            return r.status, r.headers, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read())


def test_raw_http_errors_share_one_shape():
    headers = {"Authorization": f"Bearer {KEY}"}
    json_headers = {**headers, "content-type": "application/json"}
    cases = [
        ("POST", "/v1/chat/completions", b"{not json", json_headers, 400, "invalid_json"),
        ("POST", "/v1/chat/completions", b"{}", {**headers, "content-type": "text/plain"}, 415, "unsupported_media_type"),
        ("GET", "/v1/nothing", None, headers, 404, "unknown_url"),
        ("POST", "/v1/chat/completions", b"{}" + b" " * (3 << 20), json_headers, 413, "payload_too_large"),
        ("GET", "/v1/models", None, {}, 401, "invalid_api_key"),
    ]
    for method, path, body, hdrs, status, code in cases:
        got, response_headers, answer = raw(method, path, body, hdrs)
        assert got == status, (path, answer)
        assert set(answer["error"]) == {"message", "type", "param", "code"}
        assert answer["error"]["code"] == code
        assert response_headers["x-request-id"]


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
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_a_client_tool_round_trip(client):
    first = client.chat.completions.create(
        model="default", messages=WEATHER_QUESTION, tools=[WEATHER]
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # The client runs the function and sends the result back.
    follow_up = WEATHER_QUESTION + [
        choice.message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}),
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"},
    ]
    second = client.chat.completions.create(model="default", messages=follow_up, tools=[WEATHER])
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "It is 18 degrees and sunny in Paris."


def test_a_named_tool_choice_and_a_streamed_call(client):
    r = client.chat.completions.create(
        model="default",
        messages=WEATHER_QUESTION,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"

    stream = client.chat.completions.create(
        model="default", messages=WEATHER_QUESTION, tools=[WEATHER], stream=True
    )
    chunks = [c for c in stream if c.choices]
    deltas = [t for c in chunks for t in (c.choices[0].delta.tool_calls or [])]
    assert [d.index for d in deltas] == [0]
    assert deltas[0].function.name == "get_weather"
    assert json.loads(deltas[0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tools_on_a_policy_that_cannot_call_functions_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="default",
            messages=WEATHER_QUESTION,
            tools=[WEATHER],
            extra_body={"policy": "search-r1"},
        )
    assert e.value.param == "tools"
