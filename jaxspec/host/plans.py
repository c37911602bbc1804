"""A decode step as the executor plans and dispatches it, and the inputs it hands the jitted step.

`Plan` is one decode batch as step 5 decides it (`Executor._plan`); `InFlight`, a dispatched step
whose outputs the host has not read yet. `step_inputs` lays a plan out as `StepInputs` of numpy
arrays, rows past the plan's requests padding them to the compile bucket: jit moves them to the
device in one go, cheaper than a device array per field. `Layout` holds what the layout needs
besides the plan.
"""

import dataclasses

import numpy as np

from jaxspec.device import kv_cache
from jaxspec.device import sampling
from jaxspec.device import step as step_lib
from jaxspec.host import requests as requests_lib


@dataclasses.dataclass(frozen=True, kw_only=True)
class Layout:
    """How an executor's rows reach its steps.

    Attributes:
      table_cols: page-table columns of every row: the longest sequence allowed, so one width
        per compiled bucket (attention reads only up to each row's length).
      implementation, mesh, numerics: as `kv_cache.CacheView`'s.
    """

    table_cols: int
    implementation: str | None
    mesh: object
    numerics: str


@dataclasses.dataclass
class Plan:
    """One decode batch, as decided in step 5."""

    requests: list[requests_lib.Request]
    rows: int                  # the compile bucket: rows past len(requests) are padding
    k: int
    drafts: np.ndarray         # i32[rows, k] host drafts (zeros for automaton drafts)
    draft_lens: np.ndarray     # i32[rows] real draft lengths to verify
    matches: np.ndarray        # i32[rows] match length behind each draft (0: unknown)
    slots: np.ndarray          # i32[rows] automaton slots (dummy slot for padding)
    start: float               # when planning began (step time counts from here)
    draft_seconds: float       # host planning: drafting, the K decision and the gates
    decide_seconds: float      # the K decision and the gates alone
    bare: bool = False         # a plain step that leaves the automata alone (all rows rest)
    parents: np.ndarray | None = None   # i32[rows, k] token trees' parents (`device.tree`)


@dataclasses.dataclass
class InFlight:
    """A dispatched decode step whose outputs the host has not read yet."""

    plan: Plan
    out: step_lib.StepOutputs  # device arrays
    key: tuple                 # the compile ledger's key of its program
    dispatched: float          # when its dispatch began
    compiled: bool             # the dispatch traced (compiled) the step
    chained: bool = False      # dispatched before the step before it was read


def sampling_arrays(reqs, rows: int) -> sampling.SamplingArrays:
    """The requests' sampling parameters, padding rows greedy."""
    pad = rows - len(reqs)
    p = [r.params for r in reqs]
    return sampling.SamplingArrays(
        temperature=np.asarray([x.temperature for x in p] + [0.0] * pad, np.float32),
        top_k=np.asarray([x.top_k for x in p] + [0] * pad, np.int32),
        top_p=np.asarray([x.top_p for x in p] + [1.0] * pad, np.float32),
        seed=np.asarray([x.seed for x in p] + [0] * pad, np.int32))


def view(layout: Layout, reqs, rows: int, lengths, num_new) -> kv_cache.CacheView:
    """Rows' page tables, lengths and valid new tokens; padding rows after the requests."""
    table = np.zeros((rows, layout.table_cols), np.int32)
    for i, r in enumerate(reqs):
        table[i] = r.pages.table_row(layout.table_cols)
    pad = rows - len(reqs)
    return kv_cache.CacheView(page_table=table,
                              lengths=np.asarray(list(lengths) + [0] * pad, np.int32),
                              num_new=np.asarray(list(num_new) + [0] * pad, np.int32),
                              implementation=layout.implementation, mesh=layout.mesh,
                              numerics=layout.numerics)


def step_inputs(layout: Layout, plan: Plan, previous=None) -> step_lib.StepInputs:
    """The plan's step inputs. `previous`: (new tokens, their counts) of the step before, not
    read yet (a chained step: they give each row its last token and length on the device); None
    passes zeros in their place, so a chained step and an unchained one run the same program."""
    reqs, pad = plan.requests, plan.rows - len(plan.requests)
    cache = view(layout, reqs, plan.rows, [r.num_cached for r in reqs], [1 + plan.k] * len(reqs))
    last = [0] * len(reqs) if previous is not None else [r.output[-1] for r in reqs]
    if previous is None:
        previous = (np.zeros((plan.rows, 1 + plan.k), np.int32), np.zeros((plan.rows,), np.int32))
    return step_lib.StepInputs(
        last_tokens=np.asarray(last + [0] * pad, np.int32),
        drafts=plan.drafts, draft_lens=plan.draft_lens, view=cache,
        sampling=sampling_arrays(reqs, plan.rows), slots=plan.slots,
        previous=previous, parents=plan.parents)
