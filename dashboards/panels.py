"""Building blocks shared by laggard's Grafana dashboards (grafana-foundation-sdk builders).

The SDK computes ``gridPos`` but leaves panel ids at 0 and query ``refId`` empty. Grafana needs
both to be unique and stable (links, alerts and library panels address panels by id), so every
panel goes through :class:`Board`, which numbers panels in the order they are added and names
queries ``A``, ``B``, ... in the order given.

Every query selects on the ``$node`` (Prometheus ``instance``: one agent per node) and, where
per rank, the ``$run`` and ``$rank`` template variables (per-rank queries keep ``run`` in their
``by`` clauses, so two runs' rank 0 stay two lines); rates use Grafana's ``$__rate_interval``
so they stay correct at any scrape interval.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import common, prometheus, table, timeseries
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DatasourceVariable,
    QueryVariable,
    Row,
)
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    DataTransformerConfig,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

#: Every panel and variable queries the data source the user picks in ``$datasource``.
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
#: Selector every query carries: the node (Prometheus ``instance``) chosen in ``$node``.
NODE = 'instance=~"$node"'
#: Selector of per-rank queries: the training run chosen in ``$run`` (every per-rank series
#: carries ``run``; a rank number means something only within its run).
RUN = 'run=~"$run"'
#: Selector of per-rank queries.
RANK = 'rank=~"$rank"'
#: Window of ``rate()``/``increase()``: Grafana's own choice, at least 4 scrape intervals.
RATE = "$__rate_interval"
#: Tag on every laggard dashboard (Grafana's dashboard links and search use it).
TAG = "laggard"


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL query of a panel.

    Attributes:
        expr: the PromQL expression (template variables allowed).
        legend: Grafana legend format, e.g. ``"rank {{rank}}"``.
        table: query as an instant table (for table panels) instead of a range of time series.
    """

    expr: str
    legend: str = ""
    table: bool = False

    def builder(self, ref_id: str) -> prometheus.Dataquery:
        """The SDK query builder with the given ``refId``."""
        q = prometheus.Dataquery().expr(self.expr).ref_id(ref_id).datasource(DATASOURCE)
        if self.legend:
            q = q.legend_format(self.legend)
        if self.table:
            q = q.instant().format(PromQueryFormat.TABLE)
        else:
            q = q.range()
        return q


def datasource_variable() -> DatasourceVariable:
    """``$datasource``: any Prometheus data source configured in Grafana."""
    return DatasourceVariable("datasource").label("Data source").type("prometheus")


def label_variable(name: str, label: str, title: str, series: str) -> QueryVariable:
    """A multi-value variable listing the values of ``label`` on ``series``.

    Args:
        name: variable name (``$name`` in queries).
        label: the Prometheus label whose values are listed.
        title: what the drop-down shows.
        series: a series selector, e.g. ``laggard_gpu_info{instance=~"$node"}``.

    "All" expands to ``.*`` so a selector ``label=~"$name"`` also matches series without the
    label's value list being known to Grafana.
    """
    return (
        QueryVariable(name)
        .label(title)
        .datasource(DATASOURCE)
        .query(f"label_values({series}, {label})")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.NATURAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )


def node_variable(series: str) -> QueryVariable:
    """``$node``: the agents' ``instance`` values found on ``series``."""
    return label_variable("node", "instance", "Node", series)


def run_variable(series: str) -> QueryVariable:
    """``$run``: the training runs (``run`` label) found on ``series`` of the chosen nodes."""
    return label_variable("run", "run", "Run", f"{series}{{{NODE}}}")


def rank_variable(series: str) -> QueryVariable:
    """``$rank``: the ranks found on ``series`` of the chosen nodes and runs."""
    return label_variable("rank", "rank", "Rank", f"{series}{{{NODE}, {RUN}}}")


class Board:
    """A dashboard under construction that numbers its panels and queries.

    Args:
        uid: stable dashboard uid (URLs and provisioning refer to it; never change it).
        title: dashboard title.
        description: one line shown in Grafana's dashboard list.
        variables: template variables after ``$datasource``, in display order.
    """

    def __init__(
        self, uid: str, title: str, description: str, variables: list[QueryVariable]
    ) -> None:
        self.uid = uid
        self._next_id = 1
        self._dashboard = (
            Dashboard(title)
            .uid(uid)
            .description(description)
            .tags([TAG])
            .editable()
            .tooltip(DashboardCursorSync.CROSSHAIR)
            .refresh("30s")
            .time("now-1h", "now")
            .timezone("browser")
            .with_variable(datasource_variable())
        )
        for variable in variables:
            self._dashboard = self._dashboard.with_variable(variable)

    def row(self, title: str) -> None:
        """Start a new (expanded) row; the panels added next go under it."""
        self._dashboard = self._dashboard.with_row(Row(title).id(self._take_id()))

    def add(self, panel: Builder[Any], *queries: Query, width: int = 12, height: int = 8) -> None:
        """Add ``panel`` with ``queries`` (refIds ``A``, ``B``, ... in order).

        Args:
            panel: an SDK panel builder with its title, unit and options set.
            queries: one or more queries; at most 26.
            width: grid columns out of 24.
            height: grid rows.

        Raises:
            ValueError: no query, or more than 26.
        """
        if not 1 <= len(queries) <= len(string.ascii_uppercase):
            raise ValueError(f"a panel takes 1 to 26 queries, got {len(queries)}")
        refs = string.ascii_uppercase[: len(queries)]
        targets = [q.builder(ref) for q, ref in zip(queries, refs, strict=True)]
        panel = panel.id(self._take_id()).datasource(DATASOURCE).span(width).height(height)
        self._dashboard = self._dashboard.with_panel(panel.targets(targets))

    def build(self) -> Dashboard:
        """The finished SDK dashboard builder."""
        return self._dashboard

    def _take_id(self) -> int:
        panel_id = self._next_id
        self._next_id += 1
        return panel_id


def series_panel(title: str, unit: str, description: str) -> timeseries.Panel:
    """A time-series panel with laggard's defaults: a table legend with last and max values."""
    return (
        timeseries.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .legend(
            common.VizLegendOptions()
            .display_mode(LegendDisplayMode.TABLE)
            .placement(LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
    )


def table_panel(title: str, description: str) -> table.Panel:
    """A table of an instant query, without the evaluation-time column Prometheus adds."""
    hide_time = DataTransformerConfig(id_val="organize",
                                      options={"excludeByName": {"Time": True}})
    return table.Panel().title(title).description(description).with_transformation(hide_time)


def to_json(dashboard: Dashboard) -> dict[str, Any]:
    """Render an SDK dashboard to the JSON model Grafana imports (a plain dict)."""
    return json.loads(JSONEncoder(sort_keys=True).encode(dashboard.build()))
