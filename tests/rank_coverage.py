#!/usr/bin/env python3
"""What the MPI suites reach on more ranks that they do not reach on fewer.

The device build runs its MPI suites on 2 ranks only, and the host build runs each of its suites on
2 ranks and on 3 or 4 (tests/README.md, "Rank counts"). This checks those choices: in a build
configured with -Db_coverage=true, it runs each suite on the fewer rank counts, reads gcov's counts,
runs it again on the most, and prints every line and function of the library (include/mpopt,
Thrust, CUB) that only the last run executed. For the device executable it fails if one of them is
device code (Thrust, CUB, or a header of include/mpopt named for CUDA, the device or offloading); for
the host's, if any library line or function is new.

  meson setup cov -Db_coverage=true -Dcuda=disabled && ninja -C cov tests/test_device_mpi_suites
  python3 tests/rank_coverage.py cov [--ranks 2,4] [suite ...]
  ninja -C cov tests/test_mpi_suites
  python3 tests/rank_coverage.py cov --host --ranks 2,3,4 [suite ...]
  python3 tests/rank_coverage.py cov --host --ranks 2,4,3 mpi_zero mpi_moe mpi_onebit ...
"""
import argparse
import os
import pathlib
import subprocess

from gcov_counts import device_file, executed

SUITES = ["mpi_zero", "mpi_gradient_types", "mpi_compressed_allreduce", "mpi_onebit", "mpi_onebit_adam",
          "mpi_zero_one_adam"]
# The host suites that run on 1, 2 and 3 ranks, not 4 (tests/meson.build: those not marked 'four').
HOST_SUITES = ["mpi_communicator", "mpi_replicated", "mpi_gradient_types", "mpi_memory", "mpi_custom_rules",
               "mpi_overlap", "mpi_spike_guard", "mpi_config_loop"]
ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1",
       "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}


def library_file(name):
    if "/include/mpopt/" in name:
        return name[name.index("include/mpopt/"):]
    return name if ("/thrust/" in name or "/cub/" in name) else None


def device_code(name):
    return device_file(name) is not None


def counts(objdirs):
    """Executed lines and functions of the library, from the .gcda files gcov reads now."""
    return executed([g for d in objdirs for g in d.glob("*.gcda")], library_file)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("build", type=pathlib.Path, help="a build directory configured with -Db_coverage=true")
    p.add_argument("--host", action="store_true", help="the host's test_mpi_suites (and libmpopt's code)")
    p.add_argument("--ranks", type=lambda t: [int(n) for n in t.split(",")], default=[2, 4], metavar="N,N[,N]",
                   help="rank counts: every one but the last together, against the last (default 2,4)")
    p.add_argument("suites", nargs="*")
    args = p.parse_intermixed_args()
    build = args.build.resolve()
    name = "test_mpi_suites" if args.host else "test_device_mpi_suites"
    exe = build / "tests" / name
    objdirs = [build / "tests" / (name + ".p")] + ([build / "libmpopt.a.p"] if args.host else [])
    env = {**os.environ, **ENV}
    fewer, most = args.ranks[:-1], args.ranks[-1]
    failing = 0
    for suite in args.suites or (HOST_SUITES if args.host else SUITES):
        for gcda in (g for d in objdirs for g in d.glob("*.gcda")):
            gcda.unlink()
        seen = []
        for np in args.ranks:
            subprocess.run(["mpirun", "-np", str(np), str(exe), f"--source-file=*/{suite}.cpp", "--no-skipped-summary"],
                           env=env, stdout=subprocess.DEVNULL, check=True)
            if np in (fewer[-1], most):
                seen.append(counts(objdirs))  # cumulative: the second holds every run
        new_lines = sorted(seen[1][0] - seen[0][0])
        new_functions = sorted(seen[1][1] - seen[0][1])
        new = new_lines + new_functions
        failing += len(new) if args.host else sum(device_code(n) for n, _ in new)
        print(f"{suite}: {len(seen[0][0])} library lines on {fewer} ranks; "
              f"{len(new_lines)} lines and {len(new_functions)} functions only on {most}")
        for n, line in new_lines:
            print(f"  {n}:{line}" + ("  (device code)" if device_code(n) else ""))
        for n, function in new_functions:
            print(f"  {n}: {function[:200]}" + ("  (device code)" if device_code(n) else ""))
    print(f"{'library' if args.host else 'device'} code reached only on {most} ranks: {failing} lines and functions")
    return 0 if failing == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
