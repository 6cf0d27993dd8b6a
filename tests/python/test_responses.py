"""seeker's citations and Responses API through the official `openai` client.

Run by scripts/api-tests.sh against `cargo run --example api_server` (the real
HTTP server with a scripted policy that searches "Mona Lisa painter" in the
default corpus, then answers "Leonardo da Vinci", with a `[1]` marker when the
question asks to cite sources). The SDK's own types must parse every object
and event: the checks below use its classes, not dictionaries.
"""

import json
import os

import openai
import pytest
from openai.types.chat.chat_completion_message import Annotation as ChatAnnotation
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseFunctionWebSearch,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseTextDeltaEvent,
)
from openai.types.responses.response_output_text import AnnotationURLCitation

URL = os.environ["SEEKER_URL"]
KEY = os.environ["SEEKER_KEY"]
QUESTION = "Who painted the Mona Lisa?"


@pytest.fixture
def client():
    return openai.OpenAI(base_url=f"{URL}/v1", api_key=KEY, max_retries=0)


def cited(text, annotation):
    return text[annotation.start_index : annotation.end_index]


def test_chat_completions_carry_url_citations(client):
    r = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": f"{QUESTION} Cite your sources."}],
    )
    message = r.choices[0].message
    assert message.content == "Leonardo da Vinci [1]"
    assert message.annotations, "the [1] marker is a citation"
    a = message.annotations[0]
    assert isinstance(a, ChatAnnotation) and a.type == "url_citation"
    assert cited(message.content, a.url_citation) == "[1]"
    # Source 1 is the first document of the search, as the web UI numbers it.
    first = r.model_extra["seeker"]["documents"][0]
    assert a.url_citation.title == first["title"]
    assert a.url_citation.url.startswith(("http", "seeker://"))

    stream = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": f"{QUESTION} Cite your sources."}],
        stream=True,
    )
    last = [c for c in stream if c.choices][-1]
    assert last.choices[0].finish_reason == "stop"
    streamed = last.choices[0].delta.model_extra["annotations"]
    assert streamed == [x.model_dump() for x in message.annotations]


def test_responses_create_returns_typed_items_with_queries_sources_and_citations(client):
    r = client.responses.create(
        model="default",
        input=QUESTION,
        tools=[{"type": "web_search"}],
        include=["web_search_call.action.sources"],
    )
    assert isinstance(r, Response)
    assert r.status == "completed"
    assert r.output_text == "Leonardo da Vinci"
    kinds = [type(item) for item in r.output]
    assert ResponseReasoningItem in kinds
    assert kinds[-1] is ResponseOutputMessage
    calls = [i for i in r.output if isinstance(i, ResponseFunctionWebSearch)]
    assert len(calls) == 1
    action = calls[0].action
    assert action.type == "search" and action.queries == ["Mona Lisa painter"]
    assert action.sources and all(s.url for s in action.sources)
    text = r.output[-1].content[0]
    assert isinstance(text, ResponseOutputText)
    # No marker: the documents that hold the answer are cited over it.
    assert text.annotations, "a document holds 'Leonardo da Vinci'"
    for a in text.annotations:
        assert isinstance(a, AnnotationURLCitation)
        assert cited(text.text, a) == "Leonardo da Vinci"
        assert a.url in {s.url for s in action.sources}
    assert r.usage.output_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens


def test_streamed_responses_follow_the_documented_sequence(client):
    events = list(
        client.responses.create(
            model="default", input=QUESTION, tools=[{"type": "web_search"}], stream=True
        )
    )
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    searching = [t for t in types if t.startswith("response.web_search_call.")]
    assert searching == [
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.web_search_call.completed",
    ]
    deltas = [e for e in events if isinstance(e, ResponseTextDeltaEvent)]
    assert "".join(d.delta for d in deltas) == "Leonardo da Vinci"
    assert types.index("response.output_text.annotation.added") < types.index(
        "response.output_text.done"
    )
    assert isinstance(events[-1], ResponseCompletedEvent)
    assert events[-1].response.output_text == "Leonardo da Vinci"


def test_the_sdk_stream_helper_accumulates_the_same_response(client):
    # `responses.stream` rebuilds the response from the events and fails on
    # any event out of place.
    with client.responses.stream(model="default", input=QUESTION) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.output_text == "Leonardo da Vinci"
    assert [i.type for i in final.output][-1] == "message"


def test_responses_errors_name_the_field(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="default", input=QUESTION, previous_response_id="resp_1")
    assert e.value.param == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(
            model="default",
            input=QUESTION,
            tools=[{"type": "file_search", "vector_store_ids": ["vs_1"]}],
        )
    assert e.value.param == "tools[0]"


def test_a_function_tool_round_trip_through_responses(client):
    weather = {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.responses.create(model="default", input=question, tools=[weather])
    calls = [i for i in r.output if isinstance(i, ResponseFunctionToolCall)]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    follow_up = question + [
        calls[0].model_dump(include={"type", "call_id", "name", "arguments"}),
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 degrees"},
    ]
    r = client.responses.create(model="default", input=follow_up, tools=[weather])
    assert r.output_text == "It is 18 degrees and sunny in Paris."
