"""A tiny byte-level BPE vocabulary for writing toy checkpoints (the real model and the full
forward live in tests/conftest.py)."""

import pytest
import tokenizers


@pytest.fixture(scope="session")
def byte_vocab():
    """A tiny byte-level BPE vocabulary: 3 control tokens, the 256 byte symbols, a few merges and
    one user-defined token.

    Returns (tokens, merges, token_types) with GGUF token types (1 normal, 3 control, 4 user).
    """
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n")]
    tokens = specials + alphabet + [a + b for a, b in merges] + ["<tool>"]
    types = [3] * len(specials) + [1] * (len(tokens) - len(specials) - 1) + [4]
    return tokens, [f"{a} {b}" for a, b in merges], types
