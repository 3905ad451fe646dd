"""What the handlers make of a request's strings before storing them. The requests' own
checks (types, values) are gpusched.core.requests.catalog'; this is only about the database."""

from __future__ import annotations


def text(value: str) -> str:
    """For a text column: lone surrogates (undecodable bytes in argv) as \\udcXX escapes."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")
