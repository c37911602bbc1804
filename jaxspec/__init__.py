"""jaxspec: model-free speculative decoding for JAX.

Drafts come from text already seen (an n-gram pool on the host, a suffix automaton on the device);
the target model verifies 1 + K positions in one jitted forward; a control plane decides every
iteration whether to speculate and how far.
"""

# Speculation configs and the draft-length schedule
from jaxspec.config import AutoConfig as AutoConfig
from jaxspec.config import NGramConfig as NGramConfig
from jaxspec.config import SAConfig as SAConfig
from jaxspec.config import SAEnhancerConfig as SAEnhancerConfig
from jaxspec.config import suggest_spec_config as suggest_spec_config
from jaxspec.schedule import draft_len_for_batch_size as draft_len_for_batch_size

# Drafters, the acceptance gate and the suffix automaton
from jaxspec.host.drafter import Drafter as Drafter
from jaxspec.host.gate import SpeculationGate as SpeculationGate
from jaxspec.host.ngram import NGramDrafter as NGramDrafter
from jaxspec.host.ngram import NGramPool as NGramPool
from jaxspec.host.sa_manager import SAManager as SAManager
from jaxspec.host.sa_reference import SuffixAutomaton as SuffixAutomaton

# The engine
from jaxspec.engine import Engine as Engine
from jaxspec.engine import Generation as Generation
from jaxspec.host.requests import SamplingParams as SamplingParams
from jaxspec.host.scheduler import SchedulerConfig as SchedulerConfig
