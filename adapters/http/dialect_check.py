"""A dialect checked against the live server it describes: the server's own request schema (FastAPI's
/openapi.json) must have every field the dialect sends, or the server would drop it silently (its request model
ignores unknown fields), and the defaults the dialect documents must be the server's. Runs once when an engine
connects to a server whose dialect names its request schema."""

from __future__ import annotations

from typing import Any

import httpx

from adapters.http.dialects import Dialect
from harness.core.vocabulary import OPENAI_FIELDS


class DialectMismatch(RuntimeError):
    """The live server has no field for a param the dialect sends."""


def sent_fields(dialect: Dialect) -> dict[str, str]:
    """canonical param -> the request field the dialect sends it under."""
    return {name: OPENAI_FIELDS.get(name) or dialect.extra_fields[name]
            for name in (*OPENAI_FIELDS, *dialect.extra_fields) if dialect.handling(name) == "honours"}


def schema_problems(dialect: Dialect, schema: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(fields the server does not have, documented defaults the server does not use) for one request schema."""
    properties = schema.get("properties", {})
    missing = [f"{name} (sent as {field})" for name, field in sent_fields(dialect).items() if field not in properties]
    differ = []
    for name, documented in dialect.defaults.items():
        field = sent_fields(dialect).get(name)
        actual = properties.get(field, {}).get("default") if field else None
        if isinstance(documented, (int, float)) and actual is not None and actual != documented:
            differ.append(f"the {dialect.name} dialect documents {name} (field {field}) defaulting to {documented}, "
                          f"the live server's request schema to {actual}")
    return missing, differ


def check(dialect: Dialect, base_url: str, headers: dict[str, str], http: httpx.Client) -> list[str]:
    """Warnings for defaults that differ; DialectMismatch when a field the dialect sends is missing. base_url ends
    with /v1; the schema is served at the root."""
    if not dialect.request_schema:
        return []
    url = f"{base_url.removesuffix('/v1')}/openapi.json"
    try:
        document = http.get(url, headers=headers, timeout=30).json()
        schema = document["components"]["schemas"][dialect.request_schema]
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        return [f"the {dialect.name} dialect could not be checked against the server ({url}: {type(exc).__name__} "
                f"{exc}): its documented fields and defaults are assumed"]
    missing, differ = schema_problems(dialect, schema)
    if missing:
        raise DialectMismatch(f"the server's {dialect.request_schema} has no field for {', '.join(missing)}: it would "
                              f"ignore them silently; this server is not the one the {dialect.name} dialect describes")
    return differ
