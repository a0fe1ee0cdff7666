"""canitoolcall's conformance suite through swarmtune's parsing: each of its recorded replies (nine families,
469 in the pinned release) read in one piece, and streamed one character at a time and in seeded random
groups of characters, as tests/toolcall_adapter.py replays them for `canitoolcall run`. Every reply must
conform (soft-v1 whitespace accepted), and a stream must read as the whole reply does.
`python bench/tool_families.py` prints the same suite's table per family."""

import pytest
from canitoolcall.adapters.base import ReplayInput
from canitoolcall.chunking import ChunkStrategy, split_text
from canitoolcall.pytest_plugin import assert_conforms, assert_equivalent
from toolcall_adapter import Swarmtune

ADAPTER = Swarmtune()
STREAMS = [ChunkStrategy("char", seed=0), ChunkStrategy("char", seed=1), ChunkStrategy("rand", seed=2, max_group=8)]


def test_conformance(canitoolcall_fixture, canitoolcall_family):
    raw = ReplayInput.from_fixture(canitoolcall_fixture, canitoolcall_family)
    if not ADAPTER.supports(raw.family, raw.model):
        pytest.fail(f"no template for {raw.family} / {raw.model}")
    whole = ADAPTER.parse(raw, canitoolcall_fixture.tools)
    assert_conforms(canitoolcall_fixture, whole, soft=True, family=canitoolcall_family)
    for strategy in STREAMS:
        streamed = ADAPTER.parse_stream_text(raw, split_text(raw.text, strategy), canitoolcall_fixture.tools)
        assert_equivalent(whole, streamed)
