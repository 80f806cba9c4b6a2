# SPDX-License-Identifier: Apache-2.0
"""python -m rmmc: the version, the library, the devices and each device's
stack in one line each.

    python -m rmmc            what each device's stack is or would be (builds nothing)
    python -m rmmc --stacks   builds each device's registry stack and prints its line
    python -m rmmc --summary  the same, with memory_summary()'s table per device
"""
import argparse
import os
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m rmmc", description=__doc__.splitlines()[0])
    ap.add_argument("--stacks", action="store_true",
                    help="build each device's stack (RMMC_ALLOC_CONF) and print its status")
    ap.add_argument("--summary", action="store_true", help="a table per device (implies --stacks)")
    a = ap.parse_args(argv)
    import rmmc
    from rmmc._summary import device_names, memory_summary, memory_summary_line
    print("rmmc %s (%s)" % (rmmc.version(), rmmc.library_path()))
    status, spec, message = rmmc.config_status()
    conf = os.environ.get("RMMC_ALLOC_CONF")
    print("process default: %s%s" % (spec or conf or "cuda", "" if status == "SUCCESS" else
                                      " (RMMC_ALLOC_CONF=%r) %s: %s" % (
                                          conf, status, message.splitlines()[0])))
    n = rmmc.device_count()
    names = device_names()
    if n == 0:
        print("devices: none (no GPU or driver: host stacks only, e.g. "
              "rmmc.Resource('pool > host'))")
        return 0 if status == "SUCCESS" else 1
    print("devices: %d" % n)
    failed = status != "SUCCESS"
    for d in range(n):
        name = names[d] if d < len(names) else "?"
        try:
            free, total = rmmc.mr.available_device_memory(d)
            mem = "%.1f of %.1f GiB free" % (free / 2**30, total / 2**30)
        except rmmc.RmmcError as e:
            mem = "memory unknown (%s)" % e.status_name
        print("  device %d: %s, %s" % (d, name, mem))
    for d in range(n):
        if not (a.stacks or a.summary):
            try:
                print("  stack %d: %s (built on first use)"
                      % (d, rmmc.device_spec(spec or "cuda", d)))
            except rmmc.RmmcError as e:
                print("  stack %d: %s" % (d, e))
                failed = True
            continue
        try:
            print("  stack %d: %s" % (d, memory_summary_line(d)))
            if a.summary:
                sys.stdout.write(memory_summary(d))
        except rmmc.RmmcError as e:
            print("  stack %d: %s" % (d, e))
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
