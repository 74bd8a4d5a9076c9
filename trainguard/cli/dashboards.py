"""`trainguard dashboards build|queries`: Grafana dashboards as JSON; their PromQL."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dash = sub.add_parser("dashboards", help="Grafana dashboards (grafanalib)")
    d_sub = dash.add_subparsers(dest="dashboards_command", required=True)
    build = d_sub.add_parser("build", help="write every dashboard as JSON")
    build.add_argument("--out", type=Path, required=True,
                       help="directory (the provisioned one: dashboards/)")
    build.set_defaults(func=_build)
    queries = d_sub.add_parser("queries", help="print every PromQL expression, by dashboard")
    queries.set_defaults(func=_queries)


def _build(args: argparse.Namespace) -> int:
    from trainguard.dashboards.build import write_all

    for path in write_all(args.out):
        print(path)
    return 0


def _queries(args: argparse.Namespace) -> int:
    from trainguard.dashboards.build import build_all
    from trainguard.dashboards.queries import expressions

    for name, doc in build_all().items():
        for q in expressions(doc):
            print(f"{name}\t{q.where}\t{q.expr}")
    return 0
