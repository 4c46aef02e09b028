"""Turns raw results into the comparisons with targets and the markdown report.

Targets (see ``bench/README.md``):

- ax embedded per-node overhead / a peer's (LangGraph with SqliteSaver; DBOS on a
  SQLite system database) per-node overhead ≤ 0.5;
- the SDK: one-shot ``ax.run`` of the financial shape at most twice LangGraph's open +
  build + compile + invoke of the same graph per call, with wall time ≤ 1.5 times CPU
  time; the reusable engine (``ax.open``) per-node overhead ≤ 0.5 of each peer's on the
  chain and the financial shape;
- a reconciler pass is flat in the number of finished tasks: median pass time with
  10,000 finished / with 10 ≤ 1.5, and the same store reads per pass;
- ax on etcd + Redis, engine in process: node throughput ≥ 80 % of the floor;
- ax through API + executors: node throughput ≥ 50 % of the floor;
- per-node cost flat in DAG size and in concurrency: growth (cost at the largest size
  / cost at the smallest) ≤ 1.5.

The workloads a comparison holds against each other ran in rounds that took turns (see
``bench.runner``): each result is its median round, with every round under ``rounds``
(a section's floors under ``floors``). A comparison is judged on the median of its
per-round ratios, round i of one side against round i of the other, since those were
taken seconds apart while the machine's speed drifts by a third over minutes; its
figures are the sides' median rounds. Results without rounds (an older file) give the
single ratio.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["FLAT", "ONESHOT_TARGET", "PEER_TARGET", "WALL_OVER_CPU_TARGET", "markdown",
           "not_succeeded", "summarize"]

#: Growth factor up to which a per-node cost counts as flat.
FLAT = 1.5
#: ax per-node overhead / a peer's, at most.
PEER_TARGET = 0.5
#: One-shot ``ax.run`` per call / LangGraph's open + build + compile + invoke, at most.
ONESHOT_TARGET = 2.0
#: Wall time / CPU time of a one-shot ``ax.run``, at most (no waiting on timers).
WALL_OVER_CPU_TARGET = 1.5

#: The peers: label, key under ``results["peer"]``, key of their chains in scaling.
_PEERS = (("LangGraph", "langgraph", "langgraph_chain"), ("DBOS", "dbos", "dbos_chain"))

_Result = Mapping[str, Any]

# Which floor each engine workload is held against: sequential work can use only one
# operation at a time; concurrent work can overlap them.
_FLOOR_OF = {
    "chain_default_lane": "etcd_redis_sequential",
    "chain_fast_lane": "etcd_redis_sequential",
    "financial_sequential_default_lane": "etcd_redis_sequential",
    "financial_sequential_fast_lane": "etcd_redis_sequential",
    "financial_concurrent": "etcd_redis_concurrent_8",
    "financial_concurrent_fast_lane": "etcd_redis_concurrent_8",
    "fanout": "etcd_redis_concurrent_8",
}


def _get(data: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(data, Mapping) or key not in data:
            return None
        data = data[key]
    return data


def _ok(result: Any) -> bool:
    return isinstance(result, Mapping) and "error" not in result and bool(result)


def _quotient(a: Any, b: Any) -> float | None:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return None
    if math.isnan(a) or math.isnan(b):
        return None
    return a / b


def _ratio(a: Any, b: Any) -> float | None:
    q = _quotient(a, b)
    return None if q is None else round(q, 3)


#: One side of a comparison: its figure in the median round, and in every round (None
#: for a result without rounds).
_Side = tuple[Any, Sequence[Any] | None]


def _side(result: Any, *path: str) -> _Side:
    """The figure at ``path`` of ``result`` (its median round) and of each of its rounds;
    a round that failed gives None."""
    rounds = _get(result, "rounds")
    per_round = ([_get(r, *path) if _ok(r) else None for r in rounds]
                 if isinstance(rounds, Sequence) and rounds else None)
    return _get(result, *path), per_round


def _paired_ratio(a: _Side, b: _Side) -> tuple[float | None, list[float]]:
    """``a / b`` and the per-round ratios it was judged on.

    With rounds on both sides: the median (for an even count the mean of the middle
    two) of the ratios of round i of ``a`` to round i of ``b``, skipping a round where
    either side failed. Pairing matters: the two sides of a round were taken seconds
    apart, so a slow minute of the machine weighs on both and cancels out of that
    round's ratio, whereas a ratio of the two sides' medians may pair a fast round with
    a slow one. When a side has no rounds (an older results file), or no round ran on
    both sides: the ratio of the figures, and no per-round ratios.
    """
    if a[1] is not None and b[1] is not None:
        ratios = [q for x, y in zip(a[1], b[1], strict=False)
                  if (q := _quotient(x, y)) is not None]
        if ratios:
            return round(statistics.median(ratios), 3), [round(q, 3) for q in ratios]
    return _ratio(a[0], b[0]), []


def _round_median(side: _Side) -> tuple[float | None, list[float]]:
    """A figure that is already a ratio (wall / CPU of one run) judged over rounds: the
    median of the rounds' values; the single value without rounds."""
    values = [float(v) for v in side[1] or () if isinstance(v, int | float)]
    if not values:
        return (side[0] if isinstance(side[0], int | float) else None), []
    return round(statistics.median(values), 3), values


def _cmp(name: str, value: float | None, target: str, met: bool | None,
         detail: str, *, percent: bool = False,
         rounds: Sequence[float] = ()) -> dict[str, Any]:
    """One comparison; ``rounds`` are the per-round ratios its value is the median of,
    listed after the figures."""
    if rounds:
        fmt = "{:.1%}" if percent else "{:.2f}"
        detail += "; rounds " + ", ".join(fmt.format(r) for r in rounds)
    return {"name": name, "value": value, "target": target, "met": met, "detail": detail,
            "percent": percent, "rounds": list(rounds)}


def _at_most(name: str, value: float | None, limit: float, detail: str,
             rounds: Sequence[float] = ()) -> dict[str, Any]:
    return _cmp(name, value, f"≤ {limit:g}", None if value is None else value <= limit,
                detail, rounds=rounds)


def _vs(name: str, a: _Side, b: _Side, limit: float, detail: str) -> dict[str, Any]:
    """``a / b ≤ limit``, judged on the median of the paired per-round ratios."""
    value, rounds = _paired_ratio(a, b)
    return _at_most(name, value, limit, detail, rounds)


def _chain_overhead(name: str, label: str, ax: Any, peer: Any) -> dict[str, Any]:
    a = _side(ax, "node_latency", "ready_to_committed", "p50_ms")
    b = _side(peer, "step_interval", "p50_ms")
    return _vs(name, a, b, PEER_TARGET,
               f"ax ready→committed p50 {a[0]} ms vs {label} step p50 {b[0]} ms")


def _wall_per_node(name: str, ax_label: str, ax: Any, label: str, peer: Any) \
        -> dict[str, Any]:
    """ax's wall time per node against a peer's."""
    a, b = _side(ax, "wall_per_node_ms"), _side(peer, "wall_per_node_ms")
    return _vs(name, a, b, PEER_TARGET, f"{ax_label} {a[0]} ms vs {label} {b[0]} ms")


def _vs_peer(emb: _Result, peers: _Result, scaling: _Result) -> list[dict[str, Any]]:
    """ax embedded against each peer, the same comparison for every peer in a row."""
    out = []
    ax_chains = scaling.get("chain") or {}
    main = str(_get(emb, "chain", "size"))
    sizes = {n for _, _, key in _PEERS for n in (scaling.get(key) or {})
             if n in ax_chains and n != main}
    for n in sorted(sizes, key=int):
        for label, _, key in _PEERS:
            peer_chain = (scaling.get(key) or {}).get(n)
            if peer_chain is not None:
                out.append(_chain_overhead(
                    f"embedded / {label}, chain of {n} per-node overhead (p50)", label,
                    ax_chains[n], peer_chain))
    chain_ax: Any = emb.get("chain")
    for label, key, _ in _PEERS:
        chain_peer: Any = _get(peers, key, "chain")
        if _ok(chain_ax) and _ok(chain_peer):
            out.append(_chain_overhead(
                f"embedded / {label}, chain of {chain_ax.get('size')} per-node overhead "
                "(p50)", label, chain_ax, chain_peer))
    for name in ("chain", "fanout", "financial_sequential", "financial_concurrent"):
        ax: Any = emb.get(name)
        for label, key, _ in _PEERS:
            peer: Any = _get(peers, key, name)
            if _ok(ax) and _ok(peer):
                out.append(_wall_per_node(f"embedded / {label}, {name} wall time per node",
                                          "ax", ax, label, peer))
    return out


def _vs_payload(payload: _Result) -> list[dict[str, Any]]:
    """Large values passed node to node: ``ax.open`` against LangGraph (no target)."""
    ax: Any = payload.get("ax_open")
    lg: Any = payload.get("langgraph")
    if not (_ok(ax) and _ok(lg)):
        return []
    a, b = _side(ax, "wall_per_node_ms"), _side(lg, "wall_per_node_ms")
    ratio, rounds = _paired_ratio(a, b)
    return [_cmp(f"ax.open / LangGraph, chain of {ax.get('nodes')} passing "
                 f"{ax.get('bytes', 0) / 1000:.0f} KB node to node, wall time per node",
                 ratio, "(no target)", None,
                 f"ax.open {a[0]} ms (CPU {ax.get('cpu_per_node_ms')}) vs LangGraph {b[0]} ms "
                 f"(CPU {lg.get('cpu_per_node_ms')}) per node", rounds=rounds)]


def _vs_sdk(sdk: _Result, peers: _Result) -> list[dict[str, Any]]:
    """The SDK as users call it: one-shot ``ax.run`` and the reusable engine."""
    out = []
    one: Any = sdk.get("ax_oneshot")
    lg_one: Any = sdk.get("langgraph_oneshot")
    if _ok(one) and _ok(lg_one):
        a, b = _side(one, "run_wall", "p50_ms"), _side(lg_one, "run_wall", "p50_ms")
        out.append(_vs(
            "one-shot ax.run / LangGraph open + build + compile + invoke, financial, per "
            "call (p50)", a, b, ONESHOT_TARGET,
            f"ax.run {a[0]} ms vs LangGraph {b[0]} ms per call"))
    for name, label, limit in (("ax_oneshot", "one-shot ax.run", WALL_OVER_CPU_TARGET),
                               ("ax_reuse_financial", "reusable engine", None)):
        r: Any = sdk.get(name)
        if _ok(r):
            detail = (f"{r['wall_s']} s wall vs {r['cpu_s']} s CPU over {r['runs']} runs "
                      f"(p50 per run {_get(r, 'run_wall', 'p50_ms')} vs "
                      f"{_get(r, 'run_cpu', 'p50_ms')} ms)")
            ratio, rounds = _round_median(_side(r, "wall_over_cpu"))
            out.append(_at_most(f"{label} wall / CPU, financial", ratio, limit, detail,
                                 rounds)
                       if limit is not None else
                       _cmp(f"{label} wall / CPU, financial", ratio, "(no target)", None,
                            detail, rounds=rounds))
    chain: Any = sdk.get("ax_reuse_chain")
    fin: Any = sdk.get("ax_reuse_financial")
    # The peers' runs taken next to the reusable engine's, in the SDK section; a run
    # without them (a subset of sections) uses the peer section's.
    nearby: Any = sdk.get("peers") or {}
    for label, key, _ in _PEERS:
        peer_chain: Any = _get(nearby, key, "chain") or _get(peers, key, "chain")
        if _ok(chain) and _ok(peer_chain):
            out.append(_chain_overhead(
                f"reusable engine / {label}, chain of {chain.get('size')} per-node overhead "
                "(p50)", label, chain, peer_chain))
    for label, key, _ in _PEERS:
        peer_fin: Any = (_get(nearby, key, "financial_sequential")
                         or _get(peers, key, "financial_sequential"))
        if _ok(fin) and _ok(peer_fin):
            out.append(_wall_per_node(
                f"reusable engine / {label}, financial wall time per node",
                "ax engine.run", fin, label, peer_fin))
    return out


def _vs_reconciler(rec: _Result) -> list[dict[str, Any]]:
    """Flat: median pass time at the most finished tasks / at the fewest ≤ FLAT, and the
    same store reads per pass (a pass that reads finished tasks is not flat however
    fast the store is today)."""
    out = []
    for backend in ("sqlite", "etcd"):
        r: Any = rec.get(backend)
        if not _ok(r) or not r.get("points"):
            continue
        points = sorted(r["points"].values(), key=lambda p: p["finished"])
        lo, hi = points[0], points[-1]
        growth = r.get("growth")
        same = lo["reads_per_pass"] == hi["reads_per_pass"]
        out.append(_cmp(
            f"reconciler pass ({backend}), {hi['finished']:,} / {lo['finished']:,} "
            "finished tasks", growth, f"≤ {FLAT} and the same reads",
            None if growth is None else growth <= FLAT and same,
            f"median pass {hi['pass_median_ms']} ms vs {lo['pass_median_ms']} ms; store "
            f"reads per pass {hi['reads_per_pass']:g} vs {lo['reads_per_pass']:g}; "
            f"{lo['unfinished']} unfinished tasks"))
    return out


def _vs_floor(label: str, section: _Result, floors: _Result, target: float) \
        -> list[dict[str, Any]]:
    """Each workload of ``section`` against the floor measured as the section started:
    round i of the workload against the floor of round i (``section["floors"]``; the
    median round is ``section["floor"]``), or else the run's first floor (``floors``)."""
    own = _get(section, "floor", "floor") or {}
    own_rounds = _get(section, "floors")
    out = []
    for name, result in (_get(section, "workloads") or {}).items():
        floor_name = _FLOOR_OF.get(name) or ""
        floor: _Side = (_get(own, floor_name, "nodes_per_s"),
                        [_get(f, "floor", floor_name, "nodes_per_s") if _ok(f) else None
                         for f in own_rounds] if isinstance(own_rounds, Sequence) else None)
        where = "this section's"
        if floor[0] is None:
            floor, where = (_get(floors, floor_name, "nodes_per_s"), None), "the run's"
        if not _ok(result) or floor[0] is None:
            continue
        r, rounds = _paired_ratio(_side(result, "nodes_per_s"), floor)
        first = _get(floors, floor_name, "nodes_per_s")
        out.append(_cmp(f"{label} {name} / floor", r, f"≥ {target:.0%}",
                        None if r is None else r >= target,
                        f"{result['nodes_per_s']} nodes/s vs {where} {floor_name} floor "
                        f"{floor[0]} nodes/s"
                        + (f" (the run's first: {first})"
                           if where == "this section's" and first is not None else ""),
                        percent=True, rounds=rounds))
    return out


def _growth(series: Mapping[str, Any], metric: tuple[str, ...], *,
            judged: bool = True) -> dict[str, Any]:
    """Growth of ``metric`` over ``series`` (size → result); ``judged=False`` for a
    figure shown for information only (e.g. latency under queueing)."""
    points = []
    for key, result in series.items():
        value = _get(result, *metric) if _ok(result) else None
        if isinstance(value, int | float):
            points.append((int(key), float(value)))
    points.sort()
    if len(points) < 2:
        return {"points": points, "growth": None, "flat": None}
    growth = _ratio(points[-1][1], points[0][1])
    return {"points": points, "growth": growth,
            "max_over_min": _ratio(max(v for _, v in points), min(v for _, v in points)),
            "flat": None if growth is None or not judged else growth <= FLAT,
            "judged": judged}


def summarize(results: _Result) -> dict[str, Any]:
    """Comparisons with the targets, and scaling growth, from raw results."""
    floors = _get(results, "floor", "floor") or {}
    emb = _get(results, "embedded", "workloads") or {}
    peers = _get(results, "peer") or {}
    comparisons = _vs_peer(emb, peers, _get(results, "scaling") or {})
    comparisons += _vs_sdk(_get(results, "sdk") or {}, peers)
    comparisons += _vs_reconciler(_get(results, "reconciler") or {})
    comparisons += _vs_payload(_get(results, "payload") or {})
    comparisons += _vs_floor("etcd+Redis in-process", _get(results, "etcd_redis") or {},
                             floors, 0.8)
    if _get(results, "api", "status") == "measured":
        comparisons += _vs_floor("API+executors", _get(results, "api") or {}, floors, 0.5)
    sq = _get(floors, "sqlite_inprocess", "nodes_per_s")
    for name, result in emb.items():
        if _ok(result) and sq:
            r = _ratio(result["nodes_per_s"], sq)
            comparisons.append(_cmp(f"embedded {name} / SQLite+in-process floor", r,
                                    "(no target)", None,
                                    f"{result['nodes_per_s']} nodes/s vs {sq} nodes/s",
                                    percent=True))
    chain = _get(results, "scaling", "chain") or {}
    conc = _get(results, "scaling", "concurrency") or {}
    scaling = {
        "chain": {
            "ready_to_committed_p50_ms": _growth(
                chain, ("node_latency", "ready_to_committed", "p50_ms")),
            "wall_per_node_ms": _growth(chain, ("wall_per_node_ms",)),
            "cpu_per_node_ms": _growth(chain, ("cpu_per_node_ms",)),
        },
        **{key: {
            "step_p50_ms": _growth(_get(results, "scaling", key) or {},
                                   ("step_interval", "p50_ms")),
            "wall_per_node_ms": _growth(_get(results, "scaling", key) or {},
                                        ("wall_per_node_ms",)),
        } for _, _, key in _PEERS},
        "concurrency": {
            "cpu_per_node_ms": _growth(conc, ("cpu_per_node_ms",)),
            "wall_per_node_ms": _growth(conc, ("wall_per_node_ms",)),
            # Queueing: with c tasks in flight a node waits behind the others (Little's
            # law), so latency grows with c by construction. Not judged.
            "ready_to_committed_p50_ms": _growth(
                conc, ("node_latency", "ready_to_committed", "p50_ms"), judged=False),
        },
    }
    return {"comparisons": comparisons, "scaling": scaling}


# ---------------------------------------------------------------------- markdown


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_f(c) if not isinstance(c, str) else c for c in row) + " |"
              for row in rows]
    return "\n".join(lines) + "\n"


def _verdict(met: bool | None) -> str:
    return "-" if met is None else ("met" if met else "**missed**")


def not_succeeded(run: _Result) -> dict[str, int]:
    """The tasks of one run that did not end SUCCEEDED, counted by status."""
    return {k: v for k, v in (run.get("statuses") or {}).items() if k != "SUCCEEDED"}


def _oddities(run: _Result) -> list[str]:
    """What looked odd in one run of an ax workload: the harness's anomalies, a commit
    that took a fifth of the run, warnings and errors the servers logged."""
    notes = [f"{k} {v}" for k, v in (run.get("anomalies") or {}).items()]
    slow = run.get("slowest_commit") or {}
    if slow.get("share_of_wall", 0) >= 0.2:
        notes.append(f"node {slow['node']} took {slow['claimed_to_committed_s']:.1f} s to "
                     f"commit ({slow['share_of_wall']:.0%} of the run)")
    logs = sum(p["count"] for p in (run.get("log_problems") or {}).values())
    if logs:
        notes.append(f"{logs} log warnings/errors")
    return notes


def _round_notes(r: _Result, oddities: Any = _oddities) -> str | None:
    """The anomalies column of a workload run in rounds: what went wrong in each round,
    not only in the round shown (a failed round, tasks that did not succeed,
    ``oddities``); None for a workload run once."""
    rounds = r.get("rounds")
    if not isinstance(rounds, Sequence):
        return None
    notes = []
    for i, run in enumerate(rounds, 1):
        if not _ok(run):
            found = [f"failed ({_get(run, 'error')})"]
        else:
            bad = not_succeeded(run)
            found = ([f"not succeeded {bad}"] if bad else []) + oddities(run)
        if found:
            notes.append(f"round {i}: {', '.join(found)}")
    return "; ".join(notes) or "none"


def _engine_rows(label: str, workloads: _Result) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for name, r in workloads.items():
        if not _ok(r):
            rows.append([label, name, f"error: {_get(r, 'error')}"] + [""] * 13)
            continue
        lat = _get(r, "node_latency", "ready_to_committed") or {}
        store = r.get("store") or {}
        conflicts = store.get("conflicts", 0) if store else None
        rss = _get(r, "process", "peak_rss_mib")
        if isinstance(r.get("peak_rss_mib"), Mapping):  # API: the servers' peaks
            rss = "api {api} / exec {executor0}".format(**{
                k: r["peak_rss_mib"].get(k, "-") for k in ("api", "executor0")})
        bad = not_succeeded(r)
        size = f"{r['shape']} {r['size']}" if r.get("size") else r["shape"]
        odd = _round_notes(r) or ", ".join(_oddities(r)) or "none"
        rows.append([
            label, name + (f" ⚠ {bad}" if bad else ""),
            f"{size} x {r['tasks']}" + (f" ({r['inflight']} in flight)"
                                        if r.get("inflight", 1) > 1 else ""),
            r["nodes"], r["nodes_per_s"], r["tasks_per_s"], r["wall_per_node_ms"],
            lat.get("p50_ms"), lat.get("p99_ms"), r.get("cpu_per_node_ms"),
            r.get("write_txns_per_node"), r.get("reads_per_node", "-"),
            r.get("queue_calls_per_node", "-"), conflicts, rss, odd,
        ])
    return rows


def _peer_rows(label: str, workloads: _Result) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for name, r in workloads.items():
        if not _ok(r):
            rows.append([label, name, f"error: {_get(r, 'error')}"] + [""] * 13)
            continue
        step = r.get("step_interval") or {}
        size = f"{r['shape']} {r['size']}" if r.get("size") else r["shape"]
        rows.append([
            label, name,
            f"{size} x {r['tasks']}" + (f" ({r['inflight']} in flight)"
                                        if r.get("inflight", 1) > 1 else ""),
            r["nodes"], r["nodes_per_s"], r["tasks_per_s"], r["wall_per_node_ms"],
            step.get("p50_ms"), step.get("p99_ms"), r.get("cpu_per_node_ms"), "-", "-", "-",
            "-", _get(r, "process", "peak_rss_mib"), _round_notes(r, lambda _: []) or "-",
        ])
    return rows


def _floor_md(floor: _Result) -> str:
    if not _ok(floor):
        return f"Floor not measured: {_get(floor, 'error')}\n"
    rows = []
    names = {"etcd": "etcd CAS txn (EtcdStore.txn, Mod == rev)",
             "etcd_raw_aetcd": "etcd CAS txn (raw aetcd)",
             "redis_queue": "Redis push + reliable pop + ack (RedisQueue)",
             "redis_raw": "Redis LPUSH + LMOVE + LREM (raw redis-py)",
             "sqlite": "SQLite CAS txn (SqliteStore, synchronous=FULL)",
             "inprocess_queue": "in-process queue push + pop + ack"}
    for key, label in names.items():
        for mode in ("sequential", "concurrent_8"):
            m = _get(floor, key, mode)
            if m:
                rows.append([label, mode.replace("_", " "), m["ops"],
                             m["latency"]["p50_ms"], m["latency"]["p99_ms"], m["ops_per_s"]])
    text = _table(["primitive", "mode", "ops", "p50 ms", "p99 ms", "ops/s"], rows)
    frows = [[k, v["nodes_per_s"], v["per_node_ms"]] for k, v in floor.get("floor", {}).items()]
    text += "\nFloor = 2 CAS transactions + 1 queue round trip per node:\n\n"
    text += _table(["floor", "nodes/s", "ms per node"], frows)
    return text


def _scaling_md(results: _Result, summary: _Result) -> str:
    chain = _get(results, "scaling", "chain") or {}
    conc = _get(results, "scaling", "concurrency") or {}
    text = "Chain (embedded), per node:\n\n"
    rows = []
    for n, r in sorted(chain.items(), key=lambda kv: int(kv[0])):
        if _ok(r):
            lat = _get(r, "node_latency", "ready_to_committed") or {}
            rows.append([int(n), lat.get("p50_ms"), lat.get("p99_ms"), r["wall_per_node_ms"],
                         r["cpu_per_node_ms"], _get(r, "submit", "p50_ms"),
                         _get(r, "process", "peak_rss_mib")])
    text += _table(["nodes", "ready→committed p50 ms", "p99 ms", "wall/node ms",
                    "CPU/node ms", "submit ms", "peak RSS MiB"], rows)
    for label, _, key in _PEERS:
        peer = _get(results, "scaling", key) or {}
        if not peer:
            continue
        text += f"\n{label} chain, per node (step = interval between node starts):\n\n"
        rows = [[int(n), _get(r, "step_interval", "p50_ms"), _get(r, "step_interval", "p99_ms"),
                 r["wall_per_node_ms"], r["cpu_per_node_ms"],
                 r.get("build_s", r.get("launch_s"))]
                for n, r in sorted(peer.items(), key=lambda kv: int(kv[0])) if _ok(r)]
        text += _table(["nodes", "step p50 ms", "p99 ms", "wall/node ms", "CPU/node ms",
                        "build (LangGraph) / launch (DBOS) s"], rows)
    text += "\nFinancial shape (embedded) by tasks in flight, per node:\n\n"
    rows = []
    for c, r in sorted(conc.items(), key=lambda kv: int(kv[0])):
        if _ok(r):
            lat = _get(r, "node_latency", "ready_to_committed") or {}
            rows.append([int(c), r["nodes_per_s"], r["wall_per_node_ms"], r["cpu_per_node_ms"],
                         lat.get("p50_ms"), lat.get("p99_ms")])
    text += _table(["in flight", "nodes/s", "wall/node ms", "CPU/node ms",
                    "ready→committed p50 ms", "p99 ms"], rows)
    text += "\nGrowth = cost at the largest size / cost at the smallest "
    text += f"(flat: ≤ {FLAT}):\n\n"
    rows = []
    for group, metrics in (summary.get("scaling") or {}).items():
        for metric, g in metrics.items():
            if not g.get("judged", True):
                verdict = "information only (queueing)"
            elif g.get("flat") is None:
                verdict = "-"
            else:
                verdict = "flat" if g["flat"] else "**not flat**"
            rows.append([group, metric, g.get("growth"), g.get("max_over_min"), verdict])
    text += _table(["series", "metric", "growth", "max/min", "verdict"], rows)
    return text


def _sdk_md(sdk: _Result) -> str:
    if not sdk:
        return "not measured\n"
    labels = {"ax_oneshot": "`ax.run(path, input, home=...)`, one shot per call",
              "langgraph_oneshot": "LangGraph: open SqliteSaver + build + compile + invoke "
                                   "+ close per call",
              "ax_reuse_financial": "`with ax.open(home) as engine: engine.run(path, input)`",
              "ax_reuse_chain": "`engine.run(path, input)` on one `ax.open`"}
    rows: list[list[Any]] = []
    for name, label in labels.items():
        r: Any = sdk.get(name)
        if not _ok(r):
            rows.append([label, f"error: {_get(r, 'error')}"] + [""] * 7)
            continue
        shape = f"{r['shape']} {r['size']}" if r.get("size") else r.get("shape", "financial")
        rows.append([label, f"{shape} x {r['runs']}", _get(r, "run_wall", "p50_ms"),
                     _get(r, "run_cpu", "p50_ms"), r.get("wall_over_cpu"),
                     r.get("wall_per_node_ms", "-"),
                     _get(r, "node_latency", "ready_to_committed", "p50_ms") or "-",
                     r.get("open_s", _get(r, "build_compile", "p50_ms")) or "-",
                     _get(r, "process", "peak_rss_mib")])
    nearby = []
    for label, key, _ in _PEERS:
        fin: Any = _get(sdk, "peers", key, "financial_sequential")
        chain: Any = _get(sdk, "peers", key, "chain")
        if _ok(fin) or _ok(chain):
            nearby.append(f"{label} financial {_get(fin, 'wall_per_node_ms') or '-'} ms "
                          f"wall/node, chain step p50 "
                          f"{_get(chain, 'step_interval', 'p50_ms') or '-'} ms")
    after = (" The reusable engine's targets hold it against the peers' runs taken in "
             f"turns with it, round by round, in this section (median rounds: "
             f"{'; '.join(nearby)})." if nearby else "")
    return ("Per call: wall time (`perf_counter`) and CPU time (`time.process_time`, every "
            "thread); wall/CPU is over all timed calls. The last-but-one column is "
            "`ax.open`'s time in seconds, or LangGraph's build + compile p50 in ms."
            f"{after}\n\n"
            + _table(["workload", "runs", "wall/call p50 ms", "CPU/call p50 ms", "wall/CPU",
                      "wall/node ms", "ready→committed p50 ms", "open s / build ms",
                      "peak RSS MiB"], rows))


def _reconciler_md(rec: _Result) -> str:
    rows: list[list[Any]] = []
    for backend in ("sqlite", "etcd"):
        r: Any = rec.get(backend)
        if r is None:
            continue
        if not _ok(r):
            rows.append([backend, f"error: {_get(r, 'error')}"] + [""] * 7)
            continue
        for p in sorted(r["points"].values(), key=lambda p: p["finished"]):
            rows.append([backend, p["finished"], p["unfinished"], p["fill_s"],
                         p["pass_median_ms"], _get(p, "pass", "p90_ms"), p["reads_per_pass"],
                         p["txns_per_pass"], r.get("growth")])
    if not rows:
        return "not measured\n"
    return ("`Reconciler.run_once` on a store holding finished tasks (restored copies of "
            "a financial run) and a few unfinished ones (WAITING, one RUNNING under a live "
            "lease); median of the timed passes, store reads and transactions per pass. "
            f"Flat: growth ≤ {FLAT} and the same reads.\n\n"
            + _table(["store", "finished", "unfinished", "fill s", "pass median ms",
                      "p90 ms", "reads/pass", "txns/pass", "growth"], rows))


def _store_alone_md(results: _Result) -> str:
    """The embedded one-at-a-time workloads next to their own write transactions
    replayed on the store alone (``store_replay``: same writes, same durability, no
    engine), and what a ratio of 0.5 to each peer would leave for the engine."""
    rows = []
    for name, r in (_get(results, "embedded", "workloads") or {}).items():
        alone = r.get("store_replay") if _ok(r) else None
        if not alone:
            continue
        ax, store = r["wall_per_node_ms"], alone["wall_per_node_ms"]
        peers = []
        for label, key, _ in _PEERS:
            wall = _get(results, "peer", key, name, "wall_per_node_ms")
            if isinstance(wall, int | float):
                peers.append(f"{label} {_f(wall)}: {_f(wall * PEER_TARGET - store)}")
        rows.append([name, _f(ax), f"{_f(store)} ({store / ax:.0%})", _f(ax - store),
                     _f(alone["txn"]["p50_ms"]), f"{alone['puts_per_txn']} / "
                     f"{alone['bytes_per_txn']} B", "; ".join(peers) or "-"])
    if not rows:
        return ""
    return ("Each one-at-a-time embedded workload's write transactions, in commit order, "
            "committed again one after another on a new SQLite store (`synchronous=FULL`, "
            "as the engine's) without compares and without the engine (`bench.axrun."
            "replay`): no engine on this store and disk goes under that. Wall time per "
            "node; the last column is each peer's wall time per node and what a ratio of "
            "0.5 to it leaves for the engine beyond the store.\n\n"
            + _table(["workload", "ax ms", "the store alone ms (share)", "the rest ms",
                      "store txn p50 ms", "puts / bytes per txn",
                      "peer ms: left for the engine at 0.5"], rows))


def markdown(results: _Result) -> str:
    """The human-readable report (``results.md``)."""
    meta = results.get("meta", {})
    summary = results.get("summary") or summarize(results)
    host = meta.get("host", {})
    v = meta.get("versions", {})
    out = ["# ax benchmark results\n"]
    out.append(
        f"Run {meta.get('started_at', '?')}, {meta.get('duration_s', '?')} s"
        f"{' (QUICK mode: tiny counts, figures meaningless)' if meta.get('quick') else ''}; "
        f"{host.get('cpus', '?')} CPUs, load average {host.get('load_start')} at start, "
        f"{host.get('load_end')} at end (other work on the machine skews every figure). "
        f"Python {v.get('python')}, SQLite {v.get('sqlite')}, {v.get('etcd')}, "
        f"{v.get('redis')}, LangGraph {v.get('langgraph')} "
        f"(checkpoint-sqlite {v.get('langgraph-checkpoint-sqlite')}), DBOS {v.get('dbos')}.\n")
    out.append("## Targets\n")
    rounds = _get(meta, "sizes", "rounds")
    if isinstance(rounds, int) and rounds > 1:
        out.append(f"Each workload compared ran {rounds} times, in rounds that took turns "
                   "(round 1 of each side, then round 2, ...). A ratio is the median of "
                   "its per-round ratios, round i against round i (listed after the "
                   "figures); the figures are each side's median round.\n")
    rows = [[c["name"], f"{c['value']:.1%}" if c.get("percent") and c["value"] is not None
             else c["value"], c["target"], _verdict(c["met"]), c["detail"]]
            for c in summary.get("comparisons", [])]
    out.append(_table(["comparison", "ratio", "target", "verdict", "figures"], rows))
    out.append("\n## Floor (same run)\n")
    out.append(_floor_md(results.get("floor", {})))
    again = [[label, name, v["nodes_per_s"], v["per_node_ms"],
              ", ".join(_f(_get(f, "floor", name, "nodes_per_s"))
                        for f in _get(results, key, "floors") or []) or "-"]
             for label, key in (("etcd + Redis in process", "etcd_redis"),
                                ("API + executors", "api"))
             for name, v in (_get(results, key, "floor", "floor") or {}).items()]
    if again:
        out.append("\nMeasured again at the start of every round of a section, on its "
                   "servers (each round of its workloads is held against its round's "
                   "floor); the median round by the sequential floor, then every round:\n\n")
        out.append(_table(["section", "floor", "nodes/s", "ms per node", "rounds nodes/s"],
                          again))
    out.append("\n## Engines, same shapes\n")
    out.append("Per-node latency is `ready` → `committed` from each task's timeline for ax "
               "(it includes queueing when many nodes are ready at once) and the interval "
               "between consecutive node (step) starts for LangGraph and DBOS (chain "
               "only). Writes are "
               "committed write transactions per executed node (API runs: etcd write "
               "requests, counted by its revision; transactions merged into one request "
               "count once); queue calls are the queue "
               "operations (push, pop, ack, requeue: one round trip each on Redis) per "
               "executed node, measured in process. Peak RSS is the workload's "
               "own process (API runs: the API and first executor processes).\n\n")
    rows = _engine_rows("ax embedded", _get(results, "embedded", "workloads") or {})
    for label, key, _ in _PEERS:
        rows += _peer_rows(label, _get(results, "peer", key) or {})
    rows += _engine_rows("ax etcd+Redis", _get(results, "etcd_redis", "workloads") or {})
    api = results.get("api", {})
    if api.get("status") == "measured":
        rows += _engine_rows("ax API+2 executors", api.get("workloads") or {})
    out.append(_table(["engine", "workload", "run", "nodes", "nodes/s", "tasks/s",
                       "wall/node ms", "latency p50 ms", "p99 ms", "CPU/node ms",
                       "writes/node", "reads/node", "queue calls/node", "CAS conflicts",
                       "peak RSS MiB",
                       "anomalies"], rows))
    if api.get("status") != "measured":
        out.append(f"\nThrough API + executors: **{api.get('status', 'not measured yet')}**"
                   f" — {api.get('reason', api.get('error', ''))}\n")
    celery = _get(results, "peer", "celery") or {}
    if celery:
        out.append(f"\nCelery: {celery.get('status')} — {celery.get('reason')}\n")
    store_alone = _store_alone_md(results)
    if store_alone:
        out.append("\n### The store alone\n")
        out.append(store_alone)
    out.append("\n## Scaling\n")
    out.append(_scaling_md(results, summary))
    out.append("\n## The SDK as users call it\n")
    out.append(_sdk_md(results.get("sdk") or {}))
    out.append("\n## Reconciler pass cost\n")
    out.append(_reconciler_md(results.get("reconciler") or {}))
    val = results.get("validation", {})
    out.append("\n## Validation of a large DAG\n")
    if _ok(val) and "literal" in val:
        rows = [[k.replace("_", " "), val[k]["min_s"], val[k]["median_s"],
                 val[k]["per_node_us"], val[k]["stored_bytes"]]
                for k in ("literal", "template_per_node")]
        out.append(f"`load_dag_mapping` on a {val['nodes']:,}-node chain (best of "
                   f"{val['repeat']}):\n\n")
        out.append(_table(["inputs", "min s", "median s", "µs per node", "stored bytes"],
                          rows))
    else:
        out.append(f"not measured: {val.get('error')}\n")
    prof = results.get("profile", {})
    out.append("\n## Profile (cProfile, " + str(prof.get("workload", "?")) + ")\n")
    if prof.get("by_tottime"):
        out.append(f"Total profiled time {prof.get('total_s')} s; top functions by own "
                   "time (C calls such as SQLite's `execute` include their I/O waits):\n\n")
        rows = [[r["function"], r["calls"], r["tottime_s"], f"{r['tottime_share']:.1%}",
                 r["cumtime_s"]] for r in prof["by_tottime"][:15]]
        out.append(_table(["function", "calls", "own s", "own share", "cumulative s"], rows))
        rows = [[r["function"], r["calls"], r["cumtime_s"],
                 f"{r['cumtime_s'] / prof['total_s']:.1%}" if prof.get("total_s") else "-"]
                for r in prof["by_cumtime"][:15]]
        out.append("\nBy cumulative time:\n\n")
        out.append(_table(["function", "calls", "cumulative s", "share"], rows))
    else:
        out.append(f"not measured: {prof.get('error')}\n")
    errors = [f"- {name}: {sec['error']}" for name, sec in results.items()
              if isinstance(sec, Mapping) and "error" in sec]
    if errors:
        out.append("\n## Errors\n\n" + "\n".join(errors) + "\n")
    return "\n".join(out)
