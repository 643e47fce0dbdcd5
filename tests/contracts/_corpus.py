"""The contract-file corpora: tests/contracts/bad (one bad file per case) and tests/contracts/good.

Each bad file starts with two comment lines: ``# loader: LINE: FIELD: TEXT`` (several joined
by `` | ``), every problem the loader must report, and ``# schema: VERDICT``, what the JSON
Schema says of the same file: ``invalid``; ``valid`` when only the loader can see the problem
(bounds, names defined elsewhere in the file); ``not-json`` when the file is not a JSON value
at all (YAML syntax, tags, duplicate keys, encoding), so no schema can judge it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

HERE = Path(__file__).parent
BAD = HERE / "bad"
GOOD = HERE / "good"
REFUND_BOT = HERE / "refund_bot"


@dataclass(frozen=True)
class Expected:
    line: int
    field: str
    text: str


@dataclass(frozen=True)
class BadCase:
    name: str
    file: Path
    kind: Literal["tool", "session"]
    expected: tuple[Expected, ...]
    schema: str


def bad_cases() -> list[BadCase]:
    cases = []
    for folder in sorted(BAD.iterdir()):
        (file,) = folder.iterdir()
        loader_line, schema_line = file.read_bytes().split(b"\n", 2)[:2]
        expected = []
        for item in loader_line.decode().removeprefix("# loader: ").split(" | "):
            line, field, text = item.split(": ", 2)
            expected.append(Expected(int(line), field, text))
        kind: Literal["tool", "session"] = "session" if file.name == "session.yaml" else "tool"
        cases.append(BadCase(folder.name, file, kind, tuple(expected), schema_line.decode().removeprefix("# schema: ")))
    return cases


def good_files() -> list[Path]:
    return sorted([*GOOD.glob("*/*.yaml"), *REFUND_BOT.glob("*.yaml")])
