"""Test plugin encodings whose failures a test switches on and off through the environment:
one that fails evaluation at long sequences, one whose training loss turns NaN."""

import os

from posbench import PositionalEncoding, register_encoding


@register_encoding("test_eval_failing")
class EvalFailing(PositionalEncoding):
    """Fails in evaluation past 8 positions while POSBENCH_TEST_FAIL_EVAL is set."""

    def embed(self, x, span):
        if not self.training and len(span) > 8 and os.environ.get("POSBENCH_TEST_FAIL_EVAL"):
            raise MemoryError("simulated: out of memory at a long evaluation length")
        return x


@register_encoding("test_diverging")
class Diverging(PositionalEncoding):
    """Makes the training loss NaN while POSBENCH_TEST_DIVERGE is set."""

    def embed(self, x, span):
        if self.training and os.environ.get("POSBENCH_TEST_DIVERGE"):
            return x * float("nan")
        return x
