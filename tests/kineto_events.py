"""Kineto trace documents written here to the format of Kineto ``output_json.cpp`` (see
``laggard.parsers.kineto``), for the reader's and the analysis' tests (importable as
``kineto_events``)."""

from __future__ import annotations


def x(name, ts, dur, cat="cpu_op", tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def document(events, rank=0, world=2, **meta):
    return {"schemaVersion": 1, "traceEvents": events, "traceName": "t",
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world,
                                "pg_config": [{"pg_name": "0", "pg_desc": "default_pg",
                                               "pg_size": world, "ranks": list(range(world))}]},
            **meta}
