"""Builds a prompt's suffix automaton on the host, in the device slot layout, with numba.

`build(tokens, max_seq_len)` returns one slot's arrays (`jaxspec.device.sa_state.SAState` fields,
no slot axis) exactly as `sa_state.extend` would leave a zeroed slot after appending the same
tokens one by one: same state numbering, same hash, same probing and the same edge insertion
order, hence bit-identical tables. `SAManager` copies the result into a device slot.
"""

import numba
import numpy as np

from jaxspec.device import sa_state

_WORD = 0xFFFFFFFF
_STATE_MUL = sa_state.HASH_STATE_MUL
_MIX_MUL = sa_state.HASH_MIX_MUL
_POSITIVE = 0x7FFFFFFF


@numba.njit(inline="always")
def _hash(state, token, num_buckets):
    # sa_state.hash_bucket in 64-bit arithmetic, truncated to 32 bits wherever int32 would wrap.
    x = (np.int64(state) * _STATE_MUL + np.int64(token)) & _WORD
    x ^= x >> 15
    x = (x * _MIX_MUL) & _WORD
    x ^= x >> 13
    return (x & _POSITIVE) % num_buckets


@numba.njit(inline="always")
def _probe(table_state, table_token, table_target, source, token, num_buckets):
    bucket = _hash(source, token, num_buckets)
    while table_target[bucket] != 0 and (table_state[bucket] != source
                                         or table_token[bucket] != token):
        bucket = 0 if bucket + 1 == num_buckets else bucket + 1
    return bucket


@numba.njit(inline="always")
def _insert(edge_head, table_state, table_token, table_target, table_next, bucket, source, token,
            target):
    table_state[bucket] = source
    table_token[bucket] = token
    table_target[bucket] = target
    table_next[bucket] = edge_head[source]
    edge_head[source] = bucket + 1


@numba.njit(cache=True)
def _build(tokens, state_len, link, firstpos, edge_head, text, table_state, table_token,
           table_target, table_next):
    num_buckets = table_target.shape[0]
    num_states, last = 1, 0
    for n in range(tokens.shape[0]):
        token = tokens[n]
        text[n] = token
        cur = num_states
        num_states += 1
        state_len[cur] = state_len[last] + 1
        firstpos[cur] = n
        p = last
        while True:
            bucket = _probe(table_state, table_token, table_target, p, token, num_buckets)
            if table_target[bucket] != 0:
                break
            _insert(edge_head, table_state, table_token, table_target, table_next, bucket, p,
                    token, cur)
            p = -1 if p == 0 else link[p]
            if p < 0:
                break
        if p >= 0:
            q = table_target[bucket]
            if state_len[p] + 1 == state_len[q]:
                link[cur] = q
            else:
                clone = num_states
                num_states += 1
                state_len[clone] = state_len[p] + 1
                firstpos[clone] = firstpos[q]
                link[clone] = link[q]
                edge = edge_head[q]
                while edge != 0:
                    entry = edge - 1
                    edge_token = table_token[entry]
                    slot = _probe(table_state, table_token, table_target, clone, edge_token,
                                  num_buckets)
                    _insert(edge_head, table_state, table_token, table_target, table_next, slot,
                            clone, edge_token, table_target[entry])
                    edge = table_next[entry]
                while p >= 0:
                    slot = _probe(table_state, table_token, table_target, p, token, num_buckets)
                    if table_target[slot] != q:
                        break
                    table_target[slot] = clone
                    p = -1 if p == 0 else link[p]
                link[q] = clone
                link[cur] = clone
        last = cur
    return num_states, last


def build(tokens, max_seq_len: int) -> sa_state.SAState:
    """The automaton of `tokens` as one slot's numpy arrays (no slot axis).

    Args:
      tokens: int sequence or array of at most `max_seq_len` int32 tokens.
      max_seq_len: the slot capacity.

    Raises:
      ValueError: if the tokens do not fit or are not int32 values.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or (tokens.size and not np.issubdtype(tokens.dtype, np.integer)):
        raise ValueError(f"tokens must be a 1-D integer sequence, got shape {tokens.shape} "
                         f"dtype {tokens.dtype}")
    if tokens.size > max_seq_len:
        raise ValueError(f"{tokens.size} tokens exceed max_seq_len={max_seq_len}")
    info = np.iinfo(np.int32)
    if tokens.size and (tokens.min() < info.min or tokens.max() > info.max):
        raise ValueError(f"tokens must fit int32, got range [{tokens.min()}, {tokens.max()}]")
    out = sa_state.zeros(max_seq_len, xp=np)
    num_states, last = _build(
        tokens.astype(np.int32), out.state_len, out.link, out.firstpos, out.edge_head, out.text,
        out.table_state, out.table_token, out.table_target, out.table_next)
    return out.replace(text_len=np.array(tokens.size, np.int32),
                       num_states=np.array(num_states, np.int32), last=np.array(last, np.int32))
