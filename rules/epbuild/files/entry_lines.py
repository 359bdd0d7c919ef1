"""JSON objects of many entries written one entry per line (`  "name": <entry's JSON>,`) and read back entry by
entry: the build report and the settings record hold one entry per task, the external-data index one per model,
and a run decodes or encodes only the few it needs or changes (decoding every entry on every run was a large
share of a run that changed one model).

The writer keeps the sha256 of the text it wrote (in the record's header, `state.journaled`; for the build report,
the user's file, in a file of its own: `vouch`); a text with that digest is exactly what `entry_lines` made, so its
lines are split without decoding the whole (`plain_texts`). Any other text (edited, torn, an older epbuild's) is
decoded whole by the caller.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Container, Iterator, MutableMapping
from pathlib import Path
from typing import Any

from ..errors import json_value
from .layout import write_atomic


def quoted(name: str) -> str:
    """`json.dumps(name)`, without encoding plain names (most are: encoding each showed at many targets)."""
    plain = name.isascii() and name.isprintable() and '"' not in name and "\\" not in name
    return f'"{name}"' if plain else json.dumps(name)


def entry_lines(texts: dict[str, str]) -> str:
    """The entries' lines, sorted by name, without the object's braces: equal entries give equal bytes."""
    return ",\n".join(f"  {quoted(name)}: {texts[name]}" for name in sorted(texts))


# an entry's line as `entry_lines` writes it, for a name JSON writes without escapes: the name's characters are the
# name, the rest of the line without its comma the entry's JSON
ENTRY = re.compile(r'^  "([^"\\\n]*)": ([^\n]*[^,\n])', re.M)


def plain_texts(text: str) -> dict[str, str] | None:
    """Each entry's JSON text by name, from a text of one line per entry between a first and a last line, which
    `entry_lines` made (the digest vouches for it; one scan in C, not a loop over the lines in Python):
    None where a name is one JSON escapes (then the whole is decoded)."""
    texts = dict(ENTRY.findall(text))
    return texts if len(texts) == text.count("\n") - 2 else None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def vouched(digest_file: Path | None, text: str) -> bool:
    """Whether `text` is the one whose digest was last left in `digest_file`."""
    if digest_file is None:
        return False
    try:
        return digest_file.read_text() == _digest(text)
    except OSError:
        return False


def vouch(digest_file: Path, text: str) -> None:
    """Leave the digest of `text`, just written whole (after it: a digest never names a text not yet written)."""
    digest_file.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(digest_file, _digest(text))


class LazyEntries(MutableMapping):
    """Entries by name, in the file's order, each decoded from its JSON text only when asked for; the text of an
    entry read and not set since is kept, to be written again as it was (`text`)."""

    def __init__(self, texts: dict[str, str] | None = None, decoded: dict[str, Any] | None = None):
        self._items: dict[str, str | Any] = {**(texts or {}), **(decoded or {})}  # a str: not decoded yet
        self._texts = dict(texts or {})

    def __getitem__(self, name: str) -> Any:
        found = self._items[name]
        if isinstance(found, str):
            found = self._items[name] = json_value(found)
        return found

    def get(self, name: str, default: Any = None) -> Any:  # Mapping's, without raising and catching a KeyError
        return self[name] if name in self._items else default

    def __setitem__(self, name: str, entry: Any) -> None:
        self._items[name] = entry
        self._texts.pop(name, None)

    def __delitem__(self, name: str) -> None:
        del self._items[name]
        self._texts.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def text(self, name: str) -> str:
        """The entry's JSON text: as read, unless it was set since, else encoded (keys sorted)."""
        found = self._texts.get(name)
        return found if found is not None else json.dumps(self._items[name], sort_keys=True)

    def only(self, names: Container[str]) -> LazyEntries:
        """The entries of `names`, none decoded for it."""
        kept = LazyEntries()
        kept._items = {name: item for name, item in self._items.items() if name in names}
        kept._texts = {name: text for name, text in self._texts.items() if name in names}
        return kept
