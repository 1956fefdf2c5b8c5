"""A verl `Metric` that aggregates a ratio of sums: the TEPO metrics, weighted by tokens as the loss is.

verl's engines collect each micro-batch's metrics into a `Metric` (verl.utils.py_functional.append_to_dict),
gather one per data-parallel rank (allgather_dict_into_dict) and reduce them per mini-batch with
`Metric.aggregate_dp`: MEAN and SUM values are averaged over ranks first, so a per-micro-batch ratio comes out as
the unweighted mean over micro-batches and ranks, not the mini-batch's value. With dynamic batch size the
micro-batches differ in tokens and responses, and a micro-batch with no masked token pulls a masked mean down.

A `RatioMetric` keeps each micro-batch's (numerator, denominator) and reduces to sum(numerators) /
sum(denominators) over every micro-batch of every rank: exactly the ratio over the whole mini-batch, whatever the
split, with no global count needed (the loss cannot know a global count of, say, masked tokens in advance).
`install()` teaches verl's `Metric.aggregate_dp` to dispatch to it; every other metric is reduced by verl's own
code unchanged. The driver then averages the per-mini-batch values over the step's mini-batches as it does for
every actor metric.
"""

from __future__ import annotations

from verl.utils.metric import AggregationType, Metric

from tepo_verl.core.metrics import ratio_value


class RatioMetric(Metric):
    """Values are (numerator, denominator) pairs; the aggregate is sum(num) / sum(den), `empty` when that is 0/0."""

    def __init__(self, num: float | None = None, den: float | None = None, empty: float = 0.0) -> None:
        super().__init__(aggregation=AggregationType.SUM)
        self.empty = empty
        if num is not None:
            self.append((num, den))

    def append(self, value) -> None:
        if isinstance(value, Metric):
            self.extend(value)
            return
        num, den = value
        self.values.append((float(num), float(den)))

    def extend(self, values) -> None:
        if isinstance(values, Metric) and not isinstance(values, RatioMetric):
            raise ValueError(f"cannot merge a {type(values).__name__} into a RatioMetric")
        for value in values.values if isinstance(values, Metric) else values:
            self.append(value)

    def init_list(self) -> RatioMetric:
        return RatioMetric(empty=self.empty)

    def aggregate(self) -> float:
        return ratio_of_sums([self])


def ratio_of_sums(metrics: list[RatioMetric]) -> float:
    """sum of every numerator / sum of every denominator, over all the metrics' values (micro-batches x ranks)."""
    num = sum(n for metric in metrics for n, _ in metric.values)
    den = sum(d for metric in metrics for _, d in metric.values)
    return ratio_value(num, den, metrics[0].empty)


def _aggregate_dp(cls, metric_lists):
    if metric_lists and isinstance(metric_lists[0], RatioMetric):
        return ratio_of_sums(metric_lists)
    return _aggregate_dp.stock(cls, metric_lists)


def install() -> None:
    """Route RatioMetric through verl's Metric.aggregate_dp (idempotent); loud if verl's Metric has changed."""
    current = Metric.__dict__.get("aggregate_dp")
    if not isinstance(current, classmethod):
        raise RuntimeError("verl.utils.metric.Metric.aggregate_dp is no longer a classmethod; tepo-verl's "
                           "token-weighted metrics need updating for this verl")
    if current.__func__ is _aggregate_dp:
        return
    _aggregate_dp.stock = current.__func__
    Metric.aggregate_dp = classmethod(_aggregate_dp)
