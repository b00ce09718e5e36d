"""Checks on the collected tests themselves."""

from __future__ import annotations

import re
from collections.abc import Iterator

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


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """A module's in-process training on one intra-op thread (restored after it). The tiny
    models' matmuls on two threads of a loaded two-core host (CI's two xdist workers and their
    child processes) waited on each other: a step 20-50 times slower. Use it where the results
    compared are each computed in one process (this one or a child, each its own thread
    count): ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
