"""Builds a prompt's suffix automaton on the host, in the device slot layout, with numba.

`build(tokens, max_seq_len)` returns one slot's arrays (`jaxspec.sa_layout.SAState` fields, no
slot axis) exactly as `jaxspec.device.sa_state.extend` would leave a zeroed slot after appending
the same tokens one by one: same state numbering, same hash, same probing and the same edge
insertion order, hence bit-identical tables. `SAManager` copies the result into a device slot.
"""

import numba
import numpy as np

from jaxspec import sa_layout

_WORD = 0xFFFFFFFF
_STATE_MUL = sa_layout.HASH_STATE_MUL
_MIX_MUL = sa_layout.HASH_MIX_MUL
_POSITIVE = sa_layout.HASH_POSITIVE
# numba reads module-level ints as compile-time constants.
_LEN, _LINK, _FIRSTPOS, _EDGE_HEAD = (sa_layout.LEN, sa_layout.LINK, sa_layout.FIRSTPOS,
                                     sa_layout.EDGE_HEAD)
_SOURCE, _TOKEN, _TARGET, _NEXT = (sa_layout.SOURCE, sa_layout.TOKEN, sa_layout.TARGET,
                                  sa_layout.NEXT)


@numba.njit(inline="always")
def _hash(state, token, num_buckets):
    # sa_layout.hash_bucket in 64-bit arithmetic, truncated to 32 bits wherever int32 would wrap.
    x = (np.int64(state) * _STATE_MUL + np.int64(token)) & _WORD
    x ^= x >> 15
    x = (x * _MIX_MUL) & _WORD
    x ^= x >> 13
    return (x & _POSITIVE) % num_buckets


@numba.njit(inline="always")
def _probe(edges, source, token):
    num_buckets = edges.shape[0]
    bucket = _hash(source, token, num_buckets)
    while edges[bucket, _TARGET] != 0 and (edges[bucket, _SOURCE] != source
                                           or edges[bucket, _TOKEN] != token):
        bucket = 0 if bucket + 1 == num_buckets else bucket + 1
    return bucket


@numba.njit(inline="always")
def _insert(states, edges, bucket, source, token, target):
    edges[bucket, _SOURCE] = source
    edges[bucket, _TOKEN] = token
    edges[bucket, _TARGET] = target
    edges[bucket, _NEXT] = states[source, _EDGE_HEAD]
    states[source, _EDGE_HEAD] = bucket + 1


@numba.njit(cache=True)
def _build(tokens, states, text, edges):
    num_states, last = 1, 0
    for n in range(tokens.shape[0]):
        token = tokens[n]
        text[n] = token
        cur = num_states
        num_states += 1
        states[cur, _LEN] = states[last, _LEN] + 1
        states[cur, _FIRSTPOS] = n
        p = last
        while True:
            bucket = _probe(edges, p, token)
            if edges[bucket, _TARGET] != 0:
                break
            _insert(states, edges, bucket, p, token, cur)
            p = -1 if p == 0 else states[p, _LINK]
            if p < 0:
                break
        if p >= 0:
            q = edges[bucket, _TARGET]
            if states[p, _LEN] + 1 == states[q, _LEN]:
                states[cur, _LINK] = q
            else:
                clone = num_states
                num_states += 1
                states[clone, _LEN] = states[p, _LEN] + 1
                states[clone, _LINK] = states[q, _LINK]
                states[clone, _FIRSTPOS] = states[q, _FIRSTPOS]
                edge = states[q, _EDGE_HEAD]
                while edge != 0:
                    entry = edge - 1
                    edge_token = edges[entry, _TOKEN]
                    _insert(states, edges, _probe(edges, clone, edge_token), clone, edge_token,
                            edges[entry, _TARGET])
                    edge = edges[entry, _NEXT]
                while p >= 0:
                    redirect = _probe(edges, p, token)
                    if edges[redirect, _TARGET] != q:
                        break
                    edges[redirect, _TARGET] = clone
                    p = -1 if p == 0 else states[p, _LINK]
                states[q, _LINK] = clone
                states[cur, _LINK] = clone
        last = cur
    return num_states, last


def build(tokens, max_seq_len: int) -> sa_layout.SAState:
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
    out = sa_layout.zeros(max_seq_len, xp=np)
    num_states, last = _build(tokens.astype(np.int32), out.states, out.text, out.edges)
    return out.replace(text_len=np.array(tokens.size, np.int32),
                       num_states=np.array(num_states, np.int32), last=np.array(last, np.int32))
