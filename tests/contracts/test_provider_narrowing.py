"""Narrowing a request's tools per provider API: what is cut, what goes with an emptied list, which tool
choices are dropped, and requests whose tools are not a list at all."""

from __future__ import annotations

from typing import Any

import pytest

from otel_replay.contracts.providers.anthropic import MessagesAdapter
from otel_replay.contracts.providers.openai import ChatAdapter, ResponsesAdapter

CHAT = ChatAdapter()
RESPONSES = ResponsesAdapter()
MESSAGES = MessagesAdapter()


def _chat(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {}}}


def _responses(name: str) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": {}}


def _messages(name: str) -> dict[str, Any]:
    return {"name": name, "input_schema": {}}


ENTRY = {"chat": _chat, "responses": _responses, "messages": _messages}
ADAPTERS = {"chat": CHAT, "responses": RESPONSES, "messages": MESSAGES}
FORCE = {
    "chat": lambda name: {"type": "function", "function": {"name": name}},
    "responses": lambda name: {"type": "function", "name": name},
    "messages": lambda name: {"type": "tool", "name": name},
}
APIS = sorted(ADAPTERS)


@pytest.mark.parametrize("api", APIS)
def test_only_the_kept_tools_are_offered_and_the_request_is_a_copy(api: str) -> None:
    adapter, entry = ADAPTERS[api], ENTRY[api]
    request = {"model": "m", "tools": [entry("a"), entry("b"), entry("c")]}
    narrowed = adapter.narrow(request, frozenset({"a", "c"}))
    assert adapter.offered(narrowed) == ["a", "c"]
    assert adapter.offered(request) == ["a", "b", "c"]  # the caller's request is untouched
    assert adapter.model(narrowed) == "m"


@pytest.mark.parametrize("api", APIS)
def test_a_tool_choice_forcing_a_removed_tool_is_dropped_and_one_forcing_a_kept_tool_stays(api: str) -> None:
    adapter, entry, force = ADAPTERS[api], ENTRY[api], FORCE[api]
    tools = [entry("a"), entry("b")]
    dropped = adapter.narrow({"tools": tools, "tool_choice": force("b")}, frozenset({"a"}))
    assert "tool_choice" not in dropped
    kept = adapter.narrow({"tools": tools, "tool_choice": force("a")}, frozenset({"a"}))
    assert kept["tool_choice"] == force("a")


@pytest.mark.parametrize("api", APIS)
def test_a_tool_choice_naming_no_tool_stays(api: str) -> None:
    adapter, entry = ADAPTERS[api], ENTRY[api]
    choice: Any = {"type": "auto"} if api == "messages" else "required"
    narrowed = adapter.narrow({"tools": [entry("a"), entry("b")], "tool_choice": choice}, frozenset({"a"}))
    assert narrowed["tool_choice"] == choice


@pytest.mark.parametrize("api", APIS)
def test_an_emptied_tools_list_is_left_out_with_what_the_api_refuses_without_tools(api: str) -> None:
    adapter, entry = ADAPTERS[api], ENTRY[api]
    request = {"model": "m", "tools": [entry("b")], "tool_choice": "auto", "parallel_tool_calls": False}
    narrowed = adapter.narrow(request, frozenset())
    assert "tools" not in narrowed and "tool_choice" not in narrowed
    # only the openai APIs take parallel_tool_calls, and refuse it without tools
    assert ("parallel_tool_calls" in narrowed) is (api == "messages")
    assert adapter.offered(narrowed) is None


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("tools", ["a", None, 7, {"name": "a"}])
def test_tools_that_are_not_a_list_leave_the_request_as_it_is(api: str, tools: Any) -> None:
    adapter = ADAPTERS[api]
    request = {"tools": tools, "tool_choice": FORCE[api]("a")}
    assert adapter.narrow(request, frozenset()) is request
    assert adapter.offered(request) is None


@pytest.mark.parametrize("api", APIS)
def test_entries_without_a_name_are_neither_offered_nor_cut(api: str) -> None:
    adapter, entry = ADAPTERS[api], ENTRY[api]
    odd: list[Any] = [{"type": "web_search"}, 42, "x", {"name": 3}]
    narrowed = adapter.narrow({"tools": [*odd, entry("a")]}, frozenset())
    assert adapter.offered(narrowed) == []
    assert len(narrowed["tools"]) == 4  # the unnamed entries pass; only "a" is cut


def test_a_model_that_is_not_a_string_is_none() -> None:
    for adapter in ADAPTERS.values():
        assert adapter.model({"model": ["gpt"]}) is None
        assert adapter.model({}) is None
