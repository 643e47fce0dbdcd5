"""A tool an agent framework runs is linked to the model's call although the framework reshapes the arguments.

Frameworks (the OpenAI Agents SDK, pydantic-ai, LangGraph) call the function with what its signature takes: they
drop members it has no parameter for, pass each omitted parameter's default, add a context object of their own,
and validate a member into the pydantic model a parameter names. The execution still takes the model's call id;
arguments the model did not ask for leave it unlinked.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pydantic
import pytest
from opentelemetry.sdk.trace import ReadableSpan

from otel_replay import semconv as sc
from otel_replay.instrumentation import _toolcalls, tool
from otel_replay.instrumentation import scripted as s

from .conftest import Pipeline


class RunContext:
    """What a framework hands a tool beside the model's arguments (no JSON value)."""


class Booking(pydantic.BaseModel):
    city: str
    nights: int


@pytest.fixture(autouse=True)
def no_remembered_calls() -> Iterator[None]:
    """Each test starts with no model call remembered (the memory is the process's; earlier tests leave calls)."""
    _toolcalls._calls.clear()
    yield
    _toolcalls._calls.clear()


def ask(server: s.ScriptedServer, *calls: tuple[str, str, str]) -> None:
    """One model response asking for ``calls`` (id, tool name, arguments as the model wrote them)."""
    server.enqueue(s.chat_completion(None, tool_calls=list(calls)))
    with openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as client:
        client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "plan"}])


def call_ids(spans: list[ReadableSpan]) -> list[str | None]:
    return [span.attributes.get(sc.GEN_AI_TOOL_CALL_ID) for span in spans]


def test_defaults_passed_a_context_added_and_unknown_members_dropped_keep_the_call_id(server, instrumented: Pipeline):
    @tool(tracer_provider=instrumented.provider)
    def forecast(ctx: RunContext, city: str, days: int = 3, units: str = "C") -> str:
        return f"{city}: {days} days in {units}"

    ask(
        server,
        ("call_oslo", "forecast", '{"city": "Oslo", "verbose": true}'),  # a member forecast has no parameter for
        ("call_rome", "forecast", '{"city": "Rome", "days": 5}'),
    )
    forecast(RunContext(), "Rome", 5, "C")  # as the framework calls it: every parameter passed
    forecast(RunContext(), "Oslo", 3, "C")
    model = instrumented.one("chat")
    rome, oslo = instrumented.spans("execute_tool")
    assert call_ids([rome, oslo]) == ["call_rome", "call_oslo"]
    assert all([link.context.span_id for link in span.links] == [model.context.span_id] for span in (rome, oslo))


def test_arguments_the_model_did_not_ask_for_take_no_call_id(server, instrumented: Pipeline):
    @tool(tracer_provider=instrumented.provider)
    def forecast(ctx: RunContext, city: str, days: int = 3) -> str:
        return city

    ask(server, ("call_oslo", "forecast", '{"city": "Oslo"}'), ("call_list", "forecast", '["Oslo"]'))
    forecast(RunContext(), "Oslo", 7)  # a non-default value the model never gave
    forecast(RunContext(), "Paris", 3)  # another city
    forecast(RunContext(), "Oslo")  # at last the call the model asked for
    assert call_ids(instrumented.spans("execute_tool")) == [None, None, "call_oslo"]


def test_a_call_with_exactly_the_models_arguments_is_matched_before_an_older_looser_one(server, instrumented: Pipeline):
    @tool(tracer_provider=instrumented.provider)
    def forecast(city: str, days: int = 3) -> str:
        return city

    ask(
        server,
        ("call_loose", "forecast", '{"city": "Oslo", "note": "x"}'),
        ("call_exact", "forecast", '{"city": "Oslo"}'),
    )
    forecast(city="Oslo")
    forecast(city="Oslo")
    forecast(city="Oslo")  # both calls answered: the third takes none
    assert call_ids(instrumented.spans("execute_tool")) == ["call_exact", "call_loose", None]


def test_a_member_validated_into_a_pydantic_model_keeps_the_call_id(server, instrumented: Pipeline):
    @tool(tracer_provider=instrumented.provider)
    def book(request: Booking) -> str:
        return request.city

    ask(server, ("call_book", "book", '{"request": {"nights": 2, "city": "Oslo"}}'))
    book(Booking(city="Oslo", nights=1))  # not what was asked
    book(Booking.model_validate({"city": "Oslo", "nights": 2}))
    assert call_ids(instrumented.spans("execute_tool")) == [None, "call_book"]
