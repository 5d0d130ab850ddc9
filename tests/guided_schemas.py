"""JSON schemas and prompts for guided decoding's tests: nested objects, arrays, enums, required
fields and bounded numbers, bounded in length so that every output can complete."""

from __future__ import annotations

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 16},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "address"],
    "additionalProperties": False,
}
PRODUCT = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 9999},
        "tags": {
            "type": "array",
            "items": {"enum": ["new", "sale", "eco", "gift"]},
            "minItems": 1,
            "maxItems": 3,
        },
        "in_stock": {"type": "boolean"},
    },
    "required": ["id", "tags", "in_stock"],
    "additionalProperties": False,
}
EVENT = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["meeting", "call", "trip"]},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        "attendees": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "role": {"enum": ["host", "guest"]},
                },
                "required": ["name", "role"],
                "additionalProperties": False,
            },
            "maxItems": 2,
        },
    },
    "required": ["kind", "priority", "attendees"],
    "additionalProperties": False,
}
SCHEMAS = {"person": PERSON, "product": PRODUCT, "event": EVENT}

_SUBJECTS = (
    "a teacher", "a farmer", "a pilot", "a painter", "a nurse", "a chef", "a sailor",
    "a student", "a doctor", "a baker", "a poet", "a singer", "a miner", "a judge",
    "a dancer", "a tailor", "a driver", "a writer", "a coach", "a banker",
)  # fmt: skip
_ASKS = ("Describe {} as JSON.", "Give a JSON record about {}.", "Return JSON for {}.")
PROMPTS = [ask.format(subject) for ask in _ASKS for subject in _SUBJECTS]  # 60
