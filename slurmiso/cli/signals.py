"""``slurmiso signals check URL``: what slurmiso reads of an inference server, before the ladder
acts on it."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Dict, List, Optional, Tuple

from slurmiso.errors import UsageError

EPILOG = """examples:
  slurmiso signals check http://127.0.0.1:8000/metrics
  slurmiso signals check http://127.0.0.1:8000/metrics --class infer --window 30
  slurmiso signals check http://127.0.0.1:8000/metrics --server vllm --json

Reads the endpoint twice, --window seconds apart, the way the agent reads a job's
--iso-metrics endpoint, and judges the answer with the ladder's own rule: the share of
requests slower than the class's SLO bound, per model, from the server's buckets. Send
traffic to the server meanwhile: an idle window has no latency. Exit status: 0 when every
figure could be read, 1 when the verdict is unknown or a warning names a bound the buckets
cannot resolve, 2 on a usage error (see docs/admin-guide.md, next to slurmiso probe)."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "signals", help="check how slurmiso reads an inference server's /metrics",
        description="Checks of the inference signals the SLO ladder judges.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sp = p.add_subparsers(dest="signals_cmd", metavar="COMMAND")
    c = sp.add_parser("check", help="read an endpoint twice and print what slurmiso sees",
                      epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("url", help="the server's metrics URL (http://HOST:PORT/metrics)")
    c.add_argument("--server", default="", help="use this profile of monitor.signals.servers "
                   "only (default: the first whose series are present)")
    c.add_argument("--class", dest="job_class", default="",
                   help="judge against this class's monitor.slo (default: every class with "
                   "a per-job latency or error limit)")
    c.add_argument("--window", type=float, default=10.0,
                   help="seconds between the two readings (default 10)")
    c.add_argument("--json", action="store_true", help="one JSON object")
    c.set_defaults(func=run_check)
    p.set_defaults(func=lambda a: _need_command(p))


def _need_command(p: argparse.ArgumentParser) -> int:
    p.print_help()
    return 2


def run_check(args: argparse.Namespace) -> int:
    from slurmiso.config import load_config

    cfg = load_config(args.config)
    if not 0 < args.window <= 3600:
        raise UsageError(f"--window {args.window:g}: expected 0 < seconds <= 3600",
                         hint="give the seconds between the two readings, e.g. --window 10")
    report = check(cfg, args.url, args.server, args.job_class, args.window)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(render(report))
    return 0 if report["ok"] else 1


def _fetch(url: str, timeout: float, limit: int) -> str:
    import urllib.error
    import urllib.request

    if not url.startswith(("http://", "https://")):
        raise UsageError(f"{url!r} is not an http(s) URL",
                         hint="give the full URL, e.g. http://127.0.0.1:8000/metrics")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - http(s) only
            body = resp.read(limit + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise UsageError(f"cannot read {url}: {exc}",
                         hint="is the server running, and is this its metrics URL?") from exc
    if len(body) > limit:
        raise UsageError(f"{url} answered more than {limit} bytes (monitor.signals.max_body)",
                         hint="the agent would refuse it too: raise max_body or trim series")
    return body.decode("utf-8", "replace")


def check(cfg: Any, url: str, server: str, job_class: str, window_s: float,
          fetch: Any = None, sleep: Any = time.sleep) -> Dict[str, Any]:
    """The report: the profile matched, the window's figures, and each class's verdict."""
    from slurmiso.agent.endpoint import BadAnswer, Profile, Profiles
    from slurmiso.agent.job_signals import figures
    from slurmiso.exposition.histogram import Window

    fetch = fetch or _fetch
    profiles = [p for p in cfg.monitor.signals.servers if not server or p.name == server]
    if not profiles:
        names = ", ".join(p.name for p in cfg.monitor.signals.servers)
        raise UsageError(f"--server {server}: no such profile", hint=f"one of {names}")
    reader = Profiles([Profile.from_config(p) for p in profiles])
    limit = cfg.monitor.signals.max_body_mb * 1024 * 1024
    timeout = float(cfg.monitor.signals.timeout_s) + 1.0
    window = Window(window_s + 1.0)
    answer = None
    started = time.monotonic()
    try:
        for i in range(2):
            if i:
                sleep(max(0.0, window_s - (time.monotonic() - started)))
            answer = reader.read(fetch(url, timeout, limit))
            window.add(float(i) * window_s, answer.counters)
    except BadAnswer as exc:
        return {"url": url, "ok": False, "profile": None, "reason": exc.reason,
                "detail": str(exc), "classes": [], "warnings": []}
    assert answer is not None
    lat = figures(answer, window)
    return _report(cfg, url, answer.profile, lat, job_class)


def _report(cfg: Any, url: str, profile: str, lat: Any, job_class: str) -> Dict[str, Any]:
    from slurmiso.exposition.job_series import JobSignals
    from slurmiso.monitor import ladder
    from slurmiso.monitor.policy import Policy, SloLimit
    from slurmiso.monitor.slo_share import resolvable, share_over

    windows = tuple((sg, model, hist) for (sg, model), hist in sorted(lat.windows.items()))
    e2e = lat.e2e()
    js = JobSignals("check", job_class, latency_age_s=0.0, requests=lat.requests,
                    error_rate=lat.error_ratio, windows=windows,
                    p50_ms=_ms(e2e.get("0.5")), p95_ms=_ms(e2e.get("0.95")),
                    p99_ms=_ms(e2e.get("0.99")),
                    unknown=tuple(f"latency:{u}" for u in lat.unknown))
    classes: List[Dict[str, Any]] = []
    warnings: List[str] = []
    policy = Policy(hysteresis_pct=cfg.monitor.ladder.hysteresis_pct)
    for slo in cfg.monitor.slo:
        if job_class and slo.class_name != job_class:
            continue
        if slo.p99_latency_ms is None and slo.max_error_rate is None:
            continue
        limit = SloLimit(slo.class_name, p99_latency_ms=slo.p99_latency_ms,
                         max_error_rate=slo.max_error_rate, signal=slo.signal)
        v = ladder.job_verdict("check", js, limit, policy)
        row: Dict[str, Any] = {"class": slo.class_name, "signal": slo.signal,
                               "p99_ms": slo.p99_latency_ms, "verdict": v.kind,
                               "reason": v.why, "over": {}}
        if slo.p99_latency_ms is not None:
            bound = float(slo.p99_latency_ms) / 1000.0
            for sg, model, hist in windows:
                if sg != slo.signal:
                    continue
                share = share_over(hist, bound)
                if share is not None:
                    row["over"][model or "-"] = [share.low, share.high]
                words = resolvable([e for e, _ in hist], bound)
                if words:
                    warnings.append(f"{slo.class_name} ({sg}{f', model {model}' if model else ''}"
                                    f"): {words}")
        classes.append(row)
    if job_class and not classes:
        raise UsageError(f"--class {job_class}: no monitor.slo with a per-job limit for it",
                         hint="add p99_ms or max_error_rate to its monitor.slo entry")
    quantiles = {f"{sg}/{model or '-'}": {q: v * 1000.0 for q, v in qs.items()}
                 for (sg, model), qs in sorted(lat.quantiles.items())}
    ok = not warnings and all(c["verdict"] != ladder.UNKNOWN for c in classes)
    return {"url": url, "ok": ok, "profile": profile, "requests": lat.requests,
            "error_ratio": lat.error_ratio, "unknown": list(lat.unknown),
            "quantiles_ms": quantiles, "classes": classes, "warnings": warnings}


def _ms(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else seconds * 1000.0


def render(r: Dict[str, Any]) -> str:
    if r.get("profile") is None:
        return (f"{r['url']}: no figures ({r['reason']}: {r['detail']})\n"
                "  the agent would mark this job's latency unknown with that reason")
    lines = [f"{r['url']}: read as {r['profile']}"]
    req = r["requests"]
    lines.append(f"  requests in the window: {'unknown' if req is None else f'{req:g}'}")
    err = r["error_ratio"]
    lines.append("  error ratio: " + ("unknown (" + ", ".join(r["unknown"]) + ")"
                                      if err is None else f"{err:.2%}"))
    for key, qs in r["quantiles_ms"].items():
        shown = ", ".join(f"P{_pct(q)} {v:.0f} ms" for q, v in sorted(qs.items()))
        lines.append(f"  {key}: {shown} (interpolated in the server's buckets)")
    for c in r["classes"]:
        over: List[Tuple[str, List[float]]] = sorted(c["over"].items())
        shares = "; ".join(f"{m}: {lo:.1%}" + ("" if lo == hi else f"-{hi:.1%}")
                           for m, (lo, hi) in over)
        lines.append(f"  class {c['class']}: {c['verdict']} - {c['reason']}"
                     + (f" [over {c['p99_ms']:g} ms: {shares}]" if shares else ""))
    for w in r["warnings"]:
        lines.append(f"  warning: {w}")
    return "\n".join(lines)


def _pct(q: str) -> str:
    return f"{float(q) * 100:g}"
