"""A verl `Metric` that aggregates a ratio of sums: the TEPO metrics, weighted by tokens as the loss is.

verl's engines collect each micro-batch's metrics into a `Metric` (verl.utils.py_functional.append_to_dict),
gather one per data-parallel rank (allgather_dict_into_dict) and reduce them per mini-batch with
`Metric.aggregate_dp`: MEAN and SUM values are averaged over ranks first, so a per-micro-batch ratio comes out as
the unweighted mean over micro-batches and ranks, not the mini-batch's value. With dynamic batch size the
micro-batches differ in tokens and responses, and a micro-batch with no masked token pulls a masked mean down.

A `RatioMetric` keeps each micro-batch's (numerator, denominator) and reduces to sum(numerators) /
sum(denominators): exactly the ratio over every token it has seen, whatever the split, with no global count needed
(the loss cannot know a global count of, say, masked tokens in advance). `install()`, called by the first `tepo`
loss of a process, teaches verl's `Metric.aggregate_dp` to merge the ranks' RatioMetrics into one rather than reduce
them to a float (the same worker process then reduces the mini-batch). verl's worker then collects the step's
mini-batches into one RatioMetric (`append_to_dict` merges Metric values), and the driver's `reduce_metrics` reduces
a Metric with its own `aggregate()`: the logged value is the ratio over the whole step, every mini-batch and epoch
weighted by its tokens. (Averaging per-mini-batch values instead would count a mini-batch where a ratio is
undefined, say one with no positive-advantage token, as 0.) Every other metric is reduced by verl's own code
unchanged.

A `FirstMiniBatchMetric` reduces to its statistic (MIN or MAX) over the step's first mini-batch alone: the
on-policy update, where l = l_old up to numerical noise. Its values accumulate per micro-batch on each rank;
`aggregate_dp` seals the ranks' values of one mini-batch into one group, and the step keeps its groups in the
order verl ran them, so `aggregate()` reads the first. (A value that never went through `aggregate_dp` belongs to
no mini-batch: the aggregate is then NaN, logged as unknown, never a statistic over the wrong updates.) The verl
contract (contract.py, "step metric reduction") checks at load time that verl still carries a Metric from the
worker to the driver this way.
"""

from __future__ import annotations

from verl.utils.metric import AggregationType, Metric

from tepo_verl.core.metrics import ratio_value
from tepo_verl.import_hooks import replace


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
        """sum of every numerator / sum of every denominator (micro-batches x ranks x mini-batches)."""
        return ratio_value(sum(n for n, _ in self.values), sum(d for _, d in self.values), self.empty)


class FirstMiniBatchMetric(Metric):
    """Micro-batch values (floats) until `aggregate_dp` seals one mini-batch's into a group; the aggregate is the
    statistic over the first group (the step's first, on-policy, update), NaN when there is none."""

    def __init__(self, aggregation: AggregationType = AggregationType.MAX, value: float | None = None) -> None:
        super().__init__(aggregation=aggregation)
        self.mini_batches: list[list[float]] = []  # sealed groups, in the order verl ran the mini-batches
        if value is not None:
            self.append(value)

    def append(self, value) -> None:
        if isinstance(value, FirstMiniBatchMetric):
            if value.aggregation != self.aggregation:
                raise ValueError(f"aggregation mismatch: {self.aggregation} != {value.aggregation}")
            self.mini_batches.extend(value.mini_batches)
            self.values.extend(value.values)
        elif isinstance(value, Metric):
            raise ValueError(f"cannot merge a {type(value).__name__} into a FirstMiniBatchMetric")
        else:
            self.values.append(float(value))

    def extend(self, values) -> None:
        for value in [values] if isinstance(values, Metric) else values:
            self.append(value)

    def init_list(self) -> FirstMiniBatchMetric:
        return FirstMiniBatchMetric(self.aggregation)

    def aggregate(self) -> float:
        if not self.mini_batches:
            return float("nan")
        return float(self._aggregate(self.mini_batches[0], self.aggregation))


def sealed(metrics: list[FirstMiniBatchMetric]) -> FirstMiniBatchMetric:
    """One group holding every rank's values of one mini-batch."""
    out = metrics[0].init_list()
    out.mini_batches.append([value for metric in metrics for value in metric.values])
    return out


def merged(metrics: list[RatioMetric]) -> RatioMetric:
    """One RatioMetric holding every value of `metrics` (the ranks' of one mini-batch)."""
    out = metrics[0].init_list()
    for metric in metrics:
        out.extend(metric)
    return out


def _merging_ratios(stock_aggregate_dp):
    """verl's Metric.aggregate_dp, with RatioMetric and FirstMiniBatchMetric merged rather than reduced."""

    def aggregate_dp(cls, metric_lists):
        if metric_lists and isinstance(metric_lists[0], RatioMetric):
            return merged(metric_lists)  # reduced by the driver's reduce_metrics, over the whole step
        if metric_lists and isinstance(metric_lists[0], FirstMiniBatchMetric):
            return sealed(metric_lists)  # one mini-batch, kept apart from the step's others
        return stock_aggregate_dp(cls, metric_lists)

    return aggregate_dp


_INSTALLED = False


def install() -> None:
    """Route RatioMetric through verl's Metric.aggregate_dp (idempotent; the first `tepo` loss of a process calls
    it, so a process that never runs that loss keeps verl's Metric as it is); loud if verl's Metric has changed."""
    global _INSTALLED
    if _INSTALLED:
        return
    if not isinstance(Metric.__dict__.get("aggregate_dp"), classmethod):
        raise RuntimeError("verl.utils.metric.Metric.aggregate_dp is no longer a classmethod; tepo-verl's "
                           "token-weighted metrics need updating for this verl")
    replace(Metric, "aggregate_dp", _merging_ratios)
    _INSTALLED = True
