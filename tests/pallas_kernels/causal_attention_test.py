"""Exact mode's attention three ways (the XLA reference, the kernel interpreted on CPU, compiled on
a GPU) against a float64 oracle, causal and through token trees' masks, and bitwise: a query's
output is the same float in a plain call (one new token), a verify call (several), a batch with
other rows, and a wider table. Every slot no query may see holds NaN (the NULL page, slots past
the last new token, other layers)."""


from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax import export
import jax.numpy as jnp
import numpy as np

from jaxspec.device import causal_attention as causal_lib
from jaxspec.device import ops
from jaxspec.pallas_kernels import paged_attention
from tests import helpers

PAGE_SIZE = 16
HEAD_DIM = 16
NUM_LAYERS = 2
LAYER = 1
TOLERANCE = {jnp.float32: 1e-5, jnp.bfloat16: 1e-4}


def _pages(totals, *, kv_heads, table_width, dtype, seed=0):
    """(k_pages, v_pages, page_table): each row's keys at positions < totals[b] random, every
    other slot NaN; distinct pages per row."""
    rng = np.random.default_rng(seed)
    rows = len(totals)
    num_pages = 1 + rows * table_width
    shape = (NUM_LAYERS, num_pages, PAGE_SIZE, kv_heads, HEAD_DIM)
    k, v = np.full(shape, np.nan), np.full(shape, np.nan)
    order = rng.permutation(np.arange(1, num_pages)).reshape(rows, table_width)
    table = np.zeros((rows, table_width), np.int32)
    for b, n in enumerate(totals):
        used = -(-n // PAGE_SIZE)
        table[b, :used] = order[b, :used]
        for pos in range(n):
            page, slot = table[b, pos // PAGE_SIZE], pos % PAGE_SIZE
            k[LAYER, page, slot] = rng.standard_normal((kv_heads, HEAD_DIM))
            v[LAYER, page, slot] = rng.standard_normal((kv_heads, HEAD_DIM))
    return jnp.asarray(k, dtype), jnp.asarray(v, dtype), jnp.asarray(table)


def _queries(rows, kv_heads, num_queries, seed=1):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((rows, kv_heads, num_queries, HEAD_DIM)) * HEAD_DIM ** -0.5
    return jnp.asarray(q, jnp.float32)


def _oracle(q, k_pages, v_pages, table, lengths, num_new, tree=None):
    """float64 attention of each query over the keys up to its position (with a tree: the keys
    cached before the new ones, and the new ones the tree marks)."""
    q = np.asarray(q, np.float64)
    k = np.asarray(k_pages[LAYER].astype(jnp.float32), np.float64)
    v = np.asarray(v_pages[LAYER].astype(jnp.float32), np.float64)
    rows, kv_heads, num_queries, _ = q.shape
    out = np.zeros(q.shape)
    for b in range(rows):
        keys = k[np.asarray(table[b])].reshape(-1, kv_heads, HEAD_DIM)
        values = v[np.asarray(table[b])].reshape(-1, kv_heads, HEAD_DIM)
        for h in range(kv_heads):
            for r in range(num_queries):
                n = int(lengths[b]) + r % num_new + 1
                seen = np.arange(n)
                if tree is not None:
                    new = np.flatnonzero(np.asarray(tree[b, r % num_new]))
                    seen = np.concatenate([np.arange(int(lengths[b])), int(lengths[b]) + new])
                s = keys[seen, h] @ q[b, h, r]
                p = np.exp(s - s.max())
                out[b, h, r] = p @ values[seen, h] / p.sum()
    return out


@absltest.skipThisClass("base class: run through its subclasses")
class CausalAttentionTestBase(parameterized.TestCase):

    def partials(self, q, k, v, table, lengths, *, num_new, tree=None):
        raise NotImplementedError

    def attend(self, q, k, v, table, lengths, *, num_new, tree=None):
        return causal_lib.merge_splits(*self.partials(q, k, v, table, lengths,
                                                      num_new=num_new, tree=tree))

    @parameterized.named_parameters(
        # name, cached lengths, new tokens, KV heads, G, table width, dtype
        ("decode", [0, 15, 16, 200], 1, 2, 3, 16, jnp.float32),
        ("verify", [5, 127, 128, 300], 6, 2, 3, 20, jnp.float32),
        ("prompt_chunk", [0, 40], 37, 1, 2, 8, jnp.float32),
        ("bf16_verify", [1, 129, 250], 5, 3, 3, 20, jnp.bfloat16),
    )
    def test_matches_oracle(self, lengths, num_new, kv_heads, groups, width, dtype):
        k, v, table = _pages([n + num_new for n in lengths], kv_heads=kv_heads,
                             table_width=width, dtype=dtype)
        q = _queries(len(lengths), kv_heads, groups * num_new)
        lengths = jnp.asarray(lengths, jnp.int32)
        got = self.attend(q, k, v, table, lengths, num_new=num_new)
        np.testing.assert_allclose(np.asarray(got), _oracle(q, k, v, table, lengths, num_new),
                                   rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])

    @parameterized.named_parameters(
        # name, cached lengths, tree nodes, KV heads, G, table width, dtype
        ("small_tree", [5, 127, 0], 6, 2, 3, 20, jnp.float32),
        ("tree_of_33_across_blocks", [100, 250], 33, 1, 3, 24, jnp.float32),
        ("bf16_tree", [1, 129], 9, 3, 3, 20, jnp.bfloat16),
    )
    def test_tree_matches_oracle(self, lengths, num_new, kv_heads, groups, width, dtype):
        k, v, table = _pages([n + num_new for n in lengths], kv_heads=kv_heads,
                             table_width=width, dtype=dtype)
        q = _queries(len(lengths), kv_heads, groups * num_new)
        tree = jnp.asarray(helpers.random_tree(len(lengths), num_new))
        lengths = jnp.asarray(lengths, jnp.int32)
        got = self.attend(q, k, v, table, lengths, num_new=num_new, tree=tree)
        np.testing.assert_allclose(np.asarray(got),
                                   _oracle(q, k, v, table, lengths, num_new, tree),
                                   rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])

    @parameterized.product(dtype=[jnp.float32, jnp.bfloat16])
    def test_a_query_is_computed_alike_in_any_call(self, dtype):
        # Row 0 holds 300 keys; tokens 290..295 are "new" in a verify call of 6, and each one
        # alone in a plain call; row 1 (different data) joins the batch in a third call, and a
        # fourth call uses a table twice as wide.
        groups, kv_heads, width = 3, 2, 20
        k, v, table = _pages([300, 290], kv_heads=kv_heads, table_width=width, dtype=dtype)
        q = _queries(2, kv_heads, groups * 6)          # rows g * 6 + t
        verify = np.asarray(self.attend(q[:1], k, v, table[:1], jnp.asarray([290]), num_new=6))
        batch = np.asarray(self.attend(q, k, v, table, jnp.asarray([290, 284]), num_new=6))
        wide = jnp.pad(table, ((0, 0), (0, width)))
        widened = np.asarray(self.attend(q[:1], k, v, wide[:1], jnp.asarray([290]), num_new=6))
        np.testing.assert_array_equal(batch[:1], verify)
        np.testing.assert_array_equal(widened, verify)
        for t in range(6):
            rows = [g * 6 + t for g in range(groups)]
            plain = np.asarray(self.attend(q[:1, :, rows], k, v, table[:1],
                                           jnp.asarray([290 + t]), num_new=1))
            np.testing.assert_array_equal(plain, verify[:, :, rows], err_msg=f"token {t}")


class CausalAttentionReferenceTest(CausalAttentionTestBase):
    """The XLA reference (the CPU path). It reads whole blocks and masks what lies past each
    query, so the invisible slots hold large finite garbage here (real stale slots are finite)."""

    def partials(self, q, k, v, table, lengths, *, num_new, tree=None):
        k, v = (jnp.where(jnp.isnan(x), 1e4, x) for x in (k, v))
        return causal_lib.causal_attention(q, k, v, table, lengths, layer=LAYER,
                                           num_new=num_new, tree=tree)


class CausalAttentionInterpretTest(CausalAttentionTestBase):
    def partials(self, q, k, v, table, lengths, *, num_new, tree=None):
        return paged_attention.causal_attention(q, k, v, table, lengths, layer=LAYER,
                                                num_new=num_new, interpret=True, tree=tree)


class CausalAttentionGpuTest(CausalAttentionTestBase):
    def setUp(self):
        super().setUp()
        if jax.default_backend() != "gpu":
            self.skipTest("compiled Pallas kernels need a GPU")

    def partials(self, q, k, v, table, lengths, *, num_new, tree=None):
        return paged_attention.causal_attention(q, k, v, table, lengths, layer=LAYER,
                                                num_new=num_new, tree=tree)


class SplitsTest(parameterized.TestCase):

    @parameterized.named_parameters(("short", 100, 256), ("4k", 4096, 256),
                                    ("8k", 8192, 512), ("32k", 32768, 2048))
    def test_split_keys_follow_the_table_only(self, table_keys, expected):
        self.assertEqual(paged_attention.split_keys(table_keys), expected)

    def test_cpu_runs_the_reference(self):
        k, v, table = _pages([40], kv_heads=1, table_width=4, dtype=jnp.float32)
        k, v = (jnp.where(jnp.isnan(x), 0.0, x) for x in (k, v))
        q = _queries(1, 1, 4)
        got = causal_lib.merge_splits(*ops.causal_attention(
            q, k, v, table, jnp.asarray([36]), layer=LAYER, num_new=4))
        np.testing.assert_allclose(np.asarray(got),
                                   _oracle(q, k, v, table, jnp.asarray([36]), 4),
                                   rtol=1e-5, atol=1e-5)


class LoweringTest(parameterized.TestCase):
    """The kernel lowers for CUDA on this CPU-only machine."""

    @parameterized.product(dtype=[jnp.float32, jnp.bfloat16], new_tokens=[1, 17],
                           tree=[False, True])
    def test_lowers_for_cuda(self, dtype, new_tokens, tree):
        pages = jax.ShapeDtypeStruct((30, 200, PAGE_SIZE, 3, 64), dtype)
        args = (jax.ShapeDtypeStruct((4, 3, 3 * new_tokens, 64), jnp.float32), pages, pages,
                jax.ShapeDtypeStruct((4, 40), jnp.int32), jax.ShapeDtypeStruct((4,), jnp.int32))
        if tree:
            args += (jax.ShapeDtypeStruct((4, new_tokens, new_tokens), jnp.bool_),)
        exported = export.export(
            jax.jit(lambda *a: paged_attention.causal_attention(
                *a[:5], layer=7, num_new=new_tokens, tree=a[5] if tree else None)),
            platforms=("cuda",),
            disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
        )(*args)
        self.assertEqual(exported.mlir_module().count("xla.gpu.triton"), 1)
        splits = 3                                   # 640 keys in splits of 256
        rows = (4, 3, splits, 3 * new_tokens)
        self.assertEqual([o.shape for o in exported.out_avals], [(*rows, 64), rows, rows])


if __name__ == "__main__":
    absltest.main()
