"""Reading ``$.a.b[0]`` paths: what each step finds, what it never finds, and every path that does not parse."""

from __future__ import annotations

from typing import Any

import pytest

from otel_replay.contracts.paths import parse_path, read_path

VALUE: dict[str, Any] = {
    "amount": 20,
    "customer": {"email": "a@example.test", "tags": ["gold", {"since": 2020}]},
    "odd key": {"it's": 1, 'say "hi"': 2, "back\\slash": 3},
    "nothing": None,
    "flag": False,
    "0": "zero as a name",
    "items": [{"sku-code": "A1"}, {"sku-code": "B2"}],
    "text": "abc",
}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("$", VALUE),
        ("$.amount", 20),
        ("$.customer.email", "a@example.test"),
        ("$.customer.tags[0]", "gold"),
        ("$.customer.tags[1].since", 2020),
        ('$["odd key"]["it\'s"]', 1),
        ("$['odd key']['it\\'s']", 1),
        ('$["odd key"]["say \\"hi\\""]', 2),
        ('$["odd key"]["back\\\\slash"]', 3),
        ("$.nothing", None),
        ("$.flag", False),
        ("$.0", "zero as a name"),
        ('$["0"]', "zero as a name"),
        ("$.items[1].sku-code", "B2"),
        ("$.items[1]['sku-code']", "B2"),
    ],
)
def test_a_path_finds_the_value_it_names(path: str, expected: Any) -> None:
    assert read_path(VALUE, path) == (True, expected)


@pytest.mark.parametrize(
    "path",
    [
        "$.missing",
        "$.customer.tags[2]",
        "$.items.0",  # a member step never indexes a list
        "$[0]",  # an index never reads an object member, even one named "0"
        "$.text[0]",  # nor a character of a string
        "$.text.length",
        "$.amount.value",
        "$.nothing.below",
        "$.customer.tags[99999999999999999]",
    ],
)
def test_a_path_to_nothing_is_not_found_rather_than_an_error(path: str) -> None:
    assert read_path(VALUE, path) == (False, None)


def test_a_list_at_the_top_and_tuples_are_indexed() -> None:
    assert read_path([{"a": (1, 2)}], "$[0].a[1]") == (True, 2)
    assert read_path(b"bytes", "$[0]") == (False, None)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "a path starts with '$'"),
        ("amount", "a path starts with '$' (like $.amount), not 'a'"),
        ("$.", "expected a member name (letters, digits, _ or -) after '.' at column 3, found the end"),
        ("$..amount", "at column 3, found '.'"),
        ("$.*", "found '*'"),
        ("$[*]", "expected an index like [0]"),
        ("$[-1]", "expected an index like [0]"),
        ("$[01]", "expected an index like [0]"),
        ("$[1", "expected an index like [0]"),
        ("$[?(@.a)]", "expected an index like [0]"),
        ("$['unclosed]", "expected the closing '"),
        ('$["a"x]', "expected ']' after the closing quote"),
        ('$["a\\n"]', "expected an escape of a quote or a backslash"),
        ("$amount", "expected '.' or '['"),
        ("$.a b", "expected '.' or '['"),
        ("$.é", "expected a member name"),
        ("$" + ".a" * 600, "a path has at most 1000 characters"),
    ],
)
def test_a_path_that_does_not_parse_raises_and_says_where(path: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        read_path(VALUE, path)
    assert message in str(caught.value)
    with pytest.raises(ValueError):
        parse_path(path)


def test_a_path_that_is_not_a_string_raises() -> None:
    with pytest.raises(ValueError, match="a path is a string"):
        parse_path(5)  # type: ignore[arg-type]


def test_parse_path_gives_the_steps() -> None:
    assert parse_path("$") == ()
    assert parse_path("$.a[3]['b c'].d") == ("a", 3, "b c", "d")
