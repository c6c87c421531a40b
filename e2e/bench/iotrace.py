#!/usr/bin/env python3
"""Run a command and report what the physical disks and a process did meanwhile.

    iotrace.py [--pid PID] [--label NAME] -- COMMAND...

For each physical disk that read anything while COMMAND ran (/proc/diskstats, sampled every
0.1 s): bytes read, GB/s, busy share (util), average reads in flight (queue), average read size
and latency, and the read rate second by second; the CPU seconds of PID (a ckptfs mount) and of
COMMAND. One JSON line on stdout; COMMAND's own output goes to stderr.

What it is for: a cold load through a mount that is slower than the same load from a copy on
the same disk (BENCHMARKS.md, run R) is either waiting on the disk differently (fewer reads in
flight, smaller reads, idle gaps: queue, req_KiB, the timeline) or on CPU (the mount's seconds).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def physical_disks():
    """Block devices backed by hardware (nvme0n1, sda, vda): not partitions, dm, md, loop."""
    return sorted(d for d in os.listdir("/sys/block") if os.path.exists(f"/sys/block/{d}/device"))


def diskstats(names):
    out = {}
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if p[2] in names:
                # reads, sectors read, ms reading, in flight, ms busy, weighted ms
                out[p[2]] = [int(p[3]), int(p[5]), int(p[6]), int(p[11]), int(p[12]), int(p[13])]
    return out


def cpu_seconds(pid):
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pid", type=int, help="a process whose CPU seconds to count (the mount)")
    ap.add_argument("--label", default="", help="a name for the JSON line")
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command")
    disks = physical_disks()
    first = diskstats(disks)
    samples = [(0.0, first)]
    cpu0, child0 = cpu_seconds(a.pid), children_cpu()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=sys.stderr)
    while p.poll() is None:
        time.sleep(a.interval)
        samples.append((time.perf_counter() - t0, diskstats(disks)))
    wall = time.perf_counter() - t0
    last = diskstats(disks)
    cpu1 = cpu_seconds(a.pid)
    out = dict(label=a.label, rc=p.returncode, seconds=round(wall, 3),
               command_cpu_s=round(children_cpu() - child0, 2),
               pid_cpu_s=None if cpu0 is None or cpu1 is None else round(cpu1 - cpu0, 2), disks={})
    for d in disks:
        if d not in first or d not in last:
            continue
        reads, sectors, read_ms, _, busy_ms, weighted_ms = (y - x for x, y in zip(first[d], last[d]))
        if sectors == 0:
            continue
        # Read rate per whole second, from the samples.
        per_s, mark, at = [], 0, first[d][1]
        for t, s in samples[1:] + [(wall, last)]:
            if d in s and t - mark >= 1.0:
                per_s.append(round((s[d][1] - at) * 512 / (t - mark) / 1e6))
                mark, at = t, s[d][1]
        out["disks"][d] = dict(read_GB=round(sectors * 512 / 1e9, 3), GBps=round(sectors * 512 / 1e9 / wall, 3),
                               util=round(busy_ms / 1e3 / wall, 3), queue=round(weighted_ms / 1e3 / wall, 2),
                               req_KiB=round(sectors / 2 / max(reads, 1), 1),
                               read_ms=round(read_ms / max(reads, 1), 3), MBps_each_second=per_s)
    print(json.dumps(out))
    sys.exit(p.returncode)


if __name__ == "__main__":
    main()
