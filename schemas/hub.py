"""What ModelForge reads from a Hugging Face Hub-layout source's API, as schemas for the
bounded reader (schemas/bounded.py): only the fields the manifest resolution uses.

Unlike ModelForge's own wire models these ignore unknown fields: the Hub's answers carry
many more (model card data, siblings, security scans) and grow over time. Values are
typed loosely where the Hub's are (a path is any string here): whether a file can be
stored is decided afterwards, file by file, so that a refusal can name the file.
"""

from __future__ import annotations

from typing import Annotated, Final
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, Strict, TypeAdapter

# Where models come from unless a mirror (any server with the Hub layout) is set: for the
# control plane's resolution in MODELFORGE_ARTIFACT_SOURCE_URL (`up`, `modelforge api`),
# for an agent's downloads in its `artifact_source_url`.
HUB_URL: Final = "https://huggingface.co"
SOURCE_URL_ENV: Final = "MODELFORGE_ARTIFACT_SOURCE_URL"
AGENT_SOURCE_URL_ENV: Final = "MODELFORGE_AGENT_ARTIFACT_SOURCE_URL"


def source_shown(url: str) -> str:
    """A source as a log line or a message shows it: without any user or password, and
    saying whether it is the Hub or a mirror."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    shown = urlunsplit(parts._replace(netloc=host)).rstrip("/")
    return f"{shown} (the Hugging Face Hub)" if shown == HUB_URL else f"{shown} (a mirror)"


# Generous for a revision's model info (it lists every file) and a tree of thousands of
# files; far below what could hurt the API process.
MAX_ANSWER_BYTES: Final = 16 << 20
# The tree is paginated (`Link: rel="next"`); a repository of more pages than this is
# refused (502) rather than resolved from part of its files.
MAX_TREE_PAGES: Final = 100


class HubAnswer(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Revision(HubAnswer):
    """`GET /api/models/{repo}/revision/{revision}`"""

    sha: Annotated[str, Strict()]


class Lfs(HubAnswer):
    oid: Annotated[str, Strict()]
    size: Annotated[int, Strict()]


class TreeEntry(HubAnswer):
    """One entry of `GET /api/models/{repo}/tree/{commit}?recursive=true`."""

    type: Annotated[str, Strict()]
    path: Annotated[str, Strict(), Field(max_length=4096)]
    size: Annotated[int, Strict()] | None = None
    oid: Annotated[str, Strict()] | None = None
    lfs: Lfs | None = None


REVISION: Final = TypeAdapter(Revision)
TREE: Final = TypeAdapter(list[TreeEntry])
