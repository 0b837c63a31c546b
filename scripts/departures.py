#!/usr/bin/env python3
"""The departures from the papers, measured: each paper scenario in the simulator with vqos's
departures (`--variant vqos`) and with the papers as written (`--variant paper`), side by side.

Usage: scripts/departures.py [--vqos PATH] [FILE ...]
  PATH   the vqos binary (default: the newer of target/release/vqos and target/debug/vqos)
  FILE   scenario files (default: the ones a variant acts on, see FILES)

Prints a Markdown table on stdout: per file and phase, each VM's mean rate under both variants,
the reference allocation, the unfairness, and the scenario's checks passed. Deterministic: the
simulator's seed is fixed (1), so the same commit prints the same table.

Tested by its doctests: `python3 -m doctest scripts/departures.py` (scripts/test.sh).
Standard library only.
"""

import json
import os
import subprocess
import sys

# The files on which a paper variant changes something: ANCS (CreditLeft), the fairness
# adjuster (Algorithm 1), PID-ECN (marking on receive only).
FILES = [
    "ancs-fig4", "ancs-fig5", "ancs-fig6", "ancs-credit-left",
    "fairness-static", "fairness-fluctuating",
    "pid-ecn-unequal", "pid-ecn-start-stop", "pid-ecn-mixed", "pid-ecn-upload-download",
]


def mbit(bps):
    """Mbit/s with one decimal.

    >>> mbit(155_123_456.0)
    '155.1'
    """
    return f"{bps / 1e6:.1f}"


def row(name, i, pv, pp):
    """One table row for phase `i` of both runs' JSON phases.

    >>> a = {"start_s": 0.0, "end_s": 5.0, "unfairness": 0.01,
    ...      "vifs": {"vm1": {"mean_bps": 5e7, "expected_bps": 5e7}}}
    >>> b = {"start_s": 0.0, "end_s": 5.0, "unfairness": 0.5,
    ...      "vifs": {"vm1": {"mean_bps": 8e7, "expected_bps": 5e7}}}
    >>> row("f", 0, a, b)
    '| f | 1 (0–5 s) | vm1 50.0 | vm1 80.0 | vm1 50.0 | 1.0 % | 50.0 % |'
    """
    def rates(p, key):
        vifs = sorted(p["vifs"].items(), key=lambda kv: (len(kv[0]), kv[0]))
        if len(vifs) > 4:  # many alike: the first two and the last
            vifs = vifs[:2] + vifs[-1:]
        return ", ".join(f"{n} {mbit(v[key])}" for n, v in vifs)
    span = f"{pv['start_s']:g}–{pv['end_s']:g} s"
    return (f"| {name} | {i + 1} ({span}) | {rates(pv, 'mean_bps')} | {rates(pp, 'mean_bps')} "
            f"| {rates(pv, 'expected_bps')} | {pv['unfairness'] * 100:.1f} % "
            f"| {pp['unfairness'] * 100:.1f} % |")


def run(vqos, path, variant):
    out = subprocess.run([vqos, "sim", path, "--json", "--variant", variant],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main(argv):
    vqos = None
    if len(argv) >= 2 and argv[0] == "--vqos":
        vqos, argv = argv[1], argv[2:]
    if vqos is None:
        built = [p for p in ("target/release/vqos", "target/debug/vqos") if os.path.exists(p)]
        vqos = max(built, key=os.path.getmtime) if built else "vqos"
    files = argv or [f"scenarios/{f}.toml" for f in FILES]
    print("| file | phase | vqos (Mbit/s) | paper as written | reference | unfairness vqos "
          "| unfairness paper |")
    print("|---|---|---|---|---|---:|---:|")
    checks = []
    for path in files:
        name = os.path.basename(path).removesuffix(".toml")
        v, p = run(vqos, path, "vqos"), run(vqos, path, "paper")
        for i, (pv, pp) in enumerate(zip(v["phases"], p["phases"])):
            print(row(name, i, pv, pp))
        passed = [sum(c["pass"] for c in r["checks"]) for r in (v, p)]
        checks.append(f"{name} {passed[0]}/{len(v['checks'])} → {passed[1]}/{len(p['checks'])}")
    print()
    print("Checks of each file passed (vqos → paper as written): " + "; ".join(checks) + ".")


if __name__ == "__main__":
    main(sys.argv[1:])
