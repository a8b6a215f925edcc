"""A test plugin encoding that raises during training (a run that fails)."""

from posbench import PositionalEncoding, register_encoding


@register_encoding("test_exploding")
class Exploding(PositionalEncoding):
    """Raises during training."""

    def embed(self, x, span):
        if self.training:
            raise RuntimeError("boom in embed")
        return x
