"""``fastdata bench``: loaders against each other, against the pipeline users have today
(``baseline``), and against the model's ceiling.

- ``runner``: ``Bench``, which times each row; ``report``: the table, the reliability of a row
  and the plot; ``baseline``: the ImageFolder + PIL + DataLoader pipeline.
"""
from fastdata.bench.report import check_plot_path, figure, plot, table, unreliable
from fastdata.bench.runner import CONTENDERS, Bench, rss_tree_mb

__all__ = ["CONTENDERS", "Bench", "check_plot_path", "figure", "plot", "rss_tree_mb", "table",
           "unreliable"]
