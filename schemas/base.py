"""The wire's building blocks: one base model and one set of constrained types.

Every request model and every query or path parameter is built from these, so a value
that validates can always be stored: PostgreSQL refuses NUL characters, timestamps
outside its range, and integers beyond BIGINT, and a refusal there would be a 500.

* **Text** has no control characters (C0, DEL, C1), which also keeps them out of logs.
  Lone surrogates are refused by pydantic itself once a pattern applies.
* **Timestamps** carry an offset, their local date lies between 0001-01-02 and
  9999-12-30 (so every offset converts to UTC), and a JSON number is not a timestamp.
* **Integers** stay within ±(2**53 - 1): every JSON parser reads them exactly
  (JavaScript's Number.MAX_SAFE_INTEGER), so do JSON Schema validators that hold
  numbers as doubles, and they fit a BIGINT column.
* **Bodies are strict JSON**: ``"5"`` is not 5, ``true`` is not 1, ``0`` is not false.
  FastAPI validates bodies in Python mode, where model-wide ``strict=True`` would also
  refuse ISO strings for datetimes and UUIDs; so strictness sits on each scalar type.
  Query and path parameters always arrive as text: they use the ``*Param`` forms, with
  the same ranges and patterns and lax parsing of the digits.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Final

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict

SAFE_INT_MAX: Final = 2**53 - 1
# The first and the last day of Python's (and so asyncpg's) datetime range are refused
# whatever the offset: any offset (under 24 h) of any other day converts to UTC without
# overflowing. The JSON Schema carries the same rule as a pattern, so a client's
# validator and ours agree on every string.
TIMESTAMP_PATTERN: Final = r"^(?!0001-01-01|9999-12-31)\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}"
# A root's path segment that is not `.` or `..` (spelled out: the validator's regex
# engine has no look-ahead): it starts with a non-dot, or one dot and a non-dot, or two
# dots and anything more.
_CHAR: Final = r"[A-Za-z0-9_.+=@-]"
_NON_DOT: Final = r"[A-Za-z0-9_+=@-]"
_SEGMENT: Final = rf"(?:{_NON_DOT}{_CHAR}*|\.{_NON_DOT}{_CHAR}*|\.\.{_CHAR}+)"
# A file's path segment: any name the Hub accepts that is safe on a POSIX filesystem and
# in a log line: spaces, non-ASCII letters, `~`, parentheses are fine; `/` only between
# segments, and no backslash (a separator elsewhere), no control character (C0, DEL,
# C1), no line separator and no bidirectional override (a name could disguise itself).
_UNSAFE: Final = r"/\\\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_FILE_CHAR: Final = rf"[^{_UNSAFE}]"
_FILE_NON_DOT: Final = rf"[^.{_UNSAFE}]"
# At most 255 characters a segment, which the pattern can say; the limit in UTF-8 bytes
# (MAX_SEGMENT_BYTES) it cannot, and the validator checks that on its own.
_FILE_SEGMENT: Final = (
    rf"(?:{_FILE_NON_DOT}{_FILE_CHAR}{{0,254}}|\.{_FILE_NON_DOT}{_FILE_CHAR}{{0,253}}"
    rf"|\.\.{_FILE_CHAR}{{1,253}})"
)
FILE_PATH_PATTERN: Final = rf"^{_FILE_SEGMENT}(?:/{_FILE_SEGMENT})*$"
# What most filesystems hold in one name (NAME_MAX), in bytes.
MAX_SEGMENT_BYTES: Final = 255
# An absolute, normalised directory: no `.` or `..` segment, no `//`, no trailing `/`.
ROOT_PATTERN: Final = rf"^(?:/{_SEGMENT})+$"

# C0 controls (NUL included), DEL and C1 controls.
NO_CONTROL_CHARACTERS: Final = r"^[^\x00-\x1f\x7f-\x9f]*$"


class WireModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# Text -----------------------------------------------------------------------------------

Text = Annotated[str, Strict(), Field(pattern=NO_CONTROL_CHARACTERS)]
ShortText = Annotated[Text, Field(min_length=1, max_length=255)]
Name = Annotated[Text, Field(min_length=1, max_length=200)]
Note = Annotated[Text, Field(max_length=500)]
# An exact-match filter on a stored column of up to 128 characters.
FilterText = Annotated[Text, Field(min_length=1, max_length=128)]

LABEL_KEY_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
LABEL_VALUE_PATTERN: Final = r"^[A-Za-z0-9_.-]*$"
Label = Annotated[str, Strict(), Field(min_length=1, max_length=63, pattern=LABEL_KEY_PATTERN)]
LabelValue = Annotated[str, Strict(), Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
Labels = Annotated[
    dict[Label, LabelValue],
    Field(
        max_length=64,
        # pydantic describes key patterns as patternProperties, which still admits any
        # other key; propertyNames says what the validator really enforces.
        json_schema_extra={
            "propertyNames": {"minLength": 1, "maxLength": 63, "pattern": LABEL_KEY_PATTERN},
            "additionalProperties": False,
        },
    ),
]

# Paths (artifact files and the roots they go into): a file's is relative and
# `/`-separated, its segments never `.` or `..` and each at most MAX_SEGMENT_BYTES in
# UTF-8; a root is absolute, normalised, from a conservative character set. Receivers
# check again on their side (symlinks, the real root).


def _segments_fit(path: str) -> str:
    if any(len(part.encode()) > MAX_SEGMENT_BYTES for part in path.split("/")):
        raise ValueError(f"a path segment is longer than {MAX_SEGMENT_BYTES} bytes (UTF-8)")
    return path


FilePath = Annotated[
    str,
    Strict(),
    Field(max_length=1024, pattern=FILE_PATH_PATTERN),
    AfterValidator(_segments_fit),
]
RootPath = Annotated[str, Strict(), Field(max_length=1024, pattern=ROOT_PATTERN)]
# A file on the node, as a lease names it: a root and a file's path joined (absolute, no
# `.` or `..` segment, nothing a log line or a filesystem would misread). The node still
# resolves it under its own artifact roots before it opens it.
NodePath = Annotated[
    str,
    Strict(),
    Field(max_length=2048, pattern=rf"^(?:/{_FILE_SEGMENT})+$"),
    AfterValidator(_segments_fit),
]

# Numbers --------------------------------------------------------------------------------


def json_integer(value: Any) -> Any:
    # JSON has one number type, and JSON Schema calls 5.0 an integer: take it as 5. A
    # bool is not a number, and a string stays a string (the strict check refuses it).
    if isinstance(value, float) and value.is_integer() and abs(value) <= SAFE_INT_MAX:
        return int(value)
    return value


# The integral-float step comes last so that it runs first, and the bounds stay on the
# integer itself, where the JSON Schema shows them as minimum and maximum. A type that
# needs other bounds is written out the same way (adding a Field on top of one of these
# would hide its bounds from the schema).
Integer = Annotated[
    int, Strict(), Field(ge=-SAFE_INT_MAX, le=SAFE_INT_MAX), BeforeValidator(json_integer)
]
Count = Annotated[int, Strict(), Field(ge=0, le=SAFE_INT_MAX), BeforeValidator(json_integer)]
Positive = Annotated[int, Strict(), Field(ge=1, le=SAFE_INT_MAX), BeforeValidator(json_integer)]
Flag = Annotated[bool, Strict()]
# An int is a float (JSON does not tell them apart); a bool or a string is not.
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]

CountParam = Annotated[int, Field(ge=0, le=SAFE_INT_MAX)]
PositiveParam = Annotated[int, Field(ge=1, le=SAFE_INT_MAX)]

# Timestamps -----------------------------------------------------------------------------


_TIMESTAMP_START = re.compile(TIMESTAMP_PATTERN)


def _text_or_datetime(value: Any) -> Any:
    # pydantic would read a number, or a string of digits, as seconds since the epoch;
    # the wire says RFC 3339.
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and _TIMESTAMP_START.match(value):
        return value
    raise ValueError(
        "a timestamp is an RFC 3339 string between 0001-01-02 and 9999-12-30 (local date)"
    )


def _bounded_instant(value: datetime) -> datetime:
    # A naive timestamp is ambiguous across hosts; ordering rules need an instant.
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("timestamp must carry a timezone offset (RFC 3339)")
    try:
        value.astimezone(UTC)
    except OverflowError:  # only a datetime built in Python can get here
        raise ValueError("timestamp is outside years 1..9999 in UTC") from None
    return value


Timestamp = Annotated[
    datetime,
    BeforeValidator(_text_or_datetime),
    AfterValidator(_bounded_instant),
    Field(
        description="RFC 3339 with an offset; the local date between 0001-01-02 and 9999-12-30",
        json_schema_extra={"pattern": TIMESTAMP_PATTERN},
    ),
]
