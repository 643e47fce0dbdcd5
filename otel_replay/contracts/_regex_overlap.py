r"""Repetitions in sequence that can each take the same text: a pattern whose matching takes polynomial time.

``^.*-.*-.*-.*$`` nests nothing, yet on 2,000 dashes and a newline a backtracking matcher tries every way
of sharing the dashes between the four ``.*`` (about n**4 steps) before it fails. A chain of repetitions
costs that when each adjacent pair can take the same characters and whatever stands between them can be
matched by both, so a text can be split between them in many ways; the cost is paid only when something
after the chain can fail (``$``, a literal, a lookaround), since the first success ends the match.

:func:`overlapping_repetitions` walks the parsed pattern once, in matching order, keeping the chains
still open at each point with the number of ways they can split a text: an unbounded repetition (``*``,
``+``, ``{m,}``, lazy or greedy: ``.*?`` backtracks just as ``.*``) multiplies by the longest text a
regex sees, a counted one ``{m,n}`` by its ``n - m + 1`` choices, and a fixed count is its body written out
(``(?:.*-){3}`` is ``.*-.*-.*-``; ``(a?){30}`` thirty choices of two). An unanchored pattern is searched, which
tries every start: that is one more unbounded repetition before it, ended by a leading ``^`` or ``\A``.
A chain that can try more ways than ``max_chars ** 2`` (two unbounded repetitions on the longest text)
before something after it fails is described, and the caller refuses the pattern.

Characters are compared on probes (every code point below 256, two beyond, and each character the pattern
names, in each case), as the exponential check in :mod:`otel_replay.contracts.checks` does. Where the walk
cannot tell, it errs toward refusal, and says so here: a group, a back-reference or an atomic part between
two repetitions counts as matchable by both when any character it can take is; zero-width assertions other
than ``^`` and ``\A`` neither join nor split a chain; a repetition's body counts by the set of characters it
can take, so ``(?:ab)*(?:ba)*`` is taken to overlap. Two ways err toward accepting. Alternatives that can take
the same text multiply the ways too, and the walk counts the costliest way through them, not how many there are:
``^(?:.*|\w*)(?:.*|\w*)!$`` is kept as two repetitions, though it runs some 20 times longer than ``^.*.*!$``
(Python's matcher has no fast path for a repetition in an alternative). And past 256 chains open at one point
the least costly are dropped (it takes hundreds of repetitions in alternatives to get there). Possessive
repetitions and atomic groups never give back what they took, so nothing after them joins their chain; but
each try scans their text again, so they end a chain they overlap (see ``_atomic``), and between two
repetitions they are an atom like any other.
"""

from __future__ import annotations

import re
import re._compiler as _regex_compiler  # the stdlib's own parse of a pattern, as in checks.py
import re._constants as _c
import re._parser as _regex_parser
from typing import Any, Final, NamedTuple

__all__ = ["overlapping_repetitions"]

_REPEATS: Final = (_c.MAX_REPEAT, _c.MIN_REPEAT)
_ONE_CHAR: Final = (_c.LITERAL, _c.NOT_LITERAL, _c.IN, _c.ANY)
_STARTS: Final = (_c.AT_BEGINNING, _c.AT_BEGINNING_STRING)
_MAX_CHAINS: Final = 256  # open chains kept at one point (the most costly first): patterns are short
_MAX_PASSES: Final = 64  # a fixed count written out at most this many times: (a?){27} already passes 8192**2
_MAX_STEPS: Final = 20_000
_MOST: Final = 8  # ways are counted up to max_chars ** 8: far past refusal, and a float can still show it
_BASE: Final = "".join(chr(code) for code in range(0x100)) + "\u0100\uffff"  # the usual probes, in this order
_BASE_INDEX: Final = {probe: index for index, probe in enumerate(_BASE)}
_BASE_MASKS: dict[tuple[str, int], int] = {}  # a set's usual probes, shared by every walk (sets repeat)
_MAX_BASE_MASKS: Final = 4096
_COUNT_WORDS: Final = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_SEARCH: Final = "(search)"
_ANCHOR: Final = "anchor it with ^ or \\A, "


class _Chain(NamedTuple):
    """Repetitions that can share a text, open at one point of the walk."""

    ways: int  # how many ways the chain can split a text of the longest length, at most
    chars: int  # the characters the last repetition can take (a mask over the probes)
    musts: tuple[int, ...]  # characters each pass of the last repetition's body must take
    between: frozenset[int]  # what the atoms since the last repetition can take, each
    names: tuple[str, ...]  # the repetitions, as written, for the message


def overlapping_repetitions(parsed: _regex_parser.SubPattern, max_chars: int) -> str | None:
    """The repetitions of ``parsed`` that make matching polynomial past ``max_chars ** 2`` steps, or ``None``.

    ``parsed`` is the stdlib's parse of a pattern (``re._parser.parse``); ``max_chars`` the longest text
    the pattern is matched against. The answer is one line naming the repetitions, for an error message.
    """
    walk = _Walk(parsed, max_chars)
    start = _Chain(max_chars, walk.every, (), frozenset(), (_SEARCH,))
    walk.sequence(parsed.data, parsed.state.flags, [start])
    worst = walk.worst
    if worst is None or worst.ways <= max_chars**2:
        return None
    reps = [name for name in worst.names if name != _SEARCH]
    searched = worst.names[0] == _SEARCH
    word = _COUNT_WORDS[len(reps)] if len(reps) < len(_COUNT_WORDS) else str(len(reps))
    who = f"{word} repetitions" if len(reps) > 1 else "the repetition"
    if searched:
        who = f"an unanchored search (tried from every start) and {who}"
    names = []  # (a?){30} shows as 'a?' x30, not thirty names
    for name, times in _runs(reps):
        names += [f"'{name}' x{times}"] if times > 6 else [f"'{name}'"] * times
    return (
        f"{who} {', '.join(names)} can each match the same text: matching takes polynomial time "
        f"(up to {worst.ways:.1e} steps on {max_chars} characters); {_ANCHOR if searched else ''}"
        "make one possessive (.*+) or atomic ((?>...)), or narrow it so it cannot match what its neighbour matches"
    )


def _runs(names: list[str]) -> list[tuple[str, int]]:
    """``names`` as (name, how many times in a row)."""
    runs: list[tuple[str, int]] = []
    for name in names:
        if runs and runs[-1][0] == name:
            runs[-1] = (name, runs[-1][1] + 1)
        else:
            runs.append((name, 1))
    return runs


class _Walk:
    """One walk over a parsed pattern: the probes, and the costliest chain seen before something could fail."""

    def __init__(self, parsed: _regex_parser.SubPattern, max_chars: int) -> None:
        named: set[str] = set()
        _named_chars(parsed.data, named)
        self._extra = "".join(sorted(named - _BASE_INDEX.keys()))  # probes past the usual ones, rarely any
        self._index = {**_BASE_INDEX, **{probe: len(_BASE) + at for at, probe in enumerate(self._extra)}}
        self.every = (1 << len(self._index)) - 1
        self.max_chars = max_chars
        self.worst: _Chain | None = None
        self.steps = 0  # items walked: fixed counts written out stop past _MAX_STEPS
        self._masks: dict[tuple[str, int], int] = {}

    def sequence(self, items: list[tuple[Any, Any]], flags: int, chains: list[_Chain]) -> list[_Chain]:
        """Walk ``items`` in order from the ``chains`` open before them; the chains open after them."""
        for op, av in items:
            self.steps += 1
            chains = _fewest(self._item(op, av, flags, chains))
        return chains

    def _item(self, op: Any, av: Any, flags: int, chains: list[_Chain]) -> list[_Chain]:
        if op in _ONE_CHAR:
            self._may_fail(chains)
            return self._past(chains, self._mask(op, av, flags))
        if op is _c.AT:
            self._may_fail(chains)
            if av is _c.AT_BEGINNING and flags & re.MULTILINE:  # a line's start: what came before ends in \n
                return self._past(chains, self._mask(_c.LITERAL, ord("\n"), flags))
            return [] if av in _STARTS else chains  # after the text's start, no earlier repetition took anything
        if op is _c.SUBPATTERN:
            return self.sequence(av[-1].data, (flags | av[1]) & ~av[2], chains)
        if op is _c.BRANCH:
            return [chain for branch in av[1] for chain in self.sequence(branch.data, flags, chains)]
        if op is _c.GROUPREF_EXISTS:
            return [
                chain
                for branch in av[1:]
                for chain in (self.sequence(branch.data, flags, chains) if branch is not None else chains)
            ]
        if op in (_c.ASSERT, _c.ASSERT_NOT):
            self._may_fail(chains)
            self.sequence(av[1].data, flags, chains)  # its own chains, tried in full when it does not match
            return chains
        if op in _REPEATS:
            return self._repeat(op, av, flags, chains)
        if op in (_c.ATOMIC_GROUP, _c.POSSESSIVE_REPEAT):
            return self._atomic(op, av, flags, chains)
        # A back-reference (or anything else): it can fail, and may take any text or none.
        self._may_fail(chains)
        return chains

    def _repeat(self, op: Any, av: Any, flags: int, chains: list[_Chain]) -> list[_Chain]:
        low, high, body = av
        if high == low:  # a fixed count is its body written out that many times: (?:.*-){3} is .*-.*-.*-
            # A body that repeats nothing variably leaves the chains as one pass does (the atoms between are a set).
            passes = min(low, _MAX_PASSES) if _varies(body.data) else min(low, 1)
            for _ in range(passes):
                if self.steps > _MAX_STEPS:  # fixed counts nested deep: the ways are far past refusal by now
                    break
                chains = _fewest(self.sequence(body.data, flags, chains))
            return chains
        # Its first pass: from the chains open before it when that pass is needed; a pass that is not needed
        # may fail without taking anything back from them (only its own chains count then).
        inside = self.sequence(body.data, flags, chains if low > 0 else [])
        mask = self._takes(body.data, flags)
        optional = low == 0 or _nullable(body.data)
        if not mask:  # takes nothing: (?:)*, \b*
            return inside + chains
        ways = self.max_chars if high == _c.MAXREPEAT else high - low + 1
        musts = self._musts(body.data, flags)
        name = _shown([(op, av)])
        joined = [
            _Chain(min(chain.ways * ways, self.max_chars**_MOST), mask, musts, frozenset(), (*chain.names, name))
            for chain in chains
            if self._overlap(chain, mask, musts)
        ]
        alone = _Chain(ways, mask, musts, frozenset(), (name,))
        rest = chains if optional else self._past(chains, mask)
        return [*joined, alone, *rest, *inside]

    def _atomic(self, op: Any, av: Any, flags: int, chains: list[_Chain]) -> list[_Chain]:
        r"""Past a possessive repetition or an atomic group: it never gives back, but each try scans its text.

        So it ends a chain it overlaps (``.+?[^a]++\d+`` searched: every start, every split of ``.+?``, each
        scanning the rest with ``[^a]++``): the chain counts it, and nothing after joins it (its ``chars`` are
        none). Between two repetitions it is an atom like any other.
        """
        body = av if op is _c.ATOMIC_GROUP else av[2]
        self._may_fail(chains)
        self.sequence(body.data, flags, chains)  # it backtracks inside itself until it first matches
        mask = self._takes(body.data, flags)
        passed = self._past(chains, mask)
        optional = _nullable(body.data) or (op is _c.POSSESSIVE_REPEAT and av[0] == 0)
        if op is _c.POSSESSIVE_REPEAT:
            scan = self.max_chars if av[1] == _c.MAXREPEAT else av[1] - av[0] + 1
        else:
            scan = self.max_chars if _varies(body.data) else 1
        musts = self._musts(body.data, flags)
        name = _shown([(op, av)])
        ended = [
            _Chain(min(chain.ways * scan, self.max_chars**_MOST), 0, (), frozenset(), (*chain.names, name))
            for chain in chains
            if scan > 1 and self._overlap(chain, mask, musts)
        ]
        return (chains + passed if optional else passed) + ended

    def _overlap(self, chain: _Chain, mask: int, musts: tuple[int, ...]) -> bool:
        """Whether a text can be split between ``chain``'s last repetition and the next one (``mask``)."""
        common = chain.chars & mask
        return bool(
            common
            and all(between & common for between in chain.between)
            and all(must & mask for must in chain.musts)
            and all(must & chain.chars for must in musts)
        )

    def _past(self, chains: list[_Chain], mask: int) -> list[_Chain]:
        """``chains`` after an atom that takes one of ``mask``: only those whose repetition could take it too."""
        return [chain._replace(between=chain.between | {mask}) for chain in chains if chain.chars & mask]

    def _may_fail(self, chains: list[_Chain]) -> None:
        for chain in chains:
            if self.worst is None or chain.ways > self.worst.ways:
                self.worst = chain

    def _takes(self, items: list[tuple[Any, Any]], flags: int) -> int:
        """The characters ``items`` can take, any of them (a mask over the probes)."""
        mask = 0
        for op, av in items:
            if op in _ONE_CHAR:
                mask |= self._mask(op, av, flags)
            elif op is _c.SUBPATTERN:
                mask |= self._takes(av[-1].data, (flags | av[1]) & ~av[2])
            elif op in (*_REPEATS, _c.POSSESSIVE_REPEAT):
                mask |= self._takes(av[2].data, flags) if av[1] else 0
            elif op is _c.ATOMIC_GROUP:
                mask |= self._takes(av.data, flags)
            elif op is _c.BRANCH:
                for branch in av[1]:
                    mask |= self._takes(branch.data, flags)
            elif op is _c.GROUPREF_EXISTS:
                for branch in av[1:]:
                    mask |= self._takes(branch.data, flags) if branch is not None else 0
            elif op in (_c.GROUPREF, _c.GROUPREF_IGNORE, _c.GROUPREF_LOC_IGNORE, _c.GROUPREF_UNI_IGNORE):
                mask |= self.every
        return mask

    def _musts(self, items: list[tuple[Any, Any]], flags: int) -> tuple[int, ...]:
        r"""What each one-character atom every pass of a repeated body matches can take (``[a-z]+\.``: the dot)."""
        while len(items) == 1 and items[0][0] is _c.SUBPATTERN:
            flags = (flags | items[0][1][1]) & ~items[0][1][2]
            items = items[0][1][-1].data
        return tuple(self._mask(op, av, flags) for op, av in items if op in _ONE_CHAR)

    def _mask(self, op: Any, av: Any, flags: int) -> int:
        """The probes one one-character item matches, under ``flags`` (case, dot-all)."""
        key = (repr((op, av)), flags)
        if key in self._masks:
            return self._masks[key]
        if op in (_c.LITERAL, _c.NOT_LITERAL):  # only the character, in each case: no need to try every probe
            char = chr(av)
            one = self._one(_c.LITERAL, av, flags)
            variants = {variant for variant in (char, char.lower(), char.upper()) if variant in self._index}
            mask = sum(1 << self._index[variant] for variant in variants if one.fullmatch(variant))
            mask = mask if op is _c.LITERAL else self.every & ~mask
        elif op is _c.IN and av and av[0][0] is _c.NEGATE:  # the members are fewer to mark than the rest
            mask = self.every & ~self._mask(_c.IN, av[1:], flags) if len(av) > 1 else self.every
        elif op is _c.ANY:
            mask = self.every if flags & re.DOTALL else self.every & ~(1 << self._index["\n"])
        else:
            mask = _BASE_MASKS.get(key, -1)
            tester = self._one(op, av, flags) if mask < 0 or self._extra else None
            if tester is not None and mask < 0:
                mask = sum(1 << found.start() for found in tester.finditer(_BASE))  # the scan runs in C
                if len(_BASE_MASKS) < _MAX_BASE_MASKS:
                    _BASE_MASKS[key] = mask
            if tester is not None:
                mask |= sum(1 << (len(_BASE) + found.start()) for found in tester.finditer(self._extra))
        self._masks[key] = mask
        return mask

    def _one(self, op: Any, av: Any, flags: int) -> re.Pattern[str]:
        state = _regex_parser.State()
        state.flags = flags
        return _regex_compiler.compile(_regex_parser.SubPattern(state, [(op, av)]), flags)


def _fewest(chains: list[_Chain]) -> list[_Chain]:
    """``chains`` less those that would go on exactly like a costlier one, at most :data:`_MAX_CHAINS`."""
    best: dict[tuple[int, tuple[int, ...], frozenset[int]], _Chain] = {}
    for chain in chains:
        key = (chain.chars, chain.musts, chain.between)
        if key not in best or chain.ways > best[key].ways:
            best[key] = chain
    kept = list(best.values())
    return kept if len(kept) <= _MAX_CHAINS else sorted(kept, key=lambda chain: -chain.ways)[:_MAX_CHAINS]


def _varies(items: list[tuple[Any, Any]]) -> bool:
    """Whether ``items`` hold a repetition whose count can vary (possessive ones aside: they never give back)."""
    for op, av in items:
        if op in _REPEATS and (av[0] != av[1] or _varies(av[2].data)):
            return True
        if op is _c.SUBPATTERN and _varies(av[-1].data):
            return True
        if op is _c.ATOMIC_GROUP and _varies(av.data):
            return True
        if op is _c.BRANCH and any(_varies(branch.data) for branch in av[1]):
            return True
        if op is _c.GROUPREF_EXISTS and any(branch is not None and _varies(branch.data) for branch in av[1:]):
            return True
        if op in (_c.ASSERT, _c.ASSERT_NOT) and _varies(av[1].data):
            return True
    return False


def _nullable(items: list[tuple[Any, Any]]) -> bool:
    """Whether ``items`` can match the empty text (a back-reference is taken to)."""
    for op, av in items:
        if op in _ONE_CHAR:
            return False
        if op in (*_REPEATS, _c.POSSESSIVE_REPEAT):
            if av[0] > 0 and not _nullable(av[2].data):
                return False
        elif op is _c.SUBPATTERN:
            if not _nullable(av[-1].data):
                return False
        elif op is _c.ATOMIC_GROUP:
            if not _nullable(av.data):
                return False
        elif op is _c.BRANCH:
            if not any(_nullable(branch.data) for branch in av[1]):
                return False
    return True


def _named_chars(items: list[tuple[Any, Any]], named: set[str]) -> None:
    """Add each character ``items`` names (literals, set members and range ends), in each case, to ``named``."""
    for op, av in items:
        codes: list[int] = []
        if op in (_c.LITERAL, _c.NOT_LITERAL):
            codes.append(av)
        elif op is _c.IN:
            for kind, value in av:
                if kind in (_c.LITERAL, _c.NOT_LITERAL):
                    codes.append(value)
                elif kind is _c.RANGE:
                    codes.extend(value)
        elif op is _c.SUBPATTERN:
            _named_chars(av[-1].data, named)
        elif op in (*_REPEATS, _c.POSSESSIVE_REPEAT):
            _named_chars(av[2].data, named)
        elif op is _c.ATOMIC_GROUP:
            _named_chars(av.data, named)
        elif op in (_c.BRANCH, _c.GROUPREF_EXISTS):
            for branch in av[1:] if op is _c.GROUPREF_EXISTS else av[1]:
                if branch is not None:
                    _named_chars(branch.data, named)
        elif op in (_c.ASSERT, _c.ASSERT_NOT):
            _named_chars(av[1].data, named)
        variants = (variant for code in codes for variant in (chr(code), chr(code).lower(), chr(code).upper()))
        named.update(variant for variant in variants if len(variant) == 1)  # "ß".upper() is "SS"


_CATEGORIES: Final = {
    _c.CATEGORY_DIGIT: r"\d",
    _c.CATEGORY_NOT_DIGIT: r"\D",
    _c.CATEGORY_SPACE: r"\s",
    _c.CATEGORY_NOT_SPACE: r"\S",
    _c.CATEGORY_WORD: r"\w",
    _c.CATEGORY_NOT_WORD: r"\W",
}
_ANCHORS: Final = {
    _c.AT_BEGINNING: "^",
    _c.AT_BEGINNING_STRING: r"\A",
    _c.AT_END: "$",
    _c.AT_END_STRING: r"\Z",
    _c.AT_BOUNDARY: r"\b",
    _c.AT_NON_BOUNDARY: r"\B",
}
_SHOWN_CHARS: Final = 40


def _char(code: int, special: str) -> str:
    char = chr(code)
    if char in special or char == "\\":
        return "\\" + char
    return char if char.isprintable() else repr(char)[1:-1]


def _shown(items: list[tuple[Any, Any]]) -> str:
    """``items`` written back as a pattern (near enough to find it in the source), cut to 40 characters."""
    text = "".join(_shown_item(op, av) for op, av in items)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _shown_item(op: Any, av: Any) -> str:  # noqa: PLR0911 - one return per kind of item
    if op is _c.LITERAL:
        return _char(av, ".^$*+?{}[]|()")
    if op is _c.NOT_LITERAL:
        return f"[^{_char(av, '^]-')}]"
    if op is _c.ANY:
        return "."
    if op is _c.IN:
        if len(av) == 1 and av[0][0] is _c.CATEGORY:
            return _CATEGORIES.get(av[0][1], "[...]")
        parts = []
        for kind, value in av:
            if kind is _c.NEGATE:
                parts.append("^")
            elif kind is _c.LITERAL:
                parts.append(_char(value, "^]-"))
            elif kind is _c.RANGE:
                parts.append(f"{_char(value[0], '^]-')}-{_char(value[1], '^]-')}")
            elif kind is _c.CATEGORY:
                parts.append(_CATEGORIES.get(value, "..."))
        return "[" + "".join(parts) + "]"
    if op is _c.AT:
        return _ANCHORS.get(av, "")
    if op is _c.SUBPATTERN:
        return ("(" if av[0] is not None else "(?:") + _shown(av[-1].data) + ")"
    if op is _c.BRANCH:
        return "|".join(_shown(branch.data) for branch in av[1])
    if op is _c.ATOMIC_GROUP:
        return "(?>" + _shown(av.data) + ")"
    if op in (*_REPEATS, _c.POSSESSIVE_REPEAT):
        low, high, body = av
        inner = _shown(body.data)
        if len(body.data) != 1 or body.data[0][0] in (_c.BRANCH, *_REPEATS, _c.POSSESSIVE_REPEAT):
            inner = "(?:" + inner + ")"
        return inner + _quantifier(low, high) + {_c.MIN_REPEAT: "?", _c.POSSESSIVE_REPEAT: "+"}.get(op, "")
    return "..."


def _quantifier(low: int, high: int) -> str:
    if high == _c.MAXREPEAT:
        return {0: "*", 1: "+"}.get(low, f"{{{low},}}")
    if (low, high) == (0, 1):
        return "?"
    return f"{{{low}}}" if low == high else f"{{{low},{high}}}"
