#!/usr/bin/env bash
# mpopt as its users consume it: (1) installed, found with pkg-config; (2) as a Meson subproject
# through dependency('mpopt'). Each builds and runs examples/quickstart.cpp.
set -euo pipefail
src=$1
build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== installed, pkg-config"
meson install -C "$build" --destdir "$work/root" --quiet
pc=$(find "$work/root" -name mpopt.pc | head -1)
[ -n "$pc" ] || { echo "meson install did not install mpopt.pc"; exit 1; }
cat "$pc"
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR="$work/root" pkg-config --cflags --libs mpopt)
echo "pkg-config --cflags --libs mpopt: $flags"
g++ -std=c++20 -O2 "$src/examples/quickstart.cpp" $flags -o "$work/quickstart_installed"
(cd "$work" && ./quickstart_installed | tail -2)

echo "== Meson subproject"
mkdir -p "$work/app/subprojects"
ln -s "$src" "$work/app/subprojects/mpopt"
cp "$src/examples/quickstart.cpp" "$work/app/"
cat > "$work/app/meson.build" <<'MESON'
project('app', 'cpp', default_options : ['cpp_std=c++20'])
mpopt_dep = dependency('mpopt', fallback : ['mpopt', 'mpopt_dep'])
executable('quickstart', 'quickstart.cpp', dependencies : mpopt_dep)
MESON
meson setup "$work/app/build" "$work/app" -Dmpopt:tests=false -Dmpopt:examples=false -Dmpopt:bench=false >/dev/null
ninja -C "$work/app/build" >/dev/null
(cd "$work" && ./app/build/quickstart | tail -2)
echo "both consumers built and ran"
