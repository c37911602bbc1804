"""The Python API: generate, stream, batch, choose a drafter, write your own, enhance it.

    python examples/api.py
"""

import jaxspec as js


class RepeatLastDrafter(js.Drafter):
    """A user drafter: propose the last token again (pays off inside runs of spaces or dashes)."""

    def prepare_draft_tokens(self, requests):
        return [[r.tokens[-1]] * min(self.draft_len, r.max_sequence_length - 1 - len(r.tokens))
                for r in requests]


def main():
    capacity = js.SchedulerConfig(max_batch_size=4, max_seq_len=1024)
    engine = js.Engine.load(spec="auto", scheduler=capacity)      # SmolLM2-135M-Instruct

    edit = ("Rewrite this function with the parameter `n` renamed to `count`:\n\n"
            "def repeat(text, n):\n    out = []\n    for _ in range(n):\n        out.append(text)\n"
            "    return ''.join(out)\n")
    out = engine.generate(edit, max_new_tokens=64)
    print(out.text)
    print(f"{out.stats['tokens_per_s']} tok/s, mean acceptance length "
          f"{out.stats['mean_acceptance_length']}")

    for piece in engine.stream("Name three primary colors.", max_new_tokens=24):
        print(piece, end="", flush=True)
    print()

    batch = engine.generate_batch(["What is 2 + 2?", edit], max_new_tokens=32,
                                  spec=js.SAConfig(max_draft_len=4))
    for g in batch.generations:
        print(g.finish_reason, repr(g.text[:60]))

    custom = engine.generate(edit, max_new_tokens=32, spec=RepeatLastDrafter(max_draft_len=2))
    print("custom drafter, accepted", custom.stats["accepted"], "of", custom.stats["drafted"])

    # Any Drafter is a draft source (a draft model, MTP heads...); an enhancer runs a suffix
    # automaton per request beside it, and rows whose automaton match is at least `threshold`
    # tokens long verify the automaton's continuation instead.
    engine.set_spec(RepeatLastDrafter(max_draft_len=4), enhancer=js.SAEnhancerConfig(threshold=3))
    enhanced = engine.generate(edit, max_new_tokens=32)
    print("enhanced drafter, accepted", enhanced.stats["accepted"], "of",
          enhanced.stats["drafted"])
    return out, custom, enhanced


if __name__ == "__main__":
    main()
