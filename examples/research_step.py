"""Drive jaxspec's jitted step yourself: one request, suffix-automaton drafts, no executor.

This is the research-script view of the engine: every piece of state is a pytree you own — the KV
pages, the automata (`SAState`), the draft buffer — and one jitted call per iteration runs the
forward over [last token + K drafts], verifies, commits, extends the automaton and leaves the next
drafts on the device. The host only moves the sequence length (that is the KV rollback).

    python examples/research_step.py                   # SmolLM2-135M on a real code edit
    python examples/research_step.py --tiny --steps 8  # the tiny random model, seconds
"""

import argparse
import inspect
import textwrap

from flax import nnx
import jax.numpy as jnp
import numpy as np

from jaxspec.device import kv_cache
from jaxspec.device import sampling
from jaxspec.device import step as step_lib
from jaxspec.host import sa_slots


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="use the tiny random test model")
    parser.add_argument("--steps", type=int, default=40, help="verify steps to run")
    parser.add_argument("--k", type=int, default=5, help="draft tokens per step")
    args = parser.parse_args(argv)

    if args.tiny:
        from jaxspec.models import tiny
        model, tokenizer = tiny.tiny_model(seed=0), None
        prompt = [3, 1, 4, 1, 5, 9, 2, 6] * 4
    else:
        from jaxspec import models
        model, tokenizer = models.load(None)
        source = inspect.getsource(textwrap.indent)
        prompt = tokenizer.encode(tokenizer.apply_chat_template([{
            "role": "user", "content": f"Copy this function exactly:\n\n{source}"}]))

    graphdef, params = nnx.split(model)
    page_size, max_len = 16, len(prompt) + args.steps * (args.k + 1) + 1
    num_cols = -(-max_len // page_size)
    spec = model.cache_spec
    kv = kv_cache.init_pages(num_layers=spec.num_layers, num_pages=num_cols + 1,
                             page_size=page_size, num_kv_heads=spec.num_kv_heads,
                             head_dim=spec.head_dim)
    page_table = jnp.arange(1, num_cols + 1, dtype=jnp.int32)[None]   # one sequence, all pages
    greedy = sampling.SamplingArrays(temperature=jnp.zeros(1), top_k=jnp.zeros(1, jnp.int32),
                                     top_p=jnp.ones(1), seed=jnp.zeros(1, jnp.int32))

    # 1) Device state: the KV pages and one automaton slot (plus the dummy slot for padding).
    slot_book = sa_slots.SASlots(max_slots=1, max_seq_len=max_len + args.k, max_num_requests=1)
    state = step_lib.init_state(kv, slot_book.new_state(), draft_len=args.k)
    cfg = step_lib.StepConfig(graphdef=graphdef, k=args.k, draft_source="sa", automaton=True,
                              sa_draft_len=args.k)

    # 2) Prefill the prompt; the chosen token is the first generated one.
    view = kv_cache.CacheView(page_table=page_table, lengths=jnp.zeros(1, jnp.int32),
                              num_new=jnp.asarray([len(prompt)], jnp.int32))
    state, first, _ = step_lib.prefill(params, state, jnp.asarray([prompt], jnp.int32), view,
                                    greedy, cfg=cfg)
    tokens, length = list(prompt) + [int(first[0])], len(prompt)      # length = tokens cached

    # 3) The text so far as an automaton (built on the host), copied in; its first drafts.
    slot_book.add_request("r0", tokens)
    sa, mask = slot_book.flush(state.sa, state.active_mask)
    state = state.replace(sa=sa, active_mask=mask)
    slots = jnp.asarray(slot_book.slots(["r0"]))
    state, draft_lens, _ = step_lib.prime_drafts(state, slots, cfg=cfg)

    # 4) The loop: one jitted call per iteration; the host moves the length, nothing else.
    committed_per_step = []
    for _ in range(args.steps):
        inputs = step_lib.StepInputs(
            last_tokens=jnp.asarray([tokens[-1]], jnp.int32), drafts=jnp.zeros((1, 0), jnp.int32),
            draft_lens=draft_lens, slots=slots, sampling=greedy,
            view=kv_cache.CacheView(page_table=page_table, lengths=jnp.asarray([length]),
                                    num_new=jnp.asarray([1 + args.k], jnp.int32)))
        state, out = step_lib.step(params, state, inputs, cfg=cfg)
        draft_lens = out.next_draft_lens          # the next drafts are already on the device
        n = int(out.num_new_tokens[0])
        tokens += [int(t) for t in np.asarray(out.new_tokens[0, :n])]
        length += n                     # rollback of the rejected drafts = not counting them
        committed_per_step.append(n)
        if tokenizer is not None and tokenizer.eos_token_ids[0] in tokens[len(prompt):]:
            break

    generated = tokens[len(prompt):]
    print(tokenizer.decode(generated) if tokenizer else generated)
    print(f"{len(generated)} tokens in {len(committed_per_step)} steps: mean acceptance length "
          f"{np.mean(committed_per_step):.2f}")
    return generated


if __name__ == "__main__":
    main()
