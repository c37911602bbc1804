"""The warm run of a CPU program: inputs that run every loop of the step."""

import numpy as np
import pytest

from jaxspec.device import attention
from jaxspec.host import plans
from jaxspec.host import programs


@pytest.mark.parametrize("cols,page_size,k", [(17, 16, 0), (40, 16, 5), (256, 16, 16),
                                              (129, 2, 3)])
def test_a_warm_run_verifies_k_drafts_on_every_row_through_both_attention_loops(cols, page_size,
                                                                               k):
    """XLA:CPU compiles a loop's body when the loop first runs: padding rows (no context) left
    every block loop of attention to the first real step, a 0.2 s gap inside a request."""
    layout = plans.Layout(table_cols=cols, implementation=None, mesh=None, numerics="fast")
    rows = 2
    zeros = np.zeros((rows,), np.int32)
    plan = plans.Plan(requests=[], rows=rows, k=k, drafts=np.zeros((rows, k), np.int32),
                      draft_lens=zeros, matches=zeros, slots=zeros, start=0.0, draft_seconds=0.0,
                      decide_seconds=0.0)
    inputs = programs.busy(plans.step_inputs(layout, plan), k, page_size)
    assert inputs.view.num_new.tolist() == [1 + k] * rows
    assert inputs.draft_lens.tolist() == [k] * rows
    length = int(inputs.view.lengths.max())
    assert length < cols * page_size
    for pages_per_block in (attention.DECODE_PAGES_PER_BLOCK, attention.PREFILL_PAGES_PER_BLOCK):
        pages, tail, whole, stop = map(int, attention.block_loops(cols, page_size,
                                                                  pages_per_block, length))
        assert whole >= 1, "the loop over whole blocks never runs"
        assert stop > whole * pages // tail, "the loop over tail blocks never runs"
