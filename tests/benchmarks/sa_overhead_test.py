"""The suffix automaton overhead benchmark runs end to end on tiny inputs (no timing checks)."""

from absl.testing import absltest
from absl.testing import parameterized

from benchmarks import sa_overhead


class SAOverheadTest(parameterized.TestCase):

    @parameterized.parameters("longest", "fixed 3", "global")
    def test_measure_steps(self, mode):
        stream = list(range(7)) * 40
        seconds = sa_overhead.measure_steps(stream, 64, 2, mode, steps=2, warmup=1,
                                            implementation="xla")
        self.assertGreater(seconds, 0.0)

    def test_interpreted_kernels_and_a_given_capacity(self):
        stream = list(range(5)) * 30
        seconds = sa_overhead.measure_steps(stream, 32, 2, "longest", steps=1, warmup=1,
                                            implementation="pallas", capacity=48, interpret=True)
        self.assertGreater(seconds, 0.0)

    def test_markdown(self):
        histories, batches = sa_overhead.HISTORIES, (1, sa_overhead.DECODE_BATCH)
        rows = [dict(history=h, batch_size=b, longest=1e-4)
                for h in histories for b in batches]
        for row in rows:
            row.update({"fixed 3": 2e-4, "global": 3e-4 * row["history"] / 1024})
        ngram = {(h, b): dict(step_us=10.0, first_scan_ms=h / 100)
                 for h in histories for b in batches}
        text = sa_overhead.markdown(dict(build={h: 1e-3 for h in histories}, rows=rows,
                                         ngram=ngram, decode_s=0.1, capacity=33_200,
                                         implementation="xla"), steps=64, repeats=3)
        self.assertIn("**32.8 M tokens/s**", text)
        self.assertIn("* batch 8: SA longest x1.00, SA global x32.00, n-gram first scan x32.0",
                      text)
        self.assertIn("costs at most 100 us = **0.10%** of it (worst mode: 9.60%)", text)
        self.assertIn("| 32,768 | 3,276,812 | 3.1 |", text)


if __name__ == "__main__":
    absltest.main()
