#!/usr/bin/env python3
"""C2QoS Fig. 6 against the one number the simulator's cost model rests on: how many cycles a
64-byte frame costs next to a 1518-byte one (`r`, per frame). For each `r` the cost model of
the Fig. 6 files is re-solved so that a 1518-byte frame still costs what it costs in the file
(10 Gbit/s of 1518-byte frames fills 90 % of the 1.54 GHz core, the paper's 36/36/9/9 %), then
both files (the policer baseline `tcm` and C2QoS) are simulated and VM1's rate before and after
its neighbours switch to 64-byte frames is set beside the paper's claim.

Usage: scripts/cost-sweep.py [--vqos PATH] [--ratios 0.4,0.5,...]

The paper's own sentences (seeds/c2qos-2021.txt, §I): "at the same bits-per-second (BPS) rate,
compared to forwarding traffic with 1518-byte packet size, forwarding traffic with 64-byte
packet size consumes 10 times more CPU cycles", i.e. r = 10 × 64 / 1518 = 0.42 per frame; and
"forwarding a flow with 64-byte packets at a speed of 512 Mbps will consume more CPU cycles
than forwarding a flow with 1518-byte packets at a speed of 2.4 Gbps", i.e. r > 0.20.

Deterministic (seed 1). Tested by its doctests: `python3 -m doctest scripts/cost-sweep.py`
(scripts/test.sh). Standard library only.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

FILES = ["c2qos-fig6-tcm", "c2qos-fig6-c2qos"]
RATIOS = [0.4, 0.42, 0.5, 0.6, 0.7, 0.784, 0.9, 1.0]
SMALL, LARGE = 64, 1518


def solve(r, per_packet, per_byte, classify):
    """Per-frame and per-byte cycles giving a 64-byte frame `r` times the cost of a 1518-byte
    one, the 1518-byte frame's cost unchanged (classify cycles kept).

    >>> p, b = solve(0.78, 1000.0, 0.25, 300.0)
    >>> round(p + 300 + 1518 * b, 1), round((p + 300 + 64 * b) / (p + 300 + 1518 * b), 3)
    (1679.5, 0.78)
    >>> solve(1.0, 1000.0, 0.25, 300.0)
    (1379.5, 0.0)
    """
    large = per_packet + classify + LARGE * per_byte
    b = large * (1 - r) / (LARGE - SMALL)
    return round(large - classify - LARGE * b, 3), round(b, 6)


def with_model(text, per_packet, per_byte):
    """`text` with the `[cost_model]` table's per-frame and per-byte cycles replaced.

    >>> with_model("[cost_model]\\nper_packet_cycles = 1000.0\\nper_byte_cycles = 0.25\\n", 5, 0.5)
    '[cost_model]\\nper_packet_cycles = 5\\nper_byte_cycles = 0.5\\n'
    """
    text = re.sub(r"(?m)^per_packet_cycles = .*$", f"per_packet_cycles = {per_packet}", text)
    return re.sub(r"(?m)^per_byte_cycles = .*$", f"per_byte_cycles = {per_byte}", text)


def model_of(text):
    """The file's (per-frame, per-byte, classify) cycles.

    >>> model_of("per_packet_cycles = 1000.0\\nper_byte_cycles = 0.25\\nclassify_cycles = 300.0")
    (1000.0, 0.25, 300.0)
    """
    get = lambda k: float(re.search(rf"(?m)^{k} = (.*)$", text).group(1))
    return get("per_packet_cycles"), get("per_byte_cycles"), get("classify_cycles")


def vm1(report):
    """VM1's mean Mbit/s in phases 1 and 2 and its loss.

    >>> p = lambda x: {"vifs": {"vm1": {"mean_bps": x}}}
    >>> vm1({"phases": [p(4e9), p(3e9)]})
    (4000.0, 3000.0, 0.25)
    """
    a, b = (p["vifs"]["vm1"]["mean_bps"] / 1e6 for p in report["phases"][:2])
    return a, b, round(1 - b / a, 4)


def main(argv):
    vqos, ratios = None, RATIOS
    while argv:
        if argv[0] == "--vqos":
            vqos, argv = argv[1], argv[2:]
        elif argv[0] == "--ratios":
            ratios, argv = [float(x) for x in argv[1].split(",")], argv[2:]
        else:
            sys.exit(f"unknown argument {argv[0]}\n{__doc__}")
    if vqos is None:
        built = [p for p in ("target/release/vqos", "target/debug/vqos") if os.path.exists(p)]
        vqos = max(built, key=os.path.getmtime) if built else "vqos"
    texts = {f: open(f"scenarios/{f}.toml").read() for f in FILES}
    base = model_of(texts[FILES[0]])
    print("| r (64 B / 1518 B cycles per frame) | per bit | per-frame cycles | per-byte cycles "
          "| tcm: VM1 Mbit/s, 1518 B → 64 B neighbours | loss | c2qos: VM1 Mbit/s | loss |")
    print("|---:|---:|---:|---:|---|---:|---|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for r in ratios:
            per_packet, per_byte = solve(r, *base)
            cells = []
            for f in FILES:
                path = os.path.join(tmp, f"{f}.toml")
                with open(path, "w") as out:
                    out.write(with_model(texts[f], per_packet, per_byte))
                res = subprocess.run([vqos, "sim", path, "--json"], check=True,
                                     capture_output=True, text=True)
                a, b, loss = vm1(json.loads(res.stdout))
                cells += [f"{a:.0f} → {b:.0f}", f"{loss * 100:.1f} %"]
            per_bit = r * LARGE / SMALL
            print(f"| {r:g} | {per_bit:.1f}× | {per_packet:g} | {per_byte:g} | "
                  + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
