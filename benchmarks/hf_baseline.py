"""The external baseline: Hugging Face transformers on torch CPU, same GGUF, same token ids.

transformers loads the SmolLM2 GGUF itself (dequantized to fp32 `nn.Linear`s; it needs
`accelerate`). Its tokenizer for this GGUF differs from ours where whitespace precedes a digit, so
it is never used: both engines get the same prompt token ids, and outputs are compared as ids.
`prompt_lookup_num_tokens=K` is HF's prompt lookup decoding (batch 1 only), the peer jaxspec's
drafters are measured against.

torch's CPU threads are OpenMP threads, which by default spin while they wait for work. On a
machine whose cores are busy with other processes that collapses throughput (measured here on 2
shared cores: 1.0 tok/s with 2 spinning threads, 7.5 tok/s with `OMP_WAIT_POLICY=PASSIVE`, 12
with 1 thread), so `HFModel.load` sets PASSIVE unless the environment already chose a policy; it
must be set before torch is first imported.

On a GPU (`device="cuda"`, the GPU check's `hf` section) the same float32 model runs under torch's
CUDA build; torch's float32 matmuls there stay IEEE float32 unless a caller allows TF32.
`HFModel.from_llama` puts a jaxspec Llama's weights (the tiny test model) into transformers'
`LlamaForCausalLM`, so the GPU check's CPU smoke run exercises the same code path.

torch, transformers and accelerate come with the `bench` extra; `unavailable_reason()` says what
is missing so callers can skip the baseline with that message.
"""

from collections.abc import Collection
from collections.abc import Sequence
import importlib.util
import os
import pathlib

import numpy as np

INSTALL = "pip install -e '.[bench]'"
REQUIRED = ("torch", "transformers", "accelerate")
OMP_WAIT_POLICY = "OMP_WAIT_POLICY"
UNKNOWN_CONTEXT = 2048        # transformers wants a trained context length; default RoPE ignores it


def unavailable_reason() -> str | None:
    """None when the baseline can run, else which package is missing and how to install it."""
    missing = [name for name in REQUIRED if importlib.util.find_spec(name) is None]
    if missing:
        return f"HF baseline skipped: {', '.join(missing)} not installed ({INSTALL})"
    return None


class HFModel:
    """Greedy generation with a transformers causal LM on token ids.

    Args:
      model: a transformers `PreTrainedModel` with `generate`, in eval mode, on `device`.
      device: the torch device the model is on ("cpu", "cuda").
    """

    def __init__(self, model, device: str = "cpu"):
        self.model = model
        self.device = device

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, *, device: str = "cpu") -> "HFModel":
        """transformers' own load of a GGUF file (None = the embedded SmolLM2), offline, fp32, moved
        to `device`."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault(OMP_WAIT_POLICY, "PASSIVE")
        import torch
        import transformers

        if path is None:
            from jaxspec import models

            path = models.default_gguf_path()
        path = pathlib.Path(path)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32)
        return cls(model.to(device).eval(), device)

    @classmethod
    def from_llama(cls, model, *, device: str = "cpu") -> "HFModel":
        """transformers' `LlamaForCausalLM` holding a jaxspec Llama's weights, in float32.

        Args:
          model: a `jaxspec.models.llama.LlamaForCausalLM` (the tiny test model, say).
          device: the torch device to put it on.
        """
        os.environ.setdefault(OMP_WAIT_POLICY, "PASSIVE")
        import torch
        import transformers

        from jaxspec.models import checkpoint
        from jaxspec.models import hf_loader

        cfg = model.cfg
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
            head_dim=cfg.resolved_head_dim, rope_theta=cfg.rope_theta,
            rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=cfg.tie_embeddings,
            max_position_embeddings=cfg.max_position_embeddings or UNKNOWN_CONTEXT,
            bos_token_id=None, eos_token_id=None))
        params = checkpoint.flat_params(model)
        tensors = {"model.embed_tokens.weight": params["embed.embedding"],
                   "model.norm.weight": params["norm.weight"],
                   "lm_head.weight": params["embed.embedding"] if cfg.tie_embeddings
                   else params["lm_head.kernel"].T}
        for suffix, name in hf_loader._LAYER_TENSORS.items():   # HF name -> ours, one mapping
            for i in range(cfg.num_layers):
                w = params[name][i]
                tensors[f"model.layers.{i}.{suffix}"] = w.T if w.ndim == 2 else w
        hf.load_state_dict({k: torch.tensor(np.asarray(v, np.float32)) for k, v in tensors.items()})
        return cls(hf.to(device).eval(), device)

    @property
    def threads_note(self) -> str:
        """Where HF runs, for result tables: torch's CPU threads and OpenMP wait policy, or the
        GPU's name."""
        import torch

        if self.device != "cpu":
            return f"{self.device}: {torch.cuda.get_device_name(self.device)}"
        policy = os.environ.get(OMP_WAIT_POLICY, "default")
        return f"{torch.get_num_threads()} threads, {OMP_WAIT_POLICY}={policy}"

    def generate(self, prompt: Sequence[int], *, max_new_tokens: int, stop_ids: Collection[int],
                 prompt_lookup_num_tokens: int | None = None) -> list[int]:
        """Greedy continuation of `prompt`: new token ids, the stop token included if one ended it.

        Args:
          prompt: token ids.
          max_new_tokens: tokens to generate at most.
          stop_ids: ids that end generation (empty: run to `max_new_tokens`).
          prompt_lookup_num_tokens: K for prompt lookup decoding, or None for plain greedy.
        """
        import torch
        import transformers

        if not prompt:
            raise ValueError("prompt is empty")
        config = transformers.GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=sorted(stop_ids) or None,
            # generate() wants a pad id for its bookkeeping; batch 1 never pads.
            pad_token_id=min(stop_ids) if stop_ids else 0,
            prompt_lookup_num_tokens=prompt_lookup_num_tokens)
        ids = torch.tensor([list(prompt)], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      generation_config=config)
        return out[0, len(prompt):].tolist()
