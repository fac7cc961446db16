"""Text for an operator's terminal: what a node or an operator wrote (a hostname, a
display name, a GPU's name, a failure's detail, a server's error message) is shown as the
characters it is, never obeyed.

Two things in such text would be obeyed otherwise. Rich markup (`[green]`, `[link=…]`)
is parsed from every str Rich prints, so the CLI builds what it prints as rich.text.Text,
which Rich never parses: `literal`. And a terminal acts on control characters itself,
whoever prints them: an ESC starts a sequence (erase the screen, an OSC 8 hyperlink,
a retitled window), and a bidirectional override or an invisible format character makes
text read other than it is. `visible` spells each of those out (`\\x1b`, `\\u202e`), as
Python's repr would, and leaves every other character as it is.
"""

from __future__ import annotations

import unicodedata
from typing import Final

from rich.style import Style
from rich.text import Text

# Unicode's categories of what a terminal acts on or does not show: controls (C0, DEL,
# C1), format characters (bidirectional embeddings, overrides and isolates, marks,
# zero-width characters, tags, …), line and paragraph separators, and surrogates (a lone
# one cannot even be encoded for the terminal).
HIDDEN_CATEGORIES: Final = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
# How a spelled character stands out from text that happens to read `\x1b`, where there
# are styles.
SPELLED_STYLE: Final = Style(reverse=True)
# As Python writes them, which an operator reads at a glance.
SHORT_SPELLINGS: Final = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def hidden(char: str) -> bool:
    return unicodedata.category(char) in HIDDEN_CATEGORIES


def spell(char: str) -> str:
    if char in SHORT_SPELLINGS:
        return SHORT_SPELLINGS[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: str) -> str:
    """text with each hidden character spelled out; the rest as it is."""
    # Every hidden character is also unprintable: most text is done at once.
    if text.isprintable():
        return text
    return "".join(spell(char) if hidden(char) else char for char in text)


def literal(text: str, style: str | Style | None = None) -> Text:
    """text as a Text that shows exactly its characters: never markup, each hidden
    character spelled out (and set off, on a terminal with styles)."""
    shown = Text(style=style or "")
    if text.isprintable():
        shown.append(text)
        return shown
    run: list[str] = []
    for char in text:
        if not hidden(char):
            run.append(char)
            continue
        if run:
            shown.append("".join(run))
            run.clear()
        shown.append(spell(char), style=SPELLED_STYLE)
    if run:
        shown.append("".join(run))
    return shown
