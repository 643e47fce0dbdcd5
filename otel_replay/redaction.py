"""The one redaction engine: every secret is replaced by ``[REDACTED]`` before anything is written.

Every write path goes through it: captured content (:func:`scrub`), a recording's HTTP bodies, URLs and
headers, tool, model, commit and decision arguments, error messages and outcomes.

What is redacted:

* **values under a secret name**: a JSON key, a ``name=value`` or ``name: value`` pair, a URL query
  parameter, a header. A name is split into words (``clientSecret``, ``db_password``, ``X-Amz-Signature``,
  ``AWS_SECRET_ACCESS_KEY``, ``Ocp-Apim-Subscription-Key``) and the words are matched, never substrings:
  ``author``, ``keyboard`` and ``monkey`` are not secret names, and neither are the LLM counts
  ``max_tokens`` / ``input_tokens`` / ``token_count`` (see :func:`is_secret_name`);
* **values shaped like secrets**, wherever they are: API keys (``sk-``, ``AKIA``, ``AIza``, ``gh*_``,
  ``xox*-`` ...), JWTs, PEM private keys, ``Bearer`` / ``Basic`` credentials, a password in a URL
  (``postgres://user:pw@host``), ``Password=`` / ``AccountKey=`` in a connection string, and card numbers
  (13 to 19 digits, spaces or dashes between, Luhn-valid, starting 2 to 6: a long number failing
  that is left alone);
* what the user adds: :func:`add_secret_names`, :func:`add_secret_patterns`, or the variables
  ``OTEL_REPLAY_REDACT_NAMES`` (comma-separated names) and ``OTEL_REPLAY_REDACT_PATTERNS`` (regular
  expressions, one per line).

The built-in rules run in time linear in the text (each rule can start only at the first character of a
run, so a failed scan is never repeated inside the run); a user's pattern is the user's to keep linear.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
from collections.abc import Mapping
from typing import Any, Final

from otel_replay import settings
from otel_replay.errors import ConfigError

__all__ = [
    "MAX_CONTENT_CHARS",
    "REDACTED",
    "SCAN_CHARS",
    "ContentStats",
    "add_secret_names",
    "add_secret_patterns",
    "check_settings",
    "is_secret_name",
    "message_of",
    "redact",
    "redact_error",
    "redact_headers",
    "redact_json_text",
    "redact_partial_json",
    "redact_url",
    "redact_value",
    "reset_secret_rules",
    "scrub",
    "stats",
]

_log = logging.getLogger("otel_replay.redaction")

REDACTED: Final = "[REDACTED]"
MAX_CONTENT_CHARS: Final = 32_768
"""Captured content longer than this is cut, with a marker saying how much was cut."""
SCAN_CHARS: Final = 4 * MAX_CONTENT_CHARS
"""Only this much captured content is scanned for secrets; the rest is cut before scanning (so a cut never
splits a secret that was then left unredacted: the cut to MAX_CONTENT_CHARS happens after redaction)."""

# --- names -------------------------------------------------------------------------------------------------

_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+")
"""The words of a name: ``clientSecret`` -> client, Secret; ``APIKey`` -> API, Key; digits and separators split."""

_ALWAYS: Final = frozenset(
    {
        "password", "passwd", "pwd", "passphrase", "passcode", "secret", "secrets", "credential", "credentials",
        "creds", "cookie", "cookies", "signature", "sig", "authorization", "apikey", "apikeys", "secretkey",
        "accesskey", "privatekey", "clientsecret", "authtoken", "accesstoken", "refreshtoken", "sessionid",
        "sessiontoken", "cvv", "cvc", "otp", "jwt", "bearer",
    }
)  # fmt: skip
"""A name holding one of these words is secret wherever the word stands."""
_COUNTED: Final = frozenset(
    {
        "count", "counts", "limit", "limits", "usage", "budget", "id", "ids", "index", "type", "length", "len",
        "estimate", "number", "num", "total", "logprobs", "logprob", "probability", "details",
    }
)  # fmt: skip
"""``token`` followed by one of these is a count or a vocabulary entry (``token_count``), not a credential."""
_COUNTING: Final = frozenset(
    {"max", "min", "num", "total", "input", "output", "prompt", "completion", "reasoning", "cached", "remaining"}
)
"""``token`` after one of these is a count (``max_token``)."""
_TOKENS_SECRET: Final = frozenset({"access", "refresh", "auth", "api", "bearer", "session", "oauth", "id"})
"""``tokens`` (plural: an LLM count, ``max_tokens``) is secret only after one of these (``access_tokens``)."""
_KEY_QUALIFIED: Final = frozenset(
    {
        "api", "access", "secret", "private", "subscription", "account", "signing", "encryption", "master",
        "client", "auth", "license", "shared", "storage", "service", "app", "consumer", "session", "ssh", "gpg",
    }
)  # fmt: skip
"""``key`` after one of these is secret wherever it stands (``api_key_value``)."""
_KEY_PLAIN: Final = frozenset(
    {
        "primary", "foreign", "sort", "partition", "cache", "idempotency", "dedup", "dedupe", "routing", "row",
        "public", "object", "lookup", "hash", "range", "composite", "unique", "index", "map", "dict", "group",
        "message", "event", "websocket", "sequence", "order", "natural", "surrogate", "sharding", "shard",
        "bucket", "redis", "s", "translation", "i", "hot", "primarykey", "foreignkey",
    }
)  # fmt: skip
"""``key`` after one of these names data, not a credential (``primary_key``, ``idempotency_key``)."""
_KEY_NAMING: Final = frozenset({"id", "ids", "name", "names", "type", "version", "prefix", "alias", "arn"})
"""``key`` followed by one of these names a key without holding it (``access_key_id``, ``key_name``)."""
_AUTH_PLAIN: Final = frozenset(
    {
        "type", "method", "methods", "url", "uri", "endpoint", "scheme", "schemes", "mode", "provider",
        "required", "enabled", "disabled", "domain", "server", "flow", "version", "status", "error", "errors",
    }
)  # fmt: skip
"""``auth`` followed by one of these names a setting, not a credential (``auth_type``)."""
_SESSION_SECRET: Final = frozenset({"id", "key", "token", "secret", "cookie"})


def _words(name: str) -> tuple[str, ...]:
    return tuple(word.lower() for word in _WORD.findall(name))


def _builtin_secret(words: tuple[str, ...]) -> bool:
    last = len(words) - 1
    for i, word in enumerate(words):
        before = words[i - 1] if i else ""
        after = words[i + 1] if i < last else ""
        if word in _ALWAYS:
            return True
        if word == "token":
            if after not in _COUNTED and before not in _COUNTING:
                return True
        elif word == "tokens":
            if before in _TOKENS_SECRET:
                return True
        elif word in ("key", "keys"):
            if after in _KEY_NAMING:
                continue
            if before in _KEY_QUALIFIED or (i == last and before not in _KEY_PLAIN):
                return True
        elif word == "auth":
            if after not in _AUTH_PLAIN:
                return True
        elif word == "session":
            if i == last or after in _SESSION_SECRET:
                return True
        elif word == "pass" and i == last and i > 0:  # db_pass, smtp_pass (a bare "pass" is not)
            return True
    return False


def _has_run(words: tuple[str, ...], run: tuple[str, ...]) -> bool:
    width = len(run)
    return any(words[i : i + width] == run for i in range(len(words) - width + 1))


@functools.lru_cache(maxsize=8192)
def _secret_name(name: str, added: tuple[tuple[str, ...], ...]) -> bool:
    words = _words(name[:512])
    if not words:
        return False
    return _builtin_secret(words) or any(_has_run(words, run) for run in added)


def is_secret_name(name: str) -> bool:
    """Whether a key, parameter or header called ``name`` holds a secret.

    The name is split into words (camelCase, ``snake_case``, ``kebab-case``, ``dotted.names``,
    ``SCREAMING_CASE``) and matched by word, so ``author`` or ``monkey`` never match. Secret wherever
    they stand: password, passwd, pwd, passphrase, secret, credential(s), cookie, signature, sig,
    authorization, cvv, otp, jwt, bearer. With context: ``token`` unless it is a count (``token_count``,
    ``max_token``); ``tokens`` only after access/refresh/auth/api/session/id (``max_tokens`` and
    ``input_tokens`` are LLM parameters); ``key`` as the last word unless it names data (``primary_key``,
    ``idempotency_key``) or after api/access/secret/private/subscription/account ...; ``auth`` unless a
    setting follows (``auth_type``); ``session`` as the last word or before id/key/token. Names added
    with :func:`add_secret_names` or ``OTEL_REPLAY_REDACT_NAMES`` match when their words appear in order.
    """
    if not isinstance(name, str):
        return False
    return _secret_name(name, _rules().names)


# --- user rules --------------------------------------------------------------------------------------------


class _Rules:
    __slots__ = ("names", "patterns")

    def __init__(self, names: tuple[tuple[str, ...], ...], patterns: tuple[re.Pattern[str], ...]) -> None:
        self.names = names
        self.patterns = patterns


_lock = threading.Lock()
_added_names: list[tuple[str, ...]] = []
_added_patterns: list[re.Pattern[str]] = []
_cache: tuple[int, _Rules] | None = None
"""The rules in force, with the :data:`_generation` they were built at."""
_environment: tuple[str | None, str | None] | None = None
"""The two variables as last read (``None``: not read yet)."""
_generation = 0


def _name_words(name: Any, where: str) -> tuple[str, ...]:
    words = _words(name) if isinstance(name, str) else ()
    if not words:
        raise ConfigError(f"{where}: {name!r} is not a name with letters in it")
    return words


def _compile(pattern: Any, where: str) -> re.Pattern[str]:
    if isinstance(pattern, re.Pattern):
        if not isinstance(pattern.pattern, str):
            raise ConfigError(f"{where}: {pattern.pattern!r} is a bytes pattern; a text pattern is needed")
        return pattern
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError(f"{where}: {pattern!r} is not a regular expression")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"{where}: {pattern!r} is not a valid regular expression ({exc})") from None
    if compiled.match(""):
        raise ConfigError(f"{where}: {pattern!r} matches the empty text (it would redact between every character)")
    return compiled


def add_secret_names(*names: str) -> None:
    """Treat keys, parameters and headers with these names as secret, in this process, from now on.

    Matched as :func:`is_secret_name` matches its own: by words, in any case or separator style
    (``add_secret_names("ssn")`` redacts ``ssn``, ``customer_SSN`` and ``ssnValue``; ``"member_ref"`` redacts
    ``memberRef`` and ``old-member-ref``).

    Raises:
        ConfigError: a name with no letters in it.

    """
    words = [_name_words(name, "add_secret_names") for name in names]
    global _generation
    with _lock:
        _added_names.extend(words)
        _generation += 1


def add_secret_patterns(*patterns: str | re.Pattern[str]) -> None:
    """Redact every match of these regular expressions, in every written text, in this process, from now on.

    Keep a pattern linear (no nested repeats): it runs over every body and argument written.

    Raises:
        ConfigError: naming the pattern that does not compile or that matches the empty text.

    """
    compiled = [_compile(pattern, "add_secret_patterns") for pattern in patterns]
    global _generation
    with _lock:
        _added_patterns.extend(compiled)
        _generation += 1


def reset_secret_rules() -> None:
    """Forget the names and patterns added with :func:`add_secret_names` / :func:`add_secret_patterns`.

    The built-in rules and those of the environment variables stay.
    """
    global _generation
    with _lock:
        _added_names.clear()
        _added_patterns.clear()
        _generation += 1


def _from_environment(names_raw: str | None, patterns_raw: str | None) -> tuple[list[Any], list[Any]]:
    """The names and patterns of the two variables' text (``ConfigError`` naming the variable and the bad one)."""
    names = []
    for piece in (names_raw or "").split(","):
        if piece.strip():
            names.append(_name_words(piece.strip(), settings.REDACT_NAMES))
    patterns = [
        _compile(line.strip(), settings.REDACT_PATTERNS) for line in (patterns_raw or "").splitlines() if line.strip()
    ]
    return names, patterns


def _rules() -> _Rules:
    """The added names and patterns with the environment's (as read at set-up or first use)."""
    cached = _cache
    if cached is not None and cached[0] == _generation:
        return cached[1]
    return _build(reread=False)


def _build(*, reread: bool) -> _Rules:
    global _cache, _environment
    raw = _environment
    if raw is None or reread:
        raw = (settings.env_text(settings.REDACT_NAMES), settings.env_text(settings.REDACT_PATTERNS))
    names, patterns = _from_environment(*raw)
    _environment = raw
    with _lock:
        rules = _Rules(tuple(names + _added_names), tuple(patterns + _added_patterns))
        _cache = (_generation, rules)
    return rules


def check_settings() -> None:
    """Read ``OTEL_REPLAY_REDACT_NAMES`` and ``OTEL_REPLAY_REDACT_PATTERNS`` again, now.

    Called at set-up (``configure()``, a recording or rerun starting, the model instrumentors), so a bad
    value fails there, not at the first write; a change to the variables counts from the next set-up.

    Raises:
        ConfigError: naming the variable and the name or pattern that is not valid.

    """
    _build(reread=True)


# --- value shapes ------------------------------------------------------------------------------------------

# Every token-shaped rule starts with a look-behind that admits only the first character of a run (not
# every position inside it): a rule that scans a long run and then fails is tried once per run, so the
# whole pass stays linear in the text's length whatever the text (no catastrophic backtracking).
_RUN = r"(?<![A-Za-z0-9_.+-])"

_SHAPES: Final[tuple[tuple[re.Pattern[str], str], ...]] = (
    (
        re.compile(
            r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
            r"(?:.*?-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----|.*\Z)",
            re.DOTALL,
        ),
        REDACTED,
    ),
    # A password in a URL's authority: postgres://user:pw@host, mongodb+srv://u:p@h, redis://:pw@h
    (
        re.compile(_RUN + r"([a-zA-Z][a-zA-Z0-9+.-]{1,20}://)([^\s:/@\"']{0,256}):([^\s@/\"']{1,256})@"),
        r"\1\2:" + REDACTED + "@",
    ),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + REDACTED),
    (re.compile(_RUN + r"sk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}"), REDACTED),
    (re.compile(_RUN + r"[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"), REDACTED),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(_RUN + r"AIza[0-9A-Za-z_-]{35}"), REDACTED),
    (re.compile(_RUN + r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})"), REDACTED),
    (re.compile(_RUN + r"glpat-[A-Za-z0-9_-]{20,}"), REDACTED),
    (re.compile(_RUN + r"(?:xox[abposr]|xapp)-[A-Za-z0-9-]{10,}"), REDACTED),
    (re.compile(_RUN + r"(?:hf_[A-Za-z0-9]{30,}|npm_[A-Za-z0-9]{36})"), REDACTED),
    (re.compile(_RUN + r"SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"), REDACTED),
    (re.compile(_RUN + r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),
)

_EMAIL: Final = re.compile(
    _RUN + r"[A-Za-z0-9_.+-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9-]{1,63}){1,8}"
)
"""An e-mail address: a local part of up to 64 characters, then a dotted domain (every repeat bounded).
Redacted only where ``personal=True`` is asked for (contract evidence): elsewhere an address is data the
agent acts on (a customer to look up), and a recording must serve it back as it was."""

_NAMED = re.compile(r"(?<![A-Za-z0-9_.+-])([A-Za-z_][A-Za-z0-9_.-]{0,127})(\\?[\"']?[ \t]*[:=][ \t]*(?:\\?[\"'])?)")
"""``name=``, ``name:``, ``"name": "``, ``\\"name\\":\\"`` (JSON in a JSON string), ``?name=``: a value follows."""
_VALUE = re.compile(
    r"(?<=\")(?:[^\"\\\n]|\\.){1,8192}|(?<=')(?:[^'\\\n]|\\.){1,8192}"
    r"|(?![{\[])(?:[^\s\"',;}&\\]|\\(?![\"'])){1,8192}"
)
"""The value after :data:`_NAMED`: to the closing quote when quoted (over escapes: ``"a\\"b c"``), else to a
space or a separator (a nested ``{`` or ``[`` is not a value: what is inside it is looked at on its own)."""
_ESCAPED_VALUE = re.compile(r"[^\"'\n\\]{1,8192}")
"""The value after an escaped quote (``\\"name\\":\\"value\\"``, JSON inside a JSON string): to the next backslash."""
_DIGITS = re.compile(r"(?<![0-9])[0-9]+(?:[ -][0-9]+)*")
"""A run of digit groups (spaces or dashes between): card numbers are looked for inside it."""
_GROUP = re.compile(r"[0-9]+")


def _luhn(digits: str) -> bool:
    total = 0
    for i, char in enumerate(reversed(digits)):
        d = ord(char) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _is_card(digits: str) -> bool:
    """13 to 19 digits starting 2 to 6 (the card networks' ranges) that pass the Luhn check."""
    return 13 <= len(digits) <= 19 and "2" <= digits[0] <= "6" and _luhn(digits)


def _card_spans(text: str) -> list[tuple[int, int]]:
    """Where card numbers are: a group of 13 to 19 digits, or groups of 3+ digits adding up to that.

    ``4111 1111 1111 1111``, ``3782-822463-10005``; a window is tried only from a group starting 2 to 6.
    """
    spans: list[tuple[int, int]] = []
    for run in _DIGITS.finditer(text):
        if run.end() - run.start() < 13:
            continue
        base = run.start()
        groups = [(g.start() + base, g.end() + base) for g in _GROUP.finditer(run.group())]
        i = 0
        while i < len(groups):
            best = -1
            if "2" <= text[groups[i][0]] <= "6":
                digits = ""
                for j in range(i, len(groups)):
                    start, stop = groups[j]
                    if stop - start < 3 or len(digits) + stop - start > 19:
                        break
                    digits += text[start:stop]
                    if len(digits) >= 13 and _is_card(digits):
                        best = j
            if best >= 0:
                spans.append((groups[i][0], groups[best][1]))
                i = best + 1
            else:
                i += 1
    return spans


_SCHEMES: Final = frozenset({"bearer", "basic"})
_AFTER_SCHEME: Final = " " + REDACTED


def _named_spans(text: str, names: tuple[tuple[str, ...], ...]) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    end = 0
    for found in _NAMED.finditer(text):
        if found.start() < end or not _secret_name(found.group(1), names):
            continue
        escaped = found.group(2).endswith(('\\"', "\\'"))
        value = (_ESCAPED_VALUE if escaped else _VALUE).match(text, found.end())
        if value is not None and value.group().lower() in _SCHEMES and text.startswith(_AFTER_SCHEME, value.end()):
            end = value.end() + len(_AFTER_SCHEME)  # "Authorization: Bearer [REDACTED]": already redacted
        elif value is not None:
            spans.append((value.start(), value.end()))
            end = value.end()
    return spans


def _replace(text: str, spans: list[tuple[int, int]]) -> str:
    if not spans:
        return text
    parts, at = [], 0
    for start, stop in sorted(spans):
        if start < at:  # inside a span already replaced
            continue
        parts.append(text[at:start])
        parts.append(REDACTED)
        at = stop
    parts.append(text[at:])
    return "".join(parts)


def redact(text: str, *, personal: bool = False) -> str:
    """``text`` with every secret in it replaced by ``[REDACTED]``: by shape, by name, and the user's patterns.

    ``personal=True`` also redacts e-mail addresses (what contract evidence asks for; to redact them on
    every write path, add the shape with :func:`add_secret_patterns`).
    """
    return _redact(text, _rules(), personal)


def _redact(text: str, rules: _Rules, personal: bool = False) -> str:
    if personal and "@" in text:
        text = _EMAIL.sub(REDACTED, text)
    if not _might_hold_secret(text, rules):
        return text
    for pattern, replacement in _SHAPES:
        text = pattern.sub(replacement, text)
    text = _replace(text, _named_spans(text, rules.names))
    text = _replace(text, _card_spans(text))
    for pattern in rules.patterns:
        text = pattern.sub(REDACTED, text)
    return text


def redact_value(value: Any, *, personal: bool = False) -> Any:
    """A JSON-like value (dicts, lists, text, numbers) with secrets redacted: by key name, then by shape.

    The value under a secret key is replaced whole (a dict or list too; ``null`` and booleans are kept);
    text is :func:`redact`-ed (``personal`` as there); an int that is a card number becomes
    ``[REDACTED]``. Anything else is returned as it is.
    """
    return _tree(value, _rules(), personal)


def _holds(value: Any) -> bool:
    """Whether a value under a secret name can hold a secret (``null``, ``true`` and ``false`` cannot)."""
    return value is not None and value.__class__ is not bool


def _tree(value: Any, rules: _Rules, personal: bool = False) -> Any:
    cls = value.__class__
    if cls is str:
        return _redact(value, rules, personal)
    if isinstance(value, dict):
        names = rules.names
        return {
            k: REDACTED if _holds(v) and k.__class__ is str and _secret_name(k, names) else _tree(v, rules, personal)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_tree(v, rules, personal) for v in value]
    if isinstance(value, str):
        return _redact(value, rules, personal)
    if type(value) is int and 10**12 <= value < 10**19 and _is_card(str(value)):
        return REDACTED
    return value


_MAYBE_SECRET = re.compile(
    r"pass|pwd|secret|cred|cookie|sig|auth|key|token|session|cvv|cvc|otp|jwt|bearer|basic|-----begin"
    r"|sk-|[sr]k_|akia|asia|aiza|gh[pousr]_|github_pat|glpat|xox|xapp|hf_|npm_|sg\.|eyj"
    r"|[0-9]{3}(?:[ -]?[0-9]){10}"
)
"""Run over the lower-cased text: every word and prefix a built-in rule starts from, and every card number
(3 digits, then 10 more with single separators). A literal alternation is many times faster than the same
with ``re.IGNORECASE``."""


def _might_hold_secret(text: str, rules: _Rules) -> bool:
    """False only when no rule of :func:`redact` can change ``text`` (most text: then it is not scanned)."""
    if rules.patterns:
        return True
    lowered = text.lower()
    if _MAYBE_SECRET.search(lowered) or ("@" in text and "://" in text):  # a password in a URL
        return True
    return any(run[0] in lowered for run in rules.names)


_JSON_STRING_MEMBER = re.compile(r'"((?:[^"\\]|\\.)*)"(\s*:\s*)"(?:[^"\\]|\\.)*("|\Z)', re.DOTALL)
"""``"key": "value"`` in JSON text that need not parse (a capped head): the value may run to the end."""


def redact_partial_json(text: str) -> str:
    """JSON-like text that does not parse, redacted: string values of secret-named keys whole, the rest by shape."""
    rules = _rules()
    names = rules.names

    def member(match: re.Match[str]) -> str:
        if not _secret_name(match.group(1), names):
            return match.group(0)
        return f'"{match.group(1)}"{match.group(2)}"{REDACTED}{match.group(3)}'

    if "{" in text:
        text = _JSON_STRING_MEMBER.sub(member, text)
    return _redact(text, rules)


def redact_json_text(text: str) -> str:
    """A body or arguments text with secrets redacted: JSON by key name and value shape, other text by shape.

    Text with nothing that could be a secret is returned as it is (not parsed); JSON whose redaction
    changes nothing keeps its exact bytes.
    """
    if not _might_hold_secret(text, _rules()):
        return text
    stripped = text.lstrip()
    if stripped[:1] in ("{", "["):
        try:
            tree = json.loads(text)
            redacted = redact_value(tree)
        except (ValueError, RecursionError):  # a capped head, not JSON, nested too deep: by key and shape
            return redact_partial_json(text)
        if redacted == tree:
            return text  # nothing secret: keep the exact bytes
        return json.dumps(redacted, ensure_ascii=False, separators=(",", ":"))
    return redact(text)


def redact_url(url: str) -> str:
    """``url`` with its password (``scheme://user:pw@host``) and secret query parameter values redacted."""
    return redact(url)


def redact_headers(headers: Any) -> list[list[str]]:
    """Header pairs with secret-bearing values replaced by ``[REDACTED]`` (order and repeats kept).

    A header whose name :func:`is_secret_name` (``Authorization``, ``Cookie``, ``X-Api-Key``,
    ``Ocp-Apim-Subscription-Key``, ``X-Auth-Token``, any ``*-Secret``) is redacted whole; a ``Set-Cookie``
    keeps the cookie's name and attributes; any other value by shape.
    """
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    rules = _rules()
    names = rules.names
    for key, value in pairs:
        name = key.decode("latin-1") if isinstance(key, bytes) else str(key)
        text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        if name.lower() == "set-cookie":
            out.append([name, _redact_set_cookie(text)])
        else:
            out.append([name, REDACTED if _secret_name(name, names) else _redact(text, rules)])
    return out


def _redact_set_cookie(text: str) -> str:
    """A ``Set-Cookie`` value with the cookie's value redacted and its name and attributes kept.

    A rerun's cookie jar then holds the cookie under its own name (``sid=[REDACTED]; Path=/``), as
    the recorded run's did; the attributes (path, domain, expiry, flags) carry no secret.
    """
    return ", ".join(_redact_one_cookie(piece) for piece in _NEXT_COOKIE.split(text))


_NEXT_COOKIE = re.compile(r",\s*(?=[^;,=\s]+=)")  # repeated headers joined by ", " (an Expires date's comma is not)


def _redact_one_cookie(text: str) -> str:
    first, sep, attributes = text.partition(";")
    name, eq, _ = first.partition("=")
    if not eq or not name.strip():
        return REDACTED
    return f"{name.strip()}={REDACTED}{sep}{redact(attributes) if sep else ''}"


def message_of(exc: BaseException) -> str:
    """``str(exc)``, or a note naming what its ``__str__`` raised (a broken error is still stored, named).

    Not redacted: each caller redacts it as it stores it.
    """
    try:
        return str(exc)
    except Exception as failed:  # an error whose __str__ reads fields it never got
        return f"({type(failed).__name__} while reading the message)"


def redact_error(exc: BaseException, *, capture: bool) -> str | None:
    """What an error span keeps of ``exc``'s message, redacted and cut to 500 characters.

    ``None`` with content capture off: the error's type is all that is kept.
    """
    if not capture:
        return None
    text = message_of(exc)
    return redact(text[:SCAN_CHARS].encode("utf-8", "backslashreplace").decode("utf-8"))[:500]


# --- captured content --------------------------------------------------------------------------------------


class ContentStats:
    """Counts of content dropped because it could not be rendered or redacted."""

    def __init__(self) -> None:
        """No drops yet."""
        self._lock = threading.Lock()
        self.dropped = 0

    def drop(self) -> None:
        """Count one dropped piece of content."""
        with self._lock:
            self.dropped += 1


stats = ContentStats()


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=_fallback, allow_nan=False)


def _fallback(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_none=True)
    if isinstance(value, bytes | bytearray):
        return f"<{len(value)} bytes>"
    return repr(value)


_HEAD_ITEM: Final = 8
"""What one list item or mapping member counts toward :data:`SCAN_CHARS` in :func:`_head` besides its text."""


def _head(value: Any, left: list[int]) -> Any:
    """The start of a JSON-like value that can reach a span, so that redacting and rendering it costs no more.

    Each text is cut to :data:`SCAN_CHARS` (as a text given alone is), and a list or mapping stops taking
    items once ``left[0]`` characters of text were taken: the rendered value then runs past
    :data:`MAX_CONTENT_CHARS`, where :func:`scrub` cuts it. A secret is never split where it could show:
    a text is cut only past :data:`SCAN_CHARS` of itself, and items left out are left out whole.
    """
    if isinstance(value, str):
        left[0] -= len(value) + _HEAD_ITEM
        return value[:SCAN_CHARS]
    if isinstance(value, dict):
        members: dict[Any, Any] = {}
        for key, item in value.items():
            if left[0] <= 0:
                break
            left[0] -= len(key) if isinstance(key, str) else 0
            members[key] = _head(item, left)
        return members
    if isinstance(value, list | tuple):
        items: list[Any] = []
        for item in value:
            if left[0] <= 0:
                break
            items.append(_head(item, left))
        return items
    left[0] -= _HEAD_ITEM
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        try:
            return _head(dump(mode="json", exclude_none=True), left)  # what rendering would dump, cut here
        except Exception:
            return value  # rendering calls model_dump again, and drops (and counts) the value when it fails
    return value


def scrub(value: Any) -> str | None:
    """``value`` rendered as text, redacted and capped; ``None`` (and counted) when that fails.

    A dict's or list's values under secret names are redacted whole, then the value is rendered as JSON
    (text as it is) and :func:`redact`-ed, then cut to :data:`MAX_CONTENT_CHARS` characters. A dict or list
    is cut to its start before any of that (see :func:`_head`): a 20 MB tool result costs what its first
    characters cost.
    """
    try:
        if not isinstance(value, str):
            # its start only; a dict's secret-named keys redacted by name, whatever their values
            value = redact_value(_head(value, [SCAN_CHARS]))
        text = redact(_render(value)[:SCAN_CHARS])
        if len(text) > MAX_CONTENT_CHARS:
            cut = len(text) - MAX_CONTENT_CHARS
            text = f"{text[:MAX_CONTENT_CHARS]}…[{cut}+ chars cut]"
        return text
    except Exception as exc:  # never write content we could not redact
        stats.drop()
        _log.debug("otel-replay: content dropped, it could not be rendered or redacted: %s", exc)
        return None
