"""An executor's step programs: their configs, their keys in the compile ledger, their compiles.

One `StepConfig` per (K, greedy, bare), the same object as every other executor's equal
one (`step.canonical`): jit finds a compiled step by identity. A ledger key (compiles.py) names
the config, the rows bucket and the shapes, dtypes and shardings of the weights and the state
the program was compiled for (a small id per such signature), so executors of one process share
what any of them compiled.

A program compiles ahead of time from the shapes alone (`lower(...).compile()`), safe beside
decoding since it reads no array. On a CPU, XLA finishes a program's code at its first call
(compiles.py): that call is made at compile time too, on a scratch state of zeros (an empty cache,
empty automata) and rows that run every loop of the step (`busy`), where the state is at most
`WARM_RUN_MAX_BYTES`. On a mesh the program is the jitted step itself, compiled at its first
call.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.device import step as step_lib
from jaxspec.host import plans

_SIGNATURES: dict = {}          # a step's argument shapes -> a small id
WARM_RUN_MAX_BYTES = 2**30


def abstract(x) -> jax.ShapeDtypeStruct:
    """The shape, dtype and sharding of an array (numpy or jax)."""
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=getattr(x, "sharding", None))


class StepPrograms:
    """The step programs of one executor.

    Args:
      graphdef: the model's canonical graph definition (`step.canonical_graphdef`).
      policy: the executor's `SpecPolicy`.
      params: the weights (a CPU warm run reads them).
      state: the device state (its shapes, with the weights', key the programs).
      layout: how rows reach the step (`plans.Layout`).
      record_top2: steps also return the target's two best logits per position.
      dummy_slot: the automata's dummy slot (padding rows' slot), or None without automata.
    """

    def __init__(self, *, graphdef, policy, params, state, layout: plans.Layout,
                 record_top2: bool, dummy_slot: int | None):
        self.graphdef = graphdef
        self.policy = policy
        self.params = params
        self.layout = layout
        self.record_top2 = record_top2
        self.dummy_slot = dummy_slot
        self._abstract = jax.tree.map(abstract, (params, state))
        leaves, treedef = jax.tree.flatten(self._abstract)
        self._signature = _SIGNATURES.setdefault(
            (treedef, layout.table_cols, tuple((x.shape, x.dtype, x.sharding) for x in leaves)),
            len(_SIGNATURES))
        self._warm_runs = (layout.mesh is None and jax.default_backend() == "cpu"
                           and sum(x.nbytes for x in jax.tree.leaves(state))
                           <= WARM_RUN_MAX_BYTES)
        self._configs: dict[tuple[int, bool, bool], step_lib.StepConfig] = {}

    def config(self, k: int, greedy_only: bool, bare: bool = False) -> step_lib.StepConfig:
        """The config of the step of width `k`; `bare`: a plain step that leaves the automata
        alone (every row rests). A chained step runs the same program (`plans.step_inputs`)."""
        key = (k, greedy_only, bare)
        if key not in self._configs:
            p = self.policy
            automaton = p.uses_automaton and not bare
            self._configs[key] = step_lib.canonical(step_lib.StepConfig(
                graphdef=self.graphdef, k=k, greedy_only=greedy_only,
                draft_source="none" if bare else p.source,
                automaton=automaton, global_pool=p.global_pool and automaton,
                sa_draft_len=p.max_draft_len if automaton else 0,
                max_ngram_size=p.max_ngram_size, min_match_len=p.min_match_len,
                enhancer_threshold=p.enhancer_threshold, top2=self.record_top2,
                implementation=self.layout.implementation, mesh=self.layout.mesh,
                tree=self.tree(k, bare)))
        return self._configs[key]

    def tree(self, k: int, bare: bool) -> bool:
        """Whether the step of width `k` verifies token trees (a plain one never does)."""
        return self.policy.tree and k > 0 and not bare

    def program(self, k: int, greedy_only: bool, rows: int, bare: bool = False):
        """(the compile ledger's key, a function compiling it) of the step of width `k` on `rows`
        rows."""
        cfg = self.config(k, greedy_only, bare)
        return (cfg, rows, self._signature), functools.partial(self._compile, cfg, rows)

    def _compile(self, cfg: step_lib.StepConfig, rows: int):
        """The step of `cfg` on `rows` rows (the module docstring)."""
        if self.layout.mesh is not None:
            return functools.partial(step_lib.step, cfg=cfg)
        zeros = np.zeros((rows,), np.int32)
        slots = zeros if self.dummy_slot is None else np.full((rows,), self.dummy_slot, np.int32)
        plan = plans.Plan(requests=[], rows=rows, k=cfg.k,
                          drafts=np.zeros((rows, cfg.k), np.int32), draft_lens=zeros,
                          matches=zeros, slots=slots, start=0.0, draft_seconds=0.0,
                          decide_seconds=0.0,
                          parents=np.zeros((rows, cfg.k), np.int32) if cfg.tree else None)
        inputs = plans.step_inputs(self.layout, plan)
        params, state = self._abstract
        program = step_lib.step.lower(params, state, jax.tree.map(abstract, inputs),
                                      cfg=cfg).compile()
        if self._warm_runs:
            scratch = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), state)
            jax.block_until_ready(program(self.params, scratch,
                                          busy(inputs, cfg.k, state.kv.page_size)))
        return program


def busy(inputs: step_lib.StepInputs, k: int, page_size: int) -> step_lib.StepInputs:
    """A warm run's inputs: every row verifies `k` drafts behind the longest context but one.

    XLA:CPU compiles a loop's body when the loop first runs it, not at the program's first call:
    padding rows (no context, nothing new) ran no block of attention's loops, and the first real
    step of every program then compiled them, 0.2-0.26 s inside a request (a 5-6x step gap, as
    users run AUTO). At this length both of attention's loops run (`attention.block_loops`, for
    pages of more than one slot), and the automata and verification see real rows.
    """
    rows, cols = inputs.view.page_table.shape
    view = inputs.view.replace(lengths=np.full((rows,), cols * page_size - 1, np.int32),
                               num_new=np.full((rows,), 1 + k, np.int32))
    return inputs.replace(draft_lens=np.full((rows,), k, np.int32), view=view)
