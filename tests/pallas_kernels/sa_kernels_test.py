"""One suite for the suffix automaton ops, run three ways: XLA reference, Pallas interpret mode on
CPU (tiny shapes), Pallas compiled (GPU only). Integer outputs are compared exactly with the
brute-force oracle (`sa_reference.naive_*`) and slot arrays with the host builder.
"""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import hypothesis
from hypothesis import strategies as st
import jax
from jax import export
import jax.numpy as jnp
import numpy as np

from jaxspec import sa_layout
from jaxspec.device import sa_global as sa_global_ref
from jaxspec.device import sa_state
from jaxspec.host import sa_build
from jaxspec.host import sa_reference
from jaxspec.pallas_kernels import sa_extend
from jaxspec.pallas_kernels import sa_global
from tests.helpers import draft_rows

# Fixed small shapes, so each implementation compiles once per mode.
NUM_SLOTS = 3
MAX_SEQ_LEN = 48
DRAFT_LEN = 3
ROWS = 4  # NUM_SLOTS rows plus a padding row on the dummy slot
_SETTINGS = hypothesis.settings(max_examples=8, deadline=None, derandomize=True,
                                suppress_health_check=[hypothesis.HealthCheck.too_slow])


@st.composite
def _scenario(draw, max_steps=5):
    """Prompts per slot, then steps: each row's slot (distinct) and its committed chunk."""
    vocab = draw(st.integers(2, 4))
    tokens = st.integers(0, vocab - 1)
    prompts = [draw(st.lists(tokens, max_size=12)) for _ in range(NUM_SLOTS)]
    steps = []
    for _ in range(draw(st.integers(1, max_steps))):
        order = draw(st.permutations(range(NUM_SLOTS + 1)))[:ROWS]
        chunks = [draw(st.lists(tokens, max_size=DRAFT_LEN + 1)) for _ in range(ROWS)]
        active = draw(st.lists(st.booleans(), min_size=NUM_SLOTS, max_size=NUM_SLOTS))
        steps.append((list(order), chunks, active + [draw(st.booleans())]))
    return prompts, steps


def _pool(prompts):
    state = sa_layout.init_state(NUM_SLOTS, MAX_SEQ_LEN)
    for slot, prompt in enumerate(prompts):
        state = sa_state.write_slot(state, jnp.int32(slot), sa_build.build(prompt, MAX_SEQ_LEN))
    return state


def _batch(slots, chunks):
    accepted = np.zeros((len(slots), DRAFT_LEN + 1), np.int32)
    for b, chunk in enumerate(chunks):
        accepted[b, :len(chunk)] = chunk
    return (jnp.asarray(slots, jnp.int32), jnp.asarray(accepted),
            jnp.asarray([len(c) for c in chunks], jnp.int32))



@absltest.skipThisClass("base class: run through its subclasses")
class SAKernelTestBase(parameterized.TestCase):
    """The cases; subclasses choose the implementation."""

    IMPLEMENTATION = "xla"
    INTERPRET = False

    def extend_and_lookup(self, state, slots, accepted, num_accepted, **kwargs):
        if self.IMPLEMENTATION == "xla":
            return sa_state.extend_and_lookup(state, slots, accepted, num_accepted, **kwargs)
        return sa_extend.sa_extend_and_lookup(state, slots, accepted, num_accepted,
                                              interpret=self.INTERPRET, **kwargs)

    def extend_and_global_search(self, state, slots, accepted, num_accepted, active, **kwargs):
        if self.IMPLEMENTATION == "xla":
            return sa_global_ref.extend_and_global_search(state, slots, accepted, num_accepted,
                                                          active, **kwargs)
        return sa_global.sa_extend_and_global_search(state, slots, accepted, num_accepted,
                                                     active, interpret=self.INTERPRET, **kwargs)

    def _assert_slots_match_host_build(self, state, texts):
        for slot, text in enumerate(texts):
            host = sa_build.build(text, MAX_SEQ_LEN)
            for name in sa_layout.SAState.__dataclass_fields__:
                np.testing.assert_array_equal(np.asarray(getattr(state, name)[slot]),
                                              getattr(host, name), err_msg=f"{slot=} {name}")
        dummy = state.slot(NUM_SLOTS)
        self.assertFalse(any(np.asarray(a).any() for a in jax.tree.leaves(dummy)))

    @parameterized.named_parameters(
        dict(testcase_name="longest", max_ngram_size=-1),
        dict(testcase_name="fixed_1", max_ngram_size=1),
        dict(testcase_name="fixed_3", max_ngram_size=3),
    )
    def test_growth_equals_oracle(self, max_ngram_size):
        @hypothesis.given(scenario=_scenario())
        @_SETTINGS
        def check(scenario):
            prompts, steps = scenario
            texts = [list(p) for p in prompts]
            state = _pool(prompts)
            for slots, chunks, _ in steps:
                state, *outs = self.extend_and_lookup(state, *_batch(slots, chunks),
                                                      draft_len=DRAFT_LEN,
                                                      max_ngram_size=max_ngram_size)
                expected = []
                for slot, chunk in zip(slots, chunks, strict=True):
                    if slot == NUM_SLOTS:
                        expected.append((0, []))
                        continue
                    texts[slot] += chunk
                    expected.append(sa_reference.naive_draft(texts[slot], DRAFT_LEN,
                                                             max_ngram_size))
                self.assertEqual(draft_rows(*outs), expected)
            self._assert_slots_match_host_build(state, texts)

        check()

    @parameterized.named_parameters(
        dict(testcase_name="longest", max_ngram_size=-1),
        dict(testcase_name="fixed_2", max_ngram_size=2),
    )
    def test_global_search_equals_oracle(self, max_ngram_size):
        @hypothesis.given(scenario=_scenario())
        @_SETTINGS
        def check(scenario):
            prompts, steps = scenario
            texts = [list(p) for p in prompts] + [[]]
            state = _pool(prompts)
            for slots, chunks, active in steps:
                state, *outs = self.extend_and_global_search(
                    state, *_batch(slots, chunks), jnp.asarray(active), draft_len=DRAFT_LEN,
                    max_ngram_size=max_ngram_size)
                for slot, chunk in zip(slots, chunks, strict=True):
                    if slot != NUM_SLOTS:
                        texts[slot] += chunk
                expected = [sa_reference.naive_global_draft(texts, slot, active, DRAFT_LEN,
                                                            max_ngram_size) for slot in slots]
                self.assertEqual(draft_rows(*outs), expected)
            self._assert_slots_match_host_build(state, texts[:NUM_SLOTS])

        check()

    @parameterized.product(pad=[False, True], max_ngram_size=[-1, 2])
    def test_hand_computed(self, pad, max_ngram_size):
        # slot 0: "1 2 3 1 2" -> the suffix "1 2" first ends at index 1: draft 3 1 2.
        # slot 1: "4 4 4 4" -> longest: "4 4 4" first ends at 2, draft 4; fixed 2: "4 4" first
        # ends at 1, draft 4 4.
        # slot 2: "5 6" -> no repeat, no draft.
        prompts = [[1, 2, 3], [4, 4], [5]]
        slots, chunks = [0, 1, 2], [[1, 2], [4, 4], [6]]
        if pad:  # padding rows on the dummy slot change nothing
            slots, chunks = [NUM_SLOTS] + slots, [[9, 9, 9]] + chunks
        state, *outs = self.extend_and_lookup(_pool(prompts), *_batch(slots, chunks),
                                              draft_len=DRAFT_LEN, max_ngram_size=max_ngram_size)
        expected = [(2, [3, 1, 2]), (3, [4]) if max_ngram_size == -1 else (2, [4, 4]), (0, [])]
        self.assertEqual(draft_rows(*outs), [(0, [])] * pad + expected)
        self._assert_slots_match_host_build(state, [[1, 2, 3, 1, 2], [4, 4, 4, 4], [5, 6]])

    @parameterized.named_parameters(
        # Equal match lengths: the own slot wins over a longer continuation elsewhere.
        dict(testcase_name="own_slot_wins", prompts=[[1, 2, 5, 6, 7, 8], [9, 1, 2, 3, 1, 2], []],
             own=1, expected=(2, [3, 1, 2])),
        # A longer match elsewhere beats the own slot.
        dict(testcase_name="longer_match_wins", prompts=[[7, 1, 2, 4], [1, 2, 3, 7, 1, 2], []],
             own=1, expected=(3, [4])),
        # Two other slots match "8"; slot 1's continuation is longer.
        dict(testcase_name="longer_continuation", prompts=[[8, 4, 1], [8, 4, 2, 2, 2], [3, 8]],
             own=2, expected=(1, [4, 2, 2])),
        # Full tie between slots 0 and 1: the lower slot index wins.
        dict(testcase_name="lower_slot", prompts=[[8, 5], [8, 6], [3, 8]], own=2,
             expected=(1, [5])),
        # Same, with the tie on the higher slots: the own slot 0 has no continuation.
        dict(testcase_name="lower_slot_above_own", prompts=[[3, 8], [8, 5], [8, 6]], own=0,
             expected=(1, [5])),
    )
    def test_global_ranking(self, prompts, own, expected):
        state, *outs = self.extend_and_global_search(
            _pool(prompts), *_batch([own], [[]]), jnp.ones(NUM_SLOTS + 1, jnp.bool_),
            draft_len=DRAFT_LEN)
        self.assertEqual(draft_rows(*outs), [expected])

    def test_capacity_drops_tokens(self):
        prompts = [[1, 2] * (MAX_SEQ_LEN // 2 - 1), [], []]
        slots, chunks = [0, 1], [[1, 2, 1, 2], [3]]
        state, *_ = self.extend_and_lookup(_pool(prompts), *_batch(slots, chunks),
                                           draft_len=DRAFT_LEN)
        self._assert_slots_match_host_build(state, [[1, 2] * (MAX_SEQ_LEN // 2), [3], []])


class SAKernelReferenceTest(SAKernelTestBase):
    IMPLEMENTATION = "xla"


class SAKernelInterpretTest(SAKernelTestBase):
    IMPLEMENTATION = "pallas"
    INTERPRET = True


class SAKernelGpuTest(SAKernelTestBase):
    IMPLEMENTATION = "pallas"

    def setUp(self):
        super().setUp()
        if jax.default_backend() != "gpu":
            self.skipTest("compiled Pallas kernels need a GPU")


def _abstract_args(rows=5, width=4, num_slots=3, max_seq_len=40):
    def i32(*shape):
        return jax.ShapeDtypeStruct(shape, jnp.int32)

    state = jax.eval_shape(lambda: sa_layout.init_state(num_slots, max_seq_len))
    return state, i32(rows), i32(rows, width), i32(rows)


class LoweringTest(parameterized.TestCase):
    """Each kernel lowers for CUDA on this CPU-only machine (catches most GPU-only errors)."""

    def _export(self, fn, *args):
        exported = export.export(
            jax.jit(fn), platforms=("cuda",),
            # The Triton custom call has no serialization guarantee; lowering is what we test.
            disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
        )(*args)
        return exported.mlir_module()

    @parameterized.parameters(-1, 3)
    def test_extend_and_lookup_lowers_for_cuda(self, max_ngram_size):
        module = self._export(functools.partial(sa_extend.sa_extend_and_lookup, draft_len=4,
                                                max_ngram_size=max_ngram_size),
                              *_abstract_args())
        self.assertEqual(module.count("xla.gpu.triton"), 1)

    @parameterized.parameters(-1, 3)
    def test_extend_and_global_search_lowers_for_cuda(self, max_ngram_size):
        module = self._export(
            functools.partial(sa_global.sa_extend_and_global_search, draft_len=4,
                              max_ngram_size=max_ngram_size),
            *_abstract_args(), jax.ShapeDtypeStruct((4,), jnp.bool_))
        self.assertEqual(module.count("xla.gpu.triton"), 2)


if __name__ == "__main__":
    absltest.main()
