"""The console's pages: plain server-rendered HTML, no JavaScript, every value escaped."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

from mpcml.console import charts
from mpcml.console.sources import AuditView
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import job_pb2 as jpb

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; }
nav a { margin-right: 1rem; } nav { margin-bottom: 1rem; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } .bad { color: #a00; font-weight: bold; } .ok { color: #060; }
code { font-size: 0.9em; } figure { margin: 0.5rem 0; }
"""


def _cell(value: Any) -> str:
    return f"<td>{escape(str(value))}</td>"


def table(head: Sequence[str], rows: Iterable[Sequence[Any]], raw: int = -1) -> str:
    """A table; column `raw` holds HTML made here (a link), every other cell is escaped.

    An empty `head`: no header row (a list of facts, each row led by its name).
    """
    out = ["<table>"]
    if head:
        out += ["<tr>", *(f"<th>{escape(h)}</th>" for h in head), "</tr>"]
    for row in rows:
        cells = [f"<td>{c}</td>" if i == raw else _cell(c) for i, c in enumerate(row)]
        out += ["<tr>", *cells, "</tr>"]
    out.append("</table>")
    return "".join(out)


def layout(title: str, heading: str, body: str, party: bool) -> str:
    """One page: the navigation, then `body`."""
    links = [("/", "jobs")]
    if party:
        links += [("/datasets", "datasets"), ("/policy", "policy"), ("/audit", "audit log")]
    nav = "".join(f'<a href="{href}">{escape(text)}</a>' for href, text in links)
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<link rel="icon" href="data:,">'
        f"<title>{escape(heading)} · {escape(title)}</title><style>{STYLE}</style></head>"
        f"<body><nav>{nav}</nav><h1>{escape(heading)}</h1>{body}"
        f"<p><small>{escape(title)}, read-only, rendered "
        f"{escape(time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()))}</small></p>"
        "</body></html>"
    )


def _state(status: cpb.JobStatus) -> str:
    return cpb.JobState.Name(status.state).removeprefix("JOB_STATE_") if status.state else "?"


def jobs_page(results: list[cpb.JobResult]) -> str:
    """Every job with its state and rounds."""
    rows = []
    for r in results:
        s = r.status
        link = f'<a href="/jobs/{escape(s.job_id)}">{escape(s.job_id)}</a>'
        task = jpb.Task.Name(s.task).removeprefix("TASK_").lower() if s.task else ""
        rows.append(
            (
                link,
                s.name or "-",
                task,
                _state(s),
                f"{s.committed_round}/{s.total_rounds}",
                s.submitter,
                ", ".join(s.parties),
            )
        )
    if not rows:
        return "<p>No jobs yet.</p>"
    return table(
        ["job", "name", "task", "state", "committed round", "submitter", "parties"], rows, raw=0
    )


def job_page(result: cpb.JobResult, losses: list[tuple[int, float]], where: str) -> str:
    """A job: its status, loss curve, per-round times and cost profile."""
    s = result.status
    facts = [
        ("state", _state(s)),
        ("reason", s.reason or "-"),
        ("rounds committed", f"{s.committed_round} of {s.total_rounds}"),
        ("rows", s.rows or "-"),
        ("submitter", s.submitter),
        ("parties", ", ".join(s.parties)),
        ("graph", s.graph_digest),
        ("MiB sent", f"{result.bytes_sent / 2**20:.1f}"),
        ("seconds", f"{result.seconds:.1f}"),
    ]
    body = [table([], facts)]
    body.append("<h2>Loss</h2>")
    if losses:
        svg = charts.line([r for r, _ in losses], [v for _, v in losses], "round", "loss")
        body.append(
            f'<figure class="chart" id="loss" data-points="{len(losses)}">{svg}'
            f"<figcaption>loss per round ({escape(where)})</figcaption></figure>"
        )
        body.append(table(["round", "loss"], [(r, f"{v:.6f}") for r, v in losses]))
    else:
        body.append('<p id="loss">No loss revealed to this console.</p>')
    body.append("<h2>Rounds</h2>")
    if result.rounds:
        rounds = [(r.round, r.seconds) for r in result.rounds]
        svg = charts.line([r for r, _ in rounds], [t for _, t in rounds], "round", "seconds")
        body.append(
            f'<figure class="chart" id="seconds" data-points="{len(rounds)}">{svg}</figure>'
        )
        body.append(table(["round", "seconds"], [(r, f"{t:.2f}") for r, t in rounds]))
    else:
        body.append("<p>No round committed yet.</p>")
    if result.profile:
        body.append("<h2>Cost profile</h2>")
        body.append(
            table(
                ["node", "op", "rounds", "MiB", "seconds", "calls"],
                [
                    (c.node, c.op, c.rounds, f"{c.bytes / 2**20:.2f}", f"{c.seconds:.2f}", c.calls)
                    for c in result.profile
                ],
            )
        )
    return "".join(body)


def datasets_page(infos: list[cpb.DatasetInfo]) -> str:
    """The party's catalogue as it registers it (never a value)."""
    rows = [
        (i.name, i.rows, len(i.columns) or "x".join(map(str, i.row_shape)), i.id_column or "-")
        for i in infos
    ]
    return table(["dataset", "rows", "columns (or row shape)", "id column"], rows)


def policy_page(policy: Any) -> str:
    """The party's policy: who may submit, which data, who receives what, the floor."""

    def outputs(rule: Any) -> str:
        return "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(rule.outputs_to.items())) or "-"

    def graphs(rule: Any) -> str:
        return "; ".join(str(g) for g in rule.graphs)

    rows = [("policy", outputs(policy.default), policy.default.min_rows, graphs(policy.default))]
    for kind, rules in (("dataset", policy.for_dataset), ("model", policy.for_model)):
        for name, rule in sorted(rules.items()):
            rows.append((f"{kind} {name}", outputs(rule), rule.min_rows, graphs(rule)))
    return table(
        [],
        [
            ("submitters", ", ".join(policy.submitters) or "nobody"),
            ("datasets", ", ".join(policy.datasets)),
        ],
    ) + table(["rule", "outputs_to", "min_rows", "graphs"], rows)


def audit_page(view: AuditView) -> str:
    """The audit log, newest first, with its verification."""
    status = "ok" if view.verified else "bad"
    head = f'<p id="verification" class="{status}">{escape(view.verdict or "empty log")}</p>'
    fixed = {"seq", "at", "kind", "job", "prev", "hash"}
    rows = []
    for e in reversed(view.entries):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(e.get("at", 0))))
        details = " ".join(
            f"{k}={json.dumps(v, sort_keys=True)}" for k, v in sorted(e.items()) if k not in fixed
        )
        rows.append((e.get("seq", "?"), when, e.get("kind", "?"), e.get("job") or "-", details))
    return head + table(["seq", "at (UTC)", "kind", "job", "details"], rows)
