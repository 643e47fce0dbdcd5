"""Argument invariants: bounds, equals, one_of, regex, max_length, optional; failures name path and source."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from otel_replay.contracts.checks import SlowRegexError, compile_regex, json_equal
from otel_replay.contracts.engine import Engine, ToolCallView
from otel_replay.contracts.model import ArgumentInvariant, Source, ToolContract
from otel_replay.errors import ContractLoadError

from ._engine_support import call, refund_bot, src


def _engine(*invariants: ArgumentInvariant) -> Engine:
    tool = ToolContract(tool="t", source=src("t.yaml"), argument_value_invariants=invariants)
    return Engine(refund_bot(extra_tools=[tool]))


def _inv(**kwargs: Any) -> ArgumentInvariant:
    return ArgumentInvariant(path=kwargs.pop("path", "$.v"), source=src("t.yaml", 9), **kwargs)


def _regex_engine(pattern: str) -> Engine:
    """An engine whose tool ``add_text`` checks its argument ``$.t`` (line 4 of add_text.yaml) against ``pattern``."""
    invariant = ArgumentInvariant(path="$.t", source=Source("add_text.yaml", 4), regex=pattern)
    tool = ToolContract(tool="add_text", source=Source("add_text.yaml", 1), argument_value_invariants=(invariant,))
    return Engine(refund_bot(extra_tools=[tool]))


def _details(engine: Engine, arguments: Any) -> list[str]:
    view = ToolCallView(0, "c", "t", "{}", arguments)
    decision = engine.evaluate(engine.new_state("s", None), [view])
    assert all(f.rule == "argument_invariant" for f in decision.failures), decision.failures
    return [f.detail for f in decision.failures]


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (0, False),
        (0.0001, True),
        (500, True),
        (500.0001, False),
        (-1, False),
        (True, False),
        ("5", False),
        (None, False),
        (math.nan, False),
        (math.inf, False),
        (-math.inf, False),
        (10**400, False),
        ([5], False),
    ],
)
def test_bounds_need_a_finite_number_in_range(value: Any, ok: bool) -> None:
    engine = _engine(_inv(gt=0, lte=500))
    assert (_details(engine, {"v": value}) == []) is ok


def test_each_bound_is_reported_with_its_name_and_the_number() -> None:
    engine = _engine(_inv(gte=10, lt=20))
    assert _details(engine, {"v": 9}) == ["t: $.v = 9 is below the minimum (gte 10)"]
    assert _details(engine, {"v": 20}) == ["t: $.v = 20 is not below (lt 20)"]


def test_a_missing_argument_fails_unless_optional() -> None:
    assert _details(_engine(_inv(gte=1)), {}) == ["t: $.v is missing"]
    assert _details(_engine(_inv(gte=1, optional=True)), {}) == []
    assert _details(_engine(_inv(gte=1, optional=True)), {"v": 0}) != []


def test_equals_and_one_of_use_json_equality() -> None:
    engine = _engine(_inv(equals=True, has_equals=True))
    assert _details(engine, {"v": True}) == []
    assert _details(engine, {"v": 1}) == ["t: $.v does not equal the required value"]
    none_required = _engine(_inv(equals=None, has_equals=True))
    assert _details(none_required, {"v": None}) == []
    assert _details(none_required, {"v": 0}) != []
    choice = _engine(_inv(one_of=("usd", "eur", 1)))
    assert _details(choice, {"v": "eur"}) == []
    assert _details(choice, {"v": 1.0}) == []
    assert _details(choice, {"v": True}) == ["t: $.v is not one of the 3 allowed values"]


def test_regex_is_searched_in_text_and_never_shows_the_value() -> None:
    engine = _engine(_inv(path="$.email", regex="^.+@.+"))
    assert _details(engine, {"email": "a@b"}) == []
    details = _details(engine, {"email": "secret-customer-name"})
    assert details == ["t: $.email does not match /^.+@.+/"]
    assert _details(engine, {"email": 42}) == ["t: $.email must be text to match /^.+@.+/, got number"]


def test_max_length_counts_text_and_arrays() -> None:
    engine = _engine(_inv(max_length=3))
    assert _details(engine, {"v": "abc"}) == []
    assert _details(engine, {"v": "abcd"}) == ["t: $.v is 4 long, over max_length 3"]
    assert _details(engine, {"v": [1, 2, 3, 4]}) == ["t: $.v is 4 long, over max_length 3"]
    assert _details(engine, {"v": 12345}) == ["t: $.v must be text or an array for max_length, got number"]


def test_nested_paths_and_every_problem_of_a_call_are_reported() -> None:
    engine = _engine(_inv(path="$.order.items[1].qty", gte=1, lte=5), _inv(path="$.order.id", regex="^O"))
    arguments = {"order": {"id": "X", "items": [{"qty": 1}, {"qty": 9}]}}
    assert _details(engine, arguments) == [
        "t: $.order.items[1].qty = 9 is above the maximum (lte 5)",
        "t: $.order.id does not match /^O/",
    ]
    assert _details(engine, {"order": {"id": "O1", "items": [{"qty": 1}]}}) == ["t: $.order.items[1].qty is missing"]


def test_a_failure_carries_path_tool_call_id_and_the_rule_source() -> None:
    engine = Engine(refund_bot())
    state = engine.new_state("s", None)
    decision = engine.evaluate(state, [call("lookup_customer", {"customer_email": "nobody"}, call_id="abc")])
    (failure,) = decision.failures
    assert (failure.rule, failure.tool, failure.call_id, failure.path) == (
        "argument_invariant",
        "lookup_customer",
        "abc",
        "$.customer_email",
    )
    assert str(failure.source) == "lookup_customer.yaml:12"
    assert failure.as_dict()["source"] == "lookup_customer.yaml:12"


def test_secrets_in_a_detail_are_redacted() -> None:
    # A tool named like a key (model output is hostile): the detail never carries it.
    engine = Engine(refund_bot())
    name = "sk-proj-" + "A" * 40
    decision = engine.evaluate(engine.new_state("s", None), [call(name, {})])
    assert name not in decision.failures[0].detail
    assert "[REDACTED]" in decision.failures[0].detail


@pytest.mark.parametrize(
    ("left", "right", "equal"),
    [
        (True, 1, False),
        (1, 1.0, True),
        (math.nan, math.nan, False),
        ({"a": [1]}, {"a": [1.0]}, True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ("1", 1, False),
        (None, False, False),
        ([1, 2], [2, 1], False),
    ],
)
def test_json_equality(left: Any, right: Any, equal: bool) -> None:
    assert json_equal(left, right) is equal
    assert json_equal(right, left) is equal


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ('{"n": 9007199254740992}', True),
        ('{"n": 9007199254740993}', False),
        ('{"n": 100000000000000000000000001}', False),
        ('{"n": ' + "9" * 400 + "}", False),
        ('{"n": 1e400}', False),
    ],
)
def test_whole_numbers_past_float_precision_are_compared_exactly(text: str, ok: bool) -> None:
    """2**53 + 1 read as a float is 2**53: a bound at 2**53 must still stop it."""
    tool = ToolContract(
        tool="transfer",
        source=Source("transfer.yaml", 1),
        argument_value_invariants=(ArgumentInvariant(path="$.n", source=Source("transfer.yaml", 3), lte=2**53),),
    )
    engine = Engine(refund_bot(extra_tools=[tool]))
    decision = engine.evaluate(engine.new_state("s", None), [ToolCallView.parse(0, "c", "transfer", text)])
    assert (decision.outcome == "allow") is ok


@pytest.mark.parametrize(
    "pattern", [r"^(a+)+$", r"^(\w+\s?)*$", r"^(a|b+)*$", r"(?=(x*)*)", r"(?i)^([a-z]+A)*$", r"(?s)^(.+\n)*$"]
)
def test_a_regex_that_can_take_exponential_time_is_refused_when_the_engine_is_built(pattern: str) -> None:
    """The model writes the text: ^(a+)+$ on 30 a's and a '!' would hold the gate for minutes."""
    with pytest.raises(ContractLoadError, match=r"^add_text.yaml:4: .*regex: a repetition inside a repetition"):
        _regex_engine(pattern)


@pytest.mark.parametrize("pattern", [r"^(a|a)*$", r"^(a|aa)*$", r"^(ab|a|b)*$", r"^(?:x|x?y)+$", r"(?i)^(A|ab)*$"])
def test_a_repetition_of_alternatives_that_can_start_alike_is_refused_when_the_engine_is_built(pattern: str) -> None:
    """^(a|a)*$ on 27 a's and a '!' held the gate for 6 CPU seconds (each a more doubles it), yet was accepted."""
    with pytest.raises(ContractLoadError, match=r"^add_text.yaml:4: .*regex: a repetition of alternatives"):
        _regex_engine(pattern)


@pytest.mark.parametrize(
    ("pattern", "text"),
    [(r"^(foo|bar)*$", "foobarfoo"), (r"^(?:ab|cd)+$", "abcdab"), (r"^(\w|\d)*$", "a1"), (r"^(?>a|aa)*$", "aaa")],
)
def test_a_repetition_of_alternatives_that_start_apart_or_never_backtrack_is_kept(pattern: str, text: str) -> None:
    engine = _regex_engine(pattern)
    state = engine.new_state("s", None)
    assert engine.evaluate(state, [call("add_text", {"t": text})]).outcome == "allow"
    assert engine.evaluate(state, [call("add_text", {"t": text + "!" + "a" * 40})]).outcome == "reject"


@pytest.mark.parametrize(
    ("pattern", "parts"),
    [
        (r"^.*-.*-.*-.*$", "four repetitions '.*', '.*', '.*', '.*'"),  # 2,000 dashes and a newline: > 5 minutes
        (r"^\w*\d*\w*x$", r"three repetitions '\w*', '\d*', '\w*'"),
        (r"^.*?-.*?-.*?$", "three repetitions '.*?', '.*?', '.*?'"),  # lazy ones backtrack just the same
        (r"^.{2,}-.{2,}-.{2,}x$", "three repetitions '.{2,}', '.{2,}', '.{2,}'"),
        (r"^(?:.*)(?:.*)(?:.*)x", "three repetitions '.*', '.*', '.*'"),
        (r"^[\s\S]*-[\s\S]*-[\s\S]*x", r"three repetitions '[\s\S]*', '[\s\S]*', '[\s\S]*'"),
        (r"^\S*\w*\d*$", r"three repetitions '\S*', '\w*', '\d*'"),
        (r"(?i)^[a-z]*[A-Z]*[a-z]*!$", "three repetitions '[a-z]*', '[A-Z]*', '[a-z]*'"),  # one set, case aside
        (r"^.+@.+\..+$", "three repetitions '.+', '.+', '.+'"),  # "@.@.@.…" and a newline
        (r"^(?=.*-.*-.*x)", "three repetitions '.*', '.*', '.*'"),  # a lookahead tries all of its own
        (r"^(?:\w*\d*\w*-)*$", r"three repetitions '\w*', '\d*', '\w*'"),  # inside a repetition split by '-'
        (r"^(?:.*-){3}x$", "three repetitions '.*', '.*', '.*'"),  # a fixed count is its body three times
        (r"^(a?){30}a{30}$", "30 repetitions 'a?' x30"),  # 2**30 ways to give back the a's: the classic
        (r".*-.*$", "an unanchored search (tried from every start) and two repetitions '.*', '.*'"),
        # A possessive repetition never gives back, but it scans the rest again for each split before it.
        (r".+?[^a]++\d+", "an unanchored search (tried from every start) and two repetitions '.+?', '[^a]++'"),
        (r"a*a*b", "an unanchored search (tried from every start) and two repetitions 'a*', 'a*'"),
        (r"(?!.*-.*x)", "an unanchored search (tried from every start) and two repetitions '.*', '.*'"),
        (r".{0,255}-.{0,255}-.{0,255}x", "and three repetitions '.{0,255}', '.{0,255}', '.{0,255}'"),  # 255**3 a start
    ],
)
def test_a_regex_whose_matching_takes_polynomial_time_under_the_length_cap_is_refused(pattern: str, parts: str) -> None:
    """Repetitions in sequence that can share a text try every split of it before a failing match gives up.

    ^.*-.*-.*-.*$ on 2,000 dashes and a newline held the gate over 5 minutes (n**4), well under REGEX_MAX_CHARS.
    """
    message = re.escape(parts) + " can each match the same text: matching takes polynomial time"
    with pytest.raises(SlowRegexError, match=message):
        compile_regex(pattern)
    with pytest.raises(ContractLoadError, match=r"^add_text.yaml:4: .*regex: .*can each match the same text"):
        _regex_engine(pattern)


@pytest.mark.parametrize(
    ("pattern", "text", "miss"),
    [
        (r"^.*-.*$", "a-b", "a\n-"),  # two: 0.2-0.7 CPU seconds on its worst 8192 characters (README)
        (r"^a*a*$", "aaa", "aab"),
        (r"^a*?a*?$", "aaa", "aab"),
        (r".*x", "abx", "abc"),  # the search's start and one repetition: two
        (r"a*a*", "", None),  # nothing after them can fail: the first try matches
        (r"^.*-.*-.*", "a-b-c", "a-b"),  # the same: only '-' can fail, after two of them
        (r"^.+@.+", "a@b", "a@"),  # the seed's customer_email
        (r"^[^@ ]+@[^@ ]+$", "a@b", "a@b c"),  # the example's lookup_customer
        (r"^[0-9]*+[0-9a-f]*+[a-z]*+!$", "12ab!", "12ab"),  # possessive: never gives back (refused without the +)
        (r"^(?>[0-9]*)(?>[0-9a-f]*)[a-z]*!$", "12ab!", "12ab"),  # atomic: never gives back
        (r"\w++!", "ab!", "ab"),  # the search's start and one possessive scan: two
        (r"^\w*-\d*-\w*x$", "a-1-bx", "a-b-bx"),  # '-' is neither a word character nor a digit
        (r"^[a-z]*[0-9]*[a-z]*$", "ab12cd", "ab12cd3"),  # letters and digits never overlap
        (r"^[A-Z]+[a-z]+[0-9]+$", "Ab1", "A1"),  # a shape infer writes
        (r"^\d{4}-\d{2}-\d{2}$", "2026-11-30", "2026-11-3"),  # fixed counts: one way each
        (r"^.{0,100}-.{0,100}-.{0,100}x$", "--x", "--"),  # counted: 101**3 ways at most
        (r"(?m)^.*-.*$", "a\nb-c", "abc"),  # each line's start: '.' never takes the newline before it
        (r"(?:[^@,]+,)*[^@,]+$", "a,b", "@"),  # each pass needs a ',' the last repetition cannot take
    ],
)
def test_a_regex_with_at_most_two_repetitions_that_can_share_a_text_is_kept(
    pattern: str, text: str, miss: str | None
) -> None:
    engine = _regex_engine(pattern)
    state = engine.new_state("s", None)
    assert engine.evaluate(state, [call("add_text", {"t": text})]).outcome == "allow"
    if miss is not None:
        assert engine.evaluate(state, [call("add_text", {"t": miss})]).outcome == "reject"


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        (r"^([a-z0-9]+\.)*[a-z]+$", "mail.example.org"),
        (r"^(?:[^@,]+,)*[^@,]+$", "a,b,c"),
        (r"^(\d{3}-)+\d{4}$", "555-123-4567"),
        (r"^(?>\w+\s?)*$", "two words"),
        (r"^(\w++\s?)*$", "two words"),
        (r"^(.+\n)*$", "line one\nline two\n"),
    ],
)
def test_a_repetition_split_by_a_character_it_cannot_match_or_that_never_backtracks_is_kept(
    pattern: str, text: str
) -> None:
    engine = _regex_engine(pattern)
    state = engine.new_state("s", None)
    assert engine.evaluate(state, [call("add_text", {"t": text})]).outcome == "allow"
    near_miss = engine.evaluate(state, [call("add_text", {"t": "a" * 5000 + "@"})])
    assert near_miss.outcome == "reject"


@pytest.mark.parametrize(
    ("pattern", "text", "ok"),
    [
        (r"^C[0-9]+$", "C123", True),
        (r"^C[0-9]+$", "C123\n", False),  # Python's $ also matches before a final newline; ECMA-262's does not
        (r"^[a-z_]+$", "users\n", False),
        (r"(?m)^C[0-9]+$", "C123\nC456", True),  # multi-line: $ at each line's end, as in ECMA-262's m flag
        (r"^(?m:C[0-9]+$)\nx$", "C123\nx", True),
        (r"^\d+$", "345", True),
        (r"^\d+$", "\uff13\uff14\uff15", False),  # full-width digits: int() reads them as 345
        (r"^\d+$", "\u0663", False),  # an Arabic-Indic three
        (r"^\w+$", "caf\u00e9", False),
        (r"(?i)^abc$", "ABC", True),
    ],
)
def test_a_regex_means_what_it_means_in_json_schema(pattern: str, text: str, ok: bool) -> None:
    """As in ECMA-262 (the JSON Schema's and the seed's regexes): $ ends the text, \\d and \\w are ASCII classes."""
    engine = _regex_engine(pattern)
    decision = engine.evaluate(engine.new_state("s", None), [call("add_text", {"t": text})])
    assert (decision.outcome == "allow") is ok
    if not ok:
        assert decision.failures[0].detail == f"add_text: $.t does not match /{pattern}/"
