"""PNG plots of benchmark results (matplotlib, from the `bench` extra, drawn off-screen).

* `acceptance_histograms`: for each speculating method, the share of verify steps that committed
  1, 2, ..., K+1 tokens (1 = every draft rejected, only the bonus token).
* `throughput_vs_batch`: tokens/s of each method against the batch size, from the sweep.
* `step_time_vs_context`: decode step time of each method against the context length, from the
  context sweep.
"""

from collections.abc import Collection
from collections.abc import Mapping
from collections.abc import Sequence
import pathlib


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on benchmark machines
    from matplotlib import pyplot

    return pyplot


def _save(plt, fig, path: pathlib.Path) -> pathlib.Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _save_lines(plt, fig, ax, path: pathlib.Path, title: str) -> pathlib.Path:
    """A line chart's title, grid and legend, then `_save`."""
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(plt, fig, path)


def acceptance_histograms(histograms: Mapping[str, Mapping[str, int]], path: pathlib.Path,
                          *, title: str) -> pathlib.Path:
    """One bar chart per method of its acceptance-length histogram, side by side.

    Args:
      histograms: ``{method: {str(acceptance length): verify steps}}`` (the engine's
        `acceptance_length_histogram`); methods with an empty histogram are left out.
      path: the PNG to write.
      title: the figure's title.

    Raises:
      ValueError: no method has a histogram.
    """
    histograms = {m: h for m, h in histograms.items() if h}
    if not histograms:
        raise ValueError("no acceptance-length histogram to plot")
    plt = _pyplot()
    longest = max(int(length) for h in histograms.values() for length in h)
    fig, axes = plt.subplots(1, len(histograms), figsize=(3.2 * len(histograms), 3),
                             sharey=True, squeeze=False)
    for ax, (method, hist) in zip(axes[0], histograms.items(), strict=True):
        total = sum(hist.values())
        lengths = range(1, longest + 1)
        ax.bar(lengths, [hist.get(str(n), 0) / total for n in lengths], color="tab:blue")
        ax.set_title(method)
        ax.set_xlabel("tokens committed per step")
        ax.set_xticks(list(lengths))
    axes[0][0].set_ylabel("share of verify steps")
    fig.suptitle(title)
    return _save(plt, fig, path)


def throughput_vs_batch(batch_sizes: Sequence[int], tokens_per_s: Mapping[str, Sequence[float]],
                        path: pathlib.Path, *, title: str,
                        ylabel: str = "tokens/s") -> pathlib.Path:
    """Throughput against batch size, one line per method (log-2 batch axis).

    Args:
      batch_sizes: the x values.
      tokens_per_s: ``{method: one value per batch size}``.
      path: the PNG to write.
      title: the figure's title.
      ylabel: what the values are.

    Raises:
      ValueError: a method's values do not match the batch sizes one to one.
    """
    for method, values in tokens_per_s.items():
        if len(values) != len(batch_sizes):
            raise ValueError(f"{method}: {len(values)} values for {len(batch_sizes)} batch sizes")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, values in tokens_per_s.items():
        ax.plot(batch_sizes, values, marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(batch_sizes), [str(b) for b in batch_sizes])
    ax.set_xlabel("batch size")
    ax.set_ylabel(ylabel)
    return _save_lines(plt, fig, ax, path, title)


def step_time_vs_context(contexts: Sequence[int], step_ms: Mapping[str, Sequence[float | None]],
                         path: pathlib.Path, *, title: str,
                         dashed: Collection[str] = ()) -> pathlib.Path:
    """Decode step time against context length, one line per method (log-2 context axis).

    Args:
      contexts: the x values, prompt lengths in tokens.
      step_ms: ``{method: one step time (ms) or None (not measured) per context}``; a method
        with no value at all is left out.
      path: the PNG to write.
      title: the figure's title.
      dashed: methods drawn dashed, in the colour of the line before them (a derived series,
        e.g. time per committed token next to time per step).

    Raises:
      ValueError: a method's values do not match the contexts one to one, or nothing is left to
        plot.
    """
    for method, values in step_ms.items():
        if len(values) != len(contexts):
            raise ValueError(f"{method}: {len(values)} values for {len(contexts)} contexts")
    step_ms = {m: v for m, v in step_ms.items() if any(x is not None for x in v)}
    if not step_ms:
        raise ValueError("no step time to plot")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    color = None
    for method, values in step_ms.items():
        points = [(c, v) for c, v in zip(contexts, values, strict=True) if v is not None]
        style = dict(linestyle="--", color=color) if method in dashed else {}
        (line,) = ax.plot(*zip(*points, strict=True), marker="o", label=method, **style)
        color = line.get_color()
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(contexts), [f"{c:,}" for c in contexts])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("decode step time (ms)")
    ax.set_ylim(bottom=0)
    return _save_lines(plt, fig, ax, path, title)
