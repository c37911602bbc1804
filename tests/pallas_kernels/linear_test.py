"""The row-invariant linear layer, three ways (the XLA reference, the kernel interpreted on CPU,
the kernel compiled on a GPU), against a float64 oracle; each way also shows that a row's result
does not depend on how many rows share the call (bitwise); and the kernel lowers for CUDA here."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax import export
import jax.numpy as jnp
import numpy as np

from jaxspec.device import linear as linear_lib
from jaxspec.device import ops
from jaxspec.pallas_kernels import linear as linear_kernel

EPS = 1e-5
TOLERANCE = {jnp.float32: 2e-5, jnp.bfloat16: 3e-2}


def _inputs(m, k, n, dtype, *, norm, residual, transpose_w, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k))
    w = rng.standard_normal((n, k) if transpose_w else (k, n)) * k ** -0.5
    g = 1 + 0.1 * rng.standard_normal(k) if norm else None
    r = rng.standard_normal((m, n)) if residual else None
    cast = lambda a: None if a is None else jnp.asarray(a, dtype)  # noqa: E731
    return cast(x), cast(w), cast(g), cast(r)


def _oracle(x, w, g, r, *, transpose_w):
    """float64 of the same inputs (each rounded the way the layer rounds: the normed rows to x's
    dtype)."""
    x64 = np.asarray(x.astype(jnp.float32), np.float64)
    if g is not None:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + EPS)
        x64 = np.asarray((normed * g.astype(jnp.float32)[None]).astype(x.dtype).astype(jnp.float32),
                         np.float64)
    w64 = np.asarray(w.astype(jnp.float32), np.float64)
    y = x64 @ (w64.T if transpose_w else w64)
    return y if r is None else y + np.asarray(r.astype(jnp.float32), np.float64)


_CASES = [
    # name, M, K, N, norm, residual, transpose_w
    ("one_row", 1, 64, 128, False, False, False),
    ("verify_rows_norm", 5, 576, 960, True, False, False),
    ("residual", 17, 128, 64, False, True, False),
    ("down_proj", 3, 1536, 576, False, True, False),
    ("lm_head_transposed", 2, 64, 256, True, False, True),
]


@absltest.skipThisClass("base class: run through its subclasses")
class LinearTestBase(parameterized.TestCase):

    def apply(self, x, w, g, r, *, transpose_w, out_dtype=None):
        raise NotImplementedError

    def test_float32_logits_from_bfloat16_rows(self):
        x, w, g, _ = _inputs(3, 64, 256, jnp.bfloat16, norm=True, residual=False,
                             transpose_w=True)
        got = self.apply(x, w, g, None, transpose_w=True, out_dtype=jnp.float32)
        self.assertEqual(got.dtype, jnp.float32)
        np.testing.assert_allclose(np.asarray(got), _oracle(x, w, g, None, transpose_w=True),
                                   rtol=1e-2, atol=1e-2)

    @parameterized.named_parameters(
        (f"{name}_{jnp.dtype(dtype).name}", *case, dtype)
        for name, *case in _CASES for dtype in (jnp.float32, jnp.bfloat16))
    def test_matches_oracle(self, m, k, n, norm, residual, transpose_w, dtype):
        x, w, g, r = _inputs(m, k, n, dtype, norm=norm, residual=residual,
                             transpose_w=transpose_w)
        got = self.apply(x, w, g, r, transpose_w=transpose_w)
        self.assertEqual((got.shape, got.dtype), ((m, n), x.dtype))
        tol = TOLERANCE[dtype]
        np.testing.assert_allclose(np.asarray(got.astype(jnp.float32)),
                                   _oracle(x, w, g, r, transpose_w=transpose_w),
                                   rtol=tol, atol=tol)

    @parameterized.product(dtype=[jnp.float32, jnp.bfloat16], norm=[False, True])
    def test_a_row_does_not_depend_on_its_neighbours(self, dtype, norm):
        # The same first row alone, with 4 more rows (a verify step), and with 40 (many tiles).
        x, w, g, r = _inputs(41, 576, 960, dtype, norm=norm, residual=True, transpose_w=False)
        alone = np.asarray(self.apply(x[:1], w, g, r[:1], transpose_w=False))
        for m in (5, 41):
            got = np.asarray(self.apply(x[:m], w, g, r[:m], transpose_w=False))
            np.testing.assert_array_equal(got[:1], alone, err_msg=f"{m} rows")


class LinearReferenceTest(LinearTestBase):
    def apply(self, x, w, g, r, *, transpose_w, out_dtype=None):
        return linear_lib.linear_reference(x, w, g, r, eps=EPS, transpose_w=transpose_w,
                                           out_dtype=out_dtype)


class LinearInterpretTest(LinearTestBase):
    def apply(self, x, w, g, r, *, transpose_w, out_dtype=None):
        return linear_kernel.linear(x, w, g, r, eps=EPS, transpose_w=transpose_w,
                                    out_dtype=out_dtype, interpret=True)


class LinearGpuTest(LinearTestBase):
    def setUp(self):
        super().setUp()
        if jax.default_backend() != "gpu":
            self.skipTest("compiled Pallas kernels need a GPU")

    def apply(self, x, w, g, r, *, transpose_w, out_dtype=None):
        return linear_kernel.linear(x, w, g, r, eps=EPS, transpose_w=transpose_w,
                                    out_dtype=out_dtype)


class ValidationTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("features", (4, 64), (32, 16), None, None, False, ValueError, "features"),
        ("norm", (4, 64), (64, 16), (32,), None, False, ValueError, "norm_weight"),
        ("residual", (4, 64), (64, 16), None, (4, 8), False, ValueError, "residual"),
        ("odd_n", (4, 64), (64, 24), None, None, False, NotImplementedError, "N = 24"),
    )
    def test_rejects(self, x, w, g, r, transpose_w, error, match):
        sds = lambda s: None if s is None else jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
        with self.assertRaisesRegex(error, match):
            jax.eval_shape(functools.partial(linear_kernel.linear, transpose_w=transpose_w),
                           sds(x), sds(w), sds(g), sds(r))

    def test_switch_falls_back_to_the_reference(self):
        x, w, _, _ = _inputs(3, 64, 24, jnp.float32, norm=False, residual=False,
                             transpose_w=False)
        np.testing.assert_array_equal(ops.linear(x, w, implementation=None),
                                      linear_lib.linear_reference(x, w))
        with self.assertRaises(NotImplementedError):
            ops.linear(x, w, implementation="pallas")


class LoweringTest(parameterized.TestCase):
    """The kernel lowers for CUDA on this CPU-only machine."""

    @parameterized.product(dtype=[jnp.float32, jnp.bfloat16], rows=[1, 40])
    def test_lowers_for_cuda(self, dtype, rows):
        sds = jax.ShapeDtypeStruct
        exported = export.export(
            jax.jit(functools.partial(linear_kernel.linear, transpose_w=True)),
            platforms=("cuda",),
            disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
        )(sds((rows, 576), dtype), sds((49152, 576), dtype), sds((576,), dtype),
          sds((rows, 49152), dtype))
        self.assertEqual(exported.mlir_module().count("xla.gpu.triton"), 1)
        self.assertEqual(exported.out_avals[0].shape, (rows, 49152))


if __name__ == "__main__":
    absltest.main()
