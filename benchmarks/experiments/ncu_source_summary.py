"""Experiment tool: a text summary of Nsight Compute's per-instruction warp-stall samples, to
see where in a kernel's SASS its warps wait.

    ncu --profile-from-start off --clock-control none --import-source no --section SourceCounters \\
        --section WarpStateStats -o REPORT python -m benchmarks.experiments.attention_ncu 1024 full fwd
    ncu -i REPORT.ncu-rep --page source --csv --print-source sass --kernel-name regex:cutlass > cute.csv
    python -m benchmarks.experiments.ncu_source_summary cute.csv

For each CSV: the samples and instructions executed, the stall reasons as a share of all samples, the 25
instructions with the most samples (their SASS line, share, execution count, main reasons), and the runs
of consecutive SASS lines with the same execution count (a basic block, roughly: a loop body, an
epilogue) that hold at least 0.4% of the samples or 30 lines, with their commonest opcodes.
"""
import collections
import csv
import sys


def load(path):
    rows = list(csv.reader(open(path)))
    header, data = rows[1], rows[2:]  # row 0 names the kernel
    return {h: i for i, h in enumerate(header)}, header, data


def summary(path):
    ix, header, data = load(path)
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    samples = lambda r: int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)  # noqa: E731
    executed = lambda r: int(r[ix["Instructions Executed"]] or 0)  # noqa: E731
    source = lambda r: r[ix["Source"]].strip()  # noqa: E731
    total = sum(samples(r) for r in data)
    reasons = collections.Counter({h[6:]: sum(int(r[ix[h]] or 0) for r in data) for h in stalls})
    print(f"== {path}: {total} samples, {sum(executed(r) for r in data)} instructions executed, {len(data)} lines")
    print("   " + ", ".join(f"{k}={v / total:.3f}" for k, v in reasons.most_common(10)))
    for line, r in sorted(enumerate(data), key=lambda lr: -samples(lr[1]))[:25]:
        main = sorted(((int(r[ix[h]] or 0), h[6:]) for h in stalls), reverse=True)[:3]
        print(f"   {line:5d} {samples(r) / total:6.3f} {source(r)[:60]:60s} ex={executed(r)} {main}")
    runs = []  # [first line, last line, execution count, samples, opcodes]
    for line, r in enumerate(data):
        op = source(r).split()[0] if source(r) else ""
        if runs and runs[-1][2] == executed(r):
            runs[-1][1], runs[-1][3] = line, runs[-1][3] + samples(r)
            runs[-1][4][op] += 1
        else:
            runs.append([line, line, executed(r), samples(r), collections.Counter([op])])
    print("-- runs of lines with one execution count")
    for first, last, count, s, ops in runs:
        if s / total > 0.004 or last - first >= 30:
            print(f"   {first:5d}-{last:5d} ex={count:7d} n={last - first + 1:4d} samples={s / total:.3f} "
                  f"{ops.most_common(5)}")


if __name__ == "__main__":
    for path in sys.argv[1:]:
        summary(path)
