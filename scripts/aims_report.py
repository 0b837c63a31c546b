#!/usr/bin/env python3
"""Parsing and tables for the issue-9 aims (scripts/bench-aims.sh, scripts/bench-cpu-tc.sh).

Subcommands:
  split WEIGHTS G1 G2 ...      the split of per-VM Gbit/s, normalised to the first VM, and
                               whether each VM's share is within SPLIT_TOLERANCE of its weight's
                               ("1.00:2.01:2.98 yes"); bench-cpu-tc.sh calls it per run
  cpu-tc-table CSV             Markdown of a bench-cpu-tc.sh CSV: the runs, then per switch and
                               offload setting the medians over the rounds
  report [--vhost CSV] [--dataplane CSV] [--cpu-tc CSV] [--engines TXT]
         [--cmd KIND=COMMAND]... [--failed KIND=WHY]... --title TEXT
                               the aims table (one row per aim), on stdout

Tested by its doctests: `python3 -m doctest scripts/aims_report.py` (scripts/test.sh).
Standard library only.
"""

import argparse
import csv
import io
import math
import re
import statistics
import sys

SPLIT_TOLERANCE = 0.10
"""A VM's share of the total may differ from its weight's share by this fraction of it."""


def num(text):
    """A float, or NaN for what is not a number.

    >>> num("1.5"), math.isnan(num("nan")), math.isnan(num("-")), math.isnan(num(None))
    (1.5, True, True, True)
    """
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def split(weights, gbps):
    """The split normalised to the first VM, and whether it follows the weights.

    >>> split([1, 2, 3], [0.16, 0.33, 0.49])
    ('1.00:2.06:3.06', 'yes')
    >>> split([1, 2, 3], [0.33, 0.33, 0.33])
    ('1.00:1.00:1.00', 'no')
    >>> split([1, 2, 3], [0.0, 0.5, 0.5])
    ('0:0.50:0.50', 'no')
    >>> split([1, 2, 3], [0.1, math.nan, 0.3])
    ('nan', 'no')
    """
    if any(math.isnan(g) for g in gbps) or len(weights) != len(gbps):
        return "nan", "no"
    total, wsum = sum(gbps), sum(weights)
    if gbps[0] > 0:
        text = ":".join(f"{g / gbps[0]:.2f}" for g in gbps)
    else:
        text = "0:" + ":".join(f"{g:.2f}" for g in gbps[1:])
    ok = total > 0 and all(
        abs((g / total) / (w / wsum) - 1) <= SPLIT_TOLERANCE for g, w in zip(gbps, weights)
    )
    return text, "yes" if ok else "no"


def rows_of(text):
    """The rows of a CSV text, as dicts.

    >>> rows_of("a,b\\n1,2\\n")
    [{'a': '1', 'b': '2'}]
    """
    return list(csv.DictReader(io.StringIO(text)))


def mean(values):
    """The mean of the numbers among `values` (NaN when none).

    >>> mean([1, 2, math.nan]), math.isnan(mean([math.nan]))
    (1.5, True)
    """
    v = [x for x in values if not math.isnan(x)]
    return sum(v) / len(v) if v else math.nan


def median(values):
    """The median of the numbers among `values` (NaN when none).

    >>> median([3, 1, math.nan, 2]), math.isnan(median([]))
    (2, True)
    """
    v = [x for x in values if not math.isnan(x)]
    return statistics.median(v) if v else math.nan


def ratio(a, b):
    """a / b, NaN when either is missing or b is not positive.

    >>> ratio(3, 2), math.isnan(ratio(1, 0)), math.isnan(ratio(math.nan, 1))
    (1.5, True, True)
    """
    if math.isnan(a) or math.isnan(b) or b <= 0:
        return math.nan
    return a / b


def fmt(x, digits=2):
    """A number for a table ("–" for NaN).

    >>> fmt(1.234), fmt(math.nan), fmt(12.0, 0)
    ('1.23', '–', '12')
    """
    return "–" if math.isnan(x) else f"{x:.{digits}f}"


# --- bench-cpu-tc.sh ---------------------------------------------------------------------------

CPU_TC_SAMPLE = """switch,offloads,tso_gso_gro,round,gbps_vm1,gbps_vm2,gbps_vm3,gbps_total,split,split_ok,switch_cpu_pct,softirq_pct,switch_softirq_pct,all_cpu_pct,load1_before,seconds
vqos,on,on/on/on,1,0.155,0.310,0.465,0.930,1.00:2.00:3.00,yes,6.0,1.0,7.0,40.0,0.5,10
htb,on,on/on/on,1,0.150,0.300,0.450,0.900,1.00:2.00:3.00,yes,-,5.0,5.0,30.0,0.5,10
bridge,on,on/on/on,1,0.300,0.300,0.300,0.900,1.00:1.00:1.00,n/a,-,4.0,4.0,28.0,0.5,10
vqos,off,off/off/off,1,0.155,0.310,0.465,0.930,1.00:2.00:3.00,yes,20.0,2.0,22.0,60.0,0.5,10
htb,off,off/off/off,1,0.150,0.300,0.450,0.900,1.00:2.00:3.00,yes,-,40.0,40.0,70.0,0.5,10
vqos,on,on/on/on,2,0.155,0.310,0.465,0.930,1.00:2.00:3.00,no,8.0,1.0,9.0,40.0,0.5,10
"""


def cpu_tc_summary(rows):
    """Per (switch, offloads): medians over the rounds of total Gbit/s, switch + softirq % and
    all-CPU %, the rounds whose split held, and the number of rounds.

    >>> s = cpu_tc_summary(rows_of(CPU_TC_SAMPLE))
    >>> s["vqos", "on"]
    {'gbps': 0.93, 'cpu': 8.0, 'all': 40.0, 'split_ok': 1, 'runs': 2, 'split': '1.00:2.00:3.00'}
    >>> s["htb", "off"]["cpu"], ("bridge", "off") in s
    (40.0, False)
    """
    out = {}
    for key in dict.fromkeys((r["switch"], r["offloads"]) for r in rows):
        runs = [r for r in rows if (r["switch"], r["offloads"]) == key]
        out[key] = {
            "gbps": median([num(r["gbps_total"]) for r in runs]),
            "cpu": median([num(r["switch_softirq_pct"]) for r in runs]),
            "all": median([num(r["all_cpu_pct"]) for r in runs]),
            "split_ok": sum(r["split_ok"] == "yes" for r in runs),
            "runs": len(runs),
            "split": runs[-1]["split"],
        }
    return out


def cpu_tc_table(text):
    """Markdown of a bench-cpu-tc.sh CSV.

    >>> md = cpu_tc_table(CPU_TC_SAMPLE)
    >>> "| vqos | on (TSO/GSO/GRO) | 1 | 0.155 / 0.310 / 0.465 | 1.00:2.00:3.00 (yes) |" in md
    True
    >>> "| off (1514-byte frames) | 0.93 | 22.0 | 40.0 | 0.55 | 1/1 |" in md
    True
    """
    rows = rows_of(text)
    vms = [c for c in (rows[0].keys() if rows else []) if c.startswith("gbps_vm")]
    off = {"on": "on (TSO/GSO/GRO)", "off": "off (1514-byte frames)"}
    lines = [
        "| switch | offloads | round | Gbit/s per VM | split (check) | switch CPU % | softirq % "
        "| switch + softirq % | all CPUs % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['switch']} | {off.get(r['offloads'], r['offloads'])} | {r['round']} "
            f"| {' / '.join(r[c] for c in vms)} | {r['split']} ({r['split_ok']}) "
            f"| {r['switch_cpu_pct']} | {r['softirq_pct']} | {r['switch_softirq_pct']} "
            f"| {r['all_cpu_pct']} |"
        )
    s = cpu_tc_summary(rows)
    lines += [
        "",
        "Medians over the rounds; the aim's ratio is vqosd's (process + softirq) over HTB's "
        "(softirq):",
        "",
        "| offloads | vqos Gbit/s | vqos switch + softirq % | HTB switch + softirq % "
        "| vqos / HTB | rounds the 1:2:3 split held (vqos) | bridge switch + softirq % |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in ("on", "off"):
        v, h, b = (s.get((sw, o), {}) for sw in ("vqos", "htb", "bridge"))
        nan = math.nan
        lines.append(
            f"| {off[o]} | {fmt(v.get('gbps', nan))} | {fmt(v.get('cpu', nan), 1)} "
            f"| {fmt(h.get('cpu', nan), 1)} | {fmt(ratio(v.get('cpu', nan), h.get('cpu', nan)))} "
            f"| {v.get('split_ok', 0)}/{v.get('runs', 0)} | {fmt(b.get('cpu', nan), 1)} |"
        )
    return "\n".join(lines) + "\n"


# --- bench-vhost.sh, bench-dataplane.sh, criterion -----------------------------------------------

VHOST_SAMPLE = """switch,frame_bytes,mpps,gbps,cycles_per_packet,load1
vqos-rr,64,8.39,4.57,263,1.6
vqos-8,64,8.35,4.54,264,1.6
ovs,64,11.09,6.03,197,1.6
vqos-rr,1518,3.49,42.46,631,1.7
vqos-8,1518,3.42,41.63,646,1.7
ovs,1518,3.80,46.29,nan,1.7
"""


def vhost_means(rows):
    """Mean over the rounds per (switch, frame bytes): {"mpps", "gbps", "cpp"}.

    >>> m = vhost_means(rows_of(VHOST_SAMPLE))
    >>> m["vqos-rr", 64]["mpps"], math.isnan(m["ovs", 1518]["cpp"])
    (8.39, True)
    """
    out = {}
    for key in dict.fromkeys((r["switch"], int(r["frame_bytes"])) for r in rows):
        runs = [r for r in rows if (r["switch"], int(r["frame_bytes"])) == key]
        out[key] = {
            f: mean([num(r[c]) for r in runs])
            for f, c in (("mpps", "mpps"), ("gbps", "gbps"), ("cpp", "cycles_per_packet"))
        }
    return out


DATAPLANE_SAMPLE = """switch,case,offloads,tso_gso_gro,gbps,retransmits,switch_cpu_pct,softirq_pct,all_cpu_pct,switch_softirq_pct_per_gbps,all_cpu_pct_per_gbps,load1_before,seconds
rr,1stream,on,on/on/on,15.0,0,60.0,30.0,170.0,6.0,11.3,1.0,8
rr,4vms,on,on/on/on,17.0,0,80.0,30.0,170.0,6.5,10.0,1.0,8
rr,1stream,off,off/off/off,2.0,0,99.0,8.0,130.0,53.5,65.0,1.0,8
rr,4vms,off,off/off/off,2.2,0,99.0,8.0,130.0,48.6,59.1,1.0,8
rr-uring,1stream,off,off/off/off,4.5,0,99.0,8.0,130.0,23.8,28.9,1.0,8
rr-uring,4vms,off,off/off/off,4.3,0,99.0,8.0,130.0,24.9,30.2,1.0,8
rr-uring,1stream,on,on/on/on,16.0,0,40.0,20.0,170.0,3.8,10.6,1.0,8
rr-uring,4vms,on,on/on/on,nan,0,-,-,-,nan,nan,1.0,8
ovs,1stream,on,on/on/on,11.0,0,85.0,25.0,170.0,10.0,15.5,1.0,8
ovs,4vms,on,on/on/on,13.0,0,86.0,34.0,170.0,9.2,13.1,1.0,8
"""


def dataplane_sums(rows, offloads):
    """Per switch, over the cases with `offloads` that ran: Σ Gbit/s, Σ (switch + softirq) %,
    and the number of cases. A failed case (Gbit/s NaN) counts in neither sum.

    >>> d = dataplane_sums(rows_of(DATAPLANE_SAMPLE), "on")
    >>> d["rr"], d["rr-uring"]
    ((32.0, 200.0, 2), (16.0, 60.0, 1))
    >>> dataplane_sums(rows_of(DATAPLANE_SAMPLE), "off")["rr-uring"]
    (8.8, 214.0, 2)
    """
    out = {}
    for r in rows:
        if r["offloads"] != offloads:
            continue
        g = num(r["gbps"])
        g_sum, c_sum, n = out.get(r["switch"], (0.0, 0.0, 0))
        if not math.isnan(g):
            sc = num(r["switch_cpu_pct"])
            c = (0.0 if math.isnan(sc) else sc) + num(r["softirq_pct"])
            g_sum, c_sum, n = g_sum + g, c_sum + c, n + 1
        out[r["switch"]] = (round(g_sum, 6), round(c_sum, 6), n)
    return out


UNITS_NS = {"ps": 1e-3, "ns": 1.0, "us": 1e3, "µs": 1e3, "μs": 1e3, "ms": 1e6, "s": 1e9}


def criterion_ns(text):
    """{bench id: the middle time estimate in ns} from criterion's output.

    >>> out = '''Benchmarking decision/vqos/64: Analyzing
    ... decision/vqos/64        time:   [296.12 ns 299.10 ns 302.33 ns]
    ...                         change: [-1.0% +0.2% +1.1%] (p = 0.70 > 0.05)
    ... decision/a-very-long-benchmark-name/64
    ...                         time:   [1.2010 µs 1.2100 µs 1.2200 µs]
    ... '''
    >>> criterion_ns(out)
    {'decision/vqos/64': 299.1, 'decision/a-very-long-benchmark-name/64': 1210.0}
    """
    out, last = {}, None
    pat = re.compile(r"time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]")
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith(("Benchmarking", "Found", "Warning")):
            last = line.split()[0]
        m = pat.search(line)
        if m and last and m.group(2) in UNITS_NS:
            out[last] = round(float(m.group(1)) * UNITS_NS[m.group(2)], 3)
    return out


# --- the aims table --------------------------------------------------------------------------------


def x(r):
    """A ratio as "1.23×".

    >>> x(1.234), x(math.nan)
    ('1.23×', '–')
    """
    return "–" if math.isnan(r) else f"{r:.2f}×"


def verdict(ok):
    """'**met**', '**not met**' or '– (not measured)' for True, False and None."""
    return {True: "**met**", False: "**not met**", None: "– (not measured)"}[ok]


def aims_rows(vhost=None, dataplane=None, cpu_tc=None, engines=None):
    """The rows (aim, measured, baseline, met?, kind of sub-command), one per aim; a missing
    input gives its rows as not measured.

    >>> rows = aims_rows(vhost=rows_of(VHOST_SAMPLE), dataplane=rows_of(DATAPLANE_SAMPLE),
    ...                  cpu_tc=rows_of(CPU_TC_SAMPLE),
    ...                  engines={"decision/vqos/64": 99.0, "decision/rr/64": 33.0})
    >>> [r[3] for r in rows]  # doctest: +NORMALIZE_WHITESPACE
    ['**not met**', '**met**', '**not met**', '– (reported)', '**met**', '**met**',
     '**not met**', '**not met**', '**met**']
    >>> rows[0][1]
    'vqosd `rr` 8.39 Mpps = 0.76× OVS-DPDK'
    >>> rows[4][1]
    'rr-uring 4.40 Gbit/s (2.10×); met by rr-uring'
    >>> rows[5][1]
    'rr 6.25 % of a core per Gbit/s (0.65×), rr-uring 3.75 (0.39×); met by rr, rr-uring'
    >>> [r[3] for r in aims_rows()] == ['– (not measured)'] * 4 + ['– (not measured)'] * 5
    True
    """
    rows = []
    nan = math.nan
    v = vhost_means(vhost) if vhost is not None else None

    def vget(sw, fb, f):
        return v.get((sw, fb), {}).get(f, nan) if v is not None else nan

    def judged(r, ok_if):
        return None if math.isnan(r) else ok_if(r)

    rr64, ovs64, q64 = vget("vqos-rr", 64, "mpps"), vget("ovs", 64, "mpps"), vget("vqos-8", 64, "mpps")
    r = ratio(rr64, ovs64)
    rows.append(("64-byte frames, one switch core: vqosd `rr` ≥ 1.0× OVS-DPDK's Mpps",
                 f"vqosd `rr` {fmt(rr64)} Mpps = {x(r)} OVS-DPDK", f"OVS-DPDK {fmt(ovs64)} Mpps",
                 verdict(judged(r, lambda r: r >= 1.0)), "vhost"))
    r = ratio(q64, rr64)
    rows.append(("64-byte frames: `vqos` with 8 policies ≥ 0.95× of `rr`",
                 f"`vqos` 8 policies {fmt(q64)} Mpps = {x(r)} `rr`", f"vqosd `rr` {fmt(rr64)} Mpps",
                 verdict(judged(r, lambda r: r >= 0.95)), "vhost"))
    g, go = vget("vqos-rr", 1518, "gbps"), vget("ovs", 1518, "gbps")
    r = ratio(g, go)
    rows.append(("1518-byte frames: vqosd `rr` ≥ 1.0× OVS-DPDK's Gbit/s",
                 f"vqosd `rr` {fmt(g)} Gbit/s = {x(r)} OVS-DPDK", f"OVS-DPDK {fmt(go)} Gbit/s",
                 verdict(judged(r, lambda r: r >= 1.0)), "vhost"))
    c64, o64 = vget("vqos-rr", 64, "cpp"), vget("ovs", 64, "cpp")
    c15, o15 = vget("vqos-rr", 1518, "cpp"), vget("ovs", 1518, "cpp")
    rows.append(("cycles/packet beside OVS-DPDK's (no threshold)",
                 f"vqosd `rr` {fmt(c64, 0)} (64 B), {fmt(c15, 0)} (1518 B)",
                 f"OVS-DPDK {fmt(o64, 0)} (64 B), {fmt(o15, 0)} (1518 B)",
                 "– (reported)" if v is not None else verdict(None), "vhost"))

    def order(sw):  # rr, rr-uring, rr+afp, rr-uring+afp, then the others
        return (sw.count("uring") + 2 * sw.count("afp"), sw)

    d_off = dataplane_sums(dataplane, "off") if dataplane is not None else None
    if d_off is not None and "rr" in d_off:
        avg = lambda s: s[0] / s[2] if s[2] else nan  # noqa: E731 (mean Gbit/s of the cases)
        base_v = avg(d_off["rr"])
        parts, met = [], []
        for sw in sorted((s for s in d_off if s not in ("rr", "ovs")), key=order):
            rv = ratio(avg(d_off[sw]), base_v)
            parts.append(f"{sw} {fmt(avg(d_off[sw]))}{'' if parts else ' Gbit/s'} ({x(rv)})")
            if not math.isnan(rv) and rv >= 2.0:
                met.append(sw)
        ok = bool(met) if parts and not math.isnan(base_v) else None
        rows.append(("TAP, 1514-byte frames: ≥ 2× today's vqosd (`rr`, one system call per frame)",
                     ", ".join(parts) + (f"; met by {', '.join(met)}" if met else ""),
                     f"rr {fmt(base_v)} Gbit/s (mean of the cases, offloads off)", verdict(ok),
                     "dataplane"))
    else:
        rows.append(("TAP, 1514-byte frames: ≥ 2× today's vqosd (`rr`, one system call per frame)",
                     "–", "–", verdict(None), "dataplane"))
    d_on = dataplane_sums(dataplane, "on") if dataplane is not None else None
    if d_on is not None and "ovs" in d_on:
        per = lambda s: ratio(s[1], s[0])  # noqa: E731 (% of a core per Gbit/s)
        ovs_per = per(d_on["ovs"])
        parts, met = [], []
        for sw in sorted((s for s in d_on if s != "ovs"), key=order):
            rv = ratio(per(d_on[sw]), ovs_per)
            unit = " % of a core per Gbit/s" if not parts else ""
            parts.append(f"{sw} {fmt(per(d_on[sw]))}{unit} ({x(rv)})")
            if not math.isnan(rv) and rv <= 0.7:
                met.append(sw)
        ok = bool(met) if parts and not math.isnan(ovs_per) else None
        rows.append(("TAP with TSO: (switch + softirq) CPU per Gbit/s ≤ 0.7× OVS userspace's",
                     ", ".join(parts) + (f"; met by {', '.join(met)}" if met else ""),
                     f"OVS userspace {fmt(ovs_per)} % of a core per Gbit/s", verdict(ok), "dataplane"))
    else:
        rows.append(("TAP with TSO: (switch + softirq) CPU per Gbit/s ≤ 0.7× OVS userspace's",
                     "–", "–", verdict(None), "dataplane"))

    s = cpu_tc_summary(cpu_tc) if cpu_tc is not None else {}
    for off, limit, what in (("on", 1.0, "with TSO: ≤ HTB's"),
                             ("off", 0.3, "with 1514-byte frames: ≤ 0.3× HTB's")):
        vq, h, b = (s.get((sw, off), {}) for sw in ("vqos", "htb", "bridge"))
        r = ratio(vq.get("cpu", nan), h.get("cpu", nan))
        measured = (f"vqosd {fmt(vq.get('cpu', nan), 1)} % of a core = {x(r)} HTB's; "
                    f"{fmt(vq.get('gbps', nan))} Gbit/s, split {vq.get('split', '–')} "
                    f"(held in {vq.get('split_ok', 0)}/{vq.get('runs', 0)} rounds)")
        base = (f"HTB {fmt(h.get('cpu', nan), 1)} % (split held {h.get('split_ok', 0)}/"
                f"{h.get('runs', 0)}); bridge + tbf {fmt(b.get('cpu', nan), 1)} %")
        rows.append((f"1 Gbit/s, 1:2:3 on three vifs, vqosd CPU (process + softirq) {what}",
                     measured if s else "–", base if s else "–",
                     verdict(judged(r, lambda r, lim=limit: r <= lim)), "cpu-tc"))

    e = engines if engines is not None else {}
    q, rr = e.get("decision/vqos/64", nan), e.get("decision/rr/64", nan)
    rows.append(("`vqos` engine decision at 64 backlogged vifs ≤ 100 ns",
                 f"{fmt(q, 1)} ns ({x(ratio(q, rr))} `rr`)" if e else "–",
                 f"`rr` {fmt(rr, 1)} ns" if e else "–",
                 verdict(judged(q, lambda q: q <= 100.0)), "engines"))
    return rows


def report(args):
    r"""The aims markdown from the parsed command line.

    >>> a = argparse.Namespace(cmd=["engines=cargo bench -- '^a|b$'"], failed=["vhost=exit 1"],
    ...                        vhost=None, dataplane=None, cpu_tc=None, engines=None, title="T")
    >>> md = report(a)
    >>> "| `cargo bench -- '^a\|b$'` |" in md, md.count("– (not measured: exit 1)")
    (True, 4)
    >>> md.splitlines()[0], md.count("\n")
    ('# T', 13)
    """
    def read(path):
        if not path:
            return None
        with open(path, encoding="utf-8") as f:
            return f.read()

    cmds = dict(c.split("=", 1) for c in args.cmd)
    failed = dict(c.split("=", 1) for c in args.failed)
    vhost, dataplane, cputc, engines = (read(p) for p in (args.vhost, args.dataplane, args.cpu_tc,
                                                        args.engines))
    rows = aims_rows(
        vhost=rows_of(vhost) if vhost else None,
        dataplane=rows_of(dataplane) if dataplane else None,
        cpu_tc=rows_of(cputc) if cputc else None,
        engines=criterion_ns(engines) if engines else None,
    )
    out = [f"# {args.title}", "",
           "| aim | measured | baseline (same run) | met? | command |", "|---|---|---|---|---|"]
    for aim, measured, base, met, kind in rows:
        if kind in failed:
            met = f"– (not measured: {failed[kind]})"
        cmd = cmds.get(kind, "").replace("|", "\\|")  # inside a table cell
        out.append(f"| {aim} | {measured} | {base} | {met} | `{cmd}` |")
    return "\n".join(out) + "\n"


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("split")
    s.add_argument("weights")
    s.add_argument("gbps", nargs="+")
    t = sub.add_parser("cpu-tc-table")
    t.add_argument("csv")
    r = sub.add_parser("report")
    for opt in ("--vhost", "--dataplane", "--cpu-tc", "--engines"):
        r.add_argument(opt)
    r.add_argument("--cmd", action="append", default=[], help="KIND=COMMAND")
    r.add_argument("--failed", action="append", default=[], help="KIND=WHY")
    r.add_argument("--title", required=True)
    a = p.parse_args(argv)
    if a.what == "split":
        text, ok = split([float(w) for w in a.weights.split(",")], [num(g) for g in a.gbps])
        print(text, ok)
    elif a.what == "cpu-tc-table":
        with open(a.csv, encoding="utf-8") as f:
            sys.stdout.write(cpu_tc_table(f.read()))
    else:
        sys.stdout.write(report(a))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
