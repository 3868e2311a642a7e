#!/usr/bin/env python3
"""What the device MPI suites reach on more ranks that they do not reach on fewer.

The device build runs its MPI suites on 2 ranks only (tests/README.md, "The device build"). This
checks that choice: in a build configured with -Db_coverage=true, it runs each suite on 2 ranks,
reads gcov's counts, runs it again on 4, and prints every line and function of the library
(include/mpopt, Thrust, CUB) that only the 4-rank run executed. It fails if one of them is device
code (Thrust, CUB, or a header of include/mpopt named for CUDA, the device or offloading).

  meson setup cov -Db_coverage=true -Dcuda=disabled && ninja -C cov tests/test_device_mpi_suites
  python3 tests/rank_coverage.py cov [--ranks 2 4] [suite ...]
"""
import argparse
import os
import pathlib
import subprocess

from gcov_counts import device_file, executed

SUITES = ["mpi_zero", "mpi_gradient_types", "mpi_compressed_allreduce", "mpi_onebit", "mpi_onebit_adam",
          "mpi_zero_one_adam"]
ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1",
       "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}


def library_file(name):
    if "/include/mpopt/" in name:
        return name[name.index("include/mpopt/"):]
    return name if ("/thrust/" in name or "/cub/" in name) else None


def device_code(name):
    return device_file(name) is not None


def counts(objdir):
    """Executed lines and functions of the library, from the .gcda files gcov reads now."""
    return executed(objdir.glob("*.gcda"), library_file)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("build", type=pathlib.Path, help="a build directory configured with -Db_coverage=true")
    p.add_argument("--ranks", type=int, nargs=2, default=[2, 4], metavar=("FEWER", "MORE"))
    p.add_argument("suites", nargs="*", default=SUITES)
    args = p.parse_args()
    build = args.build.resolve()
    exe = build / "tests" / "test_device_mpi_suites"
    objdir = build / "tests" / "test_device_mpi_suites.p"
    env = {**os.environ, **ENV}
    new_device_code = 0
    for suite in args.suites:
        for gcda in objdir.glob("*.gcda"):
            gcda.unlink()
        seen = []
        for np in args.ranks:
            subprocess.run(["mpirun", "-np", str(np), str(exe), f"--source-file=*/{suite}.cpp", "--no-skipped-summary"],
                           env=env, stdout=subprocess.DEVNULL, check=True)
            seen.append(counts(objdir))  # cumulative: the second holds both runs
        new_lines = sorted(seen[1][0] - seen[0][0])
        new_functions = sorted(seen[1][1] - seen[0][1])
        new_device_code += sum(device_code(name) for name, _ in new_lines + new_functions)
        print(f"{suite}: {len(seen[0][0])} library lines on {args.ranks[0]} ranks; "
              f"{len(new_lines)} lines and {len(new_functions)} functions only on {args.ranks[1]}")
        for name, line in new_lines:
            print(f"  {name}:{line}" + ("  (device code)" if device_code(name) else ""))
        for name, function in new_functions:
            print(f"  {name}: {function[:200]}" + ("  (device code)" if device_code(name) else ""))
    print(f"device code reached only on {args.ranks[1]} ranks: {new_device_code} lines and functions")
    return 0 if new_device_code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
