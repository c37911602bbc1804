"""The step-cost model: seconds of one jitted step by (batch rows, K, context bucket).

Measured, not assumed: the executor records the wall time of every step that compiled nothing
under its (rows bucket, K, context bucket) key, and the model keeps the median of the last
`WINDOW` samples. A key never measured is estimated from the widths measured at the same (rows,
context): a verify width (K >= 1) between two measured ones by a straight line between them, one
wider than all of them by a prior slope (`PRIOR_SLOPE`, a verify position costing 13% of a plain
step: the CPU figure for SmolLM2 between K = 4 and 16) from the widest, one narrower than all of
them by the chord from the plain step to the narrowest; with no verify width measured, the plain
step (or 1) times the prior. The plain step (K = 0) is not a point of the lines through verify
widths: it is a different program, and on a CPU the first verify positions cost far more than the
next ones (SmolLM2 on 2 cores: K = 1 1.7x a plain step, K = 4 2.9x, K = 8 2.9x, K = 16 4.1x). A
line fitted through the first widths tried would price K = 16 at 8-12x and adaptive K would never
try it; the prior slope beyond the widest measured width keeps a longer draft worth one try when
the acceptance predictor says so, and its measurement then replaces the guess. Below the narrowest
the same shape makes the chord a lower bound, so a narrower width also gets its one try (the prior
slope down from K = 2 priced K = 1 at 1.51x a plain step at batch 32, where it measured 1.34x, and
AUTO never ran it). Only ratios between widths at one (rows, context) steer a decision, so a wrong
absolute scale costs nothing.

A figure that is too high is never corrected: the width looks dear, is not chosen again, and is not
timed again (one 181 ms sample of K = 12 at 1k tokens, where K = 8 took 71, kept code editing at
K <= 6 from then on). One that is too low corrects itself: the width is chosen and timed. So the
model trusts a key only after `MIN_SAMPLES` samples, whose median resists one outlier; until then
a verify width is priced at the cheaper of its samples' median and the estimate from the trusted
widths, and the plain step, against which every width is weighed, is timed first
(`plain_unsettled`), and again while it looks slower than a verify step, which does all of its
work and more (one 112 ms sample where the plain step took 60 made every width look cheaper than
plain decoding on a 4.9k-token prompt).

The model is kept per model and machine in a JSON file (`default_path`), loaded at start and saved
as it learns; `jaxspec profile` fills it for every bucket and prints it.
"""

import collections
import json
import math
import os
import pathlib
import platform
import statistics

import numpy as np

WINDOW = 16                  # samples kept per key; the median resists noisy neighbours
PRIOR_SLOPE = 0.13           # extra cost per verified position, relative to a plain step
MIN_SAMPLES = 3              # samples before a key's median is trusted to be dear
MIN_CONTEXT_BUCKET = 128
SAVE_EVERY = 64              # new samples between saves


def context_bucket(tokens: int) -> int:
    """Power-of-two bucket of a batch's longest live context (attention reads what is live)."""
    bucket = MIN_CONTEXT_BUCKET
    while bucket < tokens:
        bucket *= 2
    return bucket


def model_key(model, kv_dtype=None) -> str:
    """Names what a step costs for its step-cost file: the architecture, size and dtypes of the
    weights and KV pages (not the weights' values). `kv_dtype` None: the model's dtype."""
    from flax import nnx
    import jax
    import jax.numpy as jnp

    params = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    spec = model.cache_spec
    dtype = jnp.dtype(spec.dtype).name
    kv = jnp.dtype(spec.dtype if kv_dtype is None else kv_dtype).name
    return (f"{type(model).__name__}-L{spec.num_layers}-kv{spec.num_kv_heads}x{spec.head_dim}"
            f"-V{model.vocab_size}-P{params}-{dtype}" + ("" if kv == dtype else f"-kv_{kv}"))


def default_path(model_key: str) -> pathlib.Path:
    """Where a model's cost model lives on this machine: `<model_key>-<machine>.json` in
    `$JAXSPEC_COST_CACHE`, else `$JAXSPEC_CACHE/cost`, else ~/.cache/jaxspec/cost."""
    import jax

    root = os.environ.get("JAXSPEC_COST_CACHE")
    if not root:
        root = pathlib.Path(os.environ.get("JAXSPEC_CACHE") or pathlib.Path.home() / ".cache"
                            / "jaxspec") / "cost"
    device = jax.devices()[0]
    machine = f"{platform.machine()}-{os.cpu_count()}cpu-{device.platform}-{device.device_kind}"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{model_key}-{machine}")
    return pathlib.Path(root) / f"{safe}.json"


class StepCostModel:
    """Step seconds by (rows, k, context bucket), learned online.

    Args:
      path: the JSON file to load from and save to, or None to keep it in memory only.
    """

    def __init__(self, path: pathlib.Path | None = None):
        self.path = path
        self._samples: dict[tuple[int, int, int], collections.deque] = {}
        # `_timed` per (rows, context bucket), until a sample there changes it: a decision asks
        # for it twice (`plain_unsettled`, `costs`), and steps observe one key each.
        self._timed_cache: dict[tuple[int, int], dict[int, tuple[float, int]]] = {}
        self._unsaved = 0
        if path is not None and path.is_file():
            for key, values in json.loads(path.read_text()).items():
                rows, k, context = map(int, key.split(","))
                self._samples[rows, k, context] = collections.deque(values, maxlen=WINDOW)

    def observe(self, rows: int, k: int, context: int, seconds: float) -> None:
        """One measured step (compilation excluded) of `rows` rows, width `k`, at `context`."""
        key = (rows, k, context_bucket(context))
        self._samples.setdefault(key, collections.deque(maxlen=WINDOW)).append(float(seconds))
        self._timed_cache.pop((rows, key[2]), None)
        self._unsaved += 1
        if self._unsaved >= SAVE_EVERY:
            self.save()

    def measured(self, rows: int, k: int, context: int) -> float | None:
        """The median of the samples under this key, or None."""
        samples = self._samples.get((rows, k, context_bucket(context)))
        return statistics.median(samples) if samples else None

    def _timed(self, rows: int, context: int) -> dict[int, tuple[float, int]]:
        """k -> (median seconds, samples) of every width timed at (rows, context bucket)."""
        bucket = context_bucket(context)
        if (rows, bucket) not in self._timed_cache:
            self._timed_cache[rows, bucket] = {
                k: (statistics.median(s), len(s)) for (r, k, c), s in self._samples.items()
                if r == rows and c == bucket and s}
        return self._timed_cache[rows, bucket]

    def plain_unsettled(self, rows: int, context: int) -> bool:
        """Whether the plain step at (rows, context) needs another sample before verify widths
        are weighed against it: timed fewer than `MIN_SAMPLES` times, or slower than a trusted
        verify width (an outlier; the module docstring) while its window has room (a full one
        settles a plain step really as dear as a verify step)."""
        timed = self._timed(rows, context)
        plain, n = timed.get(0, (None, 0))
        if n < MIN_SAMPLES:
            return True
        verify = [t for k, (t, m) in timed.items() if k > 0 and m >= MIN_SAMPLES]
        return n < WINDOW and bool(verify) and plain > min(verify)

    def costs(self, rows: int, context: int, widths) -> np.ndarray:
        """f64[len(widths)] estimated seconds of a step at each width (relative units where
        nothing at this (rows, context) was measured)."""
        timed = self._timed(rows, context)
        known = {k: t for k, (t, n) in timed.items() if n >= MIN_SAMPLES or k == 0}
        widths = np.asarray(widths, np.float64)
        verify = sorted((k, t) for k, t in known.items() if k > 0)
        plain = known.get(0)
        if plain is None:
            plain = verify[0][1] / (1 + PRIOR_SLOPE * verify[0][0]) if verify else 1.0
        # With no verify width measured, the plain step is the one point the prior slope leaves.
        ks, ts = np.asarray(verify or [(0, plain)]).T
        # The plain step starts the line only below the narrowest verify width: the chord.
        estimate = (np.interp(widths, np.r_[0, ks], np.r_[plain, ts])
                    + PRIOR_SLOPE * plain * np.maximum(widths - ks[-1], 0))
        # More positions never cost less: not below the plain step either.
        estimate = np.where(widths == 0, plain, np.maximum(estimate, plain))
        exact = np.asarray([known.get(int(k), np.nan) for k in widths])
        tentative = np.asarray([timed[k][0] if k in timed and k not in known else np.nan
                                for k in map(int, widths)])
        estimate = np.fmin(tentative, estimate)                  # NaN: the estimate
        return np.where(np.isnan(exact), estimate, exact)

    def table(self) -> list[tuple[int, int, int, float, int]]:
        """(rows, k, context bucket, median seconds, samples) for every measured key, sorted."""
        return sorted((r, k, c, statistics.median(s), len(s))
                      for (r, k, c), s in self._samples.items() if s)

    def save(self) -> None:
        """Writes the samples to `path` (atomically); nothing without a path or new samples."""
        if self.path is None or not self._unsaved:
            return
        self._unsaved = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({f"{r},{k},{c}": list(s)
                                   for (r, k, c), s in sorted(self._samples.items())}))
        os.replace(tmp, self.path)
