"""A test plugin with a learned scalar per head and distance, clamped at 8 distances: it
declares the table, so posbench can tell which of its rows training reaches."""

from torch import nn

from posbench import AttentionShape, IndexedTable, PositionalEncoding, register_encoding

ROWS = 8


@register_encoding("test_distance_table")
class DistanceTable(PositionalEncoding):
    """bias[h, i, j] = table[min(i - j, 7), h] for keys at or before the query."""

    relative = True

    def __init__(self, shape: AttentionShape):
        super().__init__(shape)
        self.table = nn.Embedding(ROWS, shape.n_heads)

    def rows(self, q_positions, k_positions):
        return (q_positions[:, None] - k_positions[None, :]).clamp(0, ROWS - 1)

    def indexed_tables(self):
        return [IndexedTable("table.weight", "distance", ROWS, self.rows)]

    def position_bias(self, q_span, k_span, layer, device):
        return self.table(self.rows(q_span.arange(device), k_span.arange(device))).permute(2, 0, 1)
