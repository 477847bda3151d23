"""R15: counters of notices by source, kind, mode and action, for the /metrics endpoint.

The counts live in the database (NoticeCount, incremented once per receipt,
off mode included), so every web process reports the same totals and they
survive restarts. The endpoint renders `samples()` as Prometheus text, e.g.

  preemption_notices_total{source="aws",kind="terminate",mode="prod",action="reclaimed"} 3
"""

from preemption.models import NoticeCount

NOTICES_TOTAL = "preemption_notices_total"
HELP = {NOTICES_TOTAL: "Cloud preemption notices received, by source, kind, mode and action."}
TYPES = {NOTICES_TOTAL: "counter"}


def samples() -> list[tuple[str, dict[str, str], float]]:
    """(metric name, labels, value) for every label set seen so far; kind is "" when unread (off, invalid)."""
    return [
        (NOTICES_TOTAL, {"source": source, "kind": kind, "mode": mode, "action": action}, float(count))
        for source, kind, mode, action, count in NoticeCount.objects.order_by(
            "source", "kind", "mode", "action"
        ).values_list("source", "kind", "mode", "action", "count")
    ]


def render() -> str:
    """The samples as Prometheus text exposition (for an endpoint with nothing better yet)."""
    lines = []
    for name in HELP:
        lines += [f"# HELP {name} {HELP[name]}", f"# TYPE {name} {TYPES[name]}"]
    for name, labels, value in samples():
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{text}}} {value:g}")
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
