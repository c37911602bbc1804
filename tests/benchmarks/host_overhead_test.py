"""The stdlib byte stream the overhead benchmarks draft from."""

import pytest

from benchmarks import host_overhead


def test_recursive_stream_reaches_past_the_top_level_modules():
    top = len(host_overhead.stdlib_byte_tokens(1))
    with pytest.raises(ValueError, match="bytes of"):
        host_overhead.stdlib_byte_tokens(20_000_000_000)
    tokens = host_overhead.stdlib_byte_tokens(8_000_000, recursive=True)
    assert top == 1 and len(tokens) == 8_000_000 and max(tokens) < 256
