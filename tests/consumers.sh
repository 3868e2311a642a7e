#!/usr/bin/env bash
# mpopt as its users consume it, each building and running a program: installed, found (1) with
# pkg-config (examples/quickstart.cpp), (2) with CMake's find_package, (3) as an installed Meson
# dependency; and (4) as a Meson subproject, whose tests, examples and benchmarks stay off; (5) with
# CMake's add_subdirectory. 2-5 build app.cpp (below: one optimizer's step, half quickstart's compile
# time; what they check is the package's flags). Over MPI, on 2 ranks through mpopt::mpi: a zero2
# optimizer that steps and saves, found (2) as a COMPONENT of the installed package, and a replicated
# one that steps, (6) with FetchContent.
# Also: the package carries LICENSE, below C++20 the headers stop with a clear #error, and
# mpopt::version matches the package's version. CXXFLAGS, if set, reaches every consumer's compiler
# (CMake and Meson read it too): the build passes its g++ heap setting.
set -euo pipefail
src=$1
build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
version=$(meson introspect --projectinfo "$build" | python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')

echo "== installed (meson install --destdir)"
meson install -C "$build" --destdir "$work/root" --quiet --no-rebuild
pc=$(find "$work/root" -name mpopt.pc | head -1)
config=$(find "$work/root" -name mpoptConfig.cmake | head -1)
[ -n "$pc" ] || { echo "meson install did not install mpopt.pc"; exit 1; }
[ -n "$config" ] || { echo "meson install did not install mpoptConfig.cmake"; exit 1; }
[ -f "$(dirname "$config")/mpoptConfigVersion.cmake" ] || { echo "no mpoptConfigVersion.cmake"; exit 1; }
[ -n "$(find "$work/root" -path '*/doc/mpopt/LICENSE')" ] || { echo "meson install did not install LICENSE"; exit 1; }
prefix=$(dirname "$(dirname "$(dirname "$(dirname "$config")")")")  # <prefix>/lib[/<arch>]/cmake/mpopt
[ -d "$prefix/include/mpopt" ] || prefix=$(dirname "$prefix")
export PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR="$work/root"

# Each consumer shows what its program printed last (a program that fails fails the test). Each builds
# without optimization: what is checked is that the package's flags find and link everything, which
# no optimization level changes, and the compiler's time is most of this test's.
run() { (cd "$work" && "$1" | tail -2); }

# One replicated optimizer that steps: what consumers 2-5 build.
cat > "$work/app.cpp" <<'CPP'
#include <mpopt/adam.hpp>
#include <mpopt/optimizer.hpp>

#include <cstdio>
#include <vector>

int main() {
  mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::adam> opt;
  std::vector<float> w(100, 1.0f), g(100, 0.5f);
  opt.add_group({.lr = 0.1}).add(w, g, "w");
  opt.step();
  std::printf("app: one step, w[0] %g\n", w[0]);
}
CPP

# One ZeRO-2 optimizer over MPI that steps and saves, run on 2 ranks (where mpirun is).
cat > "$work/zero2.cpp" <<'CPP'
#include <mpopt/adam.hpp>
#include <mpopt/checkpoint.hpp>
#include <mpopt/mpi.hpp>
#include <mpopt/optimizer.hpp>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    using optimizer = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam, mpopt::host, mpopt::mpi>;
    optimizer opt{mpopt::mpi{MPI_COMM_WORLD}};
    std::vector<mpopt::half> w(1000, mpopt::half(1.0f)), g(1000, mpopt::half(0.5f));
    opt.add_group({.lr = 1e-3}).add(w, g, "w");
    for (int i = 0; i < 3; ++i) opt.step();
    opt.save("zero2.safetensors");
    if (opt.communicator().rank() == 0)
      std::printf("zero2 over %d ranks: w[0] %g\n", opt.communicator().size(), float(w[0]));
  }
  MPI_Finalize();
}
CPP
# One step of replicated data parallelism over MPI (consumer 6: the MPI target, in less compile time
# than zero2.cpp's ZeRO-2 and checkpoint, and than <mpopt/mpopt.hpp>, which reads every header).
cat > "$work/mpi_app.cpp" <<'CPP'
#include <cstdio>
#include <vector>

#include <mpi.h>
#include <mpopt/adam.hpp>
#include <mpopt/mpi.hpp>
#include <mpopt/optimizer.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::adam, mpopt::host, mpopt::mpi> opt{
        mpopt::mpi{MPI_COMM_WORLD}};
    std::vector<float> w(100, 1.0f), g(100, 0.5f);
    opt.add_group({.lr = 0.1}).add(w, g, "w");
    opt.step();
    if (opt.communicator().rank() == 0)
      std::printf("mpi_app over %d ranks: one step, w[0] %g\n", opt.communicator().size(), w[0]);
  }
  MPI_Finalize();
}
CPP
run_ranks() {
  if command -v mpirun >/dev/null; then
    (cd "$work" && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
      mpirun -np 2 "$1" | tail -1)
  else
    echo "no mpirun: $1 built, not run"
  fi
}
# What a CMake build of mpopt as source compiles: the application's units alone.
only_app_objects() {
  local objects
  objects=$(find "$1" -name '*.o' | wc -l)
  [ "$objects" -eq "$2" ] || { echo "$1: $objects object files, where the application has $2"; exit 1; }
}

echo "== 1. pkg-config"
flags=$(pkg-config --cflags --libs mpopt)
echo "pkg-config --cflags --libs mpopt: $flags"
g++ -std=c++20 -O0 ${CXXFLAGS-} "$src/examples/quickstart.cpp" $flags -o "$work/quickstart_pkgconfig"
run ./quickstart_pkgconfig

echo "== 2. CMake find_package"
mkdir -p "$work/cmake_app"
cp "$work/app.cpp" "$work/zero2.cpp" "$work/cmake_app/"
cat > "$work/cmake_app/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.16)
project(app CXX)
find_package(mpopt $version EXACT REQUIRED COMPONENTS mpi)
add_executable(app app.cpp)
target_link_libraries(app PRIVATE mpopt::mpopt)
add_executable(zero2 zero2.cpp)
target_link_libraries(zero2 PRIVATE mpopt::mpi)
CMAKE
cmake -S "$work/cmake_app" -B "$work/cmake_app/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE= >/dev/null
cmake --build "$work/cmake_app/build" >/dev/null
run ./cmake_app/build/app
run_ranks ./cmake_app/build/zero2
# A part the package does not have stops find_package.
mkdir -p "$work/cmake_bad"
cat > "$work/cmake_bad/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.16)
project(bad CXX)
find_package(mpopt REQUIRED COMPONENTS tpu)
CMAKE
if cmake -S "$work/cmake_bad" -B "$work/cmake_bad/build" -DCMAKE_PREFIX_PATH="$prefix" >"$work/cmake_bad.log" 2>&1; then
  echo "find_package(mpopt COMPONENTS tpu) succeeded"
  exit 1
fi
grep -o "mpopt has no part 'tpu'[^)]*)" "$work/cmake_bad.log"

echo "== 3. installed Meson dependency"
mkdir -p "$work/meson_app"
cp "$work/app.cpp" "$work/meson_app/"
cat > "$work/meson_app/meson.build" <<MESON
project('app', 'cpp', default_options : ['cpp_std=c++20'])
executable('app', 'app.cpp', dependencies : dependency('mpopt', version : '$version'))
MESON
meson setup --buildtype=plain "$work/meson_app/build" "$work/meson_app" >/dev/null
ninja -C "$work/meson_app/build" >/dev/null
run ./meson_app/build/app

echo "== 4. Meson subproject (no -Dmpopt: options: its own targets are off)"
mkdir -p "$work/app/subprojects"
ln -s "$src" "$work/app/subprojects/mpopt"
cp "$work/app.cpp" "$work/app/"
cat > "$work/app/meson.build" <<'MESON'
project('app', 'cpp', default_options : ['cpp_std=c++20'])
mpopt_dep = dependency('mpopt', fallback : ['mpopt', 'mpopt_dep'])
executable('app', 'app.cpp', dependencies : mpopt_dep)
MESON
env -u PKG_CONFIG_PATH -u PKG_CONFIG_SYSROOT_DIR meson setup --buildtype=plain "$work/app/build" "$work/app" --wrap-mode=forcefallback >/dev/null
targets=$(ninja -C "$work/app/build" -t targets all | grep -c ': \(cpp_LINKER\|cuda_LINKER\)' || true)
[ "$targets" -eq 1 ] || { echo "the subproject added $((targets - 1)) executables of its own"; exit 1; }
ninja -C "$work/app/build" >/dev/null
run ./app/build/app

echo "== 5. CMake add_subdirectory (the source tree; builds nothing of its own)"
mkdir -p "$work/cmake_sub"
cp "$work/app.cpp" "$work/cmake_sub/"
cat > "$work/cmake_sub/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.16)
project(app CXX)
add_subdirectory("$src" mpopt)
add_executable(app app.cpp)
target_link_libraries(app PRIVATE mpopt::mpopt)
CMAKE
cmake -S "$work/cmake_sub" -B "$work/cmake_sub/build" -DCMAKE_BUILD_TYPE= >/dev/null
cmake --build "$work/cmake_sub/build" >/dev/null
only_app_objects "$work/cmake_sub/build" 1
run ./cmake_sub/build/app

echo "== 6. CMake FetchContent, mpopt::mpi"
mkdir -p "$work/cmake_fetch"
cp "$work/mpi_app.cpp" "$work/cmake_fetch/"
cat > "$work/cmake_fetch/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.16)
project(app CXX)
include(FetchContent)
FetchContent_Declare(mpopt SOURCE_DIR "$src")
FetchContent_MakeAvailable(mpopt)
add_executable(mpi_app mpi_app.cpp)
target_link_libraries(mpi_app PRIVATE mpopt::mpi)
CMAKE
cmake -S "$work/cmake_fetch" -B "$work/cmake_fetch/build" -DCMAKE_BUILD_TYPE= >/dev/null
cmake --build "$work/cmake_fetch/build" >/dev/null
only_app_objects "$work/cmake_fetch/build" 1
run_ranks ./cmake_fetch/build/mpi_app

echo "== below C++20: a clear #error"
if echo '#include <mpopt/mpopt.hpp>' | g++ -std=c++17 -fsyntax-only -Wfatal-errors -I"$src/include" -x c++ - 2>"$work/cxx17.err"; then
  echo "a C++17 build of <mpopt/mpopt.hpp> compiled"
  exit 1
fi
head -3 "$work/cxx17.err"
grep -q 'error: #error "mpopt needs C++20' "$work/cxx17.err"

echo "== mpopt::version"
cat > "$work/version.cpp" <<'CPP'
#include <mpopt/version.hpp>
#include <cstdio>
int main() { std::printf("%d.%d.%d\n", mpopt::version.major, mpopt::version.minor, mpopt::version.patch); }
CPP
g++ -std=c++20 -I"$src/include" "$work/version.cpp" -o "$work/version"
[ "$("$work/version")" = "$version" ] || { echo "mpopt::version $("$work/version") is not $version"; exit 1; }
echo "mpopt::version $version"
echo "all six consumers built and ran"
