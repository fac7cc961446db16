"""Wire models refuse unknown fields everywhere; the committed JSON Schema export is current."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from schemas import export

pytestmark = pytest.mark.fast

EXPORT_DIR = Path(__file__).resolve().parent.parent / "schemas" / "jsonschema"


def test_committed_export_is_current() -> None:
    rendered = export.render()
    committed = {path.name: path.read_text() for path in EXPORT_DIR.glob("*.json")}
    stale = sorted(name for name in rendered if committed.get(name) != rendered[name])
    extra = sorted(set(committed) - set(rendered))
    assert not stale and not extra, (
        f"schemas/jsonschema is stale (changed: {stale}, removed: {extra}); "
        "run `modelforge schemas export schemas/jsonschema`"
    )


def test_export_writes_every_model(tmp_path: Path) -> None:
    written = export.export(tmp_path)
    assert {p.name for p in written} == set(export.render())
    assert len(written) >= 40


@pytest.mark.parametrize("name", sorted(export.models()))
def test_every_model_forbids_unknown_fields(name: str) -> None:
    model: type[BaseModel] = export.models()[name]
    assert model.model_config.get("extra") == "forbid"
    schema = model.model_json_schema()
    if schema.get("type") == "object":
        assert schema.get("additionalProperties") is False
    with pytest.raises(ValidationError) as raised:
        model.model_validate({"definitely_not_a_field": 1})
    assert any(error["type"] == "extra_forbidden" for error in raised.value.errors())
