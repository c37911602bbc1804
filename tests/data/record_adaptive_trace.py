"""Records what the adaptive control plane learns from in a real run, for the cost-model and
predictor tests (`tests/host/recorded_trace_test.py`):

    python -m tests.data.record_adaptive_trace          # writes tests/data/adaptive_trace.json

SmolLM2-135M on this machine's CPU, adaptive SA (K up to 16), the code-editing workload (copies:
long matches) and MT-bench turn 1 (chat: short ones), batch 1 and 2. Kept: every step the cost
model observed, `[rows, k, context, seconds]`, and every verified row the acceptance predictor
observed, `[match_len, drafted, accepted]`, in order. The file in the repository was recorded on
2026-12-01 on 2 cores shared with other benchmarks (load average about 4.5).
"""

import json
import pathlib

from benchmarks import chat_prompts
from benchmarks import workloads
import jaxspec as js
from jaxspec import models
from jaxspec.host import cost_model as cost_model_lib

OUT = pathlib.Path(__file__).resolve().parent / "adaptive_trace.json"


def record() -> dict:
    model, tokenizer = models.load(None)
    trace = {"steps": [], "rows": []}
    for workload, batch in (("code_editing", 2), ("mtbench_turn1", 1), ("code_editing", 1)):
        prompts = chat_prompts.prompt_ids(model, tokenizer, workloads.load(workload, 2),
                                          max_new_tokens=128)
        engine = js.Engine(model, tokenizer, spec=js.SAConfig(max_draft_len=16, adaptive=True),
                           cost_model=cost_model_lib.StepCostModel(None),   # nothing cached
                           scheduler=js.SchedulerConfig(max_batch_size=batch, max_seq_len=1024))
        executor = engine.executor
        observe_cost, observe_row = executor.costs.observe, executor.predictor.observe

        def cost(rows, k, context, seconds, observe=observe_cost):
            trace["steps"].append([rows, k, context, round(seconds, 6)])
            observe(rows, k, context, seconds)

        def row(match_len, drafted, accepted, observe=observe_row):
            trace["rows"].append([int(match_len), int(drafted), int(accepted)])
            observe(match_len, drafted, accepted)

        executor.costs.observe, executor.predictor.observe = cost, row
        engine.generate_batch(prompts, max_new_tokens=128)
    return trace


if __name__ == "__main__":
    trace = record()
    OUT.write_text(json.dumps(trace, separators=(",", ":")) + "\n")
    print(f"{len(trace['steps'])} steps, {len(trace['rows'])} rows -> {OUT}")
