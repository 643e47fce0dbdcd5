"""The README's tutorial as its reader runs it: pasted, block by block, into a plain ``python3`` prompt.

The tutorial says "paste the blocks into one Python session". The interactive
interpreter of Python 3.11 and 3.12 (and ``code.InteractiveConsole``, which
IDLE and many embedded shells use) reads one statement at a time: a compound
statement (``with``, ``for``, ``def``) ends only at a blank line, so a line at
the outer level right after an indented one is a ``SyntaxError`` there, while
the same text runs as a script (which is how test_code_blocks.py runs it).
"""

from __future__ import annotations

import code
import sys

from .test_code_blocks import README, blocks_of


class _Prompt(code.InteractiveConsole):
    """An interactive console that compiles what is pasted, as the prompt does, and runs none of it."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str] = []

    def runcode(self, code: object) -> None:
        """Nothing runs: only how the prompt splits and compiles the text is checked."""

    def showsyntaxerror(self, filename: str | None = None, **kwargs: object) -> None:
        """Keep the error instead of printing it."""
        self.errors.append(repr(sys.exc_info()[1]))


def syntax_errors_when_pasted(source: str) -> list[str]:
    """The syntax errors a plain interactive prompt reports for ``source`` pasted line by line."""
    prompt = _Prompt()
    for line in source.splitlines():
        prompt.push(line)
    prompt.push("")  # the reader presses Enter after the block
    return prompt.errors


def test_a_line_after_an_indented_block_without_a_blank_line_is_what_the_prompt_refuses() -> None:
    """The check itself: the shape the tutorial once had is refused, the same text with a blank line is not."""
    assert syntax_errors_when_pasted("with open('x') as f:\n    pass\nprint(1)\n")
    assert not syntax_errors_when_pasted("with open('x') as f:\n    pass\n\nprint(1)\n")


def test_every_readme_python_block_pastes_into_a_plain_python_prompt() -> None:
    blocks = blocks_of(README)
    assert len(blocks) >= 5, blocks
    failures = [
        (n, where, errors) for n, (where, block) in enumerate(blocks, 1) if (errors := syntax_errors_when_pasted(block))
    ]
    assert not failures, failures
