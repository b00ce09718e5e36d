"""Checks on the collected tests themselves."""

from __future__ import annotations

import re

import pytest

# A parametrize id made from bytes (\x.. escapes) usually holds the bytes of a test's input,
# and such input can differ between two collections: gzip stamps the time, so two xdist
# workers collecting in different seconds listed different tests and CI refused to start
# (2026-12-07). Name such cases with ids=[...].
_BYTES_IN_ID = re.compile(r"\\x[0-9a-f]{2}")


def _named_by_bytes(item: pytest.Item) -> bool:
    """A parametrized test whose id escapes a bytes parameter (pytest also escapes non-ASCII
    text, e.g. "8× H100" as 8\xd7 H100: not flagged, text is the same in every worker)."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or not _BYTES_IN_ID.search(callspec.id):
        return False
    return any(isinstance(v, (bytes, bytearray)) for v in callspec.params.values())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    named_by_bytes = [item.nodeid for item in items if _named_by_bytes(item)]
    if named_by_bytes:
        raise pytest.UsageError(
            f"test ids made of bytes may differ between xdist workers: {named_by_bytes[0]}: "
            "give its parametrize ids=[...]"
        )
