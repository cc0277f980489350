"""report.html of a harness run: self-contained (inline CSS and SVG, no scripts)."""
import html


def _bars(rows, unit="", width=520, bar_h=18, color="#3b6ea8", fmt="{:.2f}"):
    """rows: [(label, value, extra text)] -> an inline SVG horizontal bar chart."""
    rows = [r for r in rows if r[1] is not None]
    if not rows:
        return "<p><i>no data</i></p>"
    top = max(v for _, v, _ in rows) or 1.0
    label_w, h = 260, (bar_h + 6) * len(rows) + 6
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + width + 160}" height="{h}" '
             'font-family="sans-serif" font-size="12">']
    for k, (label, v, extra) in enumerate(rows):
        y = 6 + k * (bar_h + 6)
        w = max(1.0, width * v / top)
        parts.append(f'<text x="{label_w - 6}" y="{y + bar_h - 5}" text-anchor="end">{html.escape(str(label))}</text>')
        parts.append(f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color}"/>')
        parts.append(f'<text x="{label_w + w + 6:.1f}" y="{y + bar_h - 5}">{html.escape(fmt.format(v) + unit)}'
                     f'{html.escape(" " + extra if extra else "")}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _table(header, rows):
    out = ["<table><tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in header) + "</tr>"]
    for r in rows:
        out.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _f(v, fmt="{:.2f}"):
    return "" if v is None else fmt.format(v)


def render(res):
    runs = res.get("runs", [])
    h = ["<!doctype html><html><head><meta charset='utf-8'><title>MLPerf DLRM-v2 harness</title><style>",
         "body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}",
         "table{border-collapse:collapse;margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;"
         "text-align:right;font-size:13px}th{background:#eee}td:first-child{text-align:left}",
         ".valid{color:#176b2c;font-weight:bold}.invalid{color:#a11;font-weight:bold}",
         "pre{background:#f6f6f6;padding:8px;font-size:12px;overflow-x:auto}",
         "</style></head><body>",
         "<h1>MLPerf Inference DLRM-v2 on LoadGen</h1>",
         f"<p>Server <code>{html.escape(str(res.get('server')))}</code>, model "
         f"<code>{html.escape(str(res.get('model')))}</code>, started {html.escape(str(res.get('started')))}.<br>"
         f"Command: <code>{html.escape(' '.join(res.get('argv', [])))}</code></p>"]
    lib = res.get("library", {})
    h.append(f"<p>Sample library: {lib.get('queries')} queries, {lib.get('pairs'):,} user-item pairs, ids "
             f"{html.escape(str(lib.get('ids')))}"
             + (f" (locality entry {html.escape(str(lib.get('locality_entry')))})" if lib.get("locality_entry") else "")
             + f", {lib.get('request_bytes', 0) / 2**20:.1f} MiB of pre-serialized requests.</p>")
    if runs:
        h.append("<h2>Runs</h2>")
        rows = []
        for r in runs:
            c = r["client"]
            rows.append([r["tag"], r["scenario"], r["mode"], _f(r["target_qps"]), _f(r["samples_per_s"]),
                         _f(r["samples_per_s_per_core"]), _f(r["p99_ms"]), r.get("loadgen_result"),
                         "VALID" if r["valid"] else "INVALID", c["queries"], sum(c["errors"].values()),
                         _f(c["cpu_us_per_query"], "{:.0f}"), _f(r.get("server_cpu_us_per_query"), "{:.0f}")])
        h.append(_table(["run", "scenario", "mode", "target samples/s", "samples/s", "per server core",
                         "p99 ms (LoadGen)", "LoadGen", "harness", "queries", "errors",
                         "client CPU us/query", "server CPU us/query"], rows))
        notes = sorted({n for r in runs for n in r.get("notes", [])})
        for n in notes:
            h.append(f"<p><b>Note:</b> {html.escape(n)}</p>")
        perf = [r for r in runs if r["mode"] == "PerformanceOnly"]
        if perf:
            h.append("<h3>Samples per second by run</h3>")
            h.append(_bars([(r["tag"], r["samples_per_s"], "VALID" if r["valid"] else "INVALID") for r in perf],
                           " samples/s"))
        for r in runs:
            h.append(f"<h2>{html.escape(r['tag'])}</h2>")
            cls = "valid" if r["valid"] else "invalid"
            h.append(f"<p class='{cls}'>LoadGen: {html.escape(str(r.get('loadgen_result')))}; harness: "
                     f"{'VALID' if r['valid'] else 'INVALID'}"
                     + (f" ({html.escape(r['harness_note'])})" if r.get("harness_note") else "") + "</p>")
            h.append("<pre>" + html.escape("\n".join(f"{k} : {v}" for k, v in r["loadgen"].items())) + "</pre>")
            b = r.get("breakdown")
            if b:
                h.append(f"<h3>Server time per query by stage</h3><p>{b['requests']:.0f} requests, "
                         f"{b.get('batches', 0):.0f} batches, mean batch {b.get('mean_batch_size', 0):.0f} pairs. "
                         "Shares are of the summed request durations (ember_request_duration_seconds).</p>")
                h.append(_bars([(st["stage"], st.get("per_query_ms"),
                                 f"({100 * st['share_of_request']:.1f}%)" if st.get("share_of_request") is not None
                                 else "") for st in b["stages"] if not st.get("missing")], " ms", color="#a8663b"))
                missing = [st["metric"] for st in b["stages"] if st.get("missing")]
                if missing:
                    h.append(f"<p>Not exported by the server: {html.escape(', '.join(missing))}</p>")
                if b["counters"]:
                    h.append(_table(["counter", "increase"], [[k, f"{v:,.0f}"] for k, v in b["counters"].items()]))
            by = r["client"]["by_size"]
            if by:
                h.append("<h3>Client latency by query size (median, p99)</h3>")
                h.append(_bars([(f"{s['pairs']} pairs median ({s['queries']} q)", s["median_ms"], "") for s in by]
                               + [(f"{s['pairs']} pairs p99", s["p99_ms"], "") for s in by], " ms", color="#5b8f3b"))
                h.append(_table(["pairs", "queries", "median ms", "p99 ms", "max ms"],
                                [[s["pairs"], s["queries"], _f(s["median_ms"]), _f(s["p99_ms"]), _f(s["max_ms"])]
                                 for s in by]))
    fm = res.get("find_max")
    if fm:
        h.append("<h2>find-max</h2>")
        h.append(_table(["target samples/s", "result", "p99 ms"],
                        [[_f(t["target_qps"]), "VALID" if t["valid"] else "INVALID", _f(t["p99_ms"])]
                         for t in fm["tries"]]))
        h.append(f"<p>Highest VALID Server rate (confirmed): <b>{_f(fm['highest_valid_qps'])}</b> samples/s</p>")
    acc = res.get("accuracy")
    if acc:
        h.append("<h2>Accuracy</h2>")
        h.append(_table(["quantity", "value"], [[k, v] for k, v in acc.items()]))
    h.append("</body></html>\n")
    return "".join(h)
