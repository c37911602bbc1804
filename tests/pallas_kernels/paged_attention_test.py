"""The paged-attention kernel's partials against a dense brute-force oracle, run in interpret mode
on CPU (tiny shapes) and compiled on a GPU, plus its CUDA lowering on this CPU-only machine.

Every slot the kernel must not read holds NaN: the NULL page, slots at or past each row's length,
and every other layer. One read of any of them would turn the sums into NaN.
"""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax import export
import jax.numpy as jnp
import numpy as np

from jaxspec.device import attention
from jaxspec.device import ops
from jaxspec.pallas_kernels import paged_attention
from tests import helpers

PAGE_SIZE = 16
HEAD_DIM = 64
NUM_LAYERS = 2
LAYER = 1
TOLERANCE = {jnp.float32: 1e-5, jnp.bfloat16: 1e-4}


def _inputs(lengths, *, kv_heads, query_rows, table_width, dtype, seed=0):
    """`(q, k_pages, v_pages, page_table, lengths)` with distinct random pages per row."""
    rng = np.random.default_rng(seed)
    rows = len(lengths)
    num_pages = 1 + rows * table_width  # page 0 is the garbage page
    shape = (NUM_LAYERS, num_pages, PAGE_SIZE, kv_heads, HEAD_DIM)
    k, v = rng.standard_normal(shape), rng.standard_normal(shape)
    pages = rng.permutation(np.arange(1, num_pages)).reshape(rows, table_width)
    table = np.zeros((rows, table_width), np.int32)
    for b, n in enumerate(lengths):
        used = -(-n // PAGE_SIZE)
        table[b, :used] = pages[b, :used]
        for pos in range(n, used * PAGE_SIZE):  # stale slots past the length
            k[LAYER, table[b, pos // PAGE_SIZE], pos % PAGE_SIZE] = np.nan
            v[LAYER, table[b, pos // PAGE_SIZE], pos % PAGE_SIZE] = np.nan
    for pages_ in (k, v):
        pages_[:, 0] = np.nan
        pages_[:LAYER] = np.nan
        pages_[LAYER + 1:] = np.nan
    q = rng.standard_normal((rows, kv_heads, query_rows, HEAD_DIM)) * HEAD_DIM ** -0.5
    return (jnp.asarray(q, jnp.float32), jnp.asarray(k, dtype), jnp.asarray(v, dtype),
            jnp.asarray(table), jnp.asarray(lengths, jnp.int32))


def _oracle(q, k_pages, v_pages, page_table, lengths):
    """The partials in float64, from each row's pages gathered densely and cut at its length."""
    q = np.asarray(q, np.float64)
    k = np.asarray(k_pages[LAYER].astype(jnp.float32), np.float64)
    v = np.asarray(v_pages[LAYER].astype(jnp.float32), np.float64)
    _, kv_heads, _, head_dim = q.shape
    acc = np.zeros(q.shape)
    m = np.full(q.shape[:3], paged_attention.MASK_VALUE)
    total = np.zeros(q.shape[:3])
    for b, n in enumerate(np.asarray(lengths)):
        if n == 0:
            continue
        keys = k[np.asarray(page_table[b])].reshape(-1, kv_heads, head_dim)[:n]
        values = v[np.asarray(page_table[b])].reshape(-1, kv_heads, head_dim)[:n]
        scores = np.einsum("hqd,shd->hqs", q[b], keys)
        m[b] = scores.max(axis=-1)
        p = np.exp(scores - m[b][..., None])
        total[b] = p.sum(axis=-1)
        acc[b] = np.einsum("hqs,shd->hqd", p, values)
    return acc, m, total


_CASES = [
    # name, lengths, KV heads, query rows (G * T), table width, pages per block, dtype
    ("empty_and_one", [0, 1], 1, 3, 2, 2, jnp.float32),
    # Around page boundaries, one page per block.
    ("page_boundaries", [15, 16, 17, 31], 1, 3, 2, 1, jnp.float32),
    # Around the 32-slot block boundaries, decode over 3 KV heads; the last row fills its table.
    ("block_boundaries", [31, 32, 33, 64, 80], 3, 3, 5, 2, jnp.float32),
    # Verify (G * T = 3 * 6 and 3 * 16) with padding rows (length 0, table all NULL) in between.
    ("verify_padding_rows", [70, 0, 5, 0], 3, 18, 5, 2, jnp.float32),
    ("verify_k16", [1, 47, 48], 1, 48, 3, 2, jnp.float32),
    ("bf16_block_boundaries", [31, 32, 33, 80], 3, 3, 5, 2, jnp.bfloat16),
    ("bf16_verify", [0, 17, 64], 3, 18, 4, 2, jnp.bfloat16),
]


@absltest.skipThisClass("base class: run through its subclasses")
class CachedAttentionTestBase(parameterized.TestCase):
    """The cases; subclasses choose interpret mode or a compiled kernel."""

    INTERPRET = False

    def attend(self, *args, pages_per_block, num_splits=None):
        """The public op (default splits), or the `pallas_call` with `num_splits` forced."""
        if num_splits is None:
            return paged_attention.cached_attention(*args, layer=LAYER,
                                                    pages_per_block=pages_per_block,
                                                    interpret=self.INTERPRET)
        return jax.jit(functools.partial(
            paged_attention.cached_attention_call, layer=LAYER, pages_per_block=pages_per_block,
            num_splits=num_splits, interpret=self.INTERPRET))(*args)

    def assert_partials_close(self, args, out, dtype):
        expected = _oracle(*args)
        tol = TOLERANCE[dtype]
        for name, got, want in zip(("acc", "m", "l"), out, expected, strict=True):
            self.assertEqual(got.dtype, jnp.float32, name)
            np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol, err_msg=name)

    @parameterized.named_parameters(
        (f"{name}_splits_{splits}", *case, splits)
        for name, *case in _CASES for splits in (None, 1, 2))
    def test_partials_equal_oracle(self, lengths, kv_heads, query_rows, table_width,
                                   pages_per_block, dtype, num_splits):
        args = _inputs(lengths, kv_heads=kv_heads, query_rows=query_rows,
                       table_width=table_width, dtype=dtype)
        out = self.attend(*args, pages_per_block=pages_per_block, num_splits=num_splits)
        self.assert_partials_close(args, out, dtype)

    @parameterized.named_parameters(("empty_rows", 2), ("empty_table", 0))
    def test_nothing_cached_gives_the_neutral_partials(self, table_width):
        args = _inputs([0, 0], kv_heads=1, query_rows=3, table_width=table_width,
                       dtype=jnp.float32)
        acc, m, total = self.attend(*args, pages_per_block=1)
        np.testing.assert_array_equal(np.asarray(acc), 0)
        np.testing.assert_array_equal(np.asarray(m), np.float32(paged_attention.MASK_VALUE))
        np.testing.assert_array_equal(np.asarray(total), 0)


class CachedAttentionReferenceTest(CachedAttentionTestBase):
    """The XLA reference (`jaxspec.device.attention.cached_attention`, the CPU path) on the same
    cases. It reads whole blocks and masks what lies past each length, so stale slots hold large
    finite garbage here instead of NaN (real stale slots are finite: nothing writes NaN)."""

    def attend(self, *args, pages_per_block, num_splits=None):
        del num_splits                      # the kernel's splits: the reference has none
        args = [jnp.where(jnp.isnan(a), 1e4, a) if jnp.issubdtype(a.dtype, jnp.floating) else a
                for a in args]
        return jax.jit(functools.partial(attention.cached_attention, layer=LAYER,
                                         pages_per_block=pages_per_block))(*args)


class CachedAttentionInterpretTest(CachedAttentionTestBase):
    INTERPRET = True


class ImplementationSwitchTest(parameterized.TestCase):
    """`jaxspec.device.ops.attention_partials` picks the kernel or the reference."""

    def _args(self, lengths, *, kv_heads, num_new, table_width):
        q, *cache = _inputs(lengths, kv_heads=kv_heads, query_rows=3 * num_new,
                            table_width=table_width, dtype=jnp.float32)
        return (q, *_new_tokens(len(lengths), kv_heads, num_new), *cache)

    def test_cpu_runs_the_reference(self):
        args = self._args([5, 40], kv_heads=3, num_new=2, table_width=4)
        clean = [jnp.where(jnp.isnan(a), 0.0, a) if jnp.issubdtype(a.dtype, jnp.floating)
                 else a for a in args]
        for implementation in (None, "xla"):
            out = ops.attention_partials(*clean, layer=LAYER, pages_per_block=2,
                                         implementation=implementation)
            for got, want in zip(out, _oracle_with_new(*args), strict=True):
                np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)

    def test_forced_pallas_declines_what_it_cannot_take(self):
        args = self._args([5], kv_heads=1, num_new=67, table_width=2)
        with self.assertRaises(NotImplementedError):
            ops.attention_partials(*args, layer=LAYER, pages_per_block=2,
                                   implementation="pallas")


class CachedAttentionGpuTest(CachedAttentionTestBase):

    def setUp(self):
        super().setUp()
        if jax.default_backend() != "gpu":
            self.skipTest("compiled Pallas kernels need a GPU")

    @parameterized.product(dtype=[jnp.float32, jnp.bfloat16], query_rows=[3, 51])
    def test_long_context(self, dtype, query_rows):
        # SmolLM2's 3 KV heads, K = 16 drafts (G * T = 51), thousands of cached tokens.
        args = _inputs([1, 700, 2048, 0], kv_heads=3, query_rows=query_rows, table_width=160,
                       dtype=dtype)
        self.assert_partials_close(args, self.attend(*args, pages_per_block=8), dtype)


def _new_tokens(rows, kv_heads, num_new, seed=1):
    """`(k_new, v_new)` f32[B, Hkv, T, D] of T new tokens per row."""
    rng = np.random.default_rng(seed)
    shape = (rows, kv_heads, num_new, HEAD_DIM)
    return (jnp.asarray(rng.standard_normal(shape), jnp.float32),
            jnp.asarray(rng.standard_normal(shape), jnp.float32))


def _oracle_with_new(q, k_new, v_new, k_pages, v_pages, page_table, lengths, tree=None):
    """The partials in float64 over each row's cached keys (cut at its length) and the new keys
    at or before each query's token (query r is token r % T), or those `tree` marks."""
    q = np.asarray(q, np.float64)
    k = np.asarray(k_pages[LAYER].astype(jnp.float32), np.float64)
    v = np.asarray(v_pages[LAYER].astype(jnp.float32), np.float64)
    rows, kv_heads, query_rows, head_dim = q.shape
    num_new = k_new.shape[2]
    acc = np.zeros(q.shape)
    m = np.zeros(q.shape[:3])
    total = np.zeros(q.shape[:3])
    for b, n in enumerate(np.asarray(lengths)):
        cached_k = k[np.asarray(page_table[b])].reshape(-1, kv_heads, head_dim)[:n]
        cached_v = v[np.asarray(page_table[b])].reshape(-1, kv_heads, head_dim)[:n]
        for h in range(kv_heads):
            for r in range(query_rows):
                t = r % num_new
                seen = (np.arange(t + 1) if tree is None
                        else np.flatnonzero(np.asarray(tree[b, t])))
                keys = np.concatenate([cached_k[:, h], np.asarray(k_new[b, h])[seen]])
                values = np.concatenate([cached_v[:, h], np.asarray(v_new[b, h])[seen]])
                scores = keys @ q[b, h, r]
                m[b, h, r] = scores.max()
                p = np.exp(scores - m[b, h, r])
                total[b, h, r] = p.sum()
                acc[b, h, r] = p @ values
    return acc, m, total


_NEW_CASES = [
    # name, lengths, KV heads, groups G, new tokens T, table width, pages per block, dtype
    ("decode", [0, 1, 17, 33], 1, 3, 1, 3, 2, jnp.float32),
    ("verify_padding_rows", [70, 0, 5, 0], 3, 3, 6, 5, 2, jnp.float32),
    ("verify_k16", [1, 47, 48], 1, 3, 17, 3, 2, jnp.float32),
    ("one_group_many_tokens", [31, 32], 2, 1, 40, 2, 1, jnp.float32),
    ("bf16_verify", [0, 17, 64], 3, 3, 6, 4, 2, jnp.bfloat16),
]


_TREE_CASES = [
    # name, lengths, KV heads, groups G, tree nodes T, table width, pages per block, dtype
    ("tree_of_7", [70, 0, 5], 3, 3, 7, 5, 2, jnp.float32),
    ("tree_of_33", [1, 47], 1, 3, 33, 3, 2, jnp.float32),
    ("bf16_tree", [0, 17, 64], 3, 3, 9, 4, 2, jnp.bfloat16),
]


@absltest.skipThisClass("base class: run through its subclasses")
class AttentionPartialsTestBase(parameterized.TestCase):
    """`attention_partials` (cached slots and new tokens, the fast path's attention) against the
    oracle; subclasses choose the kernel in interpret mode, compiled, or the XLA reference."""

    INTERPRET = False

    def partials(self, *args, pages_per_block, num_splits=None, tree=None):
        if num_splits is None:
            return paged_attention.attention_partials(*args, layer=LAYER,
                                                      pages_per_block=pages_per_block,
                                                      interpret=self.INTERPRET, tree=tree)
        q, k_new, v_new, *cache = args
        return jax.jit(functools.partial(
            paged_attention.cached_attention_call, layer=LAYER, pages_per_block=pages_per_block,
            num_splits=num_splits, interpret=self.INTERPRET))(q, *cache, k_new=k_new,
                                                              v_new=v_new, tree=tree)

    def check(self, lengths, kv_heads, groups, num_new, table_width, pages_per_block, dtype,
              num_splits=None, tree=False):
        cache = _inputs(lengths, kv_heads=kv_heads, query_rows=groups * num_new,
                        table_width=table_width, dtype=dtype)
        args = (cache[0], *_new_tokens(len(lengths), kv_heads, num_new), *cache[1:])
        mask = jnp.asarray(helpers.random_tree(len(lengths), num_new)) if tree else None
        out = self.partials(*args, pages_per_block=pages_per_block, num_splits=num_splits,
                            tree=mask)
        tol = TOLERANCE[dtype]
        for name, got, want in zip(("acc", "m", "l"), out, _oracle_with_new(*args, tree=mask),
                                   strict=True):
            self.assertEqual(got.dtype, jnp.float32, name)
            np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol, err_msg=name)

    @parameterized.named_parameters(
        (f"{name}_splits_{splits}", *case, splits)
        for name, *case in _NEW_CASES for splits in (None, 1, 3))
    def test_partials_equal_oracle(self, *case):
        self.check(*case)

    @parameterized.named_parameters(
        (f"{name}_splits_{splits}", *case, splits)
        for name, *case in _TREE_CASES for splits in (None, 1, 3))
    def test_tree_partials_equal_oracle(self, *case):
        self.check(*case, tree=True)


class AttentionPartialsReferenceTest(AttentionPartialsTestBase):
    """The XLA reference (`jaxspec.device.attention.attention_partials`, the CPU path); stale
    slots hold large finite garbage instead of NaN, as in `CachedAttentionReferenceTest`."""

    def partials(self, *args, pages_per_block, num_splits=None, tree=None):
        del num_splits
        args = [jnp.where(jnp.isnan(a), 1e4, a) if jnp.issubdtype(a.dtype, jnp.floating) else a
                for a in args]
        return jax.jit(functools.partial(attention.attention_partials, layer=LAYER,
                                         pages_per_block=pages_per_block))(*args, tree=tree)


class AttentionPartialsInterpretTest(AttentionPartialsTestBase):
    INTERPRET = True


class AttentionPartialsGpuTest(AttentionPartialsTestBase):

    def setUp(self):
        super().setUp()
        if jax.default_backend() != "gpu":
            self.skipTest("compiled Pallas kernels need a GPU")

    @parameterized.product(dtype=[jnp.float32, jnp.bfloat16], num_new=[1, 17])
    def test_long_context(self, dtype, num_new):
        self.check([1, 700, 2048, 0], 3, 3, num_new, 160, 8, dtype)


class ValidationTest(parameterized.TestCase):
    """Bad shapes raise ValueError; inputs the kernel does not take raise NotImplementedError."""

    def _args(self, *, rows=2, kv_heads=1, query_rows=3, head_dim=HEAD_DIM, v_heads=None,
              table_rows=None, dtype=jnp.float32):
        def sds(shape, dtype):
            return jax.ShapeDtypeStruct(shape, dtype)

        page = (NUM_LAYERS, 5, PAGE_SIZE)
        return (sds((rows, kv_heads, query_rows, head_dim), jnp.float32),
                sds((*page, kv_heads, head_dim), dtype),
                sds((*page, v_heads or kv_heads, head_dim), dtype),
                sds((table_rows or rows, 2), jnp.int32), sds((rows,), jnp.int32))

    def _call(self, args, layer=LAYER, pages_per_block=1):
        jax.eval_shape(functools.partial(paged_attention.cached_attention, layer=layer,
                                         pages_per_block=pages_per_block), *args)

    @parameterized.named_parameters(
        # name, _args overrides, layer, pages_per_block, message
        ("k_v_mismatch", {"v_heads": 2}, LAYER, 1, "differ"),
        ("table_rows", {"table_rows": 3}, LAYER, 1, r"\(3, 2\)"),
        ("layer", {}, NUM_LAYERS, 1, "layer 2"),
        ("pages_per_block", {}, LAYER, 0, "got 0"),
    )
    def test_value_error(self, overrides, layer, pages_per_block, match):
        with self.assertRaisesRegex(ValueError, match):
            self._call(self._args(**overrides), layer=layer, pages_per_block=pages_per_block)

    @parameterized.named_parameters(
        # name, _args overrides, pages_per_block, message
        ("float16_pages", {"dtype": jnp.float16}, 1, "float16"),
        ("head_dim", {"head_dim": 48}, 1, "head_dim = 48"),
        ("block", {}, 3, "pages_per_block = 48"),
        ("query_rows", {"query_rows": 129}, 1, "129 query rows"),
    )
    def test_not_implemented(self, overrides, pages_per_block, match):
        with self.assertRaisesRegex(NotImplementedError, match):
            self._call(self._args(**overrides), pages_per_block=pages_per_block)

    @parameterized.named_parameters(("tokens", (2, 1, 2, HEAD_DIM)), ("heads", (2, 2, 3, HEAD_DIM)),
                                    ("dim", (2, 1, 3, 32)))
    def test_new_tokens_that_do_not_match_q(self, shape):
        new = jax.ShapeDtypeStruct(shape, jnp.float32)
        q, *cache = self._args()
        with self.assertRaisesRegex(ValueError, "k_new and v_new"):
            jax.eval_shape(functools.partial(paged_attention.attention_partials, layer=LAYER,
                                             pages_per_block=1), q, new, new, *cache)


class LoweringTest(parameterized.TestCase):
    """The kernel lowers for CUDA on this CPU-only machine (catches most GPU-only errors)."""

    @parameterized.product(dtype=[jnp.float32, jnp.bfloat16], new_tokens=[1, 6])
    def test_lowers_for_cuda(self, dtype, new_tokens):
        # SmolLM2-like: 30 layers, 3 KV heads of dim 64, G = 3; 4 rows of 512 slots.
        pages = jax.ShapeDtypeStruct((30, 200, PAGE_SIZE, 3, HEAD_DIM), dtype)
        args = (jax.ShapeDtypeStruct((4, 3, 3 * new_tokens, HEAD_DIM), jnp.float32), pages,
                pages, jax.ShapeDtypeStruct((4, 32), jnp.int32),
                jax.ShapeDtypeStruct((4,), jnp.int32))
        exported = export.export(
            jax.jit(functools.partial(paged_attention.cached_attention, layer=7,
                                      pages_per_block=8)),
            platforms=("cuda",),
            # The Triton custom call has no serialization guarantee; lowering is what we test.
            disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
        )(*args)
        self.assertEqual(exported.mlir_module().count("xla.gpu.triton"), 1)
        rows = (4, 3, 3 * new_tokens)
        self.assertEqual([o.shape for o in exported.out_avals], [(*rows, HEAD_DIM), rows, rows])

    @parameterized.product(dtype=[jnp.float32, jnp.bfloat16], new_tokens=[1, 17],
                           tree=[False, True])
    def test_partials_with_new_tokens_lower_for_cuda(self, dtype, new_tokens, tree):
        pages = jax.ShapeDtypeStruct((30, 200, PAGE_SIZE, 3, HEAD_DIM), dtype)
        new = jax.ShapeDtypeStruct((4, 3, new_tokens, HEAD_DIM), jnp.float32)
        args = (jax.ShapeDtypeStruct((4, 3, 3 * new_tokens, HEAD_DIM), jnp.float32), new, new,
                pages, pages, jax.ShapeDtypeStruct((4, 32), jnp.int32),
                jax.ShapeDtypeStruct((4,), jnp.int32))
        if tree:
            args += (jax.ShapeDtypeStruct((4, new_tokens, new_tokens), jnp.bool_),)
        exported = export.export(
            jax.jit(lambda *a: paged_attention.attention_partials(
                *a[:7], layer=7, pages_per_block=8, tree=a[7] if tree else None)),
            platforms=("cuda",),
            disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
        )(*args)
        text = exported.mlir_module()
        self.assertEqual(text.count("xla.gpu.triton"), 1)
        # The new tokens' scores are inside the kernel: no dot outside it.
        self.assertNotIn("stablehlo.dot_general", text)


if __name__ == "__main__":
    absltest.main()
