"""Checks on the collected tests themselves."""

from __future__ import annotations

import re

import pytest

# A parametrize id made from bytes (\x.. escapes) usually holds the bytes of a test's input,
# and such input can differ between two collections: gzip stamps the time, so two xdist
# workers collecting in different seconds listed different tests and CI refused to start
# (2026-12-07). Name such cases with ids=[...].
_BYTES_IN_ID = re.compile(r"\\x[0-9a-f]{2}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    named_by_bytes = [item.nodeid for item in items if _BYTES_IN_ID.search(item.nodeid)]
    if named_by_bytes:
        raise pytest.UsageError(
            f"test ids made of bytes may differ between xdist workers: {named_by_bytes[0]}: "
            "give its parametrize ids=[...]"
        )
